"""GPU evidence for the kernel generator: default config vs SDPA's cuDNN and flash
backends (one run, same inputs), peak extra memory at long sequence lengths, and a small
sweep that informs the built-in defaults.

    python3 benchmarks/kernel_smoke.py --out DIR

Writes DIR/kernel_smoke.json and DIR/kernel_smoke.md; prints the markdown last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fa_autotune.bench import sdpa_call  # noqa: E402
from fa_autotune.spec.target import environment  # noqa: E402
from fa_autotune.tune.inputs import TrialInputs, random_inputs  # noqa: E402
from fa_autotune.tune.measure import check_correct, peak_extra_bytes, time_callable, time_config  # noqa: E402
from fa_autotune.spec.config import KernelConfig  # noqa: E402
from fa_autotune.spec.defaults import default_for  # noqa: E402
from fa_autotune.spec.target import detect_gpu  # noqa: E402
from fa_autotune.spec.problem import Problem  # noqa: E402
from fa_autotune.tune.reference import compare, reference_attention  # noqa: E402
from fa_autotune import attention  # noqa: E402

SWEEP = [
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
]


def timing_rows():
    rows = []
    for dtype in ("float16", "bfloat16"):
        for causal in (False, True):
            problem = Problem(4, 16, 16, 4096, 4096, 128, dtype, causal)
            cfg = default_for(problem, detect_gpu())
            inputs = TrialInputs.build(cfg, problem, "cuda")
            err = check_correct(cfg, problem, inputs)
            row = {"problem": problem.key, "dtype": dtype, "causal": causal, "default_config": cfg.name,
                   "default_rel_err": err.rel, "default_ok": err.passes(dtype)}
            row["default_ms"] = time_config(cfg, problem, inputs).median_ms
            q, k, v = random_inputs(problem, "cuda")
            ref, _ = reference_attention(q, k, v, causal=causal)
            for backend in ("cudnn", "flash"):
                fn, context = sdpa_call(backend, problem, q, k, v)
                with context():
                    row[f"{backend}_rel_err"] = compare(fn(), ref).rel
                    row[f"{backend}_ms"] = time_callable(fn).median_ms
            for name in ("default", "cudnn", "flash"):
                row[f"{name}_tflops"] = problem.tflops(row[f"{name}_ms"])
            row["default_vs_cudnn"] = row["cudnn_ms"] / row["default_ms"]
            rows.append(row)
    return rows


def memory_rows():
    rows = []
    for n in (16384, 65536):
        q, k, v = random_inputs(Problem(1, 8, 8, n, n, 128, "float16", True), "cuda")
        attention(q, k, v, causal=True)
        out, extra = peak_extra_bytes(lambda: attention(q, k, v, causal=True))
        rows.append({"seqlen": n, "batch": 1, "heads": 8, "head_dim": 128, "extra_bytes": extra,
                     "output_bytes": out.numel() * out.element_size(),
                     "score_matrix_bytes_if_materialised": 8 * n * n * 4})
        del q, k, v, out
    return rows


def sweep_rows():
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            problem = Problem(4, 2048 // d, 2048 // d, 4096, 4096, d, "float16", causal)
            for access in ("tensor_desc", "pointer"):
                for params in SWEEP:
                    cfg = KernelConfig(access=access, **params)
                    try:
                        inputs = TrialInputs.build(cfg, problem, "cuda")
                        ok = check_correct(cfg, problem, inputs).passes("float16")
                        ms = time_config(cfg, problem, inputs).median_ms if ok else float("nan")
                    except Exception as exc:  # keep sweeping; record why
                        ok, ms = False, float("nan")
                        print(f"{cfg.name} {problem.key}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
                    rows.append({"problem": problem.key, "config": cfg.name, "ok": ok, "ms": ms,
                                 "tflops": problem.tflops(ms) if ok else 0.0})
    return rows


def markdown(result) -> str:
    env = result["environment"]
    lines = [f"# Kernel smoke run: {env.get('gpu')} ({env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
             f"driver {env.get('driver')}, fa_autotune {env['fa_autotune']} (templates {env['template_hash']})", "",
             "## Default config vs SDPA (B=4, H=16, N=4096, D=128), TFLOPS", "",
             "| dtype | causal | default config | default | cuDNN | flash (FA2) | default / cuDNN | rel err |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["timing"]:
        lines.append(f"| {r['dtype']} | {r['causal']} | `{r['default_config']}` | {r['default_tflops']:.0f} | "
                     f"{r['cudnn_tflops']:.0f} | {r['flash_tflops']:.0f} | {r['default_vs_cudnn']:.2f}x | {r['default_rel_err']:.1e} |")
    lines += ["", "## Peak extra GPU memory of one causal call (B=1, H=8, D=128, fp16)", "",
              "| N | extra MiB | output MiB | score matrix if materialised (GiB) |", "|---|---|---|---|"]
    for r in result["memory"]:
        lines.append(f"| {r['seqlen']} | {r['extra_bytes'] / 2**20:.0f} | {r['output_bytes'] / 2**20:.0f} | "
                     f"{r['score_matrix_bytes_if_materialised'] / 2**30:.0f} |")
    lines += ["", "## Default-selection sweep (fp16, B*N = 16384, hidden 2048), TFLOPS", "",
              "| problem | config | TFLOPS |", "|---|---|---|"]
    for r in sorted(result["sweep"], key=lambda r: (r["problem"], -r["tflops"])):
        lines.append(f"| {r['problem']} | `{r['config']}` | {r['tflops']:.0f}{'' if r['ok'] else ' (failed)'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"environment": environment(), "timing": timing_rows(), "memory": memory_rows(),
              "sweep": [] if args.no_sweep else sweep_rows()}
    (args.out / "kernel_smoke.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    text = markdown(result)
    (args.out / "kernel_smoke.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

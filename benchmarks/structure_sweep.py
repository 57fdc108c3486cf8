"""Which kernel-structure knobs pay on this GPU: each FlashAttention-3/4 knob of the Q-outer
template (two Q tiles, lazy rescaling, polynomial exp2, persistent grid, head-major order,
register caps, 256-row tiles) applied to strong base configs, every variant checked against
float32 and timed side by side with SDPA cuDNN in interleaved rounds of one run.

    python3 benchmarks/structure_sweep.py --out DIR [--rounds 3]

Writes DIR/structure_sweep.json and .md (per problem: every variant's TFLOPS, ratio to
cuDNN and to its base; per knob: the median ratio to its base over bases and problems).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from fa_autotune.bench import _prepared, sdpa_call
from fa_autotune.processes import compiler_init
from fa_autotune.spec.target import environment
from fa_autotune.tune.compile import compile_for_tuning
from fa_autotune.tune.inputs import random_inputs
from fa_autotune.tune.measure import time_callable
from fa_autotune.spec.config import KernelConfig
from fa_autotune.errors import ConfigError
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.reference import compare, reference_attention

PROBLEMS = [
    Problem(1, 16, 16, 16384, 16384, 128, "float16", causal=False),
    Problem(4, 16, 16, 4096, 4096, 128, "float16", causal=True),
    Problem(4, 32, 32, 4096, 4096, 64, "float16", causal=False),
    Problem(16, 16, 16, 1024, 1024, 128, "bfloat16", causal=True),
]
BASES = {
    "m128n128w4s2-tma-ws": dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, access="tensor_desc",
                                warp_specialize=True),
    "m128n64w4s2-tma": dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, access="tensor_desc"),
    "m128n128w8s2-tma": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, access="tensor_desc"),
    "m128n64w8s3-ptr": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, access="pointer"),
}


def knobs(base: dict) -> dict[str, dict]:
    """Variants of one base: each knob alone, then the FlashAttention-4 pair and all three."""
    out = {"base": {}, "q2": dict(q_tiles=2), "q2-halfM": dict(q_tiles=2, BLOCK_M=base["BLOCK_M"] // 2),
           "lazy8": dict(rescale_threshold=8), "poly": dict(exp2_poly=True),
           "lazy8+poly": dict(rescale_threshold=8, exp2_poly=True),
           "q2-halfM+lazy8+poly": dict(q_tiles=2, BLOCK_M=base["BLOCK_M"] // 2, rescale_threshold=8, exp2_poly=True),
           "pers1": dict(persistent=1), "pers2": dict(persistent=2), "head": dict(tile_order="head"),
           "pers1+head": dict(persistent=1, tile_order="head")}
    if base["num_warps"] == 8:
        out.update({"m256": dict(BLOCK_M=256), "r128": dict(maxnreg=128), "r168": dict(maxnreg=168),
                    "m256+r240": dict(BLOCK_M=256, maxnreg=240)})
    return out


def variants(problem: Problem) -> list[tuple[str, str, KernelConfig]]:
    out = []
    for base_name, base in BASES.items():
        for knob, change in knobs(base).items():
            params = dict(base, **change)
            if params.get("warp_specialize") and problem.causal:
                continue
            try:
                out.append((base_name, knob, KernelConfig.from_mapping(params)))
            except ConfigError:
                continue
    return out


def compile_all(pool: ProcessPoolExecutor) -> dict:
    jobs = {(p, c): pool.submit(compile_for_tuning, c, p) for p in PROBLEMS for _, _, c in variants(p)}
    return {key: future.result() for key, future in jobs.items()}


def measure(problem: Problem, compiled: dict, rounds: int, rep_ms: float) -> dict:
    q, k, v = random_inputs(problem, "cuda", seed=1)
    ref, _ = reference_attention(q, k, v, causal=problem.causal)
    cudnn, context = sdpa_call("cudnn", problem, q, k, v)
    rows, fns = [], {"cudnn": cudnn}
    for base_name, knob, config in variants(problem):
        result = compiled[(problem, config)]
        row = {"base": base_name, "knob": knob, "config": config.name, "status": result.status,
               "detail": result.error[:160]}
        rows.append(row)
        if result.status != "ok":
            continue
        try:
            fn = _prepared(config, problem, q, k, v)
            report = compare(fn(), ref)
        except Exception as exc:  # a variant that cannot run is a result
            row.update(status="launch_error", detail=f"{type(exc).__name__}: {exc}"[:160])
            continue
        row["rel_error"] = report.rel
        if not report.passes(problem.dtype):
            row["status"] = "wrong_result"
            continue
        fns[config.name] = fn
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            with context() if name == "cudnn" else _null():
                samples[name].append(time_callable(fn, rep_ms=rep_ms).median_ms)
    ms = {name: statistics.median(values) for name, values in samples.items()}
    base_ms = {r["base"]: ms.get(r["config"]) for r in rows if r["knob"] == "base"}
    for row in rows:
        if row["config"] in ms:
            row["ms"] = ms[row["config"]]
            row["tflops"] = problem.tflops(row["ms"])
            row["vs_cudnn"] = ms["cudnn"] / row["ms"]
            if base_ms.get(row["base"]):
                row["vs_base"] = base_ms[row["base"]] / row["ms"]
    return {"problem": problem.key, "cudnn_ms": ms["cudnn"], "cudnn_tflops": problem.tflops(ms["cudnn"]), "rows": rows}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def knob_summary(results: list[dict]) -> dict[str, dict]:
    by_knob: dict[str, list[float]] = {}
    for res in results:
        for row in res["rows"]:
            if "vs_base" in row and row["knob"] != "base":
                by_knob.setdefault(row["knob"], []).append(row["vs_base"])
    return {k: {"median_vs_base": statistics.median(v), "best_vs_base": max(v), "n": len(v)}
            for k, v in sorted(by_knob.items())}


def markdown(summary: dict) -> str:
    env = summary["environment"]
    lines = [f"# Kernel-structure sweep on {env.get('gpu')} ({env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}, cuDNN {env['cudnn']}, templates {env['template_hash']}. "
             f"`python3 benchmarks/structure_sweep.py --out DIR`: {summary['rounds']} interleaved rounds; every "
             "variant checked against float32 first.", "",
             "## Per knob: time ratio to the same base without it (>1 = faster)", "",
             "| knob | median | best | variants timed |", "|---|---|---|---|"]
    for knob, s in summary["knobs"].items():
        lines.append(f"| {knob} | {s['median_vs_base']:.3f} | {s['best_vs_base']:.3f} | {s['n']} |")
    for res in summary["results"]:
        lines += ["", f"## {res['problem']} (cuDNN {res['cudnn_tflops']:.0f} TFLOPS)", "",
                  "| config | status | TFLOPS | vs cuDNN | vs base |", "|---|---|---|---|---|"]
        ranked = sorted(res["rows"], key=lambda r: -r.get("tflops", 0))
        for r in ranked:
            if "tflops" in r:
                vs_base = f"{r['vs_base']:.3f}" if "vs_base" in r else "-"
                lines.append(f"| {r['config']} | ok | {r['tflops']:.0f} | {r['vs_cudnn']:.3f} | {vs_base} |")
            else:
                lines.append(f"| {r['config']} | {r['status']} {r['detail'][:60]} | | | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context, initializer=compiler_init) as pool:
        compiled = compile_all(pool)
    print(f"compiled {len(compiled)} variants", file=sys.stderr, flush=True)
    results = []
    for problem in PROBLEMS:
        results.append(measure(problem, compiled, args.rounds, args.rep_ms))
        print(f"measured {problem.key}", file=sys.stderr, flush=True)
    summary = {"environment": environment(), "rounds": args.rounds, "knobs": knob_summary(results), "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "structure_sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "structure_sweep.md").write_text(markdown(summary))
    for res in results:
        best = sorted((r for r in res["rows"] if "tflops" in r), key=lambda r: -r["tflops"])[:4]
        print(res["problem"], f"cudnn {res['cudnn_tflops']:.0f}",
              " | ".join(f"{r['config'][15:]} {r['tflops']:.0f} ({r['vs_cudnn']:.2f}x)" for r in best))
    for knob, s in summary["knobs"].items():
        print(f"{knob:24s} median {s['median_vs_base']:.3f} best {s['best_vs_base']:.3f} n={s['n']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP8 attention against our tuned fp16 and SDPA cuDNN, side by side in one run, with the
error of every quantization recipe beside its speed.

    python3 benchmarks/fp8_bench.py --out DIR            # H200: D=128, N 4096/16384, causal and not
    python3 benchmarks/fp8_bench.py --out DIR --tiny     # CPU smoke run in Triton's interpreter

Per problem: fp16 `attention` (the dispatcher's tuned config), SDPA cuDNN (GPU only), and
for each recipe (per_tensor / per_head / per_block x Hadamard or not) the fastest of a few
FP8 kernel configs, timed on prequantized e4m3 inputs (kernel only). Errors are relative
to float32 attention on the unquantized inputs, measured on LLM-like inputs with outlier
channels (fa_autotune.bench.fp8_source_inputs). Writes DIR/fp8_bench.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

RECIPES = [(s, h) for s in ("per_tensor", "per_head", "per_block") for h in (False, True)]
KERNELS = [dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, access="tensor_desc"),
           dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, access="tensor_desc"),
           dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, access="tensor_desc"),
           dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, access="pointer")]
TINY_KERNELS = [dict(BLOCK_M=32, BLOCK_N=32)]


def problems(tiny: bool):
    from fa_autotune.problem import Problem

    if tiny:
        return [Problem(1, 2, 2, 64, 64, 64, "float8_e4m3fn", causal=c) for c in (False, True)]
    return [Problem(16384 // n, 16, 16, n, n, 128, "float8_e4m3fn", causal=c) for n in (4096, 16384)
            for c in (False, True)]


def measure(problem, device: str, kernels: list[dict], rounds: int) -> dict:
    import torch

    import fa_autotune
    from fa_autotune.bench import fp8_source_inputs, random_inputs, tflops, time_callable
    from fa_autotune.benchmark import sdpa_call
    from fa_autotune.config import KernelConfig
    from fa_autotune.reference import compare, reference_attention

    q16, k16, v16 = random_inputs(problem.with_dtype("float16"), device, seed=0)
    fp16 = problem.with_dtype("float16")
    calls = {"fp16 tuned": lambda: fa_autotune.attention(q16, k16, v16, problem.causal)}
    contexts = {}
    if device == "cuda":
        calls["fp16 cuDNN"], contexts["fp16 cuDNN"] = sdpa_call("cudnn", fp16, q16, k16, v16)
    source = fp8_source_inputs(problem, device, seed=1)
    ref, _ = reference_attention(*source, causal=problem.causal)
    errors, configs = {}, {}
    for scaling, hadamard in RECIPES:
        name = f"fp8 {scaling}{' + Hadamard' if hadamard else ''}"
        for kernel in kernels:
            config = KernelConfig.from_mapping(dict(kernel, fp8_scaling=scaling, fp8_hadamard=hadamard))
            out = fa_autotune.attention_fp8(*source, causal=problem.causal, config=config, scaling=scaling,
                                            hadamard=hadamard)
            report = compare(out.float(), ref)
            x = fa_autotune.quantize_fp8(q16, k16, v16, scaling=scaling, hadamard=hadamard)
            key = f"{name} / {config.name}"
            calls[key] = (lambda x=x, config=config: fa_autotune.attention_fp8(x, causal=problem.causal,
                                                                             config=config))
            errors[key], configs[key] = report.rel if report.finite else float("nan"), name
    samples = {key: [] for key in calls}
    for _ in range(rounds):
        for key, fn in calls.items():
            context = contexts.get(key)
            if context is None:
                samples[key].append(time_callable(fn, rep_ms=100, device=device).median_ms)
                continue
            with context():
                samples[key].append(time_callable(fn, rep_ms=100, device=device).median_ms)
    ms = {key: statistics.median(v) for key, v in samples.items()}
    rows = {k: {"ms": v, "tflops": tflops(problem, v)} for k, v in ms.items() if not k.startswith("fp8")}
    for key, value in ms.items():
        if key.startswith("fp8"):
            recipe = configs[key]
            if recipe not in rows or value < rows[recipe]["ms"]:
                rows[recipe] = {"ms": value, "tflops": tflops(problem, value), "rel_error": errors[key],
                                "kernel": key.split(" / ")[1], "vs_fp16_tuned": ms["fp16 tuned"] / value}
    return {"problem": problem.key, "rows": rows}


def markdown(summary: dict) -> str:
    env = summary["environment"]
    lines = [f"# FP8 attention on {env.get('gpu')} ({env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}, templates {env['template_hash']}. "
             "`python3 benchmarks/fp8_bench.py --out DIR`; FP8 e4m3 timed on prequantized inputs; errors "
             "relative to float32 on inputs with outlier channels.", ""]
    for res in summary["results"]:
        lines += [f"## {res['problem']}", "", "| provider | TFLOPS | vs fp16 tuned | rel. error | kernel |",
                  "|---|---|---|---|---|"]
        for name, r in res["rows"].items():
            ratio = f"{r['vs_fp16_tuned']:.2f}x" if "vs_fp16_tuned" in r else ""
            error = f"{r['rel_error']:.4f}" if "rel_error" in r else ""
            lines.append(f"| {name} | {r['tflops']:.0f} | {ratio} | {error} | {r.get('kernel', '')} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="tiny problems in Triton's interpreter (no GPU)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"
    from fa_autotune.bench import environment

    device = "cpu" if args.tiny else "cuda"
    kernels = TINY_KERNELS if args.tiny else KERNELS
    results = [measure(p, device, kernels, 1 if args.tiny else args.rounds) for p in problems(args.tiny)]
    summary = {"environment": environment(), "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "fp8_bench.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP8 attention against our tuned fp16 and SDPA cuDNN, side by side in one run, with the
error of every quantization recipe beside its speed.

    python3 benchmarks/fp8_bench.py --out DIR                   # H200: D=128, N 4096/16384, causal and not
    python3 benchmarks/fp8_bench.py --out DIR --seqlens 4096    # a part (e.g. one per GPU), then:
    python3 benchmarks/fp8_bench.py --merge DIR1 DIR2 --out DIR
    python3 benchmarks/fp8_bench.py --out DIR --tiny            # CPU smoke run in Triton's interpreter

Per problem: a sweep of FP8 kernel configs on the default recipe (per_block + Hadamard,
one round), then fp16 `attention` (the dispatcher's tuned config), SDPA cuDNN (GPU only),
every recipe (per_tensor / per_head / per_block x Hadamard or not) on the sweep's best
kernels, and the quantize-for-me path (fused quantization + kernel), all timed in
interleaved rounds. Recipes are timed on prequantized e4m3 inputs (kernel only). Errors are
relative to float32 attention on the unquantized inputs, measured on LLM-like inputs with
outlier channels (fa_autotune.tune.inputs.fp8_source_inputs). Writes DIR/fp8_bench.json and .md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

RECIPES = [(s, h) for s in ("per_tensor", "per_head", "per_block") for h in (False, True)]
DEFAULT_RECIPE = ("per_block", True)
# FP8 kernels swept on the default recipe; the best TOP of them then run every recipe.
# block_q / block_k: quantization blocks (a per-block tile must not straddle two blocks).
_WS = dict(num_warps=4, num_stages=2, access="tensor_desc", warp_specialize=True)
_PTR = dict(num_stages=3, access="pointer")
KERNELS = [dict(BLOCK_M=128, BLOCK_N=256, **_WS, persistent=1, block_k=256),
           dict(BLOCK_M=128, BLOCK_N=256, **_WS, persistent=1, tile_order="head", block_k=256),
           dict(BLOCK_M=128, BLOCK_N=256, **_WS, block_k=256),
           dict(BLOCK_M=128, BLOCK_N=256, **_WS, tile_order="head", block_k=256),
           dict(BLOCK_M=128, BLOCK_N=128, **_WS, persistent=1),
           dict(BLOCK_M=128, BLOCK_N=256, num_warps=8, num_stages=3, access="tensor_desc", block_k=256),
           # Without warp specialization (the only kind Triton 3.6 runs causal).
           *[dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, **_PTR, **({"block_k": 256} if bn == 256 else {}))
             for bm, bn, w in ((128, 256, 8), (64, 128, 4), (128, 64, 4), (128, 128, 8))]]
TINY_KERNELS = [dict(BLOCK_M=32, BLOCK_N=32), dict(BLOCK_M=32, BLOCK_N=64, block_k=64)]
TOP = 3


def problems(tiny: bool, seqlens: tuple[int, ...] = (4096, 16384)):
    from fa_autotune.spec.problem import Problem

    if tiny:
        return [Problem(1, 2, 2, 64, 64, 64, "float8_e4m3fn", causal=c) for c in (False, True)]
    return [Problem(16384 // n, 16, 16, n, n, 128, "float8_e4m3fn", causal=c) for n in seqlens
            for c in (False, True)]


def recipe_name(scaling: str, hadamard: bool) -> str:
    return f"fp8 {scaling}{' + Hadamard' if hadamard else ''}"


class Candidates:
    """FP8 (recipe, kernel) pairs on one problem: each checked against float32 on LLM-like
    inputs once, then timed on prequantized inputs (kernel only)."""

    def __init__(self, problem, device: str) -> None:
        from fa_autotune.tune.inputs import fp8_source_inputs, random_inputs
        from fa_autotune.tune.reference import reference_attention

        self.problem = problem
        self.q16, self.k16, self.v16 = random_inputs(problem.with_dtype("float16"), device, seed=0)
        self.source = fp8_source_inputs(problem, device, seed=1)
        self.ref, _ = reference_attention(*self.source, causal=problem.causal)
        self.calls, self.errors, self.recipe, self.kernel, self.failed = {}, {}, {}, {}, {}

    def add(self, recipe: tuple[str, bool], kernel: dict) -> str | None:
        import fa_autotune
        from fa_autotune.spec.config import KernelConfig
        from fa_autotune.tune.reference import compare

        scaling, hadamard = recipe
        blocks = {b: kernel[b] for b in ("block_q", "block_k") if b in kernel}
        config = KernelConfig.from_mapping(dict({k: v for k, v in kernel.items() if k not in blocks},
                                                fp8_scaling=scaling, fp8_hadamard=hadamard))
        key = f"{recipe_name(*recipe)} / {config.name}" + "".join(f" {b}={v}" for b, v in blocks.items())
        causal = self.problem.causal
        try:
            out = fa_autotune.attention_fp8(*self.source, causal=causal, config=config, scaling=scaling,
                                            hadamard=hadamard, **blocks)
            x = fa_autotune.quantize_fp8(self.q16, self.k16, self.v16, scaling=scaling, hadamard=hadamard, **blocks)
            fa_autotune.attention_fp8(x, causal=causal, config=config)
        except Exception as exc:  # a config that does not compile or fit is a result, not a crash
            self.failed[key] = f"{type(exc).__name__}: {exc}"[:200]
            return None
        report = compare(out.float(), self.ref)
        self.calls[key] = lambda: fa_autotune.attention_fp8(x, causal=causal, config=config)
        self.errors[key] = report.rel if report.finite else float("nan")
        self.recipe[key], self.kernel[key] = recipe_name(*recipe), kernel
        return key


def time_all(calls: dict, contexts: dict, device: str, rounds: int, rep_ms: float) -> dict[str, float]:
    """Median ms per call over ``rounds`` interleaved rounds."""
    from fa_autotune.tune.measure import time_callable

    samples = {key: [] for key in calls}
    for _ in range(rounds):
        for key, fn in calls.items():
            with contexts.get(key, contextlib.nullcontext)():
                samples[key].append(time_callable(fn, rep_ms=rep_ms, device=device).median_ms)
    return {key: statistics.median(v) for key, v in samples.items()}


def measure(problem, device: str, kernels: list[dict], rounds: int) -> dict:
    import fa_autotune
    from fa_autotune.bench import sdpa_call
    from fa_autotune.runtime.api import _fp8_usable
    from fa_autotune.runtime.dispatch import DISPATCHER
    from fa_autotune.fp8.quantize import tile_blocks

    cand = Candidates(problem, device)
    swept = [key for kernel in kernels if (key := cand.add(DEFAULT_RECIPE, kernel))]
    if not swept:
        raise SystemExit(f"no FP8 kernel of the sweep runs {problem.key}: {cand.failed}")
    sweep = time_all({k: cand.calls[k] for k in swept}, {}, device, 1, 50)
    top = [cand.kernel[k] for k in sorted(swept, key=sweep.get)[:TOP]]
    for recipe in RECIPES:
        for kernel in top:
            cand.add(recipe, kernel)
    q16, k16, v16, causal = cand.q16, cand.k16, cand.v16, problem.causal
    calls, contexts = {"fp16 tuned": lambda: fa_autotune.attention(q16, k16, v16, causal)}, {}
    if device == "cuda":
        calls["fp16 cuDNN"], contexts["fp16 cuDNN"] = sdpa_call("cudnn", problem.with_dtype("float16"), q16, k16, v16)
    # What a user of the convenience path pays: fused quantization plus the kernel.
    best = cand.kernel[min(swept, key=sweep.get)]
    blocks = {b: best[b] for b in ("block_q", "block_k") if b in best}
    config = {k: v for k, v in best.items() if k not in blocks}
    calls["fp8 end-to-end: quantize + fastest kernel"] = (
        lambda: fa_autotune.attention_fp8(q16, k16, v16, causal=causal, config=config, **blocks))
    calls["fp8 end-to-end: quantize + dispatched kernel"] = (
        lambda: fa_autotune.attention_fp8(q16, k16, v16, causal=causal))
    # The dispatcher's pick (a tuned Pareto front where one is stored, else the built-in
    # default) on inputs quantized as that config wants them: the tuned FP8 kernel alone.
    chosen = DISPATCHER.choose_fp8(problem, q16.device.type, q16.device.index or 0).config
    tuned = fa_autotune.quantize_fp8(q16, k16, v16, scaling=chosen.fp8_scaling, hadamard=chosen.fp8_hadamard,
                                     **dict(zip(("block_q", "block_k"), tile_blocks(chosen.BLOCK_M, chosen.BLOCK_N))))
    runs = _fp8_usable(chosen, problem, tuned, explicit=False).name  # as adapted to these inputs
    calls[f"fp8 dispatched kernel, prequantized ({runs})"] = (
        lambda: fa_autotune.attention_fp8(tuned, causal=causal))
    if device == "cuda":  # the quantization alone, fused against the eager float32 path
        for backend in ("triton", "torch"):
            calls[f"quantize_fp8 only ({backend})"] = (
                lambda b=backend: fa_autotune.quantize_fp8(q16, k16, v16, backend=b))
    calls.update({k: cand.calls[k] for k in cand.calls if k not in swept or cand.kernel[k] in top})
    ms = time_all(calls, contexts, device, rounds, 100)
    rows = {k: {"ms": v, "tflops": problem.tflops(v), "vs_fp16_tuned": ms["fp16 tuned"] / v}
            for k, v in ms.items() if k not in cand.recipe}
    for key, value in ms.items():
        if key in cand.recipe:
            recipe = cand.recipe[key]
            if recipe not in rows or value < rows[recipe]["ms"]:
                rows[recipe] = {"ms": value, "tflops": problem.tflops(value), "rel_error": cand.errors[key],
                                "kernel": key.split(" / ")[1], "vs_fp16_tuned": ms["fp16 tuned"] / value}
    sweep_rows = {k.split(" / ")[1]: {"ms": v, "tflops": problem.tflops(v), "rel_error": cand.errors[k]}
                  for k, v in sorted(sweep.items(), key=lambda kv: kv[1])}
    return {"problem": problem.key, "rows": rows, "sweep": sweep_rows, "failed": cand.failed}


def markdown(summary: dict) -> str:
    env = summary["environment"]
    lines = [f"# FP8 attention on {env.get('gpu')} ({env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}, templates {env['template_hash']}. "
             "`python3 benchmarks/fp8_bench.py --out DIR`; FP8 e4m3 timed on prequantized inputs; errors "
             "relative to float32 on inputs with outlier channels.", "",
             *([f"Merged from {summary['runs']} runs on GPUs of this model and software (one per GPU of one "
                "host); each problem's rows were timed side by side in one run.", ""] if summary.get("runs", 1) > 1
               else [])]
    for res in summary["results"]:
        lines += [f"## {res['problem']}", "", "| provider | ms | TFLOPS | vs fp16 tuned | rel. error | kernel |",
                  "|---|---|---|---|---|---|"]
        for name, r in res["rows"].items():
            ratio = f"{r['vs_fp16_tuned']:.2f}x" if "vs_fp16_tuned" in r else ""
            error = f"{r['rel_error']:.4f}" if "rel_error" in r else ""
            flops = "" if name.startswith("quantize") else f"{r['tflops']:.0f}"
            lines.append(f"| {name} | {r['ms']:.3f} | {flops} | {ratio} | {error} | {r.get('kernel', '')} |")
        lines.append("")
        lines += ["Kernel sweep on per_block + Hadamard (one round, 50 ms):", "",
                  "| kernel | TFLOPS | rel. error |", "|---|---|---|"]
        lines += [f"| {k} | {r['tflops']:.0f} | {r['rel_error']:.4f} |" for k, r in res.get("sweep", {}).items()]
        lines.append("")
        lines += [f"- not run: {key}: {why}" for key, why in res.get("failed", {}).items()]
        lines.append("")
    return "\n".join(lines)


def merge(paths: list[str]) -> dict:
    """One summary from parts run on GPUs of the same model and software."""
    from fa_autotune.bench import _SAME_STACK

    parts = [json.loads((Path(p) / "fp8_bench.json").read_text()) for p in paths]
    for path, part in zip(paths[1:], parts[1:]):
        differs = [k for k in _SAME_STACK if part["environment"].get(k) != parts[0]["environment"].get(k)]
        if differs:
            raise SystemExit(f"{path}: its {', '.join(differs)} differ from {paths[0]}'s")
    results = [r for part in parts for r in part["results"]]
    repeated = {r["problem"] for r in results if sum(x["problem"] == r["problem"] for x in results) > 1}
    if repeated:
        raise SystemExit(f"problems measured in more than one part: {sorted(repeated)}")
    return {"environment": parts[0]["environment"], "results": results,
            "runs": sum(part.get("runs", 1) for part in parts)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="tiny problems in Triton's interpreter (no GPU)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seqlens", default="4096,16384", help="comma-separated sequence lengths")
    parser.add_argument("--merge", nargs="+", default=None, help="no timing: merge these output folders")
    args = parser.parse_args()
    if args.merge:
        summary = merge(args.merge)
    else:
        if args.tiny:
            os.environ["TRITON_INTERPRET"] = "1"
        from fa_autotune.spec.target import environment

        device = "cpu" if args.tiny else "cuda"
        kernels = TINY_KERNELS if args.tiny else KERNELS
        seqlens = tuple(int(n) for n in args.seqlens.split(","))
        results = [measure(p, device, kernels, 1 if args.tiny else args.rounds) for p in problems(args.tiny, seqlens)]
        summary = {"environment": environment(), "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "fp8_bench.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

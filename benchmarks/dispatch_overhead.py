"""Host overhead of fa_autotune.attention against launching the same compiled kernel
directly, on a latency-bound problem (B=1, H=8, N=128, D=64, fp16).

    python3 benchmarks/dispatch_overhead.py --out DIR

Baselines use the very config attention() dispatches to: a hand-written Triton call
(allocate the output, launch with kernel[grid](...)), and the lowest possible launch (the
compiled kernel's own launcher, as attention()'s prepared plan uses after its first call)
with and without allocating the output. Each figure is the wall time per call over 2000
back-to-back calls (the GPU work is shorter than the host work, so the loop is
host-bound), median of 7 rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fa_autotune  # noqa: E402
from fa_autotune.kernels.launcher import prepare  # noqa: E402
from fa_autotune.spec.config import KernelConfig  # noqa: E402
from fa_autotune.spec.target import environment  # noqa: E402
from fa_autotune.tune.measure import time_callable  # noqa: E402

CALLS, ROUNDS = 1000, 21


def per_call_us(rows: dict) -> dict[str, dict[str, float]]:
    """Round-robin over the variants so that host noise hits them alike; median and min."""
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for fn in rows.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    for _ in range(ROUNDS):
        for name, fn in rows.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - start) / CALLS * 1e6)
    return {name: {"median": statistics.median(v), "min": min(v)} for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    info = fa_autotune.explain(q, k, v)
    config = KernelConfig.from_mapping(info["config"])
    out = torch.empty_like(q)
    run = prepare(config, q, k, v, out, None, 64 ** -0.5, 0, False)
    run(q, k, v, out, None)
    torch.testing.assert_close(fa_autotune.attention(q, k, v), out)
    ((launch, call_args),) = run.arguments(q, k, v, out, None)
    jit = launch.kernel[launch.grid]
    rest = call_args[4:]  # everything after Q, K, V and Out: the LSE (None), descales (None), scalars

    def hand_written():
        o = torch.empty_like(q)
        jit(q, k, v, o, *rest, **launch.meta)
        return o

    def raw_with_alloc():
        o = torch.empty_like(q)
        run(q, k, v, o, None)
        return o

    rows = {
        "hand-written Triton call: torch.empty_like + kernel[grid](...)": hand_written,
        "compiled kernel's own launcher, output preallocated": lambda: run(q, k, v, out, None),
        "compiled kernel's own launcher + torch.empty_like": raw_with_alloc,
        "fa_autotune.attention(q, k, v)": lambda: fa_autotune.attention(q, k, v),
        "SDPA (flash backend), for reference": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
    }
    results = per_call_us(rows)
    direct = results["hand-written Triton call: torch.empty_like + kernel[grid](...)"]["median"]
    ours = results["fa_autotune.attention(q, k, v)"]["median"]
    floor = results["compiled kernel's own launcher + torch.empty_like"]["median"]
    gpu_us = time_callable(lambda: run(q, k, v, out, None)).median_ms * 1e3
    summary = {"environment": environment(), "problem": "B=1 H=8 N=128 D=64 fp16, non-causal",
               "config": config.name, "source": info["source"], "per_call_us": results,
               "added_us": ours - direct, "ratio": ours / direct, "dispatch_us_over_floor": ours - floor,
               "kernel_gpu_us": gpu_us}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dispatch_overhead.json").write_text(json.dumps(summary, indent=2) + "\n")
    env = summary["environment"]
    lines = [f"# Host overhead of attention() ({env.get('gpu')}, {env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}; {summary['problem']}; config `{config.name}` "
             f"(source: {info['source']}); kernel time on the GPU {gpu_us:.1f} us.", "",
             "| call | us per call (median of rounds) | min |", "|---|---|---|"]
    lines += [f"| {name} | {r['median']:.2f} | {r['min']:.2f} |" for name, r in results.items()]
    lines += ["", f"attention() against the hand-written call: {ours - direct:+.2f} us ({ours / direct:.3f}x); "
              f"its own dispatch cost over the cheapest launch with the same allocation: {ours - floor:.2f} us."]
    text = "\n".join(lines) + "\n"
    (args.out / "dispatch_overhead.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

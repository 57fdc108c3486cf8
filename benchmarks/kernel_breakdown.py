"""Where a provider's time goes, kernel by kernel: each provider's call (forward, or the
backward through autograd as ``fa-autotune bench`` times it) runs under torch.profiler, and
the GPU time of every kernel it launched is averaged per call, beside the call's elapsed time
(CUDA events; elapsed minus the kernels' sum is time the GPU sat idle between them).

    python3 benchmarks/kernel_breakdown.py --head-dim 128 --seqlen 4096 --backward --out DIR
    python3 benchmarks/kernel_breakdown.py --head-dim 64 --seqlen 1024 --causal --providers tuned,cudnn
    python3 benchmarks/kernel_breakdown.py --decode --batch 128 --seqlen 1024   # one token, H_q 32, H_kv 8

Shapes follow llm-prefill (hidden 2048: heads = 2048 / head_dim; batch x seqlen = 16384, or
``--batch``); ``--decode``: one query token per sequence against a contiguous KV cache of
``--seqlen`` keys (``--heads`` / ``--kv-heads``, default 32 / 8), as ``fa-autotune bench
--space decode`` runs it. Each kernel's launch (grid, block, shared memory, registers) is read from the
profiler's trace and printed beside it: another provider's tiling, seen from outside. Each
output is checked against float32 first. The L2 is flushed before each call, as the bench does,
by a kernel the table leaves out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import defaultdict
from pathlib import Path


def kernel_times(prof, iters: int, skip: str) -> dict[str, float]:
    """Mean GPU microseconds per call of each kernel the profile saw (``skip`` left out)."""
    import torch

    total: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA or skip in event.name:
            continue
        total[event.name] += event.time_range.elapsed_us() / iters
    return dict(sorted(total.items(), key=lambda item: -item[1]))


def kernel_launches(prof, skip: str) -> dict[str, dict]:
    """Each kernel's launch shape as the profiler's trace records it (grid, block, shared
    memory, registers per thread), the first launch of each name."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    keys = ("grid", "block", "shared memory", "registers per thread", "blocks per SM", "warps per SM")
    launches: dict[str, dict] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel" or skip in event.get("name", ""):
            continue
        args = event.get("args", {})
        launches.setdefault(event["name"], {k: args[k] for k in keys if k in args})
    return launches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, help="batch size (default: 16384 tokens / seqlen)")
    parser.add_argument("--providers", default="tuned,cudnn")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--heads", type=int, default=32, help="--decode: query heads")
    parser.add_argument("--kv-heads", type=int, default=8, help="--decode: KV heads")
    parser.add_argument("--out", type=Path, help="folder for the JSON (appended to breakdown.json)")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from fa_autotune.bench import Bench
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.inputs import TrialInputs, random_inputs
    from fa_autotune.tune.measure import time_callable
    from fa_autotune.tune.reference import compare, compare_all, reference_attention, reference_gradients

    heads = 2048 // args.head_dim
    bench = Bench(tuple(args.providers.split(",")), None)
    if args.decode:
        problem = Problem(args.batch or 1, args.heads, args.kv_heads, 1, args.seqlen, args.head_dim, args.dtype,
                          causal=args.causal, kind="decode")
        x = TrialInputs.kv_cache(problem, "cuda")
        q, k, v = x.reference
    else:
        problem = Problem(args.batch or 16384 // args.seqlen, heads, heads, args.seqlen, args.seqlen, args.head_dim,
                          args.dtype, causal=args.causal, kind="bwd" if args.backward else "fwd")
        q, k, v = random_inputs(problem, "cuda")
    if args.decode:
        ref, _ = reference_attention(q, k, v, causal=problem.causal, causal_align=problem.causal_align)
        make = lambda p: bench.decode_callable_for(p, problem, x)  # noqa: E731
        judge = lambda got: compare(got, ref)  # noqa: E731
    elif args.backward:
        dout = torch.randn_like(q)
        refs = reference_gradients(q, k, v, dout, causal=problem.causal)
        make = lambda p: bench.backward_callable_for(p, problem, q, k, v, dout)  # noqa: E731
        judge = lambda got: compare_all(got, refs)  # noqa: E731
    else:
        ref, _ = reference_attention(q, k, v, causal=problem.causal)
        make = lambda p: bench.callable_for(p, problem, q, k, v)  # noqa: E731
        judge = lambda got: compare(got, ref)  # noqa: E731
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    results = {}
    for provider in bench.providers:
        fn, context, detail = make(provider)
        with (context() if context else contextlib.nullcontext()):
            report = judge(fn())
            if not report.passes(problem.dtype):
                raise SystemExit(f"{provider} is wrong on {problem.key}: rel error {report.rel:.3g}")
            elapsed = time_callable(fn, rep_ms=100).median_ms * 1e3
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    flush.bitwise_not_()
                    fn()
                torch.cuda.synchronize()
        kernels = kernel_times(prof, args.iters, "bitwise_not")
        launches = kernel_launches(prof, "bitwise_not")
        results[provider] = {"detail": detail, "elapsed_us": elapsed, "kernels_us": kernels, "launches": launches}
        print(f"\n{problem.key} {provider} ({detail}): {elapsed:.1f} us elapsed, "
              f"{sum(kernels.values()):.1f} us in kernels")
        for name, us in kernels.items():
            print(f"  {us:9.1f} us  {name[:150]}")
            if name in launches:
                print(f"               {launches[name]}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "breakdown.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[problem.key] = results
        path.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

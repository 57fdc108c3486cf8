"""Clocks and power under sustained load: each provider's forward runs back to back for
about two seconds while nvidia-smi samples the SM clock and board power every 50 ms; prints
the first 20-call batch's time (clocks still high) beside the sustained time, with the
median clock and power over the run. Long attention problems hit the board's power limit,
so their sustained speed is set by work per joule, not by the schedule alone.

    python3 benchmarks/sustained_clocks.py --batch 1 --heads 16 --seqlen 16384 --head-dim 128 [--causal] [--dtype float16]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--providers", default="tuned,cudnn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()

    import torch

    from fa_autotune.bench import Bench
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.inputs import random_inputs
    from fa_autotune.tune.reference import compare, reference_attention

    problem = Problem(args.batch, args.heads, args.heads, args.seqlen, args.seqlen, args.head_dim, args.dtype,
                      causal=args.causal, kind="fwd")
    q, k, v = random_inputs(problem, "cuda")
    ref, _ = reference_attention(q, k, v, causal=problem.causal)
    bench = Bench(tuple(args.providers.split(",")), None)
    samples: list[tuple[float, str]] = []
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    threading.Thread(target=lambda: samples.extend((time.time(), line) for line in smi.stdout), daemon=True).start()
    flops = 4 * args.batch * args.heads * args.seqlen ** 2 * args.head_dim / (2 if args.causal else 1)
    print(f"{problem.key}: {flops / 1e9:.0f} GFLOP a call")
    try:
        for rnd in range(args.rounds):
            for provider in bench.providers:
                fn, context, detail = bench.callable_for(provider, problem, q, k, v)
                with (context() if context else contextlib.nullcontext()):
                    report = compare(fn(), ref)
                    if not report.passes(problem.dtype):
                        raise SystemExit(f"{provider} is wrong on {problem.key}: rel error {report.rel:.3g}")
                    torch.cuda.synchronize()
                    time.sleep(1.0)  # let the clocks recover between providers
                    start, batches = time.time(), []
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    while time.time() - start < args.seconds:
                        begin.record()
                        for _ in range(20):
                            fn()
                        end.record()
                        end.synchronize()
                        batches.append(begin.elapsed_time(end) / 20 * 1e-3)
                    stop = time.time()
                run = [line.split(",") for t, line in samples if start + 0.2 < t < stop]
                clock = statistics.median(float(c) for c, _ in run)
                power = statistics.median(float(p) for _, p in run)
                first, last = batches[0], statistics.median(batches[-10:])
                print(f"round {rnd} {provider:6s} {detail[:60]:60s} first batch {first * 1e6:8.1f} us "
                      f"({flops / first / 1e12:5.0f} TFLOPS)  sustained {last * 1e6:8.1f} us "
                      f"({flops / last / 1e12:5.0f} TFLOPS)  SM clock {clock:.0f} MHz  power {power:.0f} W", flush=True)
    finally:
        smi.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""attention_varlen's Gluon kernel on the dynamic grid (tiles from a counter) and on the static
persistent grid, against dense attention() at the mean length (what varlen_bench compares
with), varlen_bench's four length mixes, causal and not, in interleaved rounds (order rotated
each round). Each varlen output is checked against float32 attention per sequence before it
is timed. Prints TFLOPS and, per kernel, the median of its rounds' ratios to dense; `default`
is attention_varlen as dispatched (it picks the grid itself: runtime.api.varlen_grid).

Usage: python3 benchmarks/varlen_vs_dense_grids.py
"""
import statistics

import torch

import fa_autotune
from fa_autotune.runtime.dispatch import DISPATCHER
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.measure import time_callable
from varlen_bench import length_mixes, packed_inputs
from varlen_ragged import check_varlen

HQ, HKV, D = 32, 8, 128
ROUNDS = 5


def main() -> None:
    for name, lens in length_mixes().items():
        for causal in (False, True):
            total, longest = sum(lens), max(lens)
            q, k, v, cu = packed_inputs(lens)
            flops = sum(4.0 * HQ * n * n * D for n in lens) / (2 if causal else 1)
            problem = Problem(len(lens), HQ, HKV, longest, longest, D, "bfloat16", causal, "bottom_right")
            dispatched = DISPATCHER.choose(problem, "cuda", torch.cuda.current_device()).config
            calls = {}
            for label, config in (("dynamic", dispatched.with_(persistent=1, dynamic=True)),
                                  ("static", dispatched.with_(persistent=max(dispatched.persistent, 1), dynamic=False))):
                def run(config=config):
                    return fa_autotune.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                                        check_lengths=False, config=config)
                check_varlen(run(), q, k, v, lens, causal)
                calls[label] = run
            calls["default"] = lambda: fa_autotune.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                                                    check_lengths=False)
            mean = int(round(total / len(lens) / 64) * 64)
            qd = torch.randn(len(lens), HQ, mean, D, device="cuda", dtype=torch.bfloat16)
            kd = torch.randn(len(lens), HKV, mean, D, device="cuda", dtype=torch.bfloat16)
            vd = torch.randn_like(kd)
            calls["dense"] = lambda: fa_autotune.attention(qd, kd, vd, causal=causal)
            dense_flops = len(lens) * 4.0 * HQ * mean * mean * D / (2 if causal else 1)
            for fn in calls.values():
                fn()
            torch.cuda.synchronize()
            names = list(calls)
            samples = {n: [] for n in names}
            for r in range(ROUNDS):
                for n in names[r % len(names):] + names[:r % len(names)]:
                    samples[n].append(time_callable(calls[n]).median_ms)

            def tflops(n, i):
                return (dense_flops if n == "dense" else flops) / samples[n][i] / 1e9

            line = f"{name} causal={causal} ({dispatched.name}): "
            for n in names:
                ratio = statistics.median(tflops(n, i) / tflops("dense", i) for i in range(ROUNDS))
                line += (f"{n} {statistics.median(samples[n]):.3f} ms "
                         f"{statistics.median(tflops(n, i) for i in range(ROUNDS)):.0f} TFLOPS ({ratio:.3f}); ")
            print(line, flush=True)
            del q, k, v, qd, kd, vd, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

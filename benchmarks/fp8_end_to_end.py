"""What a user of the quantize-for-me path gets: ``attention_fp8(q, k, v)`` on fp16 inputs
(fused Triton quantization, then the dispatched FP8 kernel) against fp16 ``attention``,
three interleaved rounds, on one GPU:

    python3 benchmarks/fp8_end_to_end.py

Also times ``quantize_fp8`` alone, with and without its NaN scan (one host-device sync).
Prints one line per problem (D=128, hidden 2048, B*N = 16384).
"""
from __future__ import annotations

import argparse
import statistics


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__).parse_args()
    import fa_autotune
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.inputs import random_inputs
    from fa_autotune.tune.measure import time_callable

    for n in (4096, 16384):
        for causal in (False, True):
            p = Problem(16384 // n, 16, 16, n, n, 128, "float16", causal=causal)
            q, k, v = random_inputs(p, "cuda")
            calls = {"fp16 tuned": lambda: fa_autotune.attention(q, k, v, causal),
                     "fp8 e2e (dispatched)": lambda: fa_autotune.attention_fp8(q, k, v, causal=causal),
                     "quantize only": lambda: fa_autotune.quantize_fp8(q, k, v, check_finite=False),
                     "quantize only + NaN check": lambda: fa_autotune.quantize_fp8(q, k, v)}
            for f in calls.values():
                f()
            ms = {name: [] for name in calls}
            for _ in range(3):
                for name, f in calls.items():
                    ms[name].append(time_callable(f, rep_ms=100).median_ms)
            med = {name: statistics.median(v) for name, v in ms.items()}
            print(p.key, " | ".join(f"{name} {m:.3f} ms ({med['fp16 tuned'] / m:.2f}x)" for name, m in med.items()),
                  flush=True)


if __name__ == "__main__":
    main()

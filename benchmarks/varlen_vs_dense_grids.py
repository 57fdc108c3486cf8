"""attention_varlen's Gluon kernel on the dynamic grid (tiles from a counter) and on the static
persistent grid, against dense attention() at the mean length (what varlen_bench compares
with), varlen_bench's four length mixes, causal and not, in interleaved rounds (order rotated
each round). Each varlen output is checked against float32 attention per sequence before it
is timed. Prints TFLOPS and, per kernel, the median of its rounds' ratios to dense; `default`
is attention_varlen as dispatched (it picks the grid itself: runtime.api.varlen_grid).

Usage: python3 benchmarks/varlen_vs_dense_grids.py [--mix NAME ...] [--causal {both,yes,no}] [--rounds N]
"""
import argparse

import torch

import fa_autotune
from fa_autotune.runtime.dispatch import DISPATCHER
from fa_autotune.spec.problem import Problem
from varlen_bench import against_dense, length_mixes, packed_inputs
from varlen_ragged import check_varlen

HQ, HKV, D = 32, 8, 128


def main(mixes: list[str], causal_cases: tuple[bool, ...], rounds: int) -> None:
    for name, lens in length_mixes().items():
        if mixes and name not in mixes:
            continue
        for causal in causal_cases:
            case(name, lens, causal, rounds)
            torch.cuda.empty_cache()


def case(name: str, lens: list[int], causal: bool, rounds: int) -> None:
    """One mix: the dispatched config on either grid and as dispatched, against dense."""
    longest = max(lens)
    q, k, v, cu = packed_inputs(lens)
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
    _, stats = against_dense(calls, lens, causal, rounds)
    line = f"{name} causal={causal} ({dispatched.name}): "
    for n, (ms, tf, ratio) in stats.items():
        line += f"{n} {ms:.3f} ms {tf:.0f} TFLOPS ({ratio:.3f}); "
    print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", action="append", default=[], choices=list(length_mixes()),
                        help="only this length mix (repeatable; default: all)")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    main(args.mix, {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal], args.rounds)

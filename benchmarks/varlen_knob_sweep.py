"""attention_varlen's Gluon kernel under schedule knobs on the dynamic grid it runs mixed
batches on (base: m64x2n128_s2_r240_cband_ov_pers1, the config attention_varlen dispatches on
the H200), each against dense attention() at the mean length, in interleaved rounds (order rotated each round); every
varlen output checked against float32 attention per sequence before it is timed. Prints, per
knob, TFLOPS, the median of the rounds' ratios to dense and the median speed against the base.

Usage: python3 benchmarks/varlen_knob_sweep.py [--rounds N]
"""
import argparse
import statistics

import torch

import fa_autotune
from fa_autotune.spec.config import KernelConfig
from varlen_bench import against_dense, length_mixes, packed_inputs
from varlen_ragged import check_varlen

BASE = KernelConfig.from_mapping(dict(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128,
                                      num_stages=2, persistent=1, dynamic=True))
VARIANTS = {"dyn": BASE, "dyn-lazy8": BASE.with_(rescale_threshold=8), "dyn-pp": BASE.with_(pingpong=True),
            "dyn-emu4": BASE.with_(exp2_emu=4), "dyn-pp-lazy8": BASE.with_(pingpong=True, rescale_threshold=8),
            "dyn-1loop": BASE.with_(one_loop=True)}
CASES = [("64 seqs 64-2048", False), ("64 seqs 64-2048", True), ("16 seqs 256-4096", False), ("64 seqs of 1024", False)]


def main(rounds: int) -> None:
    for name, causal in CASES:
        case(name, causal, rounds)
        torch.cuda.empty_cache()


def case(name: str, causal: bool, rounds: int) -> None:
    """One length mix: every knob and dense, interleaved."""
    lens = length_mixes()[name]
    longest = max(lens)
    q, k, v, cu = packed_inputs(lens)
    calls = {}
    for label, config in VARIANTS.items():
        def run(config=config):
            return fa_autotune.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                                check_lengths=False, config=config)
        check_varlen(run(), q, k, v, lens, causal)
        calls[label] = run
    samples, stats = against_dense(calls, lens, causal, rounds)
    print(f"{name} causal={causal}:", flush=True)
    for n, (ms, tf, ratio) in stats.items():
        speed = statistics.median(a / b for a, b in zip(samples["dyn"], samples[n]))
        print(f"   {n:14s} {ms:.3f} ms {tf:.0f} TF vs dense {ratio:.3f}  speed vs dyn {speed:.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    main(parser.parse_args().rounds)

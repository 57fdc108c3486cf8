"""FP8 error of every quantization recipe on inputs with outlier channels, through the real
FP8 kernels (Triton's interpreter emulates FP8 dots, so this runs without a GPU).

    python3 benchmarks/fp8_accuracy.py [--seeds 3]

Q and K: normal data x0.25 with 4 of 64 channels x20 (LLM-like outliers); relative
Frobenius error against float32 attention on the unquantized inputs; B1 H4 N128 D64,
scaling blocks of 32 rows, 32x32 tiles.
"""
from __future__ import annotations

import argparse
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from fa_autotune import attention_fp8  # noqa: E402
from fa_autotune.tune.reference import compare, reference_attention  # noqa: E402

RECIPES = [(s, h) for s in ("per_tensor", "per_head", "per_block") for h in (False, True)]


def errors(seed: int, fmt: str) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, 128, 64, generator=gen) for _ in range(3))
    q, k = q * 0.25, k * 0.25
    for t in (q, k):
        t[..., [3, 17, 40, 61]] *= 20.0
    ref, _ = reference_attention(q, k, v)
    out = {}
    for scaling, hadamard in RECIPES:
        o = attention_fp8(q, k, v, config={"BLOCK_M": 32, "BLOCK_N": 32}, scaling=scaling, hadamard=hadamard,
                          fmt=fmt, block_q=32, block_k=32)
        out[f"{scaling}{' + Hadamard' if hadamard else ''}"] = compare(o.float(), ref).rel
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    print("| format | recipe | " + " | ".join(f"seed {s}" for s in range(args.seeds)) + " |")
    print("|---|---|" + "---|" * args.seeds)
    for fmt in ("e4m3", "e5m2"):
        table = [errors(seed, fmt) for seed in range(args.seeds)]
        for recipe in table[0]:
            print(f"| {fmt} | {recipe} | " + " | ".join(f"{t[recipe]:.4f}" for t in table) + " |")


if __name__ == "__main__":
    main()

"""FP8 error of every quantization recipe on LLM-like inputs, through the real FP8 kernels
(Triton's interpreter emulates FP8 dots, so this runs without a GPU).

    python3 benchmarks/fp8_accuracy.py [--seeds 3] [--inputs outliers|sinks]

outliers: Q and K normal data x0.25 with 4 of 64 channels x20 (LLM-like outlier channels).
sinks: normal Q, K, V with the first 4 keys' K x40 and V x10 (attention sinks), each recipe
also with the sink tile (the first K tile scored from the fp16 Q and K: ``sink_tile=True``).
Relative Frobenius error against float32 attention on the unquantized inputs; B1 H4 N128
D64 (fp16 inputs for sinks, float32 for outliers), scaling blocks of 32 rows, 32x32 tiles.
"""
from __future__ import annotations

import argparse
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from fa_autotune import attention_fp8  # noqa: E402
from fa_autotune.tune.reference import compare, reference_attention  # noqa: E402

RECIPES = [(s, h) for s in ("per_tensor", "per_head", "per_block") for h in (False, True)]


def _inputs(seed: int, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, 128, 64, generator=gen) for _ in range(3))
    if kind == "outliers":
        q, k = q * 0.25, k * 0.25
        for t in (q, k):
            t[..., [3, 17, 40, 61]] *= 20.0
        return q, k, v
    k[:, :, :4] *= 40.0
    v[:, :, :4] *= 10.0
    return q.half(), k.half(), v.half()  # the sink tile's 16-bit dot (bf16 dots are wrong in the interpreter)


def errors(seed: int, fmt: str, kind: str = "outliers") -> dict[str, float]:
    q, k, v = _inputs(seed, kind)
    ref, _ = reference_attention(q.float(), k.float(), v.float())
    out = {}
    for sink_tile in ((False, True) if kind == "sinks" else (False,)):
        for scaling, hadamard in RECIPES:
            o = attention_fp8(q, k, v, config={"BLOCK_M": 32, "BLOCK_N": 32}, scaling=scaling, hadamard=hadamard,
                              fmt=fmt, block_q=32, block_k=32, sink_tile=sink_tile)
            name = f"{scaling}{' + Hadamard' if hadamard else ''}{' + sink tile' if sink_tile else ''}"
            out[name] = compare(o.float(), ref).rel
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--inputs", choices=("outliers", "sinks"), default="outliers")
    args = parser.parse_args()
    print("| format | recipe | " + " | ".join(f"seed {s}" for s in range(args.seeds)) + " |")
    print("|---|---|" + "---|" * args.seeds)
    for fmt in ("e4m3", "e5m2"):
        table = [errors(seed, fmt, args.inputs) for seed in range(args.seeds)]
        for recipe in table[0]:
            print(f"| {fmt} | {recipe} | " + " | ".join(f"{t[recipe]:.4f}" for t in table) + " |")


if __name__ == "__main__":
    main()

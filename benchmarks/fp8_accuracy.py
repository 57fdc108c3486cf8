"""FP8 error of every quantization recipe on LLM-like inputs, through the real FP8 kernels
(Triton's interpreter emulates FP8 dots, so this runs without a GPU).

    python3 benchmarks/fp8_accuracy.py [--seeds 3] [--inputs outliers sinks] [--formats e4m3 e5m2] [--causal]

The inputs are the tuner's (``fa_autotune.tune.inputs.fp8_source_inputs``, float16):
outliers: Q and K normal data x0.25 with 4 channels x20 (LLM-like outlier channels);
sinks: normal Q, K, V with the first 4 keys' K x40 and V x10 (attention sinks). Each recipe
(scaling x Hadamard x sink tile) is judged on each kind; "objective" is the worst kind's
error, what ``fa-autotune tune --dtype fp8`` stores as a trial's error. Relative Frobenius
error against float32 attention on the unquantized inputs; B1 H4 N128 D64, scaling blocks
of 32 rows, 32x32 tiles; the largest error over the seeds.
"""
from __future__ import annotations

import argparse
import os

os.environ["TRITON_INTERPRET"] = "1"

from fa_autotune import Fp8Recipe, attention_fp8  # noqa: E402
from fa_autotune.spec.problem import Problem  # noqa: E402
from fa_autotune.spec.recipe import FP8_SCALINGS  # noqa: E402
from fa_autotune.tune.inputs import FP8_INPUT_KINDS, fp8_source_inputs  # noqa: E402
from fa_autotune.tune.reference import compare, reference_attention  # noqa: E402

RECIPES = [Fp8Recipe(s, h, t) for s in FP8_SCALINGS for h in (False, True) for t in (False, True)]
DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def error(recipe: Fp8Recipe, fmt: str, kind: str, seed: int, causal: bool = False) -> float:
    """One recipe's relative error on one seed of one kind of inputs."""
    problem = Problem(1, 4, 4, 128, 128, 64, DTYPES[fmt], causal)
    q, k, v = fp8_source_inputs(problem, "cpu", seed, kind)
    ref, _ = reference_attention(q.float(), k.float(), v.float(), causal=causal)
    out = attention_fp8(q, k, v, causal=causal, config={"BLOCK_M": 32, "BLOCK_N": 32}, scaling=recipe.scaling,
                        hadamard=recipe.hadamard, sink_tile=recipe.sink_tile, fmt=fmt, block_q=32, block_k=32)
    return compare(out.float(), ref).rel


def describe(recipe: Fp8Recipe) -> str:
    return (f"{recipe.scaling}{' + Hadamard' if recipe.hadamard else ''}{' + sink tile' if recipe.sink_tile else ''}"
            f"{' (default)' if recipe == Fp8Recipe() else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--inputs", nargs="+", choices=FP8_INPUT_KINDS, default=list(FP8_INPUT_KINDS))
    parser.add_argument("--formats", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    columns = args.inputs + (["objective"] if len(args.inputs) > 1 else [])
    print("| format | recipe | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for fmt in args.formats:
        for recipe in RECIPES:
            worst = [max(error(recipe, fmt, kind, seed, args.causal) for seed in range(args.seeds))
                     for kind in args.inputs]
            cells = worst + ([max(worst)] if len(args.inputs) > 1 else [])
            print(f"| {fmt} | {describe(recipe)} | " + " | ".join(f"{e:.4f}" for e in cells) + " |", flush=True)


if __name__ == "__main__":
    main()

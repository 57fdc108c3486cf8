"""What a user of the quantize-for-me path gets: ``attention_fp8(q, k, v)`` on 16-bit inputs
(fused Triton quantization, then the dispatched FP8 kernel) against the same kernel on inputs
quantized beforehand (issue 42's "quantize-included" ratio), ``quantize_fp8`` alone (time and
the DRAM bytes it must move per second) and 16-bit ``attention``, interleaved rounds, one GPU:

    python3 benchmarks/fp8_end_to_end.py --out DIR

Default problems: B 2, H 16, N 8192 at D 128 (causal and not) and D 256, bf16 inputs, the
default recipe (per block + Hadamard, the sink tile on; ``--no-sink-tile`` turns it off on
both sides). The prequantized side is quantized as ``attention_fp8(q, k, v)`` plans it (the
blocks and V order of the kernel it runs), and both sides run that kernel: the dispatched
one, and the Gluon FP8 default (``--configs``; the dispatcher with tuned files set aside). Every output is
checked against float32 first. Writes ``fp8-end-to-end.json`` (the command, commit and
versions beside the rows) and prints one line per row.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=pathlib.Path, help="folder for fp8-end-to-end.json")
    parser.add_argument("--problems", nargs="+", default=["2,16,8192,128,0", "2,16,8192,128,1", "2,16,8192,256,0"],
                        help="B,H,N,D,causal per row")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--no-sink-tile", action="store_true")
    parser.add_argument("--configs", nargs="+", default=["dispatched", "gluon"], choices=["dispatched", "gluon"],
                        help="the kernel both sides run: what attention_fp8 dispatches, or the Gluon FP8 default")
    parser.add_argument("--small", action="store_true", help="a tiny fp16 problem on the CPU (Triton's interpreter)")
    args = parser.parse_args()
    if args.small:
        args.problems, args.dtype = ["1,2,64,32,0"], "float16"
    device = "cpu" if args.small else "cuda"
    rows = [measure(*map(int, spec.split(",")), dtype=args.dtype, rounds=args.rounds, rep_ms=args.rep_ms,
                    sink_tile=not args.no_sink_tile, device=device, kernel=kernel)
            for spec in args.problems for kernel in args.configs]
    if args.out:
        import torch
        import triton

        import fa_autotune

        package = pathlib.Path(fa_autotune.__file__).resolve().parent  # the tree measured (may be an older copy)
        record = {"command": ["python3", *sys.argv], "commit": _commit_of(package.parent), "package": str(package),
                  "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                  "device": rows[0]["device"], "rows": rows}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8-end-to-end.json").write_text(json.dumps(record, indent=1) + "\n")


def _commit_of(tree: pathlib.Path) -> str | None:
    """The commit checked out at ``tree``, or None where ``tree`` is not a checkout's root (an
    exported copy sitting inside another checkout would otherwise report that one's)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=tree).stdout.strip()

    top = git("rev-parse", "--show-toplevel")
    return git("rev-parse", "HEAD") if top and pathlib.Path(top).resolve() == tree.resolve() else None


def measure(b: int, h: int, n: int, d: int, causal: int, dtype: str, rounds: int, rep_ms: float, sink_tile: bool,
            device: str, kernel: str) -> dict:
    import torch

    from fa_autotune.runtime import api

    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=getattr(torch, dtype)) for _ in range(3))
    causal = bool(causal)
    # an explicit config is not kept as a plan (each call would plan again): the Gluon default
    # is what the dispatcher runs on Hopper with the tuned files set aside
    held = os.environ.get("FA_AUTOTUNE_DISABLE_TUNED")
    os.environ["FA_AUTOTUNE_DISABLE_TUNED"] = "1" if kernel == "gluon" else "0"
    api.DISPATCHER.reset()
    try:
        return _measure(q, k, v, b, h, n, d, causal, dtype, rounds, rep_ms, sink_tile, device, kernel)
    finally:
        if held is None:
            os.environ.pop("FA_AUTOTUNE_DISABLE_TUNED")
        else:
            os.environ["FA_AUTOTUNE_DISABLE_TUNED"] = held
        api.DISPATCHER.reset()


def _measure(q, k, v, b, h, n, d, causal, dtype, rounds, rep_ms, sink_tile, device, kernel) -> dict:
    import torch

    import fa_autotune
    from fa_autotune.runtime import api
    from fa_autotune.tune.measure import time_callable

    here = fa_autotune.attention_fp8(q, k, v, causal=causal, sink_tile=sink_tile)
    plan = next(p for p in api._PLANS.values() if p.quantize is not None)  # what that call planned
    if kernel == "gluon" and plan.config.language != "gluon":
        raise SystemExit(f"the FP8 default here is {plan.config.name}, not a Gluon kernel (not Hopper?)")
    x = fa_autotune.quantize_fp8(q, k, v, **plan.quantize)
    calls = {
        "prequantized": lambda: fa_autotune.attention_fp8(x, causal=causal, sink_tile=sink_tile),
        "quantize_included": lambda: fa_autotune.attention_fp8(q, k, v, causal=causal, sink_tile=sink_tile),
        "quantize_only": lambda: fa_autotune.quantize_fp8(q, k, v, **plan.quantize),
        "attention_16bit": lambda: fa_autotune.attention(q, k, v, causal),
    }
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    errors = {}
    for name in ("prequantized", "quantize_included", "attention_16bit"):
        out = calls[name]().float()
        errors[name] = float((out - ref).norm() / ref.norm())
        if not errors[name] < 0.1:  # NaN fails too
            raise SystemExit(f"{name}: relative error {errors[name]} against float32")
    prequantized = [p.config for p in api._PLANS.values() if getattr(p, "quantize", "") is None]
    if prequantized != [plan.config]:
        raise SystemExit(f"the prequantized call ran {prequantized}, the quantizing one {plan.config.name}")
    del here, out, ref
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            samples[name].append(time_callable(fn, rep_ms=rep_ms, device=device).median_ms)
    ms = {name: statistics.median(s) for name, s in samples.items()}
    work = 4.0 * b * h * n * n * d / (2 if causal else 1)
    moved = 3 * q.numel() * (q.element_size() + 1)  # read 16 bits, write 8, for q, k and v
    row = {"batch": b, "heads": h, "seqlen": n, "head_dim": d, "causal": causal, "dtype": dtype, "kernel": kernel,
           "sink_tile": sink_tile, "config": plan.config.name, "quantize": plan.quantize, "ms": ms, "samples": samples,
           "tflops": {name: work / ms[name] / 1e9 for name in ("prequantized", "quantize_included", "attention_16bit")},
           "quantize_included_ratio": ms["prequantized"] / ms["quantize_included"],
           "quantizer_tb_per_s": moved / ms["quantize_only"] / 1e9, "rel_error": errors,
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    print(json.dumps({key: row[key] for key in ("batch", "heads", "seqlen", "head_dim", "causal", "kernel", "tflops",
                                                "quantize_included_ratio", "quantizer_tb_per_s", "ms")}), flush=True)
    return row


if __name__ == "__main__":
    main()

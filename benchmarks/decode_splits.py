"""Split counts of the contiguous-cache decode kernel against SDPA cuDNN, side by side: for
each row of issue 15's table, every (split count, tile) pair checked against float32
attention first, then timed in interleaved rounds with cuDNN.

A row's (batch x KV heads) programs rarely fill 132 SMs evenly (16 x 8 = 128 leaves 4 idle at
one split); split counts that make the programs a multiple of the SM count (33, 66) balance
them at the price of a bigger combine. Balanced splits (`persistent` 1, 2, 4: that many
programs per SM share all row tiles' key steps evenly, stream-K; names end in `_sk<n>`)
balance them with a combine of only the row tiles a run boundary cuts.

A row spec ending in `r` (`64x16384r`) is a ragged batch, as a server sees one: sequence
lengths drawn (seeded) from [context / 16, context], the same cache capacity; its K/V bytes
count the keys attended, and cuDNN (which takes no per-sequence lengths here) attends the
whole capacity, so for those rows the figure to read is the balanced grid against the
fixed splits (`best fixed`, `best balanced`).

`--access pointer,tensor_desc` also times every config reading the cache through TMA
descriptors (Hopper; names end in `_tma`).

Usage: python3 benchmarks/decode_splits.py --out DIR [--rows 16x16384,8x32768,64x16384r] [--rounds 3]
           [--tiles 64x2,64x4,128x3] [--warps 4] [--splits 1,2,3,4,6,8,16,33,66] [--balanced 1,2,4]
           [--access pointer,tensor_desc]
Writes DIR/decode_splits.json and .md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_sweep import D, HKV, HQ, TABLE, plan_call, sdpa, table_inputs  # noqa: E402

from fa_autotune.spec.config import KernelConfig  # noqa: E402
from fa_autotune.tune.measure import time_callable  # noqa: E402

SPLITS = (1, 2, 3, 4, 6, 8, 16, 33, 66)
TILES = ((64, 2), (64, 4), (128, 3))  # (BLOCK_N, stages)
BALANCED = (1, 2, 4)  # programs per SM of the balanced (persistent) grid


def label(name: str) -> str:
    """A config name without its family prefix and causal mode: m16n64_w4s4_x8, ..._sk1."""
    return name.replace("attn_decode_", "").replace("_cband", "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rows", default=",".join(f"{b}x{n}" for b, n in TABLE))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiles", default=",".join(f"{n}x{s}" for n, s in TILES), help="BLOCK_N x stages pairs")
    ap.add_argument("--warps", default="4")
    ap.add_argument("--splits", default=",".join(map(str, SPLITS)))
    ap.add_argument("--balanced", default=",".join(map(str, BALANCED)), help="programs per SM; empty: none")
    ap.add_argument("--access", default="pointer", help="comma list: pointer,tensor_desc")
    args = ap.parse_args()
    tiles = [tuple(int(x) for x in t.split("x")) for t in args.tiles.split(",")]
    warps = [int(w) for w in args.warps.split(",")]
    splits_list = [int(x) for x in args.splits.split(",")]
    balanced_list = [int(x) for x in args.balanced.split(",") if x]
    accesses = args.access.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in args.rows.split(","):
        ragged = spec.endswith("r")
        batch, n = (int(x) for x in spec.rstrip("r").split("x"))
        q, kc, vc, lens = table_inputs(batch, n)
        if ragged:
            gen = torch.Generator().manual_seed(batch * n)
            lens = torch.randint(n // 16, n + 1, (batch,), generator=gen).to(device="cuda", dtype=torch.int32)
        gb = 2 * int(lens.sum()) * HKV * D * kc.element_size() / 1e9
        cudnn = sdpa(SDPBackend.CUDNN_ATTENTION, q, kc, vc)
        ref = torch.cat([sdpa(SDPBackend.MATH, q[b:b + 1].float(), kc[b:b + 1, :int(lens[b])].float(),
                              vc[b:b + 1, :int(lens[b])].float())().transpose(1, 2) for b in range(batch)])  # float32
        calls, status = {"cudnn": cudnn}, {}
        grid = ([(t, s, 0, w, a) for t in tiles for s in splits_list for w in warps for a in accesses]
                + [(t, 1, p, w, a) for t in tiles for p in balanced_list for w in warps for a in accesses])
        for (bn, stages), splits, persistent, nw, access in grid:
            if splits * bn > n or stages * bn * D > 49152:  # decode.yaml's shared-memory bound
                continue
            cfg = KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=bn, num_warps=nw, num_stages=stages,
                               num_splits=splits, persistent=persistent, access=access)
            out = torch.empty_like(q)
            try:
                fn = plan_call(cfg, q, kc, vc, lens, None, out)
                fn()
                torch.cuda.synchronize()
                err = float((out.float() - ref).norm() / ref.norm())  # bf16 against float32: about 3e-3
                if not err < 2e-2:
                    status[cfg.name] = f"wrong: rel {err:.3g}"
                    continue
                calls[cfg.name] = fn
            except Exception as exc:  # a config that cannot run is a result
                status[cfg.name] = f"{type(exc).__name__}: {str(exc)[:120]}"
        samples = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                samples[name].append(time_callable(fn).median_ms)
        ms = {name: statistics.median(v) for name, v in samples.items()}
        best = min((k for k in ms if k != "cudnn"), key=ms.get)
        fixed = min((k for k in ms if k != "cudnn" and "_sk" not in k), key=ms.get)
        balanced = min((k for k in ms if "_sk" in k), key=ms.get, default=None)
        row = {"batch": batch, "context": n, "ragged": ragged, "kv_gb": gb, "ms": ms, "status": status, "best": best,
               "best_vs_cudnn": ms["cudnn"] / ms[best], "best_fixed": fixed, "best_balanced": balanced}
        results.append(row)
        print(f"{spec}: cudnn {ms['cudnn'] * 1e3:.1f} us, best {best} {ms[best] * 1e3:.1f} us "
              f"({row['best_vs_cudnn']:.3f}x); " + ", ".join(f"{label(k)} {v * 1e3:.1f}"
                                                               for k, v in sorted(ms.items(), key=lambda kv: kv[1])[:8]),
              flush=True)
        del q, kc, vc
        torch.cuda.empty_cache()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "triton": triton.__version__, "cudnn": torch.backends.cudnn.version(),
            "rounds": args.rounds}
    (args.out / "decode_splits.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    lines = [f"# Decode split counts on {meta['gpu']} ({meta['date']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}, cuDNN {meta['cudnn']}; bf16, H_q {HQ}, H_kv {HKV}, "
             f"D {D}, one query token; median of {args.rounds} interleaved rounds; microseconds (TB/s of K/V read).", "",
             "Rows marked `r`: ragged batches (lengths from context / 16 to context; cuDNN attends the whole cache).",
             "", "| batch x context | cuDNN | best | best config | x cuDNN | best fixed | best balanced |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        us = {k: v * 1e3 for k, v in r["ms"].items()}
        balanced = f"`{label(r['best_balanced'])}` {us[r['best_balanced']]:.1f}" if r["best_balanced"] else "-"
        lines.append(f"| {r['batch']} x {r['context']}{' r' if r['ragged'] else ''} | {us['cudnn']:.1f} "
                     f"({r['kv_gb'] / r['ms']['cudnn']:.2f}) | {us[r['best']]:.1f} ({r['kv_gb'] / r['ms'][r['best']]:.2f})"
                     f" | `{r['best']}` | {r['best_vs_cudnn']:.3f} | `{label(r['best_fixed'])}` {us[r['best_fixed']]:.1f}"
                     f" | {balanced} |")
    (args.out / "decode_splits.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

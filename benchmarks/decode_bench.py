"""attention_with_kvcache as users run it (the dispatcher's tuned choice), side by side with
SDPA's cuDNN and flash backends on the same K/V (dense (B, H, N, D) tensors for SDPA), on the
issue-15 decode table: contiguous and paged (16, 128) caches, eager (lengths unchecked, as a
serving loop runs it) and replayed from a CUDA graph.

Usage: FA_AUTOTUNE_CONFIG_DIR=<exported files> python3 benchmarks/decode_bench.py --out DIR
Writes DIR/decode_bench.json and DIR/decode_bench.md (microseconds and TB/s of K/V read).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend

from decode_sweep import D, HKV, HQ, TABLE, captured, paged, run_sdpa, table_inputs
from fa_autotune.runtime.dispatch import DISPATCHER
from fa_autotune.runtime.kvcache import attention_with_kvcache
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.measure import time_callable


def graph_ms(fn) -> float:
    graph, _ = captured(fn)
    return time_callable(graph.replay).median_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for batch, n in TABLE:
        q, kc, vc, lens = table_inputs(batch, n)
        gb = Problem(batch, HQ, HKV, 1, n, D, "bfloat16", kind="decode").kv_bytes / 1e9
        row = {"batch": batch, "context": n, "kv_gb": gb,
               "cudnn_ms": run_sdpa(SDPBackend.CUDNN_ATTENTION, q, kc, vc),
               "flash_ms": run_sdpa(SDPBackend.FLASH_ATTENTION, q, kc, vc)}
        reference = attention_with_kvcache(q, kc, vc, cache_seqlens=lens, config={"loop_order": "decode",
                                                                                 "BLOCK_M": 16, "num_splits": 8})
        for page in (0, 16, 128):
            if page:
                k_cache, v_cache, table = paged(kc, vc, page)
            else:
                k_cache, v_cache, table = kc, vc, None

            def call():
                return attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table,
                                              check_lengths=False)
            out = call()
            problem = Problem(batch, HQ, HKV, 1, n, D, "bfloat16", kind="decode", page_size=page)
            choice = DISPATCHER.choose(problem, "cuda", 0)
            name = f"paged{page}" if page else "contiguous"
            row[name] = {"ms": time_callable(call).median_ms, "graph_ms": graph_ms(call), "config": choice.config.name,
                         "source": choice.source, "max_diff_vs_split8": float((out.float() - reference.float()).abs().max())}
            del k_cache, v_cache
        rows.append(row)
        cud = row["cudnn_ms"] if isinstance(row["cudnn_ms"], float) else float("nan")
        print(f"B{batch} N{n}: cudnn {cud * 1e3:.0f}us  flash {_us(row['flash_ms'])}  " + "  ".join(
            f"{k} {row[k]['ms'] * 1e3:.0f}us ({gb / row[k]['ms']:.2f} TB/s, x{cud / row[k]['ms']:.3f}, graph "
            f"{row[k]['graph_ms'] * 1e3:.0f}us, {row[k]['source']} {row[k]['config']})"
            for k in ("contiguous", "paged16", "paged128")), flush=True)
        del q, kc, vc
        torch.cuda.empty_cache()
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "python": platform.python_version(), "heads_q": HQ, "heads_kv": HKV, "head_dim": D, "dtype": "bfloat16"}
    (out_dir / "decode_bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out_dir / "decode_bench.md").write_text(markdown(meta, rows))


def _us(ms) -> str:
    return f"{ms * 1e3:.0f}us" if isinstance(ms, float) else str(ms)[:40]


def markdown(meta: dict, rows: list) -> str:
    lines = [f"# Decode: attention_with_kvcache vs SDPA on {meta['gpu']} ({meta['date']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}; bf16, "
             f"H_q {meta['heads_q']}, H_kv {meta['heads_kv']}, D {meta['head_dim']}, one query token per sequence. "
             "Median of CUDA-event timings with L2 flushed; TB/s = K/V bytes read / time. fa_autotune runs the "
             "dispatcher's choice through the public API (lengths unchecked, as a serving loop calls it); `graph` "
             "replays it from a CUDA graph.", "",
             "| batch x context | K/V MB | SDPA cuDNN | SDPA flash | contiguous | x cuDNN | graph | paged 16 | "
             "paged 128 | paged 16 / contiguous |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gb = r["kv_gb"]
        cud = r["cudnn_ms"] if isinstance(r["cudnn_ms"], float) else float("nan")

        def cell(ms):
            return f"{ms * 1e3:.0f} us ({gb / ms:.2f} TB/s)" if isinstance(ms, float) else "n/a"
        c = r["contiguous"]["ms"]
        lines.append(f"| {r['batch']} x {r['context']} | {gb * 1e3:.0f} | {cell(r['cudnn_ms'])} | {cell(r['flash_ms'])} "
                     f"| {cell(c)} | {cud / c:.3f} | {r['contiguous']['graph_ms'] * 1e3:.0f} us | "
                     f"{cell(r['paged16']['ms'])} | {cell(r['paged128']['ms'])} | {r['paged16']['ms'] / c:.3f} |")
    lines += ["", "Configs: " + "; ".join(f"{r['batch']}x{r['context']}: " + ", ".join(
        f"{k} {r[k]['config']} ({r[k]['source']})" for k in ("contiguous", "paged16", "paged128")) for r in rows), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

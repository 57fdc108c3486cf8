"""KV-cache decode on the GPU: the issue-15 table against SDPA (cuDNN, flash), with a sweep of
decode kernel configs per problem, paged caches and the public API (eager and CUDA graph).

Usage: python3 benchmarks/decode_sweep.py --out DIR [--quick]
Writes DIR/decode_sweep.json and prints a table: microseconds and TB/s of K/V read.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa_autotune.kernels.launcher import DecodePlan, resolve_scale
from fa_autotune.runtime.kvcache import attention_with_kvcache
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.defaults import decode_default
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.measure import time_callable

TABLE = [(1, 131072), (1, 262144), (64, 4096), (16, 16384), (8, 32768), (128, 1024)]
HQ, HKV, D = 32, 8, 128


def sdpa(backend, q, k, v):
    qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
    return call


def run_sdpa(backend, q, k, v):
    try:
        fn = sdpa(backend, q, k, v)
        fn()
        torch.cuda.synchronize()
        return time_callable(fn).median_ms
    except Exception as exc:  # a backend that cannot take this problem
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def plan_call(cfg, q, kc, vc, lens, bt, out):
    plan = DecodePlan(cfg, q, kc, vc, None, None, out, None, bt, resolve_scale(None, D), False)
    return lambda: plan(q, kc, vc, None, None, lens, bt, 0, out, None)


def table_inputs(batch: int, n: int):
    """Seeded q (B, 1, HQ, D), a full contiguous cache (B, n, HKV, D) and its lengths."""
    torch.manual_seed(0)
    q = torch.randn(batch, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(batch, n, HKV, D, device="cuda", dtype=torch.bfloat16)
    return q, kc, torch.randn_like(kc), torch.full((batch,), n, device="cuda", dtype=torch.int32)


def captured(fn):
    """``fn`` captured in a CUDA graph (after a warm-up on a side stream), and its output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out


def run_sweep(configs, make_call, out, ref, gb) -> dict:
    """Check (against ``ref`` where given) and time each config; failures recorded, not raised."""
    sweep = {}
    for cfg in dict.fromkeys(configs):
        try:
            fn = make_call(cfg)
            fn()
            torch.cuda.synchronize()
            err = None
            if ref is not None:
                err = float((out.float() - ref).norm() / ref.norm())
                if not math.isfinite(err) or err > 2e-2:
                    sweep[cfg.name] = {"error": f"wrong: rel {err}"}
                    continue
            ms = time_callable(fn).median_ms
            sweep[cfg.name] = {"ms": ms, "tbps": gb / ms, "config": json.loads(cfg.canonical_json()), "rel": err}
        except Exception as exc:
            sweep[cfg.name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    return sweep


def paged(kc, vc, page):
    """The same cache as pages in a shuffled order, with its block table."""
    b, n = kc.shape[:2]
    per = n // page
    order = torch.randperm(b * per, device=kc.device)
    kp = torch.empty((b * per, page, HKV, D), device=kc.device, dtype=kc.dtype)
    vp = torch.empty_like(kp)
    kp[order] = kc.reshape(b * per, page, HKV, D)
    vp[order] = vc.reshape(b * per, page, HKV, D)
    return kp, vp, order.reshape(b, per).int()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for batch, n in TABLE:
        q, kc, vc, lens = table_inputs(batch, n)
        problem = Problem(batch, HQ, HKV, 1, n, D, "bfloat16", kind="decode")
        gb = problem.kv_bytes / 1e9
        row = {"batch": batch, "context": n, "kv_gb": gb}
        row["cudnn_ms"] = run_sdpa(SDPBackend.CUDNN_ATTENTION, q, kc, vc)
        row["flash_ms"] = run_sdpa(SDPBackend.FLASH_ATTENTION, q, kc, vc)
        ref = sdpa(SDPBackend.MATH, q.float(), kc.float(), vc.float())().transpose(1, 2) if n * batch <= 2**20 else None
        default = decode_default(problem, (9, 0), sms)
        splits0 = default.num_splits
        split_set = sorted({max(1, s) for s in (splits0 // 2, splits0, splits0 * 2, 1 if batch >= 16 else splits0 * 4)}
                           if not args.quick else {splits0})
        configs = [default] + [KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=bn, num_warps=w, num_stages=st,
                                            num_splits=min(s, 128))
                               for bn, w, st, s in itertools.product((64, 128), (4,), (2, 4), split_set)]
        out = torch.empty_like(q)
        sweep = run_sweep(configs, lambda cfg: plan_call(cfg, q, kc, vc, lens, None, out), out, ref, gb)
        ok = {k: v for k, v in sweep.items() if "ms" in v}
        best_name = min(ok, key=lambda k: ok[k]["ms"])
        best = KernelConfig.from_mapping(ok[best_name]["config"])
        row.update(default=default.name, default_ms=sweep[default.name].get("ms"), best=best_name,
                   best_ms=ok[best_name]["ms"], sweep=sweep)
        for page in (16, 128):
            kp, vp, bt = paged(kc, vc, page)
            paged_problem = Problem(batch, HQ, HKV, 1, n, D, "bfloat16", kind="decode", page_size=page)
            paged_default = decode_default(paged_problem, (9, 0), sms)
            paged_configs = [paged_default, best] + [
                KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=bn, num_warps=w, num_stages=st,
                             num_splits=min(s, 128))
                for bn, w, st, s in itertools.product((32, 64), (4,), (5, 7), split_set)]
            psweep = run_sweep(paged_configs, lambda cfg: plan_call(cfg, q, kp, vp, lens, bt, out), out, ref, gb)
            pok = {k: v for k, v in psweep.items() if "ms" in v}
            pbest = min(pok, key=lambda k: pok[k]["ms"])
            row[f"paged{page}_ms"] = pok[pbest]["ms"]
            row[f"paged{page}_best"] = pbest
            row[f"paged{page}_default_ms"] = psweep[paged_default.name].get("ms")
            row[f"paged{page}_sweep"] = psweep
            del kp, vp
        # The public API: eager (lengths checked on the host, then unchecked) and in a CUDA graph.
        cfg = json.loads(best.canonical_json())
        eager = lambda: attention_with_kvcache(q, kc, vc, cache_seqlens=lens, config=cfg)  # noqa: E731
        eager()
        row["api_checked_ms"] = time_callable(eager).median_ms
        fast = lambda: attention_with_kvcache(q, kc, vc, cache_seqlens=lens, config=cfg, check_lengths=False)  # noqa: E731
        fast()
        row["api_unchecked_ms"] = time_callable(fast).median_ms
        graph, g_out = captured(fast)
        row["graph_ms"] = time_callable(graph.replay).median_ms
        # lengths change between replays: the graph reads them on the device
        lens.fill_(n // 2)
        graph.replay()
        half = attention_with_kvcache(q, kc, vc, cache_seqlens=lens, config=cfg)
        row["graph_relength_max_diff"] = float((g_out.float() - half.float()).abs().max())
        lens.fill_(n)
        rows.append(row)
        cud = row["cudnn_ms"] if isinstance(row["cudnn_ms"], float) else None
        print(f"B{batch} N{n}: {gb * 1e3:.0f} MB  cudnn {_fmt(row['cudnn_ms'], gb)}  flash {_fmt(row['flash_ms'], gb)}  "
              f"default {_fmt(row['default_ms'], gb)}  best {_fmt(row['best_ms'], gb)} ({best_name})  "
              f"x{(cud / row['best_ms']) if cud else float('nan'):.3f} cuDNN  paged16 {_fmt(row['paged16_ms'], gb)} "
              f"({row['paged16_best']}, default {_fmt(row['paged16_default_ms'], gb)})  paged128 "
              f"{_fmt(row['paged128_ms'], gb)} ({row['paged128_best']})  api {row['api_checked_ms'] * 1e3:.0f}/"
              f"{row['api_unchecked_ms'] * 1e3:.0f} us  graph {row['graph_ms'] * 1e3:.0f} us "
              f"relength diff {row['graph_relength_max_diff']:.3g}", flush=True)
        del q, kc, vc
        torch.cuda.empty_cache()
        _write(out_dir, rows)


def _write(out_dir: Path, rows: list) -> None:
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "python": platform.python_version(), "heads_q": HQ, "heads_kv": HKV, "head_dim": D, "dtype": "bfloat16"}
    (out_dir / "decode_sweep.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def _fmt(ms, gb) -> str:
    if not isinstance(ms, float):
        return str(ms)[:60]
    return f"{ms * 1e3:.0f}us/{gb / ms:.2f}TB/s"


if __name__ == "__main__":
    main()

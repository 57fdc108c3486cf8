"""The backward's kernels one at a time on the GPU: for each problem, every config of a grid is
compiled (in parallel processes), checked against float32 autograd and its dK/dV pass and dQ
pass timed separately, so the best tile of each pass shows on its own (the two passes may want
different tiles, and atomic dQ folds the dQ pass into the dK/dV one).

Usage: python3 benchmarks/bwd_sweep.py --out DIR [--quick] [--jobs 14]
           [--set triton|gluon|gluon_atomic|gluon_dq|gluon_pers]
           [--problems n4096|short]
Writes DIR/bwd_sweep.json and prints, per problem, the fastest configs of each pass and the
best whole backward (preprocess + dK/dV + dQ) against SDPA cuDNN's backward.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import multiprocessing as mp
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

# (batch, heads, kv_heads, seqlen, head_dim, causal): llm-prefill shapes (B * N = 16384)
PROBLEMS = [(4, 16, 16, 4096, 128, False), (4, 16, 16, 4096, 128, True),
            (4, 32, 32, 4096, 64, False), (4, 32, 32, 4096, 64, True)]
# --problems short: llm-prefill's N=1024 shapes and two at N=2048 (where the Gluon pass's
# programs have few query tiles each)
SHORT = [(16, 16, 16, 1024, 128, False), (16, 16, 16, 1024, 128, True), (16, 32, 32, 1024, 64, False),
         (16, 32, 32, 1024, 64, True), (8, 16, 16, 2048, 128, False), (8, 32, 32, 2048, 64, True)]
TILES = [(32, 64), (32, 128), (64, 64), (64, 128), (128, 64), (128, 32), (64, 32)]


def grid(quick: bool) -> list[dict]:
    """Separate-dQ configs over tiles x warps x stages (both passes alike), atomic dQ, then
    dK/dV shapes with the dQ pass at 128 x 64, 8 warps, 3 stages."""
    stages = (2, 3) if quick else (1, 2, 3, 4)
    out = [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s)
           for (m, n), w, s in itertools.product(TILES, (4, 8), stages)]
    for (m, n), w, s in itertools.product([(32, 128), (64, 128), (64, 64)], (4, 8), (2, 3)):
        out.append(dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s, dq_atomic=True))
    for (m, n), w, s in itertools.product([(64, 64), (128, 64), (32, 128), (64, 128)], (4, 8), (2, 3)):
        out.append(dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s, dq_block_m=128, dq_block_n=64, dq_warps=8,
                        dq_stages=3))
    return out


GLUON = dict(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=64)
DQ = dict(dq_block_m=128, dq_block_n=64, dq_warps=8, dq_stages=3)


def gluon_grid() -> list[dict]:
    """The Gluon dK/dV pass (Q/dO ring depth, consumers, masking) with the dQ pass at
    128 x 64, 8 warps, 3 stages, the same with dQ added up inside it (dq_atomic), beside the
    shipped Triton defaults (D=128 and D=64)."""
    out = [dict(GLUON, num_stages=s, consumers=c, causal_mode=mode, **DQ)
           for s, c, mode in itertools.product((2, 3), (2, 1), ("split", "masked"))]
    out += [dict(GLUON, num_stages=s, consumers=c, dq_atomic=True) for s, c in itertools.product((2, 3), (2, 1))]
    out += [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, **DQ),
            dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3, **DQ)]
    return out


def gluon_atomic_grid() -> list[dict]:
    """The Gluon pass with dQ added up inside it, against the best Gluon pass with a dQ pass
    (benchmarks/results/2026-12-01-h200-bwd-sweep-gluon/results.md) and the Triton default."""
    return ([dict(GLUON, num_stages=s, consumers=c, dq_atomic=True) for s, c in itertools.product((2, 3), (2, 1))]
            + [dict(GLUON, num_stages=2, consumers=2, **DQ), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, **DQ),
               dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3, **DQ)])


def gluon_dq_grid() -> list[dict]:
    """Two-consumer Gluon passes with dQ inside (64 or 128 query rows a step, ring depth 2
    and 3; 128 rows fit shared memory up to D=64) against the Gluon pass beside the dQ pass."""
    return ([dict(GLUON, BLOCK_M=m, num_stages=s, consumers=2, dq_atomic=True) for m in (64, 128) for s in (2, 3)]
            + [dict(GLUON, num_stages=2, consumers=2, **DQ)])


def gluon_pers_grid() -> list[dict]:
    """The Hopper defaults (dQ inside; 64 rows and a ring of 3, 128 rows and a ring of 2) on a
    grid of one program per tile, one per SM walking the tiles, and one per SM taking them
    from an atomic counter."""
    return [dict(GLUON, BLOCK_M=m, num_stages=s, consumers=2, dq_atomic=True, **extra)
            for m, s in ((64, 3), (128, 2)) for extra in ({}, dict(persistent=1), dict(persistent=1, dynamic=True))]


def inputs(problem, seed: int = 0):
    b, h, hkv, n, d, causal = problem
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    dout = torch.randn_like(q)
    return q, k, v, dout


def plan_for(config_kw: dict, problem, tensors):
    import fa_autotune
    from fa_autotune.kernels.launcher import BackwardPlan
    from fa_autotune.spec.config import KernelConfig
    q, k, v, dout = tensors
    causal = problem[5]
    out, lse = fa_autotune.attention(q, k, v, causal=causal, return_lse=True)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    cfg = KernelConfig(loop_order="backward", **config_kw)
    plan = BackwardPlan(cfg, q, k, v, out, dout, *grads, q.shape[-1] ** -0.5, 0, causal)
    return cfg, plan, (q, k, v, out, dout, lse, *grads)


def compile_one(args) -> tuple[int, str | None]:
    """In a worker process: compile every kernel of one config (fills Triton's cache)."""
    index, config_kw, problem = args
    try:
        _, plan, call = plan_for(config_kw, problem, inputs(problem))
        plan(*call, warmup=True)
        return index, None
    except Exception as exc:  # a config that does not compile: reported, not fatal
        return index, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference(q, k, v, dout, causal: bool, dtype):
    qq, kk, vv = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=True)
    out.backward(dout.to(dtype))
    return qq.grad, kk.grad, vv.grad


def cudnn_ms(q, k, v, dout, causal: bool) -> float:
    from fa_autotune.tune.measure import time_callable
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=True)
    return time_callable(lambda: torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True)).median_ms


def main() -> None:
    from fa_autotune.tune.measure import time_callable
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="stages 2 and 3 only")
    parser.add_argument("--jobs", type=int, default=14)
    parser.add_argument("--problems", choices=("n4096", "short"), default="n4096",
                        help="n4096: llm-prefill's N=4096 shapes; short: its N=1024 ones and two at N=2048")
    parser.add_argument("--set", choices=("triton", "gluon", "gluon_atomic", "gluon_dq", "gluon_pers"),
                        default="triton",
                        help="triton: the Triton kernels' tiles; gluon: the Gluon dK/dV pass against the defaults; "
                             "gluon_atomic: the Gluon pass with dQ inside it against its best with a dQ pass; "
                             "gluon_dq: two-consumer in-pass dQ forms only; gluon_pers: the defaults on persistent "
                             "grids")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    configs = {"gluon": gluon_grid, "gluon_atomic": gluon_atomic_grid,
               "gluon_dq": gluon_dq_grid, "gluon_pers": gluon_pers_grid}.get(args.set, lambda: grid(args.quick))()
    started = time.time()
    problems = SHORT if args.problems == "short" else PROBLEMS
    work = [(i, c, p) for p in problems for i, c in enumerate(configs)]
    errors: dict[tuple, str] = {}
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        for (i, _, p), (_, err) in zip(work, pool.map(compile_one, work)):
            if err:
                errors[(i, p)] = err
    print(f"compiled {len(work)} in {time.time() - started:.0f} s, {len(errors)} failed", flush=True)
    rows = []
    for problem in problems:
        b, h, hkv, n, d, causal = problem
        tensors = inputs(problem)
        exact = reference(*tensors, causal, torch.float32)
        same = reference(*tensors, causal, torch.bfloat16)
        bound = [2 * rel(p, w) + 1e-4 for p, w in zip(same, exact)]
        flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
        base = cudnn_ms(*tensors, causal)
        print(f"\n{problem}: cuDNN backward {base:.3f} ms ({flops / base * 1e-9:.0f} TFLOPS)", flush=True)
        for i, kw in enumerate(configs):
            row = dict(problem=list(problem), config=kw, cudnn_ms=base)
            if (i, problem) in errors:
                rows.append({**row, "error": errors[(i, problem)]})
                continue
            try:
                cfg, plan, call = plan_for(kw, problem, tensors)
                plan(*call)
                torch.cuda.synchronize()
                err = [rel(a, w) for a, w in zip(call[-3:], exact)]
                row.update(name=cfg.name, ok=all(e <= bd for e, bd in zip(err, bound)), err=err)
                calls = plan.calls(*call, acc=None if plan.acc_shape is None else
                                   torch.zeros(plan.acc_shape, device="cuda", dtype=torch.float32))
                # (a dynamic grid's tile counter is zeroed per call, so only whole calls time it)
                for part, (launch, targs) in zip(("pre", "dkdv", "dq") if not cfg.dynamic else (), calls):
                    row[f"{part}_ms"] = time_callable(lambda: launch(*targs), warmup_ms=10, rep_ms=40).median_ms
                row["total_ms"] = time_callable(lambda: plan(*call), warmup_ms=10, rep_ms=40).median_ms
                if plan.dq is not None:  # the passes one after the other instead of side by side
                    row["serial_ms"] = time_callable(lambda: plan(*call, concurrent=False), warmup_ms=10,
                                                     rep_ms=40).median_ms
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            rows.append(row)
        mine = [r for r in rows if r["problem"] == list(problem) and r.get("ok")]
        for part in ("dkdv", "dq", "total", "serial"):
            best = sorted((r for r in mine if f"{part}_ms" in r), key=lambda r: r[f"{part}_ms"])[:4]
            print(f"  best {part}: " + "; ".join(f"{r['name']} {r[f'{part}_ms']:.3f}" for r in best))
        if mine:
            top = min(mine, key=lambda r: r["total_ms"])
            print(f"  best whole: {top['name']} {top['total_ms']:.3f} ms = {flops / top['total_ms'] * 1e-9:.0f} TFLOPS "
                  f"= {base / top['total_ms']:.3f}x cuDNN", flush=True)
        bad = [r["name"] for r in rows if r["problem"] == list(problem) and r.get("ok") is False]
        if bad:
            print(f"  outside the error bound: {bad}")
    meta = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version())
    (args.out / "bwd_sweep.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()

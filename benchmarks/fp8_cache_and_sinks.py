"""The two FP8 paths issue 42 measures on a GPU, each beside what it replaces, in interleaved
rounds on one set of inputs, every output checked first:

- cache: ``attention_with_kvcache`` decode (one new token, 32:8 heads, D 128) over an e4m3
  cache with per-(sequence, KV head) descales against the same over a bf16 cache, contiguous
  and paged (64-row pages), at 1 x 131072 and 64 x 4096 cached keys. The FP8 output is
  checked against float32 attention over the dequantized cache, the bf16 one over its cache.
- sinks: ``attention_fp8`` on prequantized e4m3 inputs (per-block + Hadamard, the dispatched
  config) with and without the sink tile (``sink_tile=True``), D 128, N 8192, causal and
  not, on inputs with attention sinks (the first 4 keys' K x40, V x10): time and the relative
  error of each against float32; and ``attention_fp8`` quantizing the fp16 inputs itself with
  the default recipe (the sink tile on) and without the sink tile, its error on the sink
  inputs and on the tuner's outlier-channel inputs too. ``--sweep`` adds other tiles, the
  warp-specialized kernel with the sink tile's second kernel (64 or 128 rows a program) and
  the Gluon FlashAttention-3 kernel with FP8 products, with and without the sink tile.

    python3 benchmarks/fp8_cache_and_sinks.py --out DIR [--rounds 3] [--rep-ms 100] [--sweep]

Writes DIR/fp8_cache_and_sinks.json and .md. ``--small`` runs tiny shapes (on a CPU: in
Triton's interpreter, which proves the code paths, never a speed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

HQ, HKV, D = 32, 8, 128
FP8_MAX = 448.0


def _rounds(calls: dict, rounds: int, rep_ms: float, device: str) -> dict[str, float]:
    """Median ms of each call over ``rounds`` rounds in which the calls take turns."""
    from fa_autotune.tune.measure import time_callable

    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(time_callable(fn, rep_ms=rep_ms, device=device).median_ms)
    return {name: statistics.median(t) for name, t in times.items()}


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        raise AssertionError("output has NaN/Inf")
    return float((out - ref).norm() / ref.norm())


def _cache_variants(sweep: bool, small: bool, batch: int, length: int, page: int) -> list:
    """Decode configs to time over the FP8 cache beside the dispatched one (``--sweep``): 64-
    and 128-key steps, pipeline depths, 4 and 8 warps, the default split count and more."""
    from fa_autotune.spec.config import KernelConfig
    from fa_autotune.spec.defaults import decode_default
    from fa_autotune.spec.problem import Problem

    if not sweep:
        return []
    hq, hkv, d = (4, 2, 32) if small else (HQ, HKV, D)
    problem = Problem(batch, hq, hkv, 1, length, d, "bfloat16", kind="decode", page_size=page)
    split = decode_default(problem, None if small else (9, 0)).num_splits
    shapes = ([(16, 1, 4, split)] if small else
              [(64, 4, 4, split), (64, 4, 4, 2 * split), (64, 2, 4, 2 * split), (64, 2, 4, 4 * split),
               (128, 3, 4, split), (128, 3, 4, 2 * split), (128, 3, 8, split), (128, 2, 8, 2 * split)])
    return [KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=n, num_stages=stages, num_warps=warps,
                         num_splits=min(splits, 128)) for n, stages, warps, splits in shapes]


def cache_rows(small: bool, device: str, rounds: int, rep_ms: float, sweep: bool = False) -> list[dict]:
    import fa_autotune
    from fa_autotune.tune.reference import reference_attention

    dtype = torch.float16 if device == "cpu" else torch.bfloat16  # bf16 dots are wrong in the interpreter
    hq, hkv, d = (4, 2, 32) if small else (HQ, HKV, D)
    shapes = [(1, 256), (4, 64)] if small else [(1, 131072), (64, 4096)]
    rows = []
    for batch, length in shapes:
        for page in (0, 16 if small else 64):
            gen = torch.Generator(device=device).manual_seed(0)
            q = torch.randn(batch, 1, hq, d, generator=gen, device=device).to(dtype)
            if page:
                pages = batch * length // page
                shape = (pages, page, hkv, d)
                table = torch.randperm(pages, device=device).reshape(batch, length // page).to(torch.int32)
            else:
                shape, table = (batch, length, hkv, d), None
            k, v = (torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(2))
            k_descale = (k.float().abs().amax(dim=(0, 1, 3)) / FP8_MAX).expand(batch, hkv).contiguous()
            v_descale = (v.float().abs().amax(dim=(0, 1, 3)) / FP8_MAX).expand(batch, hkv).contiguous()
            k8 = (k.float() / k_descale[0].reshape(1, 1, hkv, 1)).to(torch.float8_e4m3fn)
            v8 = (v.float() / v_descale[0].reshape(1, 1, hkv, 1)).to(torch.float8_e4m3fn)
            lengths = torch.full((batch,), length, device=device, dtype=torch.int32)
            common = dict(cache_seqlens=lengths, block_table=table, check_lengths=False)

            def bf16():
                return fa_autotune.attention_with_kvcache(q, k, v, **common)

            def fp8():
                return fa_autotune.attention_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale,
                                                          **common)

            def dense(cache, descale=None):  # (batch, heads_kv, length, d) in float32, in sequence order
                x = cache.float() if descale is None else cache.float() * descale[0].reshape(1, 1, hkv, 1)
                if table is not None:
                    x = x[table.long()].flatten(1, 2)
                return x.transpose(1, 2)

            calls = {"bf16": bf16, "fp8": fp8}
            for config in _cache_variants(sweep, small, batch, length, page):
                calls[f"fp8 {config.name}"] = lambda config=config: fa_autotune.attention_with_kvcache(
                    q, k8, v8, k_descale=k_descale, v_descale=v_descale, config=config, **common)
            errors = {}
            for name, fn in calls.items():
                kc, vc, descales = (k, v, (None, None)) if name == "bf16" else (k8, v8, (k_descale, v_descale))
                ref, _ = reference_attention(q.float().transpose(1, 2), dense(kc, descales[0]), dense(vc, descales[1]))
                errors[name] = _rel(fn().transpose(1, 2), ref)
            ms = _rounds(calls, rounds, rep_ms, device)
            bytes_read = {name: 2 * k8.numel() for name in calls} | {"bf16": 2 * k.numel() * k.element_size()}
            best = min((name for name in ms if name != "bf16"), key=ms.get)
            rows.append({"batch": batch, "cache_len": length, "page_size": page, "heads": f"{hq}:{hkv}",
                         "head_dim": d, "ms": ms, "fp8_speedup": ms["bf16"] / ms["fp8"],
                         "best_fp8": best, "best_fp8_speedup": ms["bf16"] / ms[best],
                         "cache_tb_per_s": {n: bytes_read[n] / ms[n] / 1e9 for n in ms}, "rel_error": errors})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def sink_rows(small: bool, device: str, rounds: int, rep_ms: float, sweep: bool = False) -> list[dict]:
    import fa_autotune
    from fa_autotune.tune.reference import reference_attention

    b, h, n, d = (1, 2, 128, 64) if small else (2, 16, 8192, 128)
    config = {"BLOCK_M": 32, "BLOCK_N": 32} if small else None
    rows = []
    for causal in (False, True):
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=gen, device=device) for _ in range(3))
        k[:, :, :4] *= 40.0
        v[:, :, :4] *= 10.0
        q, k, v = (t.half() for t in (q, k, v))
        ref, _ = reference_attention(q.float(), k.float(), v.float(), causal=causal)
        x = fa_autotune.quantize_fp8(q, k, v, scaling="per_block", hadamard=True, sink_tile=True,
                                     **({"block_q": 32, "block_k": 32} if small else {}))

        def plain():
            return fa_autotune.attention_fp8(x, causal=causal, config=config, sink_tile=False)

        def sink():
            return fa_autotune.attention_fp8(x, causal=causal, config=config)

        def here():  # attention_fp8 quantizing itself with the default recipe (the sink tile on)
            return fa_autotune.attention_fp8(q, k, v, causal=causal, config=config,
                                             **({"block_q": 32, "block_k": 32} if small else {}))

        def here_plain():
            return fa_autotune.attention_fp8(q, k, v, causal=causal, config=config, sink_tile=False,
                                             **({"block_q": 32, "block_k": 32} if small else {}))

        calls = {"plain": plain, "sink_tile": sink, "quantize_here": here, "quantize_here_plain": here_plain}
        for tiles in ([] if not sweep or small else [dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
                                                     dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2,
                                                          access="tensor_desc")]):
            changes = dict(fp8_pv="separate") | tiles  # the recipe is the inputs' (quantized above)
            calls["sink_tile m{BLOCK_M}n{BLOCK_N}w{num_warps}s{num_stages}".format(**tiles)] = (
                lambda changes=changes: fa_autotune.attention_fp8(x, causal=causal, config=changes))
        if sweep and not small and not causal:  # warp-specialized 128 x 256 tiles (the H200's non-causal choice)
            calls.update(_specialized_calls(q, k, v))
        if sweep and not small:  # FlashAttention-3's schedule in Gluon with FP8 products
            gluon = dict(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2,
                         persistent=1, dynamic=causal)
            calls["gluon plain"] = lambda gluon=gluon: fa_autotune.attention_fp8(x, causal=causal, config=gluon,
                                                                                 sink_tile=False)
            calls["gluon sink_tile (side kernel)"] = lambda gluon=gluon: fa_autotune.attention_fp8(
                x, causal=causal, config=gluon)
        errors = {name: _rel(fn(), ref) for name, fn in calls.items()}
        ms = _rounds(calls, rounds, rep_ms, device)
        work = 4.0 * b * h * n * n * d / (2 if causal else 1)
        rows.append({"batch": b, "heads": h, "seqlen": n, "head_dim": d, "causal": causal, "ms": ms,
                     "tflops": {name: work / m / 1e9 for name, m in ms.items()},
                     "sink_tile_cost": ms["sink_tile"] / ms["plain"], "rel_error": errors,
                     "quantize_included": ms["sink_tile"] / ms["quantize_here"],
                     "rel_error_outliers": _outlier_errors(b, h, n, d, causal, config, small, device)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _specialized_calls(q, k, v) -> dict:
    """The warp-specialized kernel (128 x 256, TMA, persistent) without the sink tile and with it
    (a side kernel scores the first K tile, 64 or 128 rows per program), beside the
    unspecialized 64 x 128 kernel that ran the sink tile before the side kernel existed, on
    the same per-block inputs (256-key blocks)."""
    import fa_autotune

    x = fa_autotune.quantize_fp8(q, k, v, scaling="per_block", hadamard=True, block_q=128, block_k=256)
    ws = dict(BLOCK_M=128, BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc", causal_mode="split",
              warp_specialize=True, persistent=1)
    inline = dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3, access="pointer", causal_mode="split")
    from fa_autotune.kernels import fwd

    def taller():  # the side kernel at 128 rows and 8 warps per program (fwd.SINK_SHAPE)
        default, fwd.SINK_SHAPE = fwd.SINK_SHAPE, (128, 8)
        try:
            return fa_autotune.attention_fp8(x, config=ws)
        finally:
            fwd.SINK_SHAPE = default

    return {"ws plain": lambda: fa_autotune.attention_fp8(x, config=ws, sink_tile=False),
            "ws sink_tile (side kernel)": lambda: fa_autotune.attention_fp8(x, config=ws),
            "ws sink_tile (side kernel m128w8)": taller,
            "sink_tile m64n128w4s3 (inline)": lambda: fa_autotune.attention_fp8(x, config=inline)}


def _outlier_errors(b: int, h: int, n: int, d: int, causal: bool, config, small: bool, device: str) -> dict:
    """attention_fp8 quantizing here, with and without the sink tile, on the tuner's other kind
    of FP8 inputs (outlier channels): the default recipe must stay accurate there too."""
    import fa_autotune
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.inputs import fp8_source_inputs
    from fa_autotune.tune.reference import reference_attention

    q, k, v = fp8_source_inputs(Problem(b, h, h, n, n, d, "float8_e4m3fn", causal), device, 1, "outliers")
    ref, _ = reference_attention(q.float(), k.float(), v.float(), causal=causal)
    blocks = {"block_q": 32, "block_k": 32} if small else {}
    return {name: _rel(fa_autotune.attention_fp8(q, k, v, causal=causal, config=config, sink_tile=sink, **blocks), ref)
            for name, sink in (("quantize_here", None), ("quantize_here_plain", False))}


def _markdown(result: dict) -> str:
    lines = ["| batch x cache | pages | bf16 cache ms | fp8 cache ms | fp8 speedup | TB/s bf16 / fp8 | error bf16 / fp8 |",
             "|---|---|---|---|---|---|---|"]
    for r in result["cache"]:
        lines.append(f"| {r['batch']} x {r['cache_len']} | {r['page_size'] or '-'} | {r['ms']['bf16']:.4f} | "
                     f"{r['ms']['fp8']:.4f} | {r['fp8_speedup']:.2f}x | {r['cache_tb_per_s']['bf16']:.2f} / "
                     f"{r['cache_tb_per_s']['fp8']:.2f} | {r['rel_error']['bf16']:.4f} / {r['rel_error']['fp8']:.4f} |")
    swept = [(r, name) for r in result["cache"] for name in r["ms"] if name.startswith("fp8 ")]
    if swept:
        lines += ["", "| batch x cache | pages | FP8 config | ms | vs bf16 cache | error |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['batch']} x {r['cache_len']} | {r['page_size'] or '-'} | {name[4:]} | {r['ms'][name]:.4f} | "
                  f"{r['ms']['bf16'] / r['ms'][name]:.2f}x | {r['rel_error'][name]:.4f} |" for r, name in swept]
    lines += ["", "| problem | causal | FP8 ms | with sink tile ms | cost | TFLOPS | error / with sink tile |",
              "|---|---|---|---|---|---|---|"]
    for r in result["sinks"]:
        lines.append(f"| B{r['batch']} H{r['heads']} N{r['seqlen']} D{r['head_dim']} | {r['causal']} | "
                     f"{r['ms']['plain']:.4f} | {r['ms']['sink_tile']:.4f} | {r['sink_tile_cost']:.3f}x | "
                     f"{r['tflops']['plain']:.0f} / {r['tflops']['sink_tile']:.0f} | "
                     f"{r['rel_error']['plain']:.4f} / {r['rel_error']['sink_tile']:.4f} |")
    lines += ["", "| problem | causal | quantizing here ms (default recipe) | without sink tile ms | prequantized / "
              "quantizing here | error sinks / outliers | without sink tile |", "|---|---|---|---|---|---|---|"]
    for r in result["sinks"]:
        lines.append(f"| B{r['batch']} H{r['heads']} N{r['seqlen']} D{r['head_dim']} | {r['causal']} | "
                     f"{r['ms']['quantize_here']:.4f} | {r['ms']['quantize_here_plain']:.4f} | "
                     f"{r['quantize_included']:.3f} | {r['rel_error']['quantize_here']:.4f} / "
                     f"{r['rel_error_outliers']['quantize_here']:.4f} | {r['rel_error']['quantize_here_plain']:.4f} / "
                     f"{r['rel_error_outliers']['quantize_here_plain']:.4f} |")
    swept = [(r, name) for r in result["sinks"] for name in r["ms"] if name.startswith(("sink_tile ", "ws "))]
    if swept:
        lines += ["", "| problem | causal | sink tile config | ms | vs FP8 without | error |", "|---|---|---|---|---|---|"]
        lines += [f"| B{r['batch']} H{r['heads']} N{r['seqlen']} D{r['head_dim']} | {r['causal']} | {name.removeprefix('sink_tile ')} | "
                  f"{r['ms'][name]:.4f} | {r['ms'][name] / r['ms']['plain']:.3f}x | {r['rel_error'][name]:.4f} |"
                  for r, name in swept]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--small", action="store_true", help="tiny shapes (the CPU smoke run)")
    parser.add_argument("--only", choices=("cache", "sinks"), help="one of the two parts")
    parser.add_argument("--sweep", action="store_true",
                        help="also time other decode configs over the FP8 cache, and other tiles for the sink tile")
    args = parser.parse_args(argv)
    from fa_autotune.spec.target import environment

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.small:
        parser.error("no GPU here: only --small runs (in Triton's interpreter: TRITON_INTERPRET=1)")
    result = {"command": " ".join(sys.argv), "environment": environment(), "rounds": args.rounds,
              "rep_ms": args.rep_ms, "device": device,
              "cache": [] if args.only == "sinks" else cache_rows(args.small, device, args.rounds, args.rep_ms, args.sweep),
              "sinks": [] if args.only == "cache" else sink_rows(args.small, device, args.rounds, args.rep_ms, args.sweep)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_cache_and_sinks.json").write_text(json.dumps(result, indent=2, default=str))
    (args.out / "fp8_cache_and_sinks.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

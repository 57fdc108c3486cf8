"""Variable-length prefill on the GPU: attention_varlen on packed sequences of mixed lengths
against (a) dense attention() on equal-length batches of about the same work (TFLOPS ratio)
and (b) attention() on the batch padded to the longest sequence (time ratio). attention_varlen
runs the dispatched config (on Hopper a Gluon config's own varlen kernel), as a user calls it
(lengths checked on the host, a read-back that waits for the GPU: with new offsets tensors each
call, and with the same ones, as a model's later layers pass them, checked once) and as a
serving engine does (check_lengths=False); a last column runs the Gluon default with dynamic
tile scheduling, named explicitly, unchecked, and compared with the dispatched output before
it is timed.

Usage: python3 benchmarks/varlen_bench.py --out DIR   (writes varlen_bench.json / .md)
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import triton

import fa_autotune
from fa_autotune.spec.config import KernelConfig
from fa_autotune.tune.measure import time_callable

HQ, HKV, D = 32, 8, 128
# The last column: the Gluon default with dynamic tile scheduling (attention_varlen itself runs
# the dispatched config on the grid runtime.api.varlen_grid picks: static from 16 sequences on).
GLUON = KernelConfig(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2,
                     persistent=1, dynamic=True)


def flops(lengths, causal: bool) -> float:
    total = sum(4.0 * HQ * n * n * D for n in lengths)
    return total / 2 if causal else total


def dense_ms(batch: int, n: int, causal: bool) -> float:
    """Time of attention() (dispatched) on a dense (batch, H, n, D) problem."""
    q = torch.randn(batch, HQ, n, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, HKV, n, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    call = lambda: fa_autotune.attention(q, k, v, causal=causal)  # noqa: E731
    call()
    return time_callable(call).median_ms


def length_mixes() -> dict[str, list[int]]:
    """The three seeded mixes of sequence lengths every varlen benchmark runs, and a batch of
    equal lengths (the dense problem packed: attention_varlen's equal-length causal grid rule,
    runtime.api.varlen_grid, against dense attention() on the same work)."""
    gen = torch.Generator().manual_seed(0)
    return {"16 seqs 256-4096": torch.randint(256, 4097, (16,), generator=gen).tolist(),
            "64 seqs 64-2048": torch.randint(64, 2049, (64,), generator=gen).tolist(),
            "4 seqs 1024-16384": torch.randint(1024, 16385, (4,), generator=gen).tolist(),
            "64 seqs of 1024": [1024] * 64}


def packed_inputs(lengths: list[int]):
    """Random packed q (total, HQ, D), k and v (total, HKV, D), bf16, and their offsets."""
    total = sum(lengths)
    q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
    return q, k, torch.randn_like(k), cu


def against_dense(calls: dict, lengths, causal: bool, rounds: int) -> tuple[dict, dict]:
    """Time ``calls`` (attention_varlen on ``lengths``) and dense attention() at the mean length
    (the dense anchor every varlen benchmark compares with) in interleaved rounds, the order
    rotated each round. Returns the per-round milliseconds by name ("dense" added) and, by
    name, (median ms, median TFLOPS, median of the rounds' TFLOPS ratios to dense)."""
    mean = int(round(sum(lengths) / len(lengths) / 64) * 64)
    qd = torch.randn(len(lengths), HQ, mean, D, device="cuda", dtype=torch.bfloat16)
    kd = torch.randn(len(lengths), HKV, mean, D, device="cuda", dtype=torch.bfloat16)
    vd = torch.randn_like(kd)
    calls = {**calls, "dense": lambda: fa_autotune.attention(qd, kd, vd, causal=causal)}
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    names = list(calls)
    samples = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            samples[n].append(time_callable(calls[n]).median_ms)
    work = {n: flops([mean] * len(lengths) if n == "dense" else lengths, causal) for n in names}
    tflops = {n: [work[n] / ms / 1e9 for ms in samples[n]] for n in names}
    stats = {n: (statistics.median(samples[n]), statistics.median(tflops[n]),
                 statistics.median(a / b for a, b in zip(tflops[n], tflops["dense"]))) for n in names}
    return samples, stats


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, lengths in length_mixes().items():
        for causal in (True, False):
            total, longest = sum(lengths), max(lengths)
            q, k, v, cu = packed_inputs(lengths)
            varlen = lambda: fa_autotune.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal)  # noqa: E731
            reference = varlen()
            t_same = time_callable(varlen).median_ms
            fresh = lambda: fa_autotune.attention_varlen(q, k, v, cu.clone(), cu, longest, longest,  # noqa: E731
                                                         causal=causal)
            assert torch.equal(fresh(), reference)
            t_varlen = time_callable(fresh).median_ms
            unchecked = lambda: fa_autotune.attention_varlen(q, k, v, cu, cu, longest, longest,  # noqa: E731
                                                             causal=causal, check_lengths=False)
            assert torch.equal(unchecked(), reference)
            t_unchecked = time_callable(unchecked).median_ms
            gluon = lambda: fa_autotune.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,  # noqa: E731
                                                         config=GLUON, check_lengths=False)
            gluon_error = (gluon().float() - reference.float()).abs().max().item()
            t_gluon = time_callable(gluon).median_ms if gluon_error < 3e-2 else float("nan")  # bf16 vs bf16
            # Dense at the mean length, as many sequences as give the same tokens; and padded.
            mean = int(round(total / len(lengths) / 64) * 64)
            t_dense = dense_ms(len(lengths), mean, causal)
            t_padded = dense_ms(len(lengths), longest, causal)
            tf_varlen = flops(lengths, causal) / t_varlen / 1e9
            tf_dense = flops([mean] * len(lengths), causal) / t_dense / 1e9
            tf_gluon = flops(lengths, causal) / t_gluon / 1e9
            tf_unchecked = flops(lengths, causal) / t_unchecked / 1e9
            row = {"case": name, "causal": causal, "lengths": lengths, "varlen_ms": t_varlen, "varlen_tflops": tf_varlen,
                   "same_offsets_ms": t_same, "same_offsets_vs_dense_tflops": flops(lengths, causal) / t_same / 1e9 / tf_dense,
                   "unchecked_ms": t_unchecked, "unchecked_tflops": tf_unchecked,
                   "unchecked_vs_dense_tflops": tf_unchecked / tf_dense,
                   "gluon_ms": t_gluon, "gluon_tflops": tf_gluon, "gluon_max_abs_diff": gluon_error,
                   "gluon_vs_dense_tflops": tf_gluon / tf_dense,
                   "dense_mean_len": mean, "dense_ms": t_dense, "dense_tflops": tf_dense, "padded_ms": t_padded,
                   "varlen_vs_dense_tflops": tf_varlen / tf_dense, "padded_over_varlen_time": t_padded / t_varlen}
            rows.append(row)
            print(f"{name} causal={causal}: varlen {t_varlen:.3f} ms {tf_varlen:.0f} TFLOPS; dense(N={mean}) "
                  f"{tf_dense:.0f} TFLOPS -> {row['varlen_vs_dense_tflops']:.3f}; same offsets {t_same:.3f} ms -> "
                  f"{row['same_offsets_vs_dense_tflops']:.3f}; unchecked {t_unchecked:.3f} ms -> "
                  f"{row['unchecked_vs_dense_tflops']:.3f}; padded to {longest} "
                  f"{t_padded:.3f} ms ({row['padded_over_varlen_time']:.2f}x the varlen time); gluon dynamic varlen "
                  f"{t_gluon:.3f} ms {tf_gluon:.0f} TFLOPS -> {row['gluon_vs_dense_tflops']:.3f} (max |diff| vs "
                  f"the dispatched varlen {gluon_error:.2e})", flush=True)
            torch.cuda.empty_cache()
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "heads_q": HQ, "heads_kv": HKV, "head_dim": D, "dtype": "bfloat16"}
    (out_dir / "varlen_bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Variable-length prefill on {meta['gpu']} ({meta['date']})", "",
             f"torch {meta['torch']}, triton {meta['triton']}; bf16, H_q {HQ}, H_kv {HKV}, D {D}; "
             "`python3 benchmarks/varlen_bench.py --out DIR`. attention_varlen on packed sequences vs dense "
             "attention() (dispatched, tuned file) on equal-length batches at the mean length (TFLOPS ratio, same "
             "FLOP count convention) and on the batch padded to the longest sequence (time ratio). `checked`: "
             "attention_varlen as called by default (lengths read back and checked on the host), new offsets tensors "
             "each call; `same offsets`: the same tensors again (checked once, as a model's later layers pass "
             "them); `unchecked`: "
             "check_lengths=False, as a serving engine calls it.", "",
             "| case | causal | checked ms | checked / dense | same offsets / dense | unchecked ms | unchecked TFLOPS | dense TFLOPS (N=mean) "
             "| unchecked / dense | padded ms | padded / unchecked | Gluon dynamic / dense |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['causal']} | {r['varlen_ms']:.3f} | {r['varlen_vs_dense_tflops']:.3f} | "
                     f"{r['same_offsets_vs_dense_tflops']:.3f} | {r['unchecked_ms']:.3f} | {r['unchecked_tflops']:.0f} | {r['dense_tflops']:.0f} "
                     f"(N={r['dense_mean_len']}) | {r['unchecked_vs_dense_tflops']:.3f} | {r['padded_ms']:.3f} | "
                     f"{r['padded_ms'] / r['unchecked_ms']:.2f} | {r['gluon_vs_dense_tflops']:.3f} |")
    (out_dir / "varlen_bench.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", required=True, help="directory for varlen_bench.json and varlen_bench.md")
    main(Path(parser.parse_args().out))

"""Does reading each sequence's length on the device (cache_seqlens, before the first K/V load)
cost the contiguous decode kernel its start? The same TMA configs called with the lengths as a
tensor (as a serving engine passes them) and as a host int (no device read), against SDPA
cuDNN, in interleaved rounds (the order rotated each round); ratio = median of the rounds'.
Every output is checked against float32 attention first. The host-int call is also a different
specialisation (Triton specialises an int argument, e.g. on its divisibility by 16), so the
comparison is "device read and its specialisation" against "neither".

Usage: python3 benchmarks/decode_length_read.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_sweep import D, plan_call, sdpa, table_inputs  # noqa: E402

from fa_autotune.kernels.launcher import DecodePlan, resolve_scale  # noqa: E402
from fa_autotune.spec.config import KernelConfig  # noqa: E402
from fa_autotune.tune.measure import time_callable  # noqa: E402

ROUNDS = 5


def main() -> None:
    for batch, n in [(64, 4096), (128, 1024)]:
        q, kc, vc, lens = table_inputs(batch, n)
        calls = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, kc, vc)}
        outs = {}
        for bn, stages, warps in [(128, 3, 4), (128, 2, 4), (64, 3, 4), (64, 2, 4)]:
            cfg = KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=bn, num_warps=warps, num_stages=stages,
                               access="tensor_desc")
            outs[f"n{bn}s{stages}w{warps}_lens"] = torch.empty_like(q)
            calls[f"n{bn}s{stages}w{warps}_lens"] = plan_call(cfg, q, kc, vc, lens, None, outs[f"n{bn}s{stages}w{warps}_lens"])
            out = outs[f"n{bn}s{stages}w{warps}_int"] = torch.empty_like(q)
            plan = DecodePlan(cfg, q, kc, vc, None, None, out, None, None, resolve_scale(None, D), False)
            calls[f"n{bn}s{stages}w{warps}_int"] = (
                lambda plan=plan, out=out, q=q, kc=kc, vc=vc, n=n: plan(q, kc, vc, None, None, None, None, n, out, None))
        for fn in calls.values():
            fn()
        torch.cuda.synchronize()
        ref = sdpa(SDPBackend.MATH, q.float(), kc.float(), vc.float())().transpose(1, 2)  # float32, (B, 1, H, D)
        for name, out in outs.items():
            err = float((out.float() - ref).norm() / ref.norm())  # bf16 against float32: about 3e-3
            if not err < 2e-2:
                raise SystemExit(f"{name}: output off the float32 reference (relative error {err:.3g})")
        names = list(calls)
        samples = {k: [] for k in names}
        for r in range(ROUNDS):
            for k in names[r % len(names):] + names[:r % len(names)]:
                samples[k].append(time_callable(calls[k]).median_ms)
        ratios = {k: statistics.median(samples["cudnn"][i] / samples[k][i] for i in range(ROUNDS)) for k in names}
        print(f"{batch}x{n}: " + ", ".join(f"{k} {statistics.median(samples[k]) * 1e3:.1f}us x{ratios[k]:.3f}"
                                          for k in sorted(names, key=lambda k: -ratios[k])), flush=True)
        del q, kc, vc, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

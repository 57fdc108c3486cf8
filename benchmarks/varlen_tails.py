"""A sequence's last varlen tile shared by two query heads (launcher.varlen_tail_heads), on and
off, timed in interleaved rounds: attention_varlen's Gluon kernel (the config it dispatches)
on varlen_bench's three length mixes, causal and not (bf16, 32/8 heads, D 128, lengths
unchecked), beside dense attention() at the mean length (the bench's reference). Each
kernel's output is checked against float32 attention (per sequence) before it is timed;
a row prints the median of three rounds' medians, in TFLOPS.

Usage: python3 benchmarks/varlen_tails.py
"""
import statistics

import torch

from fa_autotune.kernels import launcher
from fa_autotune.kernels.launcher import VarlenPlan, resolve_scale
from fa_autotune.runtime.dispatch import DISPATCHER
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.measure import time_callable
from varlen_bench import dense_ms, length_mixes, packed_inputs
from varlen_bench import flops as varlen_flops
from varlen_ragged import D, HKV, HQ, check_varlen


def plan_call(config, q, k, v, cu, lens, causal, shared: bool):
    """The varlen kernel of ``config`` with the last-tile sharing on or off (the rule patched
    while the plan is built: the kernel takes it as a launch flag)."""
    rule = launcher.varlen_tail_heads
    if not shared:
        launcher.varlen_tail_heads = lambda config, group: 1
    try:
        out = torch.empty_like(q)
        plan = VarlenPlan(config, q, k, v, cu, max(lens), resolve_scale(None, D), causal, out, None)
    finally:
        launcher.varlen_tail_heads = rule

    def call():
        plan(q, k, v, cu, cu, out, None)
        return out
    return call


def main() -> None:
    for name, lens in length_mixes().items():
        for causal in (True, False):
            total = sum(lens)
            q, k, v, cu = packed_inputs(lens)
            problem = Problem(len(lens), HQ, HKV, max(lens), max(lens), D, "bfloat16", causal, "bottom_right")
            config = DISPATCHER.choose(problem, "cuda", torch.cuda.current_device()).config
            if config.language != "gluon":
                print(f"{name} causal={causal}: dispatches {config.name}, not a Gluon config; skipped")
                continue
            config = config.with_(persistent=1, dynamic=True)  # attention_varlen's grid
            calls = {"shared": plan_call(config, q, k, v, cu, lens, causal, True),
                     "not shared": plan_call(config, q, k, v, cu, lens, causal, False)}
            for call in calls.values():
                check_varlen(call(), q, k, v, lens, causal)
            flops = varlen_flops(lens, causal)
            times = {label: [] for label in calls}
            for _ in range(3):
                for label, call in calls.items():
                    times[label].append(time_callable(call).median_ms)
            mean = int(round(total / len(lens) / 64) * 64)  # varlen_bench's reference: dense at the mean length
            dense = varlen_flops([mean] * len(lens), causal) / dense_ms(len(lens), mean, causal) / 1e9
            tf = {label: flops / statistics.median(t) / 1e9 for label, t in times.items()}
            print(f"{name} causal={causal} [{config.name}]: shared {tf['shared']:.0f} ({tf['shared'] / dense:.3f}x dense), "
                  f"not shared {tf['not shared']:.0f} ({tf['not shared'] / dense:.3f}x), dense N={mean} "
                  f"{dense:.0f} TFLOPS", flush=True)
            del q, k, v
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Gluon FlashAttention-3 variants against cuDNN and the dispatched kernel, side by
side on one GPU: every output checked against float32 first, then interleaved timing rounds.

    python3 benchmarks/gluon_sweep.py --out DIR [--set schedule|one_loop|consumers|l2|dynamic|d64|own_range|own_range_3c|half_step|short_causal|exp2_emu|named_pingpong|pingpong_3c|d128_3c|lazy_rescale|lazy_default|wide_steps|q_regs]
        [--problems mixed|llm|causal|d64|d64_all|d128|short_causal|wide|d192|fp8] [--quick]

Writes DIR/gluon_sweep.json and DIR/gluon_sweep.md (TFLOPS and ratio to cuDNN per problem
and variant), and prints the markdown.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fa_autotune.bench import Bench, Unavailable, config_call
from fa_autotune.spec.config import MAX_SECTION, KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.target import environment
from fa_autotune.tune.inputs import fp8_source_inputs, random_inputs
from fa_autotune.tune.measure import time_callable
from fa_autotune.tune.reference import compare, reference_attention

G = dict(language="gluon", access="tensor_desc", num_warps=4)
# The shipped D=64 causal structures the own-range and half-step sets measure against.
D64_PLAIN = dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, overlap=False, one_loop=True)
D64_DYN = dict(D64_PLAIN, dynamic=True, section=16, exp2_emu=16)
VARIANT_SETS = {
    # benchmarks/results/2026-12-01-h200-gluon-sweep/results.md: the schedule knobs
    "schedule": {
        "m64x2 n128 s2": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2),
        "m64x2 n128 s2 plain": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, overlap=False),
        "m64x2 n128 s2 pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1),
        "m64x2 n128 s2 plain pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, overlap=False, persistent=1),
        "m64x2 n128 s2 pp pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, pingpong=True, persistent=1),
        "m64x2 n64 s3 pers": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=3, persistent=1),
        "m64x2 n64 s3 plain pers": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=3, overlap=False, persistent=1),
    },
    # one K/V loop choosing masked steps at run time against two loops (not yet measured)
    "one_loop": {
        "m64x2 n128 s2 pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1),
        "m64x2 n128 s2 pers 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1,
                                          one_loop=True),
        "m64x2 n128 s2 plain pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, overlap=False, persistent=1),
        "m64x2 n128 s2 plain pers 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, overlap=False,
                                                persistent=1, one_loop=True),
    },
    # benchmarks/results/2026-12-01-h200-gluon-sweep/consumers.md: two consumer warpgroups against three
    "consumers": {
        "m64x2 n128 s2 pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1),
        "m64x2 n128 s2 plain pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, overlap=False, persistent=1),
        "m64x2 n128 s2 pp pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, pingpong=True, persistent=1),
        "m64x3 n128 s2 r160 pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3, consumer_regs=160,
                                        persistent=1),
        "m64x3 n128 s2 r160 plain pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3,
                                              consumer_regs=160, overlap=False, persistent=1),
        "m64x3 n64 s2 r160 pers": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=2, consumers=3, consumer_regs=160,
                                       persistent=1),
        "m64x3 n64 s2 r160 plain pers": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=2, consumers=3,
                                             consumer_regs=160, overlap=False, persistent=1),
    },
    # causal grids in L2 sections of heads (l2_fraction: the share of the L2 cache one section's
    # K/V may fill, turned into the config's `section` by l2_section below; 0: every head at once,
    # the order before sections; a grid that is not persistent keeps the launcher's own rule)
    "l2": {
        "pers all-heads": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, l2_fraction=0),
        "pers l2 .25": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, l2_fraction=0.25),
        "pers l2 .5": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, l2_fraction=0.5),
        "pers l2 .75": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, l2_fraction=0.75),
        "grid l2 .5": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, l2_fraction=0.5),
        "3c n128 r160 pers l2 .5": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3, consumer_regs=160,
                                        persistent=1, l2_fraction=0.5),
    },
    # dynamic tile scheduling (an atomic counter) on a persistent grid, in L2 sections
    "dynamic": {
        "pers .5": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, l2_fraction=0.5),
        "pers dyn .5": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, l2_fraction=0.5),
        "pers dyn .75": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, l2_fraction=0.75),
        "pers dyn all-heads": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True,
                                   l2_fraction=0),
        "grid .5": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, l2_fraction=0.5),
        "pers dyn .5 plain 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True,
                                        overlap=False, one_loop=True, l2_fraction=0.5),
        "pers dyn .5 pp": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, pingpong=True,
                               l2_fraction=0.5),
        "3c n128 r160 pers dyn .5": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3, consumer_regs=160,
                                         persistent=1, dynamic=True, l2_fraction=0.5),
    },
    # D=64 causal: deeper rings and 64-row K/V steps (D=64 tiles leave shared memory for them)
    "d64": {
        "dyn plain 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, overlap=False,
                                one_loop=True),
        "dyn plain 1loop s3": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=3, persistent=1, dynamic=True,
                                   overlap=False, one_loop=True),
        "dyn s3": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=3, persistent=1, dynamic=True),
        "dyn plain 1loop n64 s4": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=4, persistent=1, dynamic=True,
                                       overlap=False, one_loop=True),
        "dyn n64 s4": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=4, persistent=1, dynamic=True),
        "static plain 1loop s3": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=3, persistent=1, overlap=False,
                                      one_loop=True),
        "3c n64 s3 r160 dyn": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=3, consumers=3, consumer_regs=160,
                                   persistent=1, dynamic=True),
    },
    # each consumer warpgroup stepping through its own K/V range (its diagonal; none past the
    # sequence's end): 64-key steps under 2 x 64-row tiles and 192-row tiles skip a step on
    # the diagonal that 128-key steps under 128-row tiles cannot; the shipped D=64 causal
    # kernels first
    "own_range": {
        "n128 plain 1loop": D64_PLAIN,
        "n128 dyn plain 1loop sec16 emu16": D64_DYN,
        **{f"n64 s{s} {name}": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=s, persistent=1, **knobs)
           for s in (2, 3) for name, knobs in (
               ("plain 1loop", dict(overlap=False, one_loop=True)),
               ("dyn plain 1loop", dict(overlap=False, one_loop=True, dynamic=True)),
               ("dyn", dict(dynamic=True)),
               ("dyn plain 1loop emu16", dict(overlap=False, one_loop=True, dynamic=True, exp2_emu=16)))},
    },
    "own_range_3c": {
        "n128 plain 1loop": D64_PLAIN,
        "3c n128 r160 dyn": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3, consumer_regs=160,
                                 persistent=1, dynamic=True),
        "3c n128 r160 dyn plain 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3,
                                             consumer_regs=160, persistent=1, dynamic=True, overlap=False,
                                             one_loop=True),
        "3c n64 r160 dyn": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=2, consumers=3, consumer_regs=160,
                                persistent=1, dynamic=True),
    },
    # the diagonal half step (half_step) in the shipped D=64 causal kernels
    "half_step": {
        "n128 plain 1loop": D64_PLAIN,
        "n128 plain 1loop half": dict(D64_PLAIN, half_step=True),
        "n128 dyn plain 1loop sec16 emu16": D64_DYN,
        "n128 dyn plain 1loop sec16 emu16 half": dict(D64_DYN, half_step=True),
        "n128 plain half": dict(D64_PLAIN, one_loop=False, half_step=True),
    },
    # short causal grids: the static persistent kernel with the consumers taking turns, and
    # without the intra-warpgroup overlap
    "short_causal": {
        "static": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1),
        "static pp": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, pingpong=True),
        "static pp 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, pingpong=True,
                                one_loop=True),
        "static plain 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, overlap=False,
                                   one_loop=True),
        "static 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, one_loop=True),
        "dyn pp": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, pingpong=True),
    },
    # D=64: one score in every N of an unmasked step exponentiated on the FMA units
    # (exp2_emu, FlashAttention-4's emulation) in the shipped D=64 kernels
    "exp2_emu": {
        "dyn plain 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, overlap=False,
                                one_loop=True),
        **{f"dyn plain 1loop emu{n}": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True,
                                           overlap=False, one_loop=True, exp2_emu=n) for n in (4, 8, 16)},
        "dyn 1loop": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, one_loop=True),
        "dyn 1loop emu8": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, one_loop=True,
                               exp2_emu=8),
        "3c r160 pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3, consumer_regs=160, persistent=1),
        **{f"3c r160 pers emu{n}": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3, consumer_regs=160,
                                        persistent=1, exp2_emu=n) for n in (4, 8)},
    },
    # the consumers taking turns on the tensor cores through named barriers (FlashAttention-3's
    # warp-scheduler barrier), in the steps-in-turn and the overlapped schedules, beside the
    # shipped structures
    "named_pingpong": {
        "plain pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, overlap=False),
        "plain pers pp": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, overlap=False, pingpong=True),
        "plain 1loop half": dict(D64_PLAIN, half_step=True),
        "plain 1loop half pp": dict(D64_PLAIN, half_step=True, pingpong=True),
        "dyn plain 1loop sec16 emu16 half pp": dict(D64_DYN, half_step=True, pingpong=True),
        "ov pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1),
        "ov pers pp": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, pingpong=True),
        "ov pers dyn pp": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, pingpong=True),
    },
    # three consumers (D <= 64, 160 registers) taking turns round robin, against the same
    # without turns and the two-consumer turns
    "pingpong_3c": {
        "2c plain pers pp": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, overlap=False,
                                 pingpong=True),
        **{f"3c {name}{' pp' if pp else ''}": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3,
                                                   consumer_regs=160, persistent=1, pingpong=pp, **knobs)
           for name, knobs in (("ov pers", {}), ("plain pers", dict(overlap=False)),
                               ("ov pers dyn", dict(dynamic=True)))
           for pp in (False, True)},
        "3c ov pers pp emu16": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=3, consumer_regs=160,
                                    persistent=1, pingpong=True, exp2_emu=16),
    },
    # D=128: three consumers (192 rows share each K/V tile, a third fewer K/V loads per FLOP);
    # at 160 registers and with one Q buffer (a persistent grid's two overflow shared memory)
    "d128_3c": {
        "2c ov pp pers": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, pingpong=True),
        **{f"3c n{n} s{s}{'' if ov else ' plain'}{' pp' if pp else ''}": dict(
            G, BLOCK_M=64, BLOCK_N=n, num_stages=s, consumers=3, consumer_regs=160, overlap=ov, pingpong=pp)
           for n, s, ov, pp in ((64, 3, True, False), (64, 3, True, True), (64, 3, False, True), (64, 4, False, True),
                                (128, 2, False, True), (128, 2, True, True))},
    },
    # FlashAttention-4's conditional rescaling (rescale_threshold) on each problem's shipped config
    "lazy_rescale": {
        "shipped": lambda problem: _shipped(problem),
        **{f"shipped lazy{t}": (lambda problem, t=t: dict(_shipped(problem), rescale_threshold=t)) for t in (4, 8)},
    },
    # head dims past 128 (D=192 padded to 256): one Q buffer per consumer (no persistent grid:
    # two Q buffers and the 2-deep 64-key K/V ring overflow shared memory), O staged in Q
    "wide": {
        **{f"n64 s2{name}": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=2, **knobs) for name, knobs in (
            ("", {}), (" plain", dict(overlap=False)), (" lazy8", dict(rescale_threshold=8)),
            (" pp", dict(pingpong=True)), (" plain pp", dict(overlap=False, pingpong=True)),
            (" 1loop", dict(one_loop=True)), (" plain 1loop", dict(overlap=False, one_loop=True)))},
    },
    # 128-key steps at D=192 over unpadded column chunks (kernels.fwd.wide_steps) against the
    # 64-key padded default: benchmarks/results/2026-12-07-h100-fwd-d192-wide-steps/
    "wide_steps": {
        "wide n64 lazy8": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=2, rescale_threshold=8),
        **{f"wide n128{name}": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, overlap=False, **knobs)
           for name, knobs in (("", {}), (" lazy8", dict(rescale_threshold=8)), (" pp", dict(pingpong=True)),
                               (" pp lazy8", dict(pingpong=True, rescale_threshold=8)),
                               (" 1loop lazy8", dict(one_loop=True, rescale_threshold=8)))},
    },
    # Q K^T's Q from registers (q_regs) beside Q from shared memory: the 64-key kernel past
    # D=128 (--problems d192) and the default's 128-key steps at 240 and 224 registers (d128)
    "q_regs": {
        **{f"n64 lazy8{name}": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=2, rescale_threshold=8, **knobs)
           for name, knobs in (("", {}), (" qr", dict(q_regs=True)), (" pp qr", dict(q_regs=True, pingpong=True)))},
        "n64 qr": dict(G, BLOCK_M=64, BLOCK_N=64, num_stages=2, q_regs=True),
        **{f"n128 pers{name}": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, **knobs)
           for name, knobs in (("", {}), (" qr", dict(q_regs=True)), (" r224", dict(consumer_regs=224)),
                               (" r224 qr", dict(consumer_regs=224, q_regs=True)))},
    },
    # the same on the Gluon default (what an untuned problem, e.g. any GQA one, runs)
    "lazy_default": {
        "default": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1),
        "default lazy8": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, rescale_threshold=8),
        "default pp lazy8": dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1, pingpong=True,
                                 rescale_threshold=8),
    },
    # FP8 (e4m3, prequantized per block + Hadamard) through the Gluon schedule: its knobs, the
    # exp2 split between MUFU and FMA units, and 256-key steps (FlashAttention-3 takes 224 at
    # D=128 in FP8), beside the Triton warp-specialized 128 x 256 kernel; `+sink`: with the
    # sink tile's second kernel; V in the wgmma order where the kernel reads it (quantize.v_order_for),
    # `v-natural`: in order. `dynamic` is set on causal problems by measure_fp8.
    "fp8": {
        **{f"n128{name}": dict(dict(G, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1), **knobs) for name, knobs in (
            ("", {}), (" plain", dict(overlap=False)), (" s3", dict(num_stages=3)), (" emu16", dict(exp2_emu=16)),
            (" emu8", dict(exp2_emu=8)), (" emu4", dict(exp2_emu=4)), (" lazy8", dict(rescale_threshold=8)),
            (" lazy8 emu8", dict(rescale_threshold=8, exp2_emu=8)), (" plain emu8", dict(overlap=False, exp2_emu=8)),
            (" pp", dict(pingpong=True)), (" +sink", dict(sink_tile=True)), (" v-natural", dict(v_natural=True)))},
        **{f"n256 plain{name}": dict(dict(G, BLOCK_M=64, BLOCK_N=256, num_stages=2, persistent=1, overlap=False), **knobs)
           for name, knobs in (("", {}), (" emu16", dict(exp2_emu=16)), (" emu8", dict(exp2_emu=8)), (" emu4", dict(exp2_emu=4)),
                               (" lazy8", dict(rescale_threshold=8)), (" pp", dict(pingpong=True)),
                               (" np", dict(persistent=0)), (" +sink", dict(sink_tile=True)),
                               (" v-natural", dict(v_natural=True)))},
        # past D=128: the wide schedule (one Q buffer per consumer), 64-key steps or 128 in turn
        **{f"wide n{n}{name}": dict(dict(G, BLOCK_M=64, BLOCK_N=n, num_stages=2), **knobs) for n, name, knobs in (
            (64, "", {}), (64, " lazy8", dict(rescale_threshold=8)), (64, " plain", dict(overlap=False)),
            (64, " s3", dict(num_stages=3)), (64, " pers", dict(persistent=1)), (64, " pp", dict(pingpong=True)),
            (64, " emu8", dict(exp2_emu=8)), (128, " plain", dict(overlap=False)),
            (128, " plain lazy8", dict(overlap=False, rescale_threshold=8)),
            (128, " plain emu8", dict(overlap=False, exp2_emu=8)), (64, " +sink", dict(sink_tile=True)))},
        "triton ws m128n256": dict(BLOCK_M=128, BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc",
                                   causal_mode="split", warp_specialize=True, persistent=1),
        "triton ws m128n256 +sink": dict(BLOCK_M=128, BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc",
                                         causal_mode="split", warp_specialize=True, persistent=1, sink_tile=True),
    },
    # the FP8 default (256-key steps in turn) with part of its exp2 on the FMA units, and with
    # the sink tile's second kernel
    "fp8_turns": {f"n256 plain pp{name}": dict(dict(G, BLOCK_M=64, BLOCK_N=256, num_stages=2, persistent=1,
                                                    overlap=False, pingpong=True), **knobs)
                  for name, knobs in (("", {}), (" emu16", dict(exp2_emu=16)), (" emu8", dict(exp2_emu=8)),
                                      (" +sink", dict(sink_tile=True)))},
}


def _shipped(problem: Problem) -> dict:
    """The config attention() runs for the problem, as fa_autotune.explain reports it (run with
    FA_AUTOTUNE_DB on an empty database: the shipped file's)."""
    import torch

    import fa_autotune

    dtype = getattr(torch, problem.dtype)
    q = torch.empty(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim, device="cuda", dtype=dtype)
    k = torch.empty(problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim, device="cuda", dtype=dtype)
    return fa_autotune.explain(q, k, k, problem.causal, causal_align=problem.causal_align)["config"]


def d128_problems(quick: bool) -> list[Problem]:
    """llm-prefill's D=128 problems, causal and not."""
    return [Problem(16384 // n, 16, 16, n, n, 128, dtype, causal)
            for dtype in ("bfloat16", "float16")[:1 if quick else 2] for n in (1024, 4096, 16384) for causal in (False, True)]


def fp8_problems(quick: bool) -> list[Problem]:
    """Issue 42's bar rows (the fp8-bar preset): e4m3 at N=8192, D=128 non-causal and causal, and
    unless quick D=256 non-causal."""
    out = [Problem(2, 16, 16, 8192, 8192, 128, "float8_e4m3fn", causal) for causal in (False, True)]
    return out if quick else out + [Problem(2, 16, 16, 8192, 8192, 256, "float8_e4m3fn")]


def d64_all_problems(quick: bool) -> list[Problem]:
    """llm-prefill's D=64 problems, causal and not."""
    return [Problem(16384 // n, 32, 32, n, n, 64, dtype, causal) for dtype in ("bfloat16", "float16")[:1 if quick else 2]
            for n in (1024, 4096, 16384) for causal in (False, True)]


def short_causal_problems(quick: bool) -> list[Problem]:
    """llm-prefill's N=1024 causal problems."""
    return [Problem(16, h, h, 1024, 1024, d, dtype, True) for dtype in ("bfloat16", "float16")[:1 if quick else 2]
            for h, d in ((16, 128), (32, 64))]


def d64_problems(quick: bool) -> list[Problem]:
    """The causal D=64 problems of llm-prefill."""
    return [Problem(b, 32, 32, n, n, 64, dtype, True) for dtype in ("bfloat16", "float16")[:1 if quick else 2]
            for b, n in ((16, 1024), (4, 4096), (1, 16384))]


def causal_problems(quick: bool) -> list[Problem]:
    """The causal problems of llm-prefill and two GQA ones, where the tile order matters."""
    out = []
    for dtype in ("bfloat16", "float16"):
        out += [Problem(16, 16, 16, 1024, 1024, 128, dtype, True), Problem(4, 16, 16, 4096, 4096, 128, dtype, True),
                Problem(1, 16, 16, 16384, 16384, 128, dtype, True), Problem(16, 32, 32, 1024, 1024, 64, dtype, True),
                Problem(4, 32, 32, 4096, 4096, 64, dtype, True), Problem(2, 32, 8, 8192, 8192, 128, dtype, True),
                Problem(8, 28, 4, 3000, 3000, 128, dtype, True)]
        if quick:
            break
    return out


def llm_problems(quick: bool) -> list[Problem]:
    """All of llm-prefill: hidden 2048, B * N = 16384, D 64 and 128, causal and not."""
    return [Problem(16384 // n, 2048 // d, 2048 // d, n, n, d, dtype, causal)
            for dtype in ("bfloat16", "float16")[:1 if quick else 2] for d in (64, 128)
            for n in (1024, 4096, 16384) for causal in (False, True)]


def wide_problems(quick: bool) -> list[Problem]:
    """Head dims 192 and 256, FlashAttention-4's anchor rows (shared/ANCHORS.md) and their fp16 twins."""
    return [p for dtype in ("bfloat16", "float16")[:1 if quick else 2] for p in (
        Problem(4, 16, 16, 4096, 4096, 192, dtype, True), Problem(2, 16, 16, 8192, 8192, 192, dtype),
        Problem(2, 16, 16, 8192, 8192, 256, dtype), Problem(4, 8, 8, 4096, 4096, 256, dtype, True))]


def d192_problems(quick: bool) -> list[Problem]:
    """Head dim 192: FlashAttention-4's anchor rows, their fp16 twin, no mask, GQA causal."""
    out = [Problem(4, 16, 16, 4096, 4096, 192, "bfloat16", True), Problem(2, 16, 16, 8192, 8192, 192, "bfloat16"),
           Problem(2, 32, 8, 4096, 4096, 192, "bfloat16", True)]
    return out if quick else out + [Problem(4, 16, 16, 4096, 4096, 192, "float16", True)]


def problems(quick: bool) -> list[Problem]:
    out = []
    for dtype in ("bfloat16", "float16"):
        out += [Problem(1, 16, 16, 16384, 16384, 128, dtype), Problem(4, 16, 16, 4096, 4096, 128, dtype, True),
                Problem(16, 16, 16, 1024, 1024, 128, dtype, True), Problem(4, 32, 32, 4096, 4096, 64, dtype),
                Problem(16, 32, 32, 1024, 1024, 64, dtype, True),
                Problem(2, 32, 8, 8192, 8192, 128, dtype, True)]
        if quick:
            break
    return out


def l2_section(problem: Problem, q, fraction: float) -> int:
    """Heads per section of a causal persistent grid whose K and V (shared by a KV group's
    query heads) fill ``fraction`` of this GPU's L2 cache: the launcher's rule for its own
    share (fa_autotune.kernels.launch.l2_section), at any share; 0: every head at once."""
    heads = problem.batch * problem.heads_q
    if fraction <= 0:
        return min(heads, MAX_SECTION)
    import torch

    kv_per_head = 2 * problem.seqlen_k * problem.head_dim_pad * q.element_size() / problem.gqa_group
    budget = torch.cuda.get_device_properties(q.device).L2_cache_size * fraction
    return max(1, min(heads, MAX_SECTION, int(budget // max(kv_per_head, 1))))


def _interleave(calls: dict, contexts: dict, rows: dict, detail: dict, problem: Problem, rounds: int,
                rep_ms: float) -> None:
    """Time ``calls`` in interleaved rounds; each row gets its median ms, TFLOPS and the median
    of its per-round ratios' reference, cuDNN (and FA4 where timed)."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            context = contexts.get(name)
            if context is not None:
                with context():
                    samples[name].append(time_callable(fn, rep_ms=rep_ms).median_ms)
            else:
                samples[name].append(time_callable(fn, rep_ms=rep_ms).median_ms)
    for name, values in samples.items():
        ms = statistics.median(values)
        row = rows.setdefault(name, {"config": detail.get(name, name), "status": "ok"})
        row.update(ms=ms, tflops=problem.tflops(ms), vs_cudnn=statistics.median(samples["cudnn"]) / ms)
        if "fa4" in samples:
            row.update(vs_fa4=statistics.median(samples["fa4"]) / ms)


def _record(rows: dict, calls: dict, name: str, config: KernelConfig, fn, report, dtype: str) -> None:
    """A variant's row after its check against float32: timed only if within dtype's tolerance."""
    rows[name] = {"config": config.name, "status": "ok" if report.passes(dtype) else "wrong_result",
                  "rel_error": report.rel}
    if report.passes(dtype):
        calls[name] = fn


def measure_fp8(problem: Problem, variants: dict, rounds: int, rep_ms: float) -> dict:
    """FP8 rows: bf16 inputs with outlier channels (the bench's), each variant on them quantized
    beforehand per block with Hadamard (blocks as tile_blocks gives for its tiles; the sink
    tile's 16-bit q and k kept where the variant asks for it), cuDNN and the dispatched FP8
    kernel (`tuned`, prequantized) beside them; every output checked against float32 first."""
    import torch

    import fa_autotune
    from fa_autotune.fp8.quantize import tile_blocks, v_order_for

    q, k, v = (t.to(torch.bfloat16) for t in fp8_source_inputs(problem, "cuda"))
    ref, _ = reference_attention(q.float(), k.float(), v.float(), causal=problem.causal)
    bench = Bench(("cudnn", "tuned"), None)
    calls, contexts, detail, rows = {}, {}, {}, {}
    for provider in ("cudnn", "tuned"):
        fn, contexts[provider], detail[provider] = bench.callable_for(provider, problem, q, k, v)
        report = compare(fn(), ref)
        rows[provider] = {"config": detail[provider], "status": "ok", "rel_error": report.rel}
        calls[provider] = fn
    for name, params in variants.items():
        if name.startswith("wide") != (problem.head_dim_pad > 128) or (name.startswith("triton ws")
                                                                     and problem.head_dim_pad > 128):
            continue  # the wide schedule's variants past D=128 only, and only they there
        params = dict(params)
        sink = params.pop("sink_tile", False)
        natural = params.pop("v_natural", False)
        if problem.causal and params.get("language") == "gluon" and params.get("persistent"):
            params["dynamic"] = True
        try:
            config = KernelConfig.from_mapping(params)
            x = fa_autotune.quantize_fp8(q, k, v, scaling="per_block", hadamard=True, sink_tile=sink,
                                         v_order="natural" if natural else v_order_for(config.warp_specialize,
                                                                                       problem.seqlen_k),
                                         **dict(zip(("block_q", "block_k"), tile_blocks(
                                             config.BLOCK_M * (config.consumers if config.language == "gluon" else 1),
                                             config.BLOCK_N))))
            fn = (lambda x=x, config=config: fa_autotune.attention_fp8(x, causal=problem.causal, config=config,
                                                                       out_dtype=torch.bfloat16))
            report = compare(fn(), ref)
        except Exception as exc:  # a variant that cannot run is a result
            rows[name] = {"config": str(params), "status": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        _record(rows, calls, name, config, fn, report, problem.dtype)
    _interleave(calls, contexts, rows, detail, problem, rounds, rep_ms)
    return {"problem": problem.key, "rows": rows}


def measure(problem: Problem, variants: dict, rounds: int, rep_ms: float, fa4: bool = False) -> dict:
    if problem.is_fp8:
        return measure_fp8(problem, variants, rounds, rep_ms)
    q, k, v = random_inputs(problem, "cuda", seed=0)
    ref, _ = reference_attention(q, k, v, causal=problem.causal)
    baselines = ("cudnn", "tuned", "fa4") if fa4 else ("cudnn", "tuned")
    bench = Bench(baselines, None)
    calls, contexts, detail, rows = {}, {}, {}, {}
    for provider in baselines:
        try:
            fn, context, detail[provider] = bench.callable_for(provider, problem, q, k, v)
            report = compare(fn(), ref)
        except Unavailable as exc:
            rows[provider] = {"config": provider, "status": f"unavailable: {exc}"[:200]}
            continue
        if not report.passes(problem.dtype):
            rows[provider] = {"config": detail[provider], "status": "wrong_result", "rel_error": report.rel}
            continue
        calls[provider], contexts[provider] = fn, context
    for name, params in variants.items():
        params = dict(params(problem) if callable(params) else params)
        if params.get("causal_mode") == "masked" and not problem.causal:
            continue
        fraction = params.pop("l2_fraction", None)
        if fraction is not None and params.get("persistent") and problem.causal and not params.get("section"):
            params["section"] = l2_section(problem, q, fraction)
        config = KernelConfig.from_mapping(params)
        try:
            fn = config_call(config, problem, q, k, v)
            report = compare(fn(), ref)
        except Exception as exc:  # a variant that cannot run is a result
            rows[name] = {"config": config.name, "status": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        _record(rows, calls, name, config, fn, report, problem.dtype)
    _interleave(calls, contexts, rows, detail, problem, rounds, rep_ms)
    return {"problem": problem.key, "rows": rows}


def table(results: list[dict], names: list[str]) -> list[str]:
    """Markdown lines: a row per problem, a cell per provider or variant: TFLOPS (ratio to
    cuDNN, and to FA4 where it ran), or why it was not timed."""
    lines = ["| problem | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in results:
        cells = []
        for name in names:
            row = r["rows"].get(name)
            if row is None:
                cells.append("-")
            elif "tflops" in row:
                fa4_ratio = f", {row['vs_fa4']:.2f}x FA4" if "vs_fa4" in row else ""
                cells.append(f"{row['tflops']:.0f} ({row['vs_cudnn']:.2f}x{fa4_ratio})")
            else:
                cells.append(row["status"][:40])
        lines.append(f"| {r['problem']} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="bf16 only")
    parser.add_argument("--set", choices=sorted(VARIANT_SETS), default="schedule", help="which variants")
    parser.add_argument("--fa4", action="store_true", help="FlashAttention-4 beside cuDNN (ratios to both)")
    parser.add_argument("--problems", choices=("mixed", "llm", "causal", "d64", "d64_all", "d128", "short_causal", "wide", "d192", "fp8"), default="mixed",
                        help="mixed: llm-prefill's shapes and one GQA; llm: all of llm-prefill; causal: the causal "
                             "ones and two GQA; d64: llm-prefill's causal D=64 ones; d64_all: its D=64 ones; short_causal: its N=1024 "
                             "causal ones")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    args = parser.parse_args()
    results = []
    chosen = {"mixed": problems, "llm": llm_problems, "causal": causal_problems, "d64": d64_problems,
              "d64_all": d64_all_problems, "d128": d128_problems, "short_causal": short_causal_problems,
              "wide": wide_problems, "d192": d192_problems, "fp8": fp8_problems}[args.problems]
    for problem in chosen(args.quick):
        results.append(measure(problem, VARIANT_SETS[args.set], args.rounds, args.rep_ms, args.fa4))
        print(problem.key, {k: round(r.get("tflops", 0)) for k, r in results[-1]["rows"].items()}, flush=True)
    summary = {"environment": environment(), "rounds": args.rounds, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gluon_sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    env = summary["environment"]
    names = ["cudnn", "tuned", *(["fa4"] if args.fa4 else []), *VARIANT_SETS[args.set]]
    lines = [f"# Gluon FlashAttention-3 variants on {env.get('gpu')} ({env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}, cuDNN {env['cudnn']}, templates {env['template_hash']}; "
             f"median of {args.rounds} interleaved rounds of {args.rep_ms:.0f} ms; `tuned` is the dispatched "
             "kernel (the shipped tuning file's choice, Gluon or Triton). TFLOPS (ratio to cuDNN); every output "
             "checked against float32 first.", "",
             *table(results, names)]
    (args.out / "gluon_sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

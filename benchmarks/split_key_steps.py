"""Issue 45's next structure, measured before it goes into the template: a Gluon forward past
head dim 128 whose K/V steps hold NA + NB keys as two power-of-two parts (64 + 32 = 96 keys at
D=192, 64 + 16 = 80 at D=256: FlashAttention-3's tile_size_fwd_sm90 takes 112 and 80 there, Triton's
tensors must be powers of two), with FlashAttention-3's intra-warpgroup overlap, against the same
kernel with one 64-key part (the shipped default's step) and against cuDNN, the dispatched
kernel and FlashAttention-4, every output checked against float32 first, interleaved rounds.

    python3 benchmarks/split_key_steps.py --out DIR [--rounds 3] [--rep-ms 100] [--fa4]
    python3 benchmarks/split_key_steps.py --aot      # no GPU: compile every variant for sm_90

The kernel (non-causal, fp16/bf16, (B, H, N, D) contiguous, D = 128 + D1 with D1 64 or 128, N a
multiple of 128; the last key step masked): a TMA producer warpgroup and two consumer
warpgroups of 64 query rows. Q, K, V and O live as two column chunks (128 + D1), K and V as
two key parts per ring stage (separate buffers: no product reads a slice along its K
dimension, triton-lang/triton#6220), so a step is S_a = Q K_a^T and S_b = Q K_b^T (two
products each), one softmax over both, and O += P_a V_a + P_b V_b for each O chunk. Registers
a consumer thread holds across a step at D=192, 64 + 32: O 96, S 48, the previous P 24. What it
weighs: one softmax round, barrier and wait per 96 keys instead of per 64 (the sm_90 step loop:
5.7 instructions a key against 6.0), against Q read from shared memory a second time a step
(an m64n32k16 product moves 3 KB in 16 clocks at full rate, more than the SM's 128 bytes a
clock). Writes DIR/split_key_steps.json and .md.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

ROWS, COLS = 64, 128  # query rows per consumer warpgroup (two: 128 a program); the first column chunk
BM = gl.constexpr(ROWS)
D0 = gl.constexpr(COLS)
LOG2E = 1.4426950408889634
# name -> (NA, NB, STAGES, PINGPONG): the key parts of a step, ring stages, consumers taking turns
VARIANTS = {
    "64 keys": (64, 0, 2, 0),
    "64 keys pp": (64, 0, 2, 1),
    "64+32 keys": (64, 32, 2, 0),
    "64+32 keys pp": (64, 32, 2, 1),
    "64+16 keys": (64, 16, 2, 0),
    "64+16 keys pp": (64, 16, 2, 1),
}


@gluon.jit
def _producer(qd0, qd1, kda0, kda1, kdb0, kdb1, vda0, vda1, vdb0, vdb1, q0s, q1s, ka0, ka1, kb0, kb1, va0, va1, vb0,
              vb1, q_bar, k_ready, k_empty, v_ready, v_empty, q_row, kv_row, n_kv, STAGES: gl.constexpr,
              NB: gl.constexpr):
    """Q once (both consumers' tiles, both chunks), then each step's K parts and V parts into
    ring stage j % STAGES, K and V on their own barriers."""
    D1: gl.constexpr = kda1.block_type.shape[1]
    NA: gl.constexpr = kda0.block_type.shape[0]
    mbarrier.expect(q_bar, 2 * BM * (D0 + D1) * 2)
    for wg in gl.static_range(2):
        tma.async_copy_global_to_shared(qd0, [q_row + wg * BM, 0], q_bar, q0s.index(wg))
        tma.async_copy_global_to_shared(qd1, [q_row + wg * BM, D0], q_bar, q1s.index(wg))
    for j in range(n_kv):
        s = j % STAGES
        ph = (j // STAGES) & 1
        row = kv_row + j * (NA + NB)
        _load_step(kda0, kda1, kdb0, kdb1, ka0, ka1, kb0, kb1, k_ready, k_empty, s, ph, row, NB)
        _load_step(vda0, vda1, vdb0, vdb1, va0, va1, vb0, vb1, v_ready, v_empty, s, ph, row, NB)


@gluon.jit
def _load_step(da0, da1, db0, db1, a0, a1, b0, b1, ready, empty, s, ph, row, NB: gl.constexpr):
    """One step's K (or V) rows into ring stage s: both column chunks of each key part, on the
    stage's ready barrier once its empty one says every consumer is done with it."""
    NA: gl.constexpr = da0.block_type.shape[0]
    D1: gl.constexpr = da1.block_type.shape[1]
    mbarrier.wait(empty.index(s), ph ^ 1)
    mbarrier.expect(ready.index(s), (NA + NB) * (D0 + D1) * 2)
    tma.async_copy_global_to_shared(da0, [row, 0], ready.index(s), a0.index(s))
    tma.async_copy_global_to_shared(da1, [row, D0], ready.index(s), a1.index(s))
    if NB > 0:
        tma.async_copy_global_to_shared(db0, [row + NA, 0], ready.index(s), b0.index(s))
        tma.async_copy_global_to_shared(db1, [row + NA, D0], ready.index(s), b1.index(s))


@gluon.jit
def _qk(q0, q1, k0, k1, zero):
    """S = Q K^T over both column chunks, issued async (two wgmma groups)."""
    tok = warpgroup_mma(q0, k0.permute((1, 0)), zero, use_acc=False, is_async=True)
    return warpgroup_mma(q1, k1.permute((1, 0)), tok, is_async=True)


@gluon.jit
def _turn_wait(turn, k, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (k & 1) ^ (1 - WG))


@gluon.jit
def _turn_pass(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG))


@gluon.jit
def _softmax(sa, sb, m_i, l_i, qk_scale, j, N, NB: gl.constexpr, MASKED: gl.constexpr):
    """Online softmax (base 2) over a step's two score parts; MASKED hides keys past N.
    Returns P's parts, the new max and sum, and the factor for the old state."""
    NA: gl.constexpr = sa.shape[1]
    row_a: gl.constexpr = gl.SliceLayout(1, sa.type.layout)
    key0 = j * (NA + NB)
    if MASKED:
        cols = gl.expand_dims(gl.arange(0, NA, layout=gl.SliceLayout(0, sa.type.layout)), 0)
        sa = gl.where(cols < N - key0, sa, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sa, 1) * qk_scale)
    if NB > 0:
        row_b: gl.constexpr = gl.SliceLayout(1, sb.type.layout)
        if MASKED:
            cols_b = gl.expand_dims(gl.arange(0, NB, layout=gl.SliceLayout(0, sb.type.layout)), 0)
            sb = gl.where(cols_b < N - key0 - NA, sb, float("-inf"))
        m_new = gl.maximum(m_new, gl.convert_layout(gl.max(sb, 1), row_a) * qk_scale)
    pa = gl.exp2(sa * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(pa, 1)
    pb = pa
    if NB > 0:
        pb = gl.exp2(sb * qk_scale - gl.expand_dims(gl.convert_layout(m_new, row_b), 1))
        l_new = l_new + gl.convert_layout(gl.sum(pb, 1), row_a)
    return pa, pb, m_new, l_new, alpha


@gluon.jit
def _operands(pa, pb, dtype: gl.constexpr, o0_layout: gl.constexpr, o1_layout: gl.constexpr, NB: gl.constexpr):
    """P's parts in 16 bits as the A operand of each O chunk's products."""
    a0: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o0_layout, k_width=2)
    a1: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o1_layout, k_width=2)
    pa16 = pa.to(dtype)
    pa0 = gl.convert_layout(pa16, a0)
    pa1 = gl.convert_layout(pa16, a1)
    pb0 = pa0
    pb1 = pa1
    if NB > 0:
        pb16 = pb.to(dtype)
        pb0 = gl.convert_layout(pb16, a0)
        pb1 = gl.convert_layout(pb16, a1)
    return pa0, pa1, pb0, pb1


@gluon.jit
def _pv(p, va0, va1, vb0, vb1, sp, acc0, acc1, NB: gl.constexpr):
    """O += P_a V_a (+ P_b V_b) for both O chunks, issued async (2 or 4 wgmma groups)."""
    t0 = warpgroup_mma(p[0], va0.index(sp), acc0, is_async=True)
    if NB > 0:
        t0 = warpgroup_mma(p[2], vb0.index(sp), t0, is_async=True)
    t1 = warpgroup_mma(p[1], va1.index(sp), acc1, is_async=True)
    if NB > 0:
        t1 = warpgroup_mma(p[3], vb1.index(sp), t1, is_async=True)
    return t0, t1


@gluon.jit
def _rescale(acc0, acc1, alpha):
    a0 = gl.convert_layout(alpha, gl.SliceLayout(1, acc0.type.layout))
    a1 = gl.convert_layout(alpha, gl.SliceLayout(1, acc1.type.layout))
    return acc0 * gl.expand_dims(a0, 1), acc1 * gl.expand_dims(a1, 1)


@gluon.jit
def _scores(q0, q1, ka0, ka1, kb0, kb1, s, sa_layout: gl.constexpr, sb_layout: gl.constexpr, NB: gl.constexpr):
    """S_a and S_b issued async (S_b's token is S_a's without a second part)."""
    NA: gl.constexpr = ka0.shape[1]
    tok_a = _qk(q0, q1, ka0.index(s), ka1.index(s), gl.zeros([BM, NA], gl.float32, sa_layout))
    tok_b = tok_a
    if NB > 0:
        tok_b = _qk(q0, q1, kb0.index(s), kb1.index(s), gl.zeros([BM, NB], gl.float32, sb_layout))
    return tok_a, tok_b


@gluon.jit
def _wait_scores(tok_a, tok_b, PV_BEHIND: gl.constexpr, NB: gl.constexpr):
    """S_a and S_b once done; PV_BEHIND: the PV products issued after them (2 or 4 groups)
    may still run."""
    if NB > 0:
        sa, sb = warpgroup_mma_wait(num_outstanding=4 if PV_BEHIND else 0, deps=(tok_a, tok_b))
    else:
        sa = warpgroup_mma_wait(num_outstanding=2 if PV_BEHIND else 0, deps=(tok_a, ))
        sb = sa
    return sa, sb


@gluon.jit
def _step(q0, q1, ka0, ka1, kb0, kb1, va0, va1, vb0, vb1, k_ready, k_empty, v_ready, v_empty, turn, acc0, acc1,
          m_i, l_i, alpha, p, j, N, qk_scale, sa_layout: gl.constexpr, sb_layout: gl.constexpr, o0_layout: gl.constexpr,
          o1_layout: gl.constexpr, WG: gl.constexpr,
          STAGES: gl.constexpr, NB: gl.constexpr, PINGPONG: gl.constexpr, MASKED: gl.constexpr):
    """Step j: issue S_j's products and, behind them, P_{j-1} V_{j-1}'s; wait for the scores
    only, so step j's softmax runs while the PV products are on the tensor cores."""
    s = j % STAGES
    sp = (j - 1) % STAGES
    mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
    mbarrier.wait(v_ready.index(sp), ((j - 1) // STAGES) & 1)
    _turn_wait(turn, j, WG, PINGPONG)
    tok_a, tok_b = _scores(q0, q1, ka0, ka1, kb0, kb1, s, sa_layout, sb_layout, NB)
    acc0, acc1 = _rescale(acc0, acc1, alpha)
    t0, t1 = _pv(p, va0, va1, vb0, vb1, sp, acc0, acc1, NB)
    _turn_pass(turn, WG, PINGPONG)
    sa, sb = _wait_scores(tok_a, tok_b, True, NB)
    mbarrier.arrive(k_empty.index(s))
    pa, pb, m_i, l_i, alpha = _softmax(sa, sb, m_i, l_i, qk_scale, j, N, NB, MASKED)
    acc0, acc1, pa0, pa1, pb0, pb1 = warpgroup_mma_wait(num_outstanding=0, deps=(t0, t1, p[0], p[1], p[2], p[3]))
    mbarrier.arrive(v_empty.index(sp))
    p = _operands(pa, pb, q0.dtype, o0_layout, o1_layout, NB)
    return acc0, acc1, m_i, l_i, alpha, p


@gluon.jit
def _consumer(q0s, q1s, ka0, ka1, kb0, kb1, va0, va1, vb0, vb1, q_bar, k_ready, k_empty, v_ready, v_empty, turn,
              od0, od1, q_row, N, n_kv, qk_scale, WG: gl.constexpr, STAGES: gl.constexpr, NB: gl.constexpr,
              PINGPONG: gl.constexpr):
    NA: gl.constexpr = ka0.shape[1]
    D1: gl.constexpr = ka1.shape[2]
    dtype: gl.constexpr = q0s.dtype
    sa_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NA, 16])
    sb_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, NB if NB > 0 else NA, 16])
    o0_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D0, 16])
    o1_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D1, 16])
    q0 = q0s.index(WG)
    q1 = q1s.index(WG)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, sa_layout))
    l_i = gl.full([BM], 0.0, gl.float32, layout=gl.SliceLayout(1, sa_layout))
    acc0 = gl.zeros([BM, D0], gl.float32, o0_layout)
    acc1 = gl.zeros([BM, D1], gl.float32, o1_layout)
    mbarrier.wait(q_bar, 0)
    # prologue: S_0 and P_0 (masked: step 0 may be the last)
    mbarrier.wait(k_ready.index(0), 0)
    _turn_wait(turn, 0, WG, PINGPONG)
    tok_a, tok_b = _scores(q0, q1, ka0, ka1, kb0, kb1, 0, sa_layout, sb_layout, NB)
    _turn_pass(turn, WG, PINGPONG)
    sa, sb = _wait_scores(tok_a, tok_b, False, NB)
    mbarrier.arrive(k_empty.index(0))
    pa, pb, m_i, l_i, alpha = _softmax(sa, sb, m_i, l_i, qk_scale, 0, N, NB, True)
    p = _operands(pa, pb, dtype, o0_layout, o1_layout, NB)
    for j in range(1, n_kv - 1):
        acc0, acc1, m_i, l_i, alpha, p = _step(q0, q1, ka0, ka1, kb0, kb1, va0, va1, vb0, vb1, k_ready, k_empty,
                                               v_ready, v_empty, turn, acc0, acc1, m_i, l_i, alpha, p, j, N,
                                               qk_scale, sa_layout, sb_layout, o0_layout, o1_layout, WG, STAGES, NB, PINGPONG,
                                               False)
    if n_kv > 1:
        acc0, acc1, m_i, l_i, alpha, p = _step(q0, q1, ka0, ka1, kb0, kb1, va0, va1, vb0, vb1, k_ready, k_empty,
                                               v_ready, v_empty, turn, acc0, acc1, m_i, l_i, alpha, p, n_kv - 1, N,
                                               qk_scale, sa_layout, sb_layout, o0_layout, o1_layout, WG, STAGES, NB, PINGPONG,
                                               True)
    # tail: the last P V
    last = n_kv - 1
    sl = last % STAGES
    acc0, acc1 = _rescale(acc0, acc1, alpha)
    mbarrier.wait(v_ready.index(sl), (last // STAGES) & 1)
    _turn_wait(turn, n_kv, WG, PINGPONG)
    t0, t1 = _pv(p, va0, va1, vb0, vb1, sl, acc0, acc1, NB)
    _turn_pass(turn, WG, PINGPONG)
    acc0, acc1, pa0, pa1, pb0, pb1 = warpgroup_mma_wait(num_outstanding=0, deps=(t0, t1, p[0], p[1], p[2], p[3]))
    mbarrier.arrive(v_empty.index(sl))
    # epilogue: O = acc / l through this warpgroup's Q buffers (Q is dead), TMA stores
    l0 = gl.convert_layout(l_i, gl.SliceLayout(1, o0_layout))
    l1 = gl.convert_layout(l_i, gl.SliceLayout(1, o1_layout))
    q0.store((acc0 / gl.expand_dims(l0, 1)).to(dtype))
    q1.store((acc1 / gl.expand_dims(l1, 1)).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(od0, [q_row + WG * BM, 0], q0)
    tma.async_copy_shared_to_global(od1, [q_row + WG * BM, D0], q1)
    tma.store_wait(0)


@gluon.jit
def split_key_fwd(qd0, qd1, kda0, kda1, kdb0, kdb1, vda0, vda1, vdb0, vdb1, od0, od1, N, qk_scale,
                  STAGES: gl.constexpr, NB: gl.constexpr, PINGPONG: gl.constexpr):
    NA: gl.constexpr = kda0.block_type.shape[0]
    D1: gl.constexpr = kda1.block_type.shape[1]
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    q_row = bh * N + pid_m * (2 * BM)
    n_kv = (N + NA + NB - 1) // (NA + NB)
    q0s = gl.allocate_shared_memory(qd0.dtype, [2, BM, D0], qd0.layout)
    q1s = gl.allocate_shared_memory(qd1.dtype, [2, BM, D1], qd1.layout)
    ka0 = gl.allocate_shared_memory(kda0.dtype, [STAGES, NA, D0], kda0.layout)
    ka1 = gl.allocate_shared_memory(kda1.dtype, [STAGES, NA, D1], kda1.layout)
    va0 = gl.allocate_shared_memory(vda0.dtype, [STAGES, NA, D0], vda0.layout)
    va1 = gl.allocate_shared_memory(vda1.dtype, [STAGES, NA, D1], vda1.layout)
    if NB > 0:
        kb0 = gl.allocate_shared_memory(kdb0.dtype, [STAGES, NB, D0], kdb0.layout)
        kb1 = gl.allocate_shared_memory(kdb1.dtype, [STAGES, NB, D1], kdb1.layout)
        vb0 = gl.allocate_shared_memory(vdb0.dtype, [STAGES, NB, D0], vdb0.layout)
        vb1 = gl.allocate_shared_memory(vdb1.dtype, [STAGES, NB, D1], vdb1.layout)
    else:  # never read: the second part's names bound to the first's buffers
        kb0 = ka0
        kb1 = ka1
        vb0 = va0
        vb1 = va1
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=2)  # one arrive per consumer warpgroup
        mbarrier.init(v_empty.index(s), count=2)
    fence_async_shared()
    gl.warp_specialize(
        [(_producer, (qd0, qd1, kda0, kda1, kdb0, kdb1, vda0, vda1, vdb0, vdb1, q0s, q1s, ka0, ka1, kb0, kb1, va0, va1,
                      vb0, vb1, q_bar, k_ready, k_empty, v_ready, v_empty, q_row, bh * N, n_kv, STAGES, NB)),
         (_consumer, (q0s, q1s, ka0, ka1, kb0, kb1, va0, va1, vb0, vb1, q_bar, k_ready, k_empty, v_ready, v_empty, turn,
                      od0, od1, q_row, N, n_kv, qk_scale, 0, STAGES, NB, PINGPONG)),
         (_consumer, (q0s, q1s, ka0, ka1, kb0, kb1, va0, va1, vb0, vb1, q_bar, k_ready, k_empty, v_ready, v_empty, turn,
                      od0, od1, q_row, N, n_kv, qk_scale, 1, STAGES, NB, PINGPONG))],
        [4, 4], [240, 240])
    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(turn.index(0))
    mbarrier.invalidate(turn.index(1))
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(s))
        mbarrier.invalidate(v_ready.index(s))
        mbarrier.invalidate(k_empty.index(s))
        mbarrier.invalidate(v_empty.index(s))


def _gl_dtype(torch_dtype_name: str):
    return {"float16": gl.float16, "bfloat16": gl.bfloat16}[torch_dtype_name]


def _blocks(head_dim: int, na: int, nb: int) -> dict:
    """The TMA box of each descriptor argument (rows, columns); a part's absent second half
    (NB = 0) takes the first's box, never read."""
    d1 = head_dim - COLS
    b = nb or na
    return {"qd0": (ROWS, COLS), "qd1": (ROWS, d1), "kda0": (na, COLS), "kda1": (na, d1), "kdb0": (b, COLS),
            "kdb1": (b, d1), "vda0": (na, COLS), "vda1": (na, d1), "vdb0": (b, COLS), "vdb1": (b, d1), "od0": (ROWS, COLS),
            "od1": (ROWS, d1)}


def check_shape(head_dim: int, seqlen: int) -> None:
    if head_dim - COLS not in (64, 128):
        raise ValueError(f"split_key_fwd runs head dims 192 and 256, not {head_dim}")
    if seqlen % (2 * ROWS):
        raise ValueError(f"split_key_fwd needs N a multiple of {2 * ROWS} (its query tiles are not masked), got {seqlen}")


def aot_compile(head_dim: int, dtype: str, na: int, nb: int, stages: int, pingpong: int):
    """Compile for sm_90 without a GPU: the CompiledKernel (PTX, cubin, metadata)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    check_shape(head_dim, 2 * ROWS)
    t = _gl_dtype(dtype)
    short = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    sig = {name: f"tensordesc<{short}[{r}, {c}],{gl.NVMMASharedLayout.get_default_for([r, c], t)!r}>"
           for name, (r, c) in _blocks(head_dim, na, nb).items()}
    sig.update(N="i32", qk_scale="fp32", STAGES="constexpr", NB="constexpr", PINGPONG="constexpr")
    src = GluonASTSource(split_key_fwd, sig, {"STAGES": stages, "NB": nb, "PINGPONG": pingpong})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def launcher(q, k, v, na: int, nb: int, stages: int, pingpong: int, sm_scale: float | None = None):
    """A zero-argument call computing softmax(q k^T * scale) v (non-causal) into a new tensor."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b, h, n, d = q.shape
    check_shape(d, n)
    if k.shape != q.shape or v.shape != q.shape or not all(t.is_contiguous() for t in (q, k, v)):
        raise ValueError("split_key_fwd takes contiguous q, k, v of one (B, H, N, D) shape")
    o = torch.empty_like(q)
    t = _gl_dtype(str(q.dtype).removeprefix("torch."))
    flat = {"q": q.view(-1, d), "k": k.view(-1, d), "v": v.view(-1, d), "o": o.view(-1, d)}
    descs = [TensorDescriptor.from_tensor(flat[name[0]], [r, c], gl.NVMMASharedLayout.get_default_for([r, c], t))
             for name, (r, c) in _blocks(d, na, nb).items()]
    qk_scale = (sm_scale or 1.0 / math.sqrt(d)) * LOG2E
    grid = (n // (2 * ROWS), b * h)

    def call():
        split_key_fwd[grid](*descs, n, qk_scale, stages, nb, pingpong, num_warps=4)
        return o

    return call


def problems() -> list:
    from fa_autotune.spec.problem import Problem

    return [Problem(2, 16, 16, 8192, 8192, 192, "bfloat16"), Problem(4, 16, 16, 4096, 4096, 192, "bfloat16"),
            Problem(4, 16, 16, 4096, 4096, 192, "float16"), Problem(2, 16, 16, 8192, 8192, 256, "bfloat16")]


def variants_for(head_dim: int) -> dict:
    nb_wanted = 32 if head_dim == 192 else 16
    return {name: spec for name, spec in VARIANTS.items() if spec[1] in (0, nb_wanted)}


def measure(problem, rounds: int, rep_ms: float, fa4: bool) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from gluon_sweep import _interleave

    from fa_autotune.bench import Bench, Unavailable
    from fa_autotune.tune.inputs import random_inputs
    from fa_autotune.tune.reference import compare, reference_attention

    q, k, v = random_inputs(problem, "cuda", seed=0)
    ref, _ = reference_attention(q, k, v, causal=False)
    providers = ("cudnn", "tuned", "fa4") if fa4 else ("cudnn", "tuned")
    bench = Bench(providers, None)
    calls, contexts, detail, rows = {}, {}, {}, {}
    candidates = []
    for provider in providers:
        try:
            fn, context, detail[provider] = bench.callable_for(provider, problem, q, k, v)
        except Unavailable as exc:
            rows[provider] = {"config": provider, "status": f"unavailable: {exc}"[:200]}
            continue
        candidates.append((provider, fn, context))
    for name, (na, nb, stages, pp) in variants_for(problem.head_dim).items():
        detail[name] = f"split_key_fwd NA={na} NB={nb} STAGES={stages} PINGPONG={pp}"
        try:
            candidates.append((name, launcher(q, k, v, na, nb, stages, pp), None))
        except Exception as exc:  # a variant that cannot launch is a result
            rows[name] = {"config": detail[name], "status": f"{type(exc).__name__}: {exc}"[:200]}
    for name, fn, context in candidates:
        try:
            report = compare(fn(), ref)
        except Exception as exc:
            rows[name] = {"config": detail[name], "status": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        rows[name] = {"config": detail[name], "status": "ok" if report.passes(problem.dtype) else "wrong_result",
                      "rel_error": report.rel}
        if report.passes(problem.dtype):
            calls[name], contexts[name] = fn, context
    _interleave(calls, contexts, rows, detail, problem, rounds, rep_ms)
    return {"problem": problem.key, "rows": rows}


def aot_report(head_dims: tuple[int, ...] = (192, 256)) -> list[dict]:
    """Every variant compiled for sm_90: spilled bytes, the wgmma groups its waits leave running
    (the PV products behind a step's scores), shared memory, wgmma count, register budgets."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fa_autotune.kernels.aot import resource_usage

    out = []
    for head_dim in head_dims:
        for name, (na, nb, stages, pp) in variants_for(head_dim).items():
            kernel = aot_compile(head_dim, "bfloat16", na, nb, stages, pp)
            _, stack = resource_usage(kernel.asm["cubin"])
            ptx = kernel.asm["ptx"]
            waits = sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)})
            out.append({"head_dim": head_dim, "variant": name, "stack_bytes": stack, "wait_groups": waits,
                        "shared_bytes": kernel.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                        "setmaxnreg": sorted({line.strip() for line in ptx.splitlines() if "setmaxnreg" in line})})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--aot", action="store_true", help="compile every variant for sm_90 and print what it holds")
    parser.add_argument("--head-dim", type=int, choices=(192, 256), help="--aot: only this head dim's variants")
    parser.add_argument("--fa4", action="store_true", help="FlashAttention-4 beside cuDNN")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    args = parser.parse_args()
    if args.aot:
        for row in aot_report((args.head_dim,) if args.head_dim else (192, 256)):
            print(json.dumps(row))
        return
    if args.out is None:
        parser.error("--out is required to measure")
    sys.path.insert(0, str(Path(__file__).parent))
    from gluon_sweep import table

    from fa_autotune.spec.target import environment

    results = []
    for problem in problems():
        results.append(measure(problem, args.rounds, args.rep_ms, args.fa4))
        print(problem.key, {k: round(r.get("tflops", 0)) for k, r in results[-1]["rows"].items()}, flush=True)
    summary = {"environment": environment(), "rounds": args.rounds, "aot": aot_report(), "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "split_key_steps.json").write_text(json.dumps(summary, indent=2) + "\n")
    names = ["cudnn", "tuned", *(["fa4"] if args.fa4 else []), *VARIANTS]
    lines = [f"# Key steps in two parts past D=128 on {summary['environment'].get('gpu')}", "",
             f"Median of {args.rounds} interleaved rounds of {args.rep_ms:.0f} ms; TFLOPS (ratio to cuDNN"
             f"{', to FA4' if args.fa4 else ''}); every output checked against float32 first.", "",
             *table(results, names)]
    (args.out / "split_key_steps.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The Gluon backward past head dim 128 (FlashAttention-3's hdim-256 split): the parts of the
``*_dkdv_wide`` kernel that templates/attn_bwd_gluon.py.jinja renders, as plain ``@gluon.jit``
functions (the template holds the entry point only, whose name spells the variant).

Why a second structure: at D=256 one warpgroup cannot hold dK and dV of 64 keys in fp32
(2 x 64 x 256 values = 256 registers a thread), so the D<=128 kernel's split (each consumer
its own keys) does not fit. Here both consumers share one block of BLOCK_N keys and split
every product in half:
    * S = Q K^T and dP = dO V^T by key columns (consumer w: keys w*BLOCK_N/2...), P and dS
      written into shared memory, the two halves side by side;
    * dV += P^T dO, dK += dS^T Q and dQ = dS K by head-dim columns (consumer w: columns
      w*D/2...), each over all BLOCK_N keys, read back from shared memory once both halves
      are there (two mbarriers a step);
so each consumer holds a BLOCK_N x D/2 half of dK and dV (128 registers at D=256) and the
five products' work is split evenly. dQ leaves in chunks of DQ_COLS columns through a
shared fp32 buffer per consumer and TMA bulk reduce-adds (as in the D<=128 kernel).
Shared memory at D=256, 16-bit inputs: K and V 64 KB, a Q ring of two 64 x 256 tiles
64 KB, dO one tile 32 KB (FlashAttention-3 keeps one too: it is released after the dV
product, early in a step, so the next one lands while dK and dQ run), P and dS 16 KB, dQ
staging 32 KB: 208 KB of the 227 KB.

Past a padded head dim (D_REST > 0, kernels.fwd.d_rest: D=192 pads to 256 with D_REST 64)
the zero columns are not multiplied: S and dP reduce over HEAD_DIM_PAD / 2 + D_REST columns
(two products each), and the second consumer's dV and dK cover its D_REST real columns
(when D_REST is at least a dQ chunk) instead of HEAD_DIM_PAD / 2; its dK and dV leave through
the same half-width TMA boxes, whose columns past D are clipped. dQ's chunks are then dealt
unevenly (_dq_chunks: at D=192 the first consumer one, the second two), so that both do about
the same work a step.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from .gluon_parts import first_q_tile, group_heads, reduce_d, tma_view
from .gluon_tma import async_reduce_add

__all__ = ["DQ_COLS", "wide_consumer", "wide_producer"]

DQ_COLS = gl.constexpr(64)  # dQ columns per bulk reduce (a 64 x 64 fp32 staging tile, 16 KB a consumer)
LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def wide_producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_smem, kv_ready, q_ready, q_empty,
                  do_ready, do_empty, HKV, GROUP, GPP, SPLITS, N_Q, causal_offset,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                  ATOMIC_DKV: gl.constexpr):
    """TMA loads of this program's tile: K and V once, then per query tile of every query
    head of the group Q into the ring (slot c % STAGES, once both consumers released it) and
    dO into its one buffer (once both consumers' dV products have read the last one). A
    fresh mbarrier counts as phase 1 complete, so the first lap does not wait."""
    b, hk, g_lo, g_hi = group_heads(gl.program_id(1), HKV, GROUP, GPP, SPLITS, ATOMIC_DKV)
    start_n = gl.program_id(0) * BLOCK_N
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, hk, start_n, 0], kv_ready, tma_view(k_smem.index(0), k_desc))
    tma.async_copy_global_to_shared(v_desc, [b, hk, start_n, 0], kv_ready, tma_view(v_smem.index(0), v_desc))
    m_lo = first_q_tile(start_n, causal_offset, BLOCK_M, IS_CAUSAL)
    m_hi = gl.cdiv(N_Q, BLOCK_M)
    c = 0
    for g in range(g_lo, g_hi):
        h = hk * GROUP + g
        for i in range(m_lo, m_hi):
            s = c % STAGES
            mbarrier.wait(q_empty.index(s), ((c // STAGES) & 1) ^ 1)
            mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, h, i * BLOCK_M, 0], q_ready.index(s),
                                            tma_view(q_bufs.index(s), q_desc))
            mbarrier.wait(do_empty, (c & 1) ^ 1)
            mbarrier.expect(do_ready, do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [b, h, i * BLOCK_M, 0], do_ready,
                                            tma_view(do_smem.index(0), do_desc))
            c += 1


@gluon.constexpr_function
def _own_cols(wg: int, head_dim_pad: int, d_rest: int) -> int:
    """The head-dim columns consumer wg accumulates dK and dV over: its half, or for the
    second consumer past a padded head dim its d_rest real ones (when a whole dQ chunk)."""
    return d_rest if wg == 1 and d_rest >= DQ_COLS.value else head_dim_pad // 2


@gluon.constexpr_function
def _dq_chunks(wg: int, head_dim_pad: int, d_rest: int) -> tuple[int, int]:
    """(first column, 64-column chunk count) of the dQ = dS K columns consumer wg computes:
    its own columns where both consumers own half, else (past a padded head dim, D=192: dK
    and dV over 128 columns against 64) dQ's chunks dealt to even the two out, the larger
    share to the second: 1 + 2 chunks, 320 against 256 columns of the three products a step
    (384 against 192 with its own columns)."""
    half = head_dim_pad // 2
    rest = _own_cols(1, head_dim_pad, d_rest)
    if rest == half:
        return wg * half, half // DQ_COLS.value
    total = (half + rest) // DQ_COLS.value
    second = (total + 1) // 2
    return (0, total - second) if wg == 0 else ((total - second) * DQ_COLS.value, second)


@gluon.jit
def _wide_step(k_smem, v_smem, q_bufs, do_smem, p_smem, ds_smem, dq_smem, q_ready, q_empty, do_ready, do_empty,
               p_full, ds_full, pds_free, dq_desc, dk, dv, Lse, Delta, b, h, row0, c, q0, k0, N_Q, N_K,
               causal_offset, qk_scale, sm_scale, WG: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HEAD_DIM_PAD: gl.constexpr,
               IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, D_REST: gl.constexpr):
    """One query tile q0 (step c) for consumer WG: its key-column half of S, dP, P and dS,
    then its head-dim half of dV and dK and its dQ chunks (_dq_chunks) over the whole key block."""
    KEYS: gl.constexpr = BLOCK_N // 2
    HALF: gl.constexpr = HEAD_DIM_PAD // 2
    COLS: gl.constexpr = _own_cols(WG, HEAD_DIM_PAD, D_REST)
    DQ0: gl.constexpr = _dq_chunks(WG, HEAD_DIM_PAD, D_REST)[0]
    DQ_N: gl.constexpr = _dq_chunks(WG, HEAD_DIM_PAD, D_REST)[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, KEYS, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    # Indices the compiler cannot prove constant (c < 2**30): the wgmma descriptors of the
    # fixed buffers are computed per step, not hoisted into registers the accumulators need.
    z = c >> 30
    k = k_smem.index(z)
    v = v_smem.index(z)
    p_buf = p_smem.index(z)
    ds_buf = ds_smem.index(z)
    dq_buf = dq_smem.index(WG + z)
    s = c % STAGES
    mbarrier.wait(q_ready.index(s), (c // STAGES) & 1)
    q = q_bufs.index(s)
    s_tok = reduce_d(q, k.slice(WG * KEYS, KEYS, dim=0), gl.zeros([BLOCK_M, KEYS], gl.float32, s_layout), D_REST)
    mbarrier.wait(do_ready, c & 1)
    do = do_smem.index(z)
    dp_tok = reduce_d(do, v.slice(WG * KEYS, KEYS, dim=0), gl.zeros([BLOCK_M, KEYS], gl.float32, s_layout),
                       D_REST)
    rows = q0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse = gl.load(Lse + row0 + rows, mask=rows < N_Q, other=float("inf"))
    lse2 = gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)  # rows that saw no key: P = 0
    delta = gl.load(Delta + row0 + rows, mask=rows < N_Q, other=0.0)
    sc = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, ))
    p = gl.exp2(sc * qk_scale - gl.expand_dims(lse2, 1))
    if MASKED:
        # Keys past N_K (TMA zero-filled) score 0, not -inf: hidden here, since dQ's
        # product would multiply their P and dS by K's zero rows.
        cols = k0 + WG * KEYS + gl.arange(0, KEYS, layout=gl.SliceLayout(0, s_layout))
        visible = gl.expand_dims(cols, 0) < N_K
        if IS_CAUSAL:
            visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1) + causal_offset)
        p = gl.where(visible, p, 0.0)
    mbarrier.wait(pds_free, (c & 1) ^ 1)  # both consumers' last dV, dK and dQ products read P and dS
    p_buf.slice(WG * KEYS, KEYS, dim=1).store(p.to(q.dtype))
    fence_async_shared()
    mbarrier.arrive(p_full)
    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok, ))
    ds = p * (dp - gl.expand_dims(delta, 1))
    ds_buf.slice(WG * KEYS, KEYS, dim=1).store(ds.to(q.dtype))
    fence_async_shared()
    mbarrier.arrive(ds_full)
    mbarrier.wait(p_full, c & 1)  # the other consumer's half of P is there too
    dv_tok = warpgroup_mma(p_buf.permute((1, 0)), do.slice(WG * HALF, COLS, dim=1), dv, is_async=True)
    mbarrier.wait(ds_full, c & 1)
    dk_tok = warpgroup_mma(ds_buf.permute((1, 0)), q.slice(WG * HALF, COLS, dim=1), dk, is_async=True)
    dq_tok = warpgroup_mma(ds_buf, k.slice(DQ0, DQ_COLS, dim=1),
                           gl.zeros([BLOCK_M, DQ_COLS], gl.float32, dq_layout), use_acc=False, is_async=True)
    dv = warpgroup_mma_wait(num_outstanding=2, deps=(dv_tok, ))
    mbarrier.arrive(do_empty)  # dO read by this consumer's dP and dV products
    dk = warpgroup_mma_wait(num_outstanding=1, deps=(dk_tok, ))
    mbarrier.arrive(q_empty.index(s))  # Q read by its S and dK products
    for j in gl.static_range(DQ_N):
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ))
        if j + 1 < DQ_N:  # the next chunk's product runs while this one is added
            dq_tok = warpgroup_mma(ds_buf, k.slice(DQ0 + (j + 1) * DQ_COLS, DQ_COLS, dim=1),
                                   gl.zeros([BLOCK_M, DQ_COLS], gl.float32, dq_layout), use_acc=False,
                                   is_async=True)
        else:
            mbarrier.arrive(pds_free)  # this consumer is done reading P and dS
        tma.store_wait(0)  # the last reduce has read the staging buffer
        dq_buf.store(dq * sm_scale)
        fence_async_shared()
        async_reduce_add(dq_desc, [b, h, q0, DQ0 + j * DQ_COLS], tma_view(dq_buf, dq_desc))
    return dk, dv


@gluon.jit
def wide_consumer(k_smem, v_smem, q_bufs, do_smem, p_smem, ds_smem, dq_smem, kv_ready, q_ready, q_empty, do_ready,
                  do_empty, p_full, ds_full, pds_free, Lse, Delta, dk_desc, dv_desc, dq_desc, DKAcc, DVAcc, HKV,
                  GROUP, GPP, SPLITS, N_Q, N_K, causal_offset, qk_scale, sm_scale, WG: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HEAD_DIM_PAD: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, ATOMIC_DKV: gl.constexpr, SPLIT: gl.constexpr, D_REST: gl.constexpr):
    """Consumer WG: its head-dim half of dK and dV for this program's key block, over every
    query tile of the group's heads (the steps whose rows do not all see every key masked,
    every step with causal_mode "masked" (SPLIT false) or on a ragged last block); then dK * sm_scale and dV stored through TMA (rows
    past N_K and padded columns clipped), or with ATOMIC_DKV added into fp32 buffers."""
    HALF: gl.constexpr = HEAD_DIM_PAD // 2
    COLS: gl.constexpr = _own_cols(WG, HEAD_DIM_PAD, D_REST)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, COLS, 16])
    b, hk, g_lo, g_hi = group_heads(gl.program_id(1), HKV, GROUP, GPP, SPLITS, ATOMIC_DKV)
    k0 = gl.program_id(0) * BLOCK_N
    m_lo = first_q_tile(k0, causal_offset, BLOCK_M, IS_CAUSAL)
    m_hi = gl.cdiv(N_Q, BLOCK_M)
    m_full = m_lo  # query tiles from m_full on see every key of the block (no mask)
    if IS_CAUSAL:
        m_full = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(k0 + BLOCK_N - 1 - causal_offset, 0), BLOCK_M), m_lo),
                            m_hi)
        if not SPLIT:
            m_full = m_hi
    if k0 + BLOCK_N > N_K:
        m_full = m_hi
    dk = gl.zeros([BLOCK_N, COLS], gl.float32, layout=acc_layout)
    dv = gl.zeros([BLOCK_N, COLS], gl.float32, layout=acc_layout)
    mbarrier.wait(kv_ready, 0)
    c = gl.to_tensor(0)
    for g in range(g_lo, g_hi):
        h = hk * GROUP + g
        row0 = (b * HKV * GROUP + h).to(gl.int64) * N_Q
        for i in range(m_lo, m_full):
            dk, dv = _wide_step(k_smem, v_smem, q_bufs, do_smem, p_smem, ds_smem, dq_smem, q_ready, q_empty, do_ready,
                                do_empty, p_full, ds_full, pds_free, dq_desc, dk, dv, Lse, Delta, b, h, row0, c,
                                i * BLOCK_M, k0, N_Q, N_K, causal_offset, qk_scale, sm_scale, WG, BLOCK_M, BLOCK_N,
                                STAGES, HEAD_DIM_PAD, IS_CAUSAL, MASKED=True, D_REST=D_REST)
            c += 1
        for i in range(m_full, m_hi):
            dk, dv = _wide_step(k_smem, v_smem, q_bufs, do_smem, p_smem, ds_smem, dq_smem, q_ready, q_empty, do_ready,
                                do_empty, p_full, ds_full, pds_free, dq_desc, dk, dv, Lse, Delta, b, h, row0, c,
                                i * BLOCK_M, k0, N_Q, N_K, causal_offset, qk_scale, sm_scale, WG, BLOCK_M, BLOCK_N,
                                STAGES, HEAD_DIM_PAD, IS_CAUSAL, MASKED=False, D_REST=D_REST)
            c += 1
    tma.store_wait(0)  # the last dQ reduce has read the staging buffer
    if ATOMIC_DKV:  # a part of the group: added into the fp32 buffers (rows past N_K masked)
        rows = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
        cols = WG * HALF + gl.arange(0, COLS, layout=gl.SliceLayout(0, acc_layout))
        offs = gl.expand_dims(((b * HKV + hk).to(gl.int64) * N_K + rows) * HEAD_DIM_PAD, 1) + gl.expand_dims(cols, 0)
        inside = gl.expand_dims(rows < N_K, 1) & gl.expand_dims(cols >= 0, 0)
        gl.atomic_add(DKAcc + offs, dk * sm_scale, mask=inside, sem="relaxed")
        gl.atomic_add(DVAcc + offs, dv, mask=inside, sem="relaxed")
    else:  # through this consumer's dQ staging buffer (16 KB: a BLOCK_N x D/2 16-bit tile; with
        # COLS < D/2 its other columns lie past D, where the TMA store clips them)
        dtype: gl.constexpr = k_smem.dtype
        out_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], dtype)
        buf = dq_smem.index(WG)._reinterpret(dtype, [BLOCK_N, HALF], out_layout)
        buf.slice(0, COLS, dim=1).store((dk * sm_scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, [b, hk, k0, WG * HALF], tma_view(buf, dk_desc))
        tma.store_wait(0)
        buf.slice(0, COLS, dim=1).store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dv_desc, [b, hk, k0, WG * HALF], tma_view(buf, dv_desc))
        tma.store_wait(0)

"""Gluon helpers that the generated FlashAttention-3 kernels share, forward and backward
(templates/attn_fwd_gluon.py.jinja, attn_bwd_gluon.py.jinja import them): plain
``@gluon.jit`` functions, so that the templates keep Jinja for text that must vary only.
Generated kernels import this module; it holds no kernel of its own.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

__all__ = ["first_q_tile", "group_heads", "post_value", "read_value", "reduce_d", "tma_view"]


@gluon.jit
def tma_view(buf, desc):
    """A 2-D [rows, HEAD_DIM_PAD] tile seen as the rank-4 (1, 1, rows, HEAD_DIM_PAD) box the
    descriptors move: the same bytes and swizzle."""
    return buf._reinterpret(buf.dtype, desc.block_type.shape, desc.layout)


@gluon.jit
def post_value(slots, slot, value):
    """The producer posts ``value`` in int32 shared-memory slot ``slot`` (every thread of its
    4 warps writes the same value; the mbarrier arrive that follows releases it to the
    consumers: a tile id beside its K/V or Q buffers, or a varlen tile's bounds)."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    slots.index(slot).store(gl.full([1], value, gl.int32, one))


@gluon.jit
def read_value(slots, slot):
    """The value posted in ``slot`` (read by a 4-warp partition after waiting on the mbarrier
    the producer arrived on after posting it)."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return gl.max(slots.index(slot).load(one), 0)


@gluon.jit
def group_heads(bhk, HKV, GROUP, GPP, SPLITS, ATOMIC_DKV: gl.constexpr):
    """The backward's work item bhk: batch, KV head and the group's query heads [g_lo, g_hi)
    (with ATOMIC_DKV one part of SPLITS of a (batch, KV head); else the whole group)."""
    if ATOMIC_DKV:
        bh = bhk // SPLITS
        g_lo = bhk % SPLITS * GPP
        g_hi = gl.minimum(g_lo + GPP, GROUP)
    else:
        bh = bhk
        g_lo = 0
        g_hi = GROUP
    return bh // HKV, bh % HKV, g_lo, g_hi


@gluon.jit
def first_q_tile(start_n, causal_offset, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """The first query tile of BLOCK_M rows that sees any key from start_n (query i sees key
    j when j <= i + causal_offset)."""
    m_lo = 0
    if IS_CAUSAL:
        m_lo = gl.maximum(start_n - causal_offset, 0) // BLOCK_M
    return m_lo


@gluon.jit
def reduce_d(a, b, zero, D_REST: gl.constexpr):
    """a @ b^T over the head dim (a: rows x HEAD_DIM_PAD, b: keys x HEAD_DIM_PAD in shared
    memory), issued async: past a padded head dim (D_REST > 0, kernels.fwd.d_rest) two
    products, one wgmma group each, over the first half and the next D_REST columns, so that
    the zero columns are not multiplied (D=96: 6 k-steps of 16 in place of 8)."""
    if D_REST == 0:
        tok = warpgroup_mma(a, b.permute((1, 0)), zero, use_acc=False, is_async=True)
    else:
        HALF: gl.constexpr = a.shape[1] // 2
        tok = warpgroup_mma(a.slice(0, HALF, dim=1), b.slice(0, HALF, dim=1).permute((1, 0)), zero, use_acc=False,
                            is_async=True)
        tok = warpgroup_mma(a.slice(HALF, D_REST, dim=1), b.slice(HALF, D_REST, dim=1).permute((1, 0)), tok,
                            is_async=True)
    return tok

"""Fused FP8 quantization on the GPU: rotation, group maxima and scaling in Triton kernels.

The eager-PyTorch path of :func:`fa_autotune.quantize_fp8` makes a dozen float32 copies of
each input (Hadamard butterflies, maxima, division, clamp, cast) and cost several times the
FP8 attention kernel it feeds. Here per-tensor and per-head scaling read each input twice in
its own dtype and write it once as FP8:

1. ``_chunk_amax``: per CHUNK rows of one head, the max |x M| (M = the signed Hadamard
   matrix, or the identity), NaN counted as inf so that a bad input cannot hide.
2. ``_scale_cast``: x M again, divided by its group's descale (amax / fmt_max, as the eager
   path defines it), clamped and cast; stored with any output strides (V goes out
   sequence-contiguous for the FP8 PV product). Per-tensor and per-head descales come from
   a few tiny torch ops in between.

Per-block scaling (the default recipe) is one launch per tensor, ``_quantize_blocks``: a
program owns one scaling block, takes its maximum over CHUNK-row pieces and then scales and
casts the same pieces, which it has just read (the second read comes from L2, so the input
crosses DRAM once).

The rotation is one ``tl.dot`` with M's entries ±1 (exact in fp16 and bf16) and float32
accumulation, scaled by 1/sqrt(n) afterwards: the same values as the butterflies up to
float32 summation order.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..spec.target import interpreter_active
from .hadamard import padded_dim

CHUNK = 64  # rows per program; a scaling block (a power of two >= 16) smaller than this sets the chunk


def block_stages(dp: int) -> int:
    """Pipeline depth of _quantize_blocks' piece loop for padded head dim ``dp``: each stage
    buffers a piece and the rotation matrix (48 KB at 128, 160 KB at 256 in fp16), so past
    128 one stage (three asked for 499712 bytes of shared memory on an H200 at D=256)."""
    return 3 if dp <= 128 else 1


@triton.jit
def _rotate(x_ptr, m_ptr, bh, chunk, stride_b, stride_h, stride_n, stride_d, heads, N,
            D: tl.constexpr, DP: tl.constexpr, ROWS: tl.constexpr, ROTATE: tl.constexpr, INTERPRET: tl.constexpr):
    """(rows, mask) of this program's ROWS x DP tile, times M when ROTATE (float32)."""
    rows = chunk * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, DP)
    mask = (rows[:, None] < N) & (cols[None, :] < D)
    base = x_ptr + (bh // heads).to(tl.int64) * stride_b + (bh % heads).to(tl.int64) * stride_h
    x = tl.load(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :] * stride_d, mask=mask, other=0.0)
    if ROTATE:
        m = tl.load(m_ptr + cols[:, None] * DP + cols[None, :])
        if INTERPRET:  # the interpreter's bf16 dot is wrong; float32 gives the same exact products
            y = tl.dot(x.to(tl.float32), m.to(tl.float32), input_precision="ieee")
        else:
            y = tl.dot(x, m, out_dtype=tl.float32)
    else:
        y = x.to(tl.float32)
    return y, rows, mask


@triton.jit
def _chunk_amax(x_ptr, m_ptr, amax_ptr, stride_b, stride_h, stride_n, stride_d, heads, N, n_chunks, inv_sqrt_n,
                D: tl.constexpr, DP: tl.constexpr, ROWS: tl.constexpr, ROTATE: tl.constexpr, INTERPRET: tl.constexpr):
    bh, chunk = tl.program_id(0), tl.program_id(1)
    y, rows, mask = _rotate(x_ptr, m_ptr, bh, chunk, stride_b, stride_h, stride_n, stride_d, heads, N, D, DP, ROWS,
                            ROTATE, INTERPRET)
    a = tl.where(y == y, tl.abs(y * inv_sqrt_n), float("inf"))  # NaN counts as inf
    tl.store(amax_ptr + bh.to(tl.int64) * n_chunks + chunk, tl.max(tl.max(a, axis=1), axis=0))


@triton.jit
def _fp8_grid(x, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """x rounded to the nearest value of an FP8 format (ties to even), in float32."""
    a = tl.abs(x)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), EMIN)
    ulp = tl.exp2(e - MBITS)
    r = a / ulp
    f = tl.floor(r)
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    up = (r - f > 0.5) | ((r - f == 0.5) & odd)
    return tl.where(x < 0, -1.0, 1.0) * tl.where(up, f + 1.0, f) * ulp


@triton.jit
def _scale_cast(x_ptr, m_ptr, scale_ptr, out_ptr, stride_b, stride_h, stride_n, stride_d, o_stride_b,
                o_stride_h, o_stride_n, o_stride_d, s_stride_b, s_stride_h, s_stride_n, heads, N,
                inv_sqrt_n, fmax, BLOCK: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                ROWS: tl.constexpr, ROTATE: tl.constexpr, INTERPRET: tl.constexpr,
                MBITS: tl.constexpr, EMIN: tl.constexpr, WGMMA_ORDER: tl.constexpr):
    bh, chunk = tl.program_id(0), tl.program_id(1)
    y, rows, mask = _rotate(x_ptr, m_ptr, bh, chunk, stride_b, stride_h, stride_n, stride_d, heads, N, D, DP, ROWS,
                            ROTATE, INTERPRET)
    b, h = (bh // heads).to(tl.int64), (bh % heads).to(tl.int64)
    scale = tl.load(scale_ptr + b * s_stride_b + h * s_stride_h + (rows // BLOCK) * s_stride_n, mask=rows < N,
                    other=1.0)
    _cast_store(y * inv_sqrt_n / scale[:, None], out_ptr, b, h, rows, mask, o_stride_b, o_stride_h, o_stride_n,
                o_stride_d, fmax, DP, INTERPRET, MBITS, EMIN, WGMMA_ORDER)


@triton.jit
def wgmma_position(rows):
    """Where V's key ``rows`` sit in the wgmma order (quantize.V_ORDERS): within each 16 keys,
    key 8a + 2c + b at 4c + 2a + b, the A-operand byte an FP8 wgmma's thread c reads for the
    accumulator column it holds (the P tile's keys then stay in their thread)."""
    return (rows & -16) | (((rows >> 1) & 3) << 2) | (((rows >> 3) & 1) << 1) | (rows & 1)


@triton.jit
def _cast_store(y, out_ptr, b, h, rows, mask, o_stride_b, o_stride_h, o_stride_n, o_stride_d, fmax,
                DP: tl.constexpr, INTERPRET: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                WGMMA_ORDER: tl.constexpr = False):
    """Clamp scaled values to the format's range, cast and store them (any output strides;
    ``WGMMA_ORDER``: each row at its wgmma_position)."""
    q = tl.clamp(y, -fmax, fmax)
    if INTERPRET:  # Triton 3.6's interpreter loses the exponent carry when it rounds to FP8
        q = _fp8_grid(q, MBITS, EMIN)
    cols = tl.arange(0, DP)
    if WGMMA_ORDER:
        rows = wgmma_position(rows)
    out = (out_ptr + b * o_stride_b + h * o_stride_h + rows[:, None].to(tl.int64) * o_stride_n
           + cols[None, :] * o_stride_d)
    tl.store(out, q.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_blocks(x_ptr, m_ptr, scale_ptr, out_ptr, stride_b, stride_h, stride_n, stride_d, o_stride_b,
                     o_stride_h, o_stride_n, o_stride_d, s_stride_b, s_stride_h, s_stride_n, heads, N, inv_sqrt_n,
                     fmax, BLOCK: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, ROWS: tl.constexpr,
                     ROTATE: tl.constexpr, INTERPRET: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                     WGMMA_ORDER: tl.constexpr):
    """Per-block scaling in one launch: this program's BLOCK rows in ROWS-row pieces, their
    maximum |x M| first (NaN counted as inf), then the descale (amax / fmax; 1 for an
    all-zero block, never below float32's tiny; NaN for a block holding NaN or inf, as
    quantize._scale_of says) stored and the same pieces scaled and cast."""
    bh, blk = tl.program_id(0), tl.program_id(1)
    first = blk * (BLOCK // ROWS)
    amax = tl.full([], 0.0, tl.float32)
    for i in range(BLOCK // ROWS):
        y, rows, mask = _rotate(x_ptr, m_ptr, bh, first + i, stride_b, stride_h, stride_n, stride_d, heads, N, D, DP,
                                ROWS, ROTATE, INTERPRET)
        a = tl.where(y == y, tl.abs(y * inv_sqrt_n), float("inf"))
        amax = tl.maximum(amax, tl.max(tl.max(a, axis=1), axis=0))
    scale = tl.maximum(tl.where(amax > 0, amax / fmax, 1.0), 1.1754943508222875e-38)
    scale = tl.where(amax == float("inf"), float("nan"), scale)
    b, h = (bh // heads).to(tl.int64), (bh % heads).to(tl.int64)
    tl.store(scale_ptr + b * s_stride_b + h * s_stride_h + blk * s_stride_n, scale)
    for i in range(BLOCK // ROWS):
        y, rows, mask = _rotate(x_ptr, m_ptr, bh, first + i, stride_b, stride_h, stride_n, stride_d, heads, N, D, DP,
                                ROWS, ROTATE, INTERPRET)
        _cast_store(y * inv_sqrt_n / scale, out_ptr, b, h, rows, mask, o_stride_b, o_stride_h, o_stride_n,
                    o_stride_d, fmax, DP, INTERPRET, MBITS, EMIN, WGMMA_ORDER)


def chunk_amax(x: torch.Tensor, m: torch.Tensor | None, rows: int = CHUNK) -> torch.Tensor:
    """(B, H, ceil(N / rows)) float32 max |x M| / sqrt(n) per ``rows`` rows (inf for NaN)."""
    batch, heads, n, d = x.shape
    n_chunks = triton.cdiv(n, rows)
    amax = torch.empty(batch, heads, n_chunks, device=x.device, dtype=torch.float32)
    _chunk_amax[(batch * heads, n_chunks)](
        x, m if m is not None else x, amax, *x.stride(), heads, n, n_chunks, _inv_sqrt_n(d, m), D=d,
        DP=padded_dim(d), ROWS=rows, ROTATE=m is not None, INTERPRET=_interpreting())
    return amax


def scale_cast(x: torch.Tensor, m: torch.Tensor | None, scale: torch.Tensor, block: int, fmax: float,
               out: torch.Tensor, wgmma_order: bool = False) -> torch.Tensor:
    """Write x M / scale[row // block], clamped to ±fmax, into FP8 ``out`` (any strides;
    ``wgmma_order``: rows at their wgmma_position)."""
    batch, heads, n, d = x.shape
    _scale_cast[(batch * heads, triton.cdiv(n, CHUNK))](
        x, m if m is not None else x, scale, out, *x.stride(), *out.stride(), *scale.stride(), heads, n,
        _inv_sqrt_n(d, m), fmax, BLOCK=block, D=d, DP=padded_dim(d), ROWS=CHUNK, ROTATE=m is not None,
        INTERPRET=_interpreting(), **_format(out), WGMMA_ORDER=wgmma_order)
    return out


def quantize_blocks(x: torch.Tensor, m: torch.Tensor | None, block: int, fmax: float,
                    out: torch.Tensor, wgmma_order: bool = False) -> torch.Tensor:
    """Per-block scaling in one launch: write x M / its block's descale into FP8 ``out`` (any
    strides; ``wgmma_order``: rows at their wgmma_position) and return the (B, H,
    ceil(N / block)) float32 descales."""
    batch, heads, n, d = x.shape
    scale = torch.empty(batch, heads, triton.cdiv(n, block), device=x.device, dtype=torch.float32)
    _quantize_blocks[(batch * heads, scale.shape[2])](
        x, m if m is not None else x, scale, out, *x.stride(), *out.stride(), *scale.stride(), heads, n,
        _inv_sqrt_n(d, m), fmax, BLOCK=block, D=d, DP=padded_dim(d), ROWS=min(CHUNK, block), ROTATE=m is not None,
        INTERPRET=_interpreting(), **_format(out), WGMMA_ORDER=wgmma_order, num_stages=block_stages(padded_dim(d)))
    return scale


def _format(out: torch.Tensor) -> dict:
    """The FP8 format's mantissa bits and smallest normal exponent (the interpreter's rounding)."""
    e4m3 = out.dtype == torch.float8_e4m3fn
    return {"MBITS": 3 if e4m3 else 2, "EMIN": -6 if e4m3 else -14}


def _interpreting() -> bool:
    return interpreter_active()


def _inv_sqrt_n(d: int, m: torch.Tensor | None) -> float:
    return 1.0 / math.sqrt(d & -d) if m is not None else 1.0

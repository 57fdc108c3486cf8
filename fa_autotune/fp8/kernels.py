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

Per-block scaling (the default recipe) is one launch per tensor, ``_quantize_blocks``, on a
persistent grid: each program loads the rotation matrix once and walks scaling blocks; a
block of up to 32768 values (256 x 128) is read once, rotated, reduced to its maximum and
cast from registers (larger blocks, and V's blocks at head dims 65-128, which it stores
transposed, go in pieces read twice, the second time from L2). V's wgmma order is gathered
on the load side, so every FP8 store is 16 bytes wide.

The rotation is one ``tl.dot`` with M's entries ±1 (exact in fp16 and bf16) and float32
accumulation, scaled by 1/sqrt(n) afterwards: the same values as the butterflies up to
float32 summation order.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..errors import InputError
from ..spec.target import detect_gpu, interpreter_active
from .hadamard import padded_dim

CHUNK = 64  # rows per program; a scaling block (a power of two >= 16) smaller than this sets the chunk


@triton.jit
def _rotate(x_ptr, m_ptr, bh, chunk, stride_b, stride_h, stride_n, stride_d, heads, N,
            D: tl.constexpr, DP: tl.constexpr, ROWS: tl.constexpr, ROTATE: tl.constexpr, INTERPRET: tl.constexpr,
            WGMMA_ORDER: tl.constexpr = False):
    """_rotate_tile for head ``bh``, loading M first."""
    base = x_ptr + (bh // heads).to(tl.int64) * stride_b + (bh % heads).to(tl.int64) * stride_h
    cols = tl.arange(0, DP)
    m = tl.load(m_ptr + cols[:, None] * DP + cols[None, :]) if ROTATE else 0.0
    return _rotate_tile(base, m, chunk, stride_n, stride_d, N, D, DP, ROWS, ROTATE, INTERPRET, WGMMA_ORDER)


@triton.jit
def _chunk_amax(x_ptr, m_ptr, amax_ptr, stride_b, stride_h, stride_n, stride_d, heads, N, n_chunks, inv_sqrt_n,
                D: tl.constexpr, DP: tl.constexpr, ROWS: tl.constexpr, ROTATE: tl.constexpr, INTERPRET: tl.constexpr):
    bh, chunk = tl.program_id(0), tl.program_id(1)
    y, rows, mask = _rotate(x_ptr, m_ptr, bh, chunk, stride_b, stride_h, stride_n, stride_d, heads, N, D, DP, ROWS,
                            ROTATE, INTERPRET)
    tl.store(amax_ptr + bh.to(tl.int64) * n_chunks + chunk, _block_amax(y, inv_sqrt_n))


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
                            ROTATE, INTERPRET, WGMMA_ORDER)
    b, h = (bh // heads).to(tl.int64), (bh % heads).to(tl.int64)
    scale = tl.load(scale_ptr + b * s_stride_b + h * s_stride_h + (rows // BLOCK) * s_stride_n, mask=rows < N,
                    other=1.0)
    _cast_store(y * inv_sqrt_n / scale[:, None], out_ptr, b, h, rows, mask, o_stride_b, o_stride_h, o_stride_n,
                o_stride_d, fmax, DP, INTERPRET, MBITS, EMIN)


@triton.jit
def wgmma_key(pos):
    """The key stored at V position ``pos`` in the wgmma order (quantize.V_ORDERS): within
    each 16, key 8a + 2c + b sits at 4c + 2a + b, the A-operand byte an FP8 wgmma's thread c
    reads for the accumulator column it holds (the P tile's keys then stay in their thread).
    Keys never leave their group of 16, so a scaling block (a multiple of 16) keeps its keys."""
    return (pos & -16) | (((pos >> 1) & 1) << 3) | (((pos >> 2) & 3) << 1) | (pos & 1)


@triton.jit
def _cast_store(y, out_ptr, b, h, pos, mask, o_stride_b, o_stride_h, o_stride_n, o_stride_d, fmax,
                DP: tl.constexpr, INTERPRET: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                COL0: tl.constexpr = 0):
    """Clamp scaled values to the format's range, cast and store them at positions ``pos``,
    columns COL0 to COL0 + DP (any output strides)."""
    q = tl.clamp(y, -fmax, fmax)
    if INTERPRET:  # Triton 3.6's interpreter loses the exponent carry when it rounds to FP8
        q = _fp8_grid(q, MBITS, EMIN)
    cols = COL0 + tl.arange(0, DP)
    out = (out_ptr + b * o_stride_b + h * o_stride_h + pos[:, None].to(tl.int64) * o_stride_n
           + cols[None, :] * o_stride_d)
    tl.store(out, q.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _block_amax(y, inv_sqrt_n):
    """max |y| / sqrt(n) of a tile, NaN counted as inf (so that a bad input cannot hide)."""
    a = tl.where(y == y, tl.abs(y * inv_sqrt_n), float("inf"))
    return tl.max(tl.max(a, axis=1), axis=0)


@triton.jit
def _quantize_blocks(x_ptr, m_ptr, scale_ptr, out_ptr, stride_b, stride_h, stride_n, stride_d, o_stride_b,
                     o_stride_h, o_stride_n, o_stride_d, s_stride_b, s_stride_h, s_stride_n, heads, N, n_blocks,
                     total, inv_sqrt_n, fmax, BLOCK: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                     ROWS: tl.constexpr, ROTATE: tl.constexpr, INTERPRET: tl.constexpr, MBITS: tl.constexpr,
                     EMIN: tl.constexpr, WGMMA_ORDER: tl.constexpr, STAGES: tl.constexpr, HALVES: tl.constexpr,
                     FULL: tl.constexpr):
    """Per-block scaling in one launch on a persistent grid: each program walks scaling
    blocks (``total`` of them, ``n_blocks`` per head) with the rotation matrix loaded once.
    A block of ROWS == BLOCK rows is read once and held in registers from maximum to cast;
    a larger one goes in ROWS-row pieces, read again for the cast (from L2). HALVES (a
    rotated head padded to 256): m_ptr holds hadamard.hadamard_halves' (256, 128) [M_L; M_R]
    and each tile is two 128-wide products (FULL: D = 256, combined as [A + B, A - B]). The
    descale is amax / fmax; 1 for an all-zero block, never below float32's tiny; NaN for a
    block holding NaN or inf, as quantize._scale_of says."""
    MW: tl.constexpr = DP // 2 if HALVES else DP
    cols = tl.arange(0, MW)
    if ROTATE:
        m = tl.load(m_ptr + cols[:, None] * MW + cols[None, :])
    else:
        m = 0.0
    if HALVES:
        mr = tl.load(m_ptr + (MW + cols[:, None]) * MW + cols[None, :])
    else:
        mr = 0.0
    for t in tl.range(tl.program_id(0), total, tl.num_programs(0), num_stages=STAGES):
        bh = t // n_blocks
        blk = t - bh * n_blocks
        b, h = (bh // heads).to(tl.int64), (bh % heads).to(tl.int64)
        base = x_ptr + b * stride_b + h * stride_h
        if HALVES and ROWS == BLOCK:
            yl, yr, rows, mask_l, mask_r = _rotate_halves(base, m, mr, blk, stride_n, stride_d, N, D, ROWS, FULL,
                                                          INTERPRET, WGMMA_ORDER)
            scale = _descale_of(tl.maximum(_block_amax(yl, inv_sqrt_n), _block_amax(yr, inv_sqrt_n)), fmax)
            tl.store(scale_ptr + b * s_stride_b + h * s_stride_h + blk * s_stride_n, scale)
            _cast_store(yl * inv_sqrt_n / scale, out_ptr, b, h, rows, mask_l, o_stride_b, o_stride_h, o_stride_n,
                        o_stride_d, fmax, MW, INTERPRET, MBITS, EMIN)
            _cast_store(yr * inv_sqrt_n / scale, out_ptr, b, h, rows, mask_r, o_stride_b, o_stride_h, o_stride_n,
                        o_stride_d, fmax, MW, INTERPRET, MBITS, EMIN, MW)
        elif ROWS == BLOCK:
            y, rows, mask = _rotate_tile(base, m, blk, stride_n, stride_d, N, D, DP, ROWS, ROTATE, INTERPRET,
                                         WGMMA_ORDER)
            scale = _descale_of(_block_amax(y, inv_sqrt_n), fmax)
            tl.store(scale_ptr + b * s_stride_b + h * s_stride_h + blk * s_stride_n, scale)
            _cast_store(y * inv_sqrt_n / scale, out_ptr, b, h, rows, mask, o_stride_b, o_stride_h, o_stride_n,
                        o_stride_d, fmax, DP, INTERPRET, MBITS, EMIN)
        else:
            first = blk * (BLOCK // ROWS)
            amax = tl.full([], 0.0, tl.float32)
            for i in tl.range(BLOCK // ROWS, num_stages=1):
                y, rows, mask = _rotate_tile(base, m, first + i, stride_n, stride_d, N, D, DP, ROWS, ROTATE,
                                             INTERPRET, WGMMA_ORDER)
                amax = tl.maximum(amax, _block_amax(y, inv_sqrt_n))
            scale = _descale_of(amax, fmax)
            tl.store(scale_ptr + b * s_stride_b + h * s_stride_h + blk * s_stride_n, scale)
            for i in tl.range(BLOCK // ROWS, num_stages=1):
                y, rows, mask = _rotate_tile(base, m, first + i, stride_n, stride_d, N, D, DP, ROWS, ROTATE,
                                             INTERPRET, WGMMA_ORDER)
                _cast_store(y * inv_sqrt_n / scale, out_ptr, b, h, rows, mask, o_stride_b, o_stride_h, o_stride_n,
                            o_stride_d, fmax, DP, INTERPRET, MBITS, EMIN)


@triton.jit
def _rotate_tile(base, m, chunk, stride_n, stride_d, N, D: tl.constexpr, DP: tl.constexpr, ROWS: tl.constexpr,
                 ROTATE: tl.constexpr, INTERPRET: tl.constexpr, WGMMA_ORDER: tl.constexpr = False):
    """(x M, positions, mask) of one head's ROWS x DP tile ``chunk`` of output positions
    (``base`` points at the head) with M already loaded (float32; x itself when not ROTATE).
    ``WGMMA_ORDER``: position p holds key wgmma_key(p), gathered here (each row is still one
    contiguous read) so that the FP8 store runs along contiguous positions; the mask reads
    the positions (the same rows: the wgmma order needs N a multiple of 16), which keeps the
    store vectorized."""
    pos = chunk * ROWS + tl.arange(0, ROWS)
    rows = wgmma_key(pos) if WGMMA_ORDER else pos
    cols = tl.arange(0, DP)
    mask = (pos[:, None] < N) & (cols[None, :] < D)
    x = tl.load(base + rows[:, None].to(tl.int64) * stride_n + cols[None, :] * stride_d, mask=mask, other=0.0)
    if ROTATE:
        y = _times(x, m, INTERPRET)
    elif INTERPRET:  # the interpreter has no bf16 scalars to mix with it
        y = x.to(tl.float32)
    else:  # kept in its 16 bits until the cast (half the registers of a float32 tile)
        y = x
    return y, pos, mask


@triton.jit
def _times(x, m, INTERPRET: tl.constexpr):
    """x @ m in float32 (the interpreter's bf16 dot is wrong; float32 gives the same exact products)."""
    if INTERPRET:
        y = tl.dot(x.to(tl.float32), m.to(tl.float32), input_precision="ieee")
    else:
        y = tl.dot(x, m, out_dtype=tl.float32)
    return y


@triton.jit
def _rotate_halves(base, m_left, m_right, chunk, stride_n, stride_d, N, D: tl.constexpr, ROWS: tl.constexpr,
                   FULL: tl.constexpr, INTERPRET: tl.constexpr, WGMMA_ORDER: tl.constexpr):
    """_rotate_tile for a head padded to 256, as two 128-wide products with M_L and M_R
    (hadamard.hadamard_halves): (left, right, positions, left mask, right mask)."""
    pos = chunk * ROWS + tl.arange(0, ROWS)
    rows = wgmma_key(pos) if WGMMA_ORDER else pos
    cols = tl.arange(0, 128)
    ptr = base + rows[:, None].to(tl.int64) * stride_n + cols[None, :] * stride_d
    ml = (pos[:, None] < N) & (cols[None, :] < D)
    mr = (pos[:, None] < N) & (cols[None, :] + 128 < D)
    a = _times(tl.load(ptr, mask=ml, other=0.0), m_left, INTERPRET)
    c = _times(tl.load(ptr + 128 * stride_d, mask=mr, other=0.0), m_right, INTERPRET)
    if FULL:
        left = a + c
        right = a - c
    else:
        left = a
        right = c
    return left, right, pos, ml, mr


@triton.jit
def _descale_of(amax, fmax):
    scale = tl.maximum(tl.where(amax > 0, amax / fmax, 1.0), 1.1754943508222875e-38)
    return tl.where(amax == float("inf"), float("nan"), scale)


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
    ``wgmma_order``: keys in the wgmma order, kernels.wgmma_key)."""
    batch, heads, n, d = x.shape
    _check_wgmma_rows(n, wgmma_order)
    _scale_cast[(batch * heads, triton.cdiv(n, CHUNK))](
        x, m if m is not None else x, scale, out, *x.stride(), *out.stride(), *scale.stride(), heads, n,
        _inv_sqrt_n(d, m), fmax, BLOCK=block, D=d, DP=padded_dim(d), ROWS=CHUNK, ROTATE=m is not None,
        INTERPRET=_interpreting(), **_format(out), WGMMA_ORDER=wgmma_order)
    return out


def quantize_blocks(x: torch.Tensor, m: torch.Tensor | None, block: int, fmax: float, out: torch.Tensor,
                    wgmma_order: bool = False, halves: torch.Tensor | None = None) -> torch.Tensor:
    """Per-block scaling in one launch: write x M / its block's descale into FP8 ``out`` (any
    strides; ``wgmma_order``: keys in the wgmma order, kernels.wgmma_key) and return the (B, H,
    ceil(N / block)) float32 descales. ``halves``: M as hadamard.hadamard_halves gives it, used
    where block_launch says (a head padded to 256, blocks of up to 128 rows)."""
    batch, heads, n, d = x.shape
    _check_wgmma_rows(n, wgmma_order)
    scale = torch.empty(batch, heads, triton.cdiv(n, block), device=x.device, dtype=torch.float32)
    dp = padded_dim(d)
    launch = block_launch(block, dp, m is not None, halves is not None, transposed=out.stride(3) != 1)
    total = batch * heads * scale.shape[2]
    grid = (max(1, min(total, _sm_count(x.device) * launch.programs_per_sm)),)
    rotation = halves if launch.halves else m if m is not None else x  # x: a pointer the kernel never reads
    _quantize_blocks[grid](
        x, rotation, scale, out, *x.stride(), *out.stride(), *scale.stride(), heads, n, scale.shape[2], total,
        _inv_sqrt_n(d, m), fmax, BLOCK=block, D=d, DP=dp, ROWS=launch.rows, ROTATE=m is not None,
        INTERPRET=_interpreting(), **_format(out), WGMMA_ORDER=wgmma_order, STAGES=launch.stages,
        HALVES=launch.halves, FULL=launch.halves and d & -d == dp, num_warps=launch.warps)
    return scale


class BlockLaunch(NamedTuple):
    """How _quantize_blocks runs for one (block, padded head dim)."""
    rows: int  # rows per tile: the whole block when it fits registers, else pieces read twice
    warps: int
    stages: int  # tiles in flight per program (the loop's software pipeline)
    programs_per_sm: int
    halves: bool = False  # the rotation as two 128-wide products (hadamard.hadamard_halves)


def block_launch(block: int, dp: int, rotate: bool = True, halves: bool = False,
                 transposed: bool = False) -> BlockLaunch:
    """Tiles of at most 32768 values (64 float32 registers a thread at 16 warps), so a block
    up to 256 x 128 is read from DRAM once and cast from registers (but for the transposed
    outputs below). A rotated head padded to 256 takes the rotation in halves when they are
    given and its blocks hold at most 128 rows (64 KB of shared memory for the matrix
    instead of 128, so two stages fit); other
    rotated tiles past D=128 take one stage, and V (not rotated, stored transposed) tiles of
    64 rows there, which ptxas fits without spilling. A ``transposed`` output (V, sequence
    axis contiguous) padded to 128 goes in 64-row pieces on 4 warps too: with whole 128- or
    256-row tiles, V's kernel (their transpose through shared memory) took half the
    quantizer's time, more than reading the block twice costs
    (benchmarks/results/2026-12-07-h100-fp8-v-transpose/)."""
    halves = halves and rotate and dp == 256 and block * dp <= _TILE_VALUES
    rows = min(block, (_TILE_VALUES if rotate or dp <= 128 else _TILE_VALUES // 2) // dp)
    if transposed and dp == 128 and block > 64:
        rows = 64
    warps = max(4, min(16, rows * dp // 2048))
    return BlockLaunch(rows=rows, warps=warps, stages=2 if dp <= 128 or not rotate or halves else 1,
                       programs_per_sm=max(1, 16 // warps), halves=halves)


_TILE_VALUES = 32768


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors, as the dispatcher detected them (fp8 sits below kernels, so
    not kernels.launch's); the interpreter gets 2, so its programs walk several blocks."""
    if device.type != "cuda":
        return 2
    return detect_gpu(device.index if device.index is not None else torch.cuda.current_device()).sm_count


def _check_wgmma_rows(n: int, wgmma_order: bool) -> None:
    """The kernels mask the wgmma order by position, which is the key's group of 16."""
    if wgmma_order and n % 16:
        raise InputError(f"the wgmma order permutes keys within groups of 16; {n} keys are not a multiple of 16")


def _format(out: torch.Tensor) -> dict:
    """The FP8 format's mantissa bits and smallest normal exponent (the interpreter's rounding)."""
    e4m3 = out.dtype == torch.float8_e4m3fn
    return {"MBITS": 3 if e4m3 else 2, "EMIN": -6 if e4m3 else -14}


def _interpreting() -> bool:
    return interpreter_active()


def _inv_sqrt_n(d: int, m: torch.Tensor | None) -> float:
    return 1.0 / math.sqrt(d & -d) if m is not None else 1.0

"""The tile table of a packed (varlen) batch, written on the device.

A varlen grid over the longest sequence's tiles leaves most programs of a batch of short
sequences drawing tiles past their sequence's end (64 sequences of 64-2048 tokens: about
half the grid). The Gluon varlen kernels instead walk only real tiles: sequence b owns
query tiles [TileStart[b], TileStart[b + 1]) of each head, TileStart being the running
count of ceil(n_q / TILE_M). Computing it on the device keeps the launch free of host
reads (serving engines capture varlen calls in CUDA graphs, with lengths that change
between replays).
"""
from __future__ import annotations

import triton
import triton.language as tl

SCAN_BLOCK = tl.constexpr(1024)


@triton.jit
def tile_starts(CuSeqQ, TileStart, B, TILE_M: tl.constexpr):
    """TileStart[0] = 0, TileStart[b + 1] = sum over b' <= b of cdiv(CuSeqQ[b' + 1] -
    CuSeqQ[b'], TILE_M): one program, SCAN_BLOCK sequences at a time."""
    tl.store(TileStart, 0)
    total = 0
    for first in range(0, B, SCAN_BLOCK):
        i = first + tl.arange(0, SCAN_BLOCK)
        lo = tl.load(CuSeqQ + i, mask=i < B, other=0)
        hi = tl.load(CuSeqQ + i + 1, mask=i < B, other=0)
        ends = total + tl.cumsum(tl.cdiv(hi - lo, TILE_M), 0)
        tl.store(TileStart + i + 1, ends, mask=i < B)
        total = tl.max(tl.where(i < B, ends, 0), 0)

"""The tile table of a packed (varlen) batch, written on the device.

A varlen grid over the longest sequence's tiles leaves most programs of a batch of short
sequences drawing tiles past their sequence's end (64 sequences of 64-2048 tokens: about
half the grid). The Gluon varlen kernels instead walk only real tiles: sequence b owns
tiles [TileStart[b], TileStart[b + 1]), TileStart being the running count of every
sequence's tiles over all H heads: cdiv(n_q, TILE_M) per head, except that a last tile
whose rows fit one consumer warpgroup (n_q % TILE_M <= TAIL_ROWS) is shared by TAIL_HEADS
query heads of one KV group, one per warpgroup (H / TAIL_HEADS such tiles instead of H:
the warpgroups that would hold no rows of that tile work on another head's). Computing it
on the device keeps the launch free of host reads (serving engines capture varlen calls in
CUDA graphs, with lengths that change between replays).
"""
from __future__ import annotations

import triton
import triton.language as tl

SCAN_BLOCK = tl.constexpr(1024)


@triton.jit
def tile_starts(CuSeqQ, TileStart, B, H, TILE_M: tl.constexpr, TAIL_ROWS: tl.constexpr, TAIL_HEADS: tl.constexpr):
    """TileStart[0] = 0, TileStart[b + 1] = the tiles of sequences 0..b (see the module
    docstring): one program, SCAN_BLOCK sequences at a time."""
    tl.store(TileStart, 0)
    total = 0
    for first in range(0, B, SCAN_BLOCK):
        i = first + tl.arange(0, SCAN_BLOCK)
        lo = tl.load(CuSeqQ + i, mask=i < B, other=0)
        hi = tl.load(CuSeqQ + i + 1, mask=i < B, other=0)
        n = tl.maximum(hi - lo, 0)
        rem = n % TILE_M
        tiles = tl.cdiv(n, TILE_M) * H
        if TAIL_HEADS > 1:
            shared = (rem > 0) & (rem <= TAIL_ROWS)
            tiles = tl.where(shared, tiles - H + H // TAIL_HEADS, tiles)
        ends = total + tl.cumsum(tiles, 0)
        tl.store(TileStart + i + 1, ends, mask=i < B)
        total = tl.max(tl.where(i < B, ends, 0), 0)

"""The varlen tile table (kernels/tiles.py), run in the interpreter: the Gluon varlen grids
walk only the tiles it lists, so a wrong entry would drop or repeat a sequence's rows."""
from __future__ import annotations

import pytest
import torch

from fa_autotune.kernels.tiles import tile_starts


@pytest.mark.parametrize("lengths, tile, tail_heads", [
    ([5, 0, 300, 128, 129], 128, 1),  # an empty sequence, lengths on and just past a tile's edge
    ([5, 0, 300, 128, 129, 192, 193], 128, 2),  # last tiles of 5, 44, 1 and 64 rows shared by 2 heads; 65 not
    ([0], 192, 3),
    ([0, 0, 7], 64, 1),
    ("random", 128, 1),  # more sequences than one scan block: the running total carries over
    ("random", 128, 2),
])
def test_tile_starts_count_each_sequences_tiles(lengths, tile, tail_heads):
    """Each sequence's tiles over H = 6 heads: cdiv(n, tile) per head, except a last tile
    of at most tile / 2 rows, which tail_heads heads share (6 / tail_heads such tiles)."""
    if lengths == "random":
        lengths = torch.randint(0, 700, (2500,), generator=torch.Generator().manual_seed(0)).tolist()
    heads, tail_rows = 6, tile // 2
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    out = torch.full((len(lengths) + 1,), -7, dtype=torch.int32)
    tile_starts[(1,)](cu, out, len(lengths), heads, TILE_M=tile, TAIL_ROWS=tail_rows, TAIL_HEADS=tail_heads)
    expected = [0]
    for n in lengths:
        full, rem = divmod(n, tile)
        tail = 0 if rem == 0 else heads // tail_heads if rem <= tail_rows else heads
        expected.append(expected[-1] + full * heads + tail)
    assert out.tolist() == expected

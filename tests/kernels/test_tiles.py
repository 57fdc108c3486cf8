"""The varlen tile table (kernels/tiles.py), run in the interpreter: the Gluon varlen grids
walk only the tiles it lists, so a wrong entry would drop or repeat a sequence's rows."""
from __future__ import annotations

import pytest
import torch

from fa_autotune.kernels.tiles import tile_starts


@pytest.mark.parametrize("lengths, tile", [
    ([5, 0, 300, 128, 129], 128),  # an empty sequence, lengths on and just past a tile's edge
    ([0], 192),
    ([0, 0, 7], 64),
    ("random", 128),  # more sequences than one scan block: the running total carries over
])
def test_tile_starts_count_each_sequences_tiles(lengths, tile):
    if lengths == "random":
        lengths = torch.randint(0, 700, (2500,), generator=torch.Generator().manual_seed(0)).tolist()
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    out = torch.full((len(lengths) + 1,), -7, dtype=torch.int32)
    tile_starts[(1,)](cu, out, len(lengths), TILE_M=tile)
    expected = [0]
    for n in lengths:
        expected.append(expected[-1] + -(-n // tile))
    assert out.tolist() == expected

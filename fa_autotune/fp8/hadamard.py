"""The randomized Hadamard rotation of incoherent processing: ``M = H diag(signs) / sqrt(n)``.

LLM activations concentrate energy in a few head-dim channels; rotating Q and K by one
orthonormal M spreads those outliers over every channel before FP8 rounding, and leaves
the scores unchanged: ``(Q M^T)(K M^T)^T = Q K^T``. When D is not a power of two, H is
block-diagonal over blocks of n = the largest power of two dividing D.
"""
from __future__ import annotations

import math
import torch

from ..errors import InputError

_SIGNED_HADAMARD: dict = {}
_HALVES: dict = {}


def padded_dim(d: int) -> int:
    """The power-of-two width (at least 16) the fused passes tile a head of ``d`` into."""
    return max(16, 1 << max(0, (d - 1).bit_length()))


def random_hadamard_signs(d: int, seed: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """A random ±1 float32 vector of length ``d``; a CPU generator keeps it device-independent."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (d,), generator=gen).float().mul_(2).sub_(1)
    return signs.to(device) if device is not None else signs


def hadamard_transform(x: torch.Tensor, signs: "torch.Tensor | None" = None) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform over the last axis, in float32.

    Computes ``FWHT(x * signs) / sqrt(n)`` in O(D log D) per row. When D is not a power of
    two the transform is block-diagonal over blocks of n = the largest power of two
    dividing D, so outliers spread only within a block (odd D: n = 1, sign flips only).
    Without signs the transform is its own inverse.
    """
    d = x.shape[-1]
    x = x.float()
    if signs is not None:
        if signs.shape != (d,):
            raise InputError(f"signs must have shape ({d},) to match the last axis, got {tuple(signs.shape)}")
        x = x * signs.to(device=x.device, dtype=x.dtype)
    if d == 0:
        return x
    n = d & -d
    lead = x.shape[:-1]
    y = x.reshape(-1, d // n, n)
    h = 1
    while h < n:
        pairs = y.reshape(-1, d // n, n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return y.reshape(*lead, d) * (1.0 / math.sqrt(n))


def signed_hadamard(d: int, seed: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The padded (DP, DP) matrix diag(signs) H with entries ±1 (exact in fp16 and bf16; 0 off
    the blocks), the fused passes' rotation as one ``tl.dot``; signs as
    :func:`random_hadamard_signs` draws them. Cached: built once per (d, seed, device,
    dtype), with no host-device sync after that."""
    key = (d, seed, str(device), dtype)
    if key not in _SIGNED_HADAMARD:
        n, dp = d & -d, padded_dim(d)
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
        m = torch.zeros(dp, dp)
        m[:d, :d] = torch.block_diag(*[h] * (d // n)) * random_hadamard_signs(d, seed)[:, None]
        _SIGNED_HADAMARD[key] = m.to(device=device, dtype=dtype)
    return _SIGNED_HADAMARD[key]


def hadamard_halves(d: int, seed: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The rotation of a head padded to 256 as two 128-wide products: the (256, 128) matrix
    [M_L; M_R] with x M = [x_L M_L + x_R M_R, x_L M_L - x_R M_R] when n = 256 (D = 256, where
    M = diag(s) [[H, H], [H, -H]] and M_L, M_R are M's left column half), else [x_L M_L,
    x_R M_R] (M block-diagonal within each half: its diagonal 128 x 128 blocks). Half of M's
    shared memory, the same exact ±1 products. Cached like :func:`signed_hadamard`."""
    key = (d, seed, str(device), dtype)
    if key not in _HALVES:
        m = signed_hadamard(d, seed, device, dtype)
        half = m.shape[0] // 2
        _HALVES[key] = m[:, :half].contiguous() if d & -d == m.shape[0] else \
            torch.cat((m[:half, :half], m[half:, half:])).contiguous()
    return _HALVES[key]

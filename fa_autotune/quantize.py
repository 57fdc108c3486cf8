"""FP8 quantization of attention inputs, FlashAttention-3 style.

Two things keep FP8 attention accurate:

* **Block scaling.** Each group of rows (a tile of ``block_q`` query rows or ``block_k``
  key/value rows of one head) gets its own scale, so one loud token costs precision only
  in its own tile. The scales come back as *descale* factors (amax / fmt_max) in the
  shape the kernel reads them: ``(batch, heads, ceil(seqlen / block))``; per-tensor and
  per-head scales are the same shape, as stride-0 broadcast views.
* **Incoherent processing.** LLM activations concentrate energy in a few head-dim
  channels; FP8 rounding error of a dot product grows with that concentration. Q and K are
  rotated by one random orthonormal Hadamard matrix ``M = H diag(signs) / sqrt(n)``,
  which spreads outlier channels over all channels. ``(Q M^T)(K M^T)^T = Q K^T``, so the
  scores, and hence the attention output, are unchanged by the rotation; V is not rotated.

Dequantizing (``Fp8Inputs.dequantize``) undoes the scales only: the rotated Q and K it
returns give (approximately) the original attention output, not the original tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import InputError
from .problem import check_qkv

if TYPE_CHECKING:
    import torch

FMT_OF_DTYPE = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
SCALINGS = ("per_tensor", "per_head", "per_block")
FORMATS = ("e4m3", "e5m2")
_FMT_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_INPUT_DTYPES = ("float16", "bfloat16", "float32")
_MIN_BLOCK = 16


def fp8_dtype(fmt: str) -> "torch.dtype":
    """The torch dtype of an FP8 format name (e4m3 is the finite-only ``fn`` variant)."""
    import torch

    _check_choice("fmt", fmt, FORMATS)
    return torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2


def random_hadamard_signs(d: int, seed: int = 0, device: "torch.device | str | None" = None) -> "torch.Tensor":
    """A random ±1 float32 vector of length ``d``; a CPU generator keeps it device-independent."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (d,), generator=gen).float().mul_(2).sub_(1)
    return signs.to(device) if device is not None else signs


def hadamard_transform(x: "torch.Tensor", signs: "torch.Tensor | None" = None) -> "torch.Tensor":
    """Orthonormal fast Walsh–Hadamard transform over the last axis, in float32.

    Computes ``FWHT(x * signs) / sqrt(n)`` in O(D log D) per row. When D is not a power of
    two the transform is block-diagonal over blocks of n = the largest power of two
    dividing D, so outliers spread only within a block (odd D: n = 1, sign flips only).
    Without signs the transform is its own inverse.
    """
    import torch

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


@dataclass(frozen=True, eq=False)
class Fp8Inputs:
    """FP8 q, k, v plus float32 descale factors, ready for an FP8 attention kernel.

    ``x[b, h, n, :].float() * x_scale[b, h, n // block]`` approximates the (rotated, if
    ``hadamard``) input, with block = ``block_q`` for q and ``block_k`` for k and v. q and
    k are contiguous (B, H, N, D); v has its sequence axis contiguous (``v.stride(2) == 1``)
    because Hopper's FP8 wgmma wants the PV product's B operand K-major.
    """

    q: "torch.Tensor"
    k: "torch.Tensor"
    v: "torch.Tensor"
    q_scale: "torch.Tensor"
    k_scale: "torch.Tensor"
    v_scale: "torch.Tensor"
    scaling: str
    hadamard: bool
    fmt: str
    block_q: int
    block_k: int
    seed: int

    @property
    def scales(self) -> tuple:
        """What an FP8 kernel launch takes: (q_scale, k_scale, v_scale, block_q, block_k)."""
        return self.q_scale, self.k_scale, self.v_scale, self.block_q, self.block_k

    def dequantize(self) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """float32 q, k, v with the scales undone but not the Hadamard rotation.

        The rotation leaves Q Kᵀ unchanged, so attention on these tensors approximates
        attention on the original inputs.
        """
        return (
            _dequantize(self.q, self.q_scale, self.block_q),
            _dequantize(self.k, self.k_scale, self.block_k),
            _dequantize(self.v, self.v_scale, self.block_k),
        )


def quantize_fp8(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    scaling: str = "per_block",
    hadamard: bool = True,
    fmt: str = "e4m3",
    block_q: int = 128,
    block_k: int = 128,
    seed: int = 0,
) -> Fp8Inputs:
    """Quantize (B, H, N, D) attention inputs to FP8 with descale factors.

    ``scaling`` picks the group sharing one scale: the whole tensor, one (batch, head),
    or ``block_q`` / ``block_k`` rows of one head. ``hadamard`` rotates Q and K by the same
    random orthonormal Hadamard matrix (from ``seed``) first. GQA (Hq a multiple of Hkv)
    is fine: every tensor is scaled over its own heads.
    """
    _validate(q, k, v, scaling, hadamard, fmt, block_q, block_k, seed)
    fmax = _FMT_MAX[fmt]
    dtype = fp8_dtype(fmt)
    if hadamard:
        signs = random_hadamard_signs(q.shape[3], seed, q.device)
        qt, kt = hadamard_transform(q, signs), hadamard_transform(k, signs)
    else:
        qt, kt = q.float(), k.float()
    vt = v.float()
    _check_finite({"q": (q, qt), "k": (k, kt), "v": (v, vt)})
    q8, q_scale = _quantize(qt, scaling, block_q, fmax, dtype)
    k8, k_scale = _quantize(kt, scaling, block_k, fmax, dtype)
    v8, v_scale = _quantize(vt, scaling, block_k, fmax, dtype)
    return Fp8Inputs(
        q=q8.contiguous(),
        k=k8.contiguous(),
        v=v8.transpose(2, 3).contiguous().transpose(2, 3),
        q_scale=q_scale,
        k_scale=k_scale,
        v_scale=v_scale,
        scaling=scaling,
        hadamard=hadamard,
        fmt=fmt,
        block_q=block_q,
        block_k=block_k,
        seed=seed,
    )


def _quantize(
    x: "torch.Tensor", scaling: str, block: int, fmax: float, dtype: "torch.dtype"
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """FP8 copy of float32 ``x`` (its own strides) and its (B, H, nblk) descale."""
    scale = _descale(x, scaling, block, fmax)
    row_scale = _row_scale(scale, x.shape[2], block)
    return (x / row_scale.unsqueeze(-1)).clamp_(-fmax, fmax).to(dtype), scale


def _descale(x: "torch.Tensor", scaling: str, block: int, fmax: float) -> "torch.Tensor":
    """amax / fmax per group, as (B, H, nblk); reduces row maxima, never pads x itself."""
    import torch

    batch, heads, n, _ = x.shape
    nblk = -(-n // block)
    row_amax = x.abs().amax(dim=-1)
    if scaling == "per_tensor":
        amax = row_amax.amax().view(1, 1, 1)
    elif scaling == "per_head":
        amax = row_amax.amax(dim=-1, keepdim=True)
    else:
        padded = torch.nn.functional.pad(row_amax, (0, nblk * block - n))
        amax = padded.view(batch, heads, nblk, block).amax(dim=-1)
    tiny = torch.finfo(torch.float32).tiny
    # All-zero groups get scale 1; tiny amax must not underflow the scale to 0.
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)).clamp_min_(tiny)
    return scale.expand(batch, heads, nblk)


def _row_scale(scale: "torch.Tensor", n: int, block: int) -> "torch.Tensor":
    """The (B, H, N) descale of each row: row n reads block n // block."""
    import torch

    rows = torch.arange(n, device=scale.device) // block
    return scale.index_select(2, rows)


def _dequantize(x8: "torch.Tensor", scale: "torch.Tensor", block: int) -> "torch.Tensor":
    return x8.float() * _row_scale(scale, x8.shape[2], block).unsqueeze(-1)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_block(name: str, value: object) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= _MIN_BLOCK
    if not ok or value & (value - 1):
        raise InputError(f"{name} must be a power of two >= {_MIN_BLOCK}, got {value!r}")


def _validate(q, k, v, scaling, hadamard, fmt, block_q, block_k, seed) -> None:
    """Reject inputs no FP8 kernel could take, naming the problem."""
    check_qkv(q, k, v, _INPUT_DTYPES)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() == 0:
            raise InputError(f"{name} is empty, shape {tuple(t.shape)}")
    if q.shape[1] % k.shape[1]:
        raise InputError(f"heads_q ({q.shape[1]}) must be a multiple of heads_kv ({k.shape[1]})")
    _check_choice("scaling", scaling, SCALINGS)
    _check_choice("fmt", fmt, FORMATS)
    _check_block("block_q", block_q)
    _check_block("block_k", block_k)
    if not isinstance(hadamard, bool):
        raise InputError(f"hadamard must be True or False, got {hadamard!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError(f"seed must be an int, got {seed!r}")


def _check_finite(pairs: dict[str, tuple["torch.Tensor", "torch.Tensor"]]) -> None:
    """Check the float32 tensors about to be scaled; look at the input only to explain a failure."""
    import torch

    for name, (original, transformed) in pairs.items():
        if bool(torch.isfinite(transformed).all()):
            continue
        if not bool(torch.isfinite(original).all()):
            raise InputError(f"{name} contains NaN or inf")
        raise InputError(f"{name} overflows float32 in the Hadamard transform; its values are too large")


def fmt_of(dtype: str) -> str:
    """quantize_fp8's fmt for a canonical FP8 dtype name ("float8_e4m3fn" -> "e4m3")."""
    if dtype not in FMT_OF_DTYPE:
        raise InputError(f"{dtype!r} is not an FP8 dtype; expected one of {sorted(FMT_OF_DTYPE)}")
    return FMT_OF_DTYPE[dtype]

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

from dataclasses import dataclass

import torch

from ..errors import InputError
from ..spec.problem import check_qkv
from ..spec.recipe import FP8_SCALINGS, Fp8Recipe
from ..spec.target import interpreter_active
from . import kernels
from .hadamard import (hadamard_halves, hadamard_transform, padded_dim, random_hadamard_signs,
                       signed_hadamard)

FMT_OF_DTYPE = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
SCALINGS = FP8_SCALINGS  # Fp8Recipe.scaling
FORMATS = ("e4m3", "e5m2")
_FMT_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
_INPUT_DTYPES = ("float16", "bfloat16", "float32")
_KERNEL_DTYPES = ("float16", "bfloat16")
BACKENDS = ("auto", "triton", "torch")
# How V's keys are stored along its contiguous sequence axis: in order, or in each 16 keys
# in the order an FP8 wgmma's threads hold P's columns in registers (kernels.wgmma_key),
# so that the kernels hand P to the PV product without moving it between threads (FlashAttention-3's
# V permutation: compiled for sm_90, 7-8% fewer instructions in an unmasked K/V step and 20%
# in a masked one of the Gluon 2 x 64 x 256 and Triton 64 x 128 kernels).
# "wgmma" needs the key count a multiple of 16; Triton's warp specialization cannot compile the
# relabelling, so warp-specialized kernels read "natural" only (v_order_for).
V_ORDERS = ("natural", "wgmma")
_MAX_FUSED_ROWS = 65535 * 16  # grid axis 1 holds the row chunks (16 rows at the smallest block)
_MIN_BLOCK = 16


def fp8_dtype(fmt: str) -> torch.dtype:
    """The torch dtype of an FP8 format name (e4m3 is the finite-only ``fn`` variant)."""
    _check_choice("fmt", fmt, FORMATS)
    return torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2


@dataclass(frozen=True, eq=False)
class Fp8Inputs:
    """FP8 q, k, v plus float32 descale factors, ready for an FP8 attention kernel.

    ``x[b, h, n, :].float() * x_scale[b, h, n // block]`` approximates the (rotated, if
    ``hadamard``) input, with block = ``block_q`` for q and ``block_k`` for k and v. q and
    k are contiguous (B, H, N, D); v has its sequence axis contiguous (``v.stride(2) == 1``)
    because Hopper's FP8 wgmma wants the PV product's B operand K-major.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    scaling: str
    hadamard: bool
    fmt: str
    block_q: int
    block_k: int
    seed: int
    # With a sink tile (quantize_fp8(..., sink_tile=True)): q and k as they were given (not
    # copied, not rotated); the kernel takes the first K tile's scores from them.
    sources: tuple[torch.Tensor, torch.Tensor] | None = None
    # V_ORDERS: "wgmma" stores each 16 keys of v in the FP8 wgmma's register order (what
    # attention_fp8 and the tuner quantize into for kernels that read it: v_order_for).
    v_order: str = "natural"

    def __post_init__(self) -> None:
        _check_v_order(self.v_order, self.v.shape[2])

    @property
    def recipe(self) -> Fp8Recipe:
        """The recipe these inputs were quantized with."""
        return Fp8Recipe(self.scaling, self.hadamard, self.sources is not None)

    @property
    def scales(self) -> tuple:
        """What an FP8 kernel launch takes: (q_scale, k_scale, v_scale, block_q, block_k,
        whether v is in the wgmma order), and the sink tile's (q, k) sources after them when
        there are any."""
        base = (self.q_scale, self.k_scale, self.v_scale, self.block_q, self.block_k, self.v_order == "wgmma")
        return base + self.sources if self.sources is not None else base

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """float32 q, k, v with the scales undone but not the Hadamard rotation.

        The rotation leaves Q Kᵀ unchanged, so attention on these tensors approximates
        attention on the original inputs.
        """
        v = self.v.index_select(2, wgmma_positions(self.v.shape[2], self.v.device)) if self.v_order == "wgmma" \
            else self.v
        return (
            _dequantize(self.q, self.q_scale, self.block_q),
            _dequantize(self.k, self.k_scale, self.block_k),
            _dequantize(v, self.v_scale, self.block_k),
        )


def wgmma_positions(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Where each of ``n`` keys (a multiple of 16) sits in V's wgmma order
    (fa_autotune.fp8.kernels.wgmma_key gives the inverse): within each 16, key 8a + 2c + b
    at 4c + 2a + b."""
    r = torch.arange(n, device=device)
    return (r & -16) | (((r >> 1) & 3) << 2) | (((r >> 3) & 1) << 1) | (r & 1)


def quantize_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scaling: str = "per_block",
    hadamard: bool = True,
    fmt: str = "e4m3",
    block_q: int = 128,
    block_k: int = 128,
    seed: int = 0,
    backend: str = "auto",
    check_finite: bool = True,
    sink_tile: bool = True,
    v_order: str = "natural",
) -> Fp8Inputs:
    """Quantize (B, H, N, D) attention inputs to FP8 with descale factors.

    ``scaling`` picks the group sharing one scale: the whole tensor, one (batch, head),
    or ``block_q`` / ``block_k`` rows of one head. ``hadamard`` rotates Q and K by the same
    random orthonormal Hadamard matrix (from ``seed``) first. GQA (Hq a multiple of Hkv)
    is fine: every tensor is scaled over its own heads. ``backend``: "triton" (fused kernels,
    one launch per tensor for per-block scaling; fp16/bf16 inputs), "torch" (eager float32
    reference), or "auto" (triton for fp16/bf16 CUDA tensors). ``check_finite`` raises InputError on NaN/inf
    inputs, at the cost of one host-device sync (attention_fp8 skips it, as attention() does
    not scan its inputs either). ``sink_tile`` keeps q and k themselves (no copy) so that the
    kernel scores the first K tile from them: with attention sinks (first keys whose scores
    dwarf the rest, as trained LLMs have) FP8's rounding of Q and K moves those keys' weight
    by several percent of the output, and this keeps it to V's rounding. On by default, as
    in the default :class:`~fa_autotune.Fp8Recipe`; ``sink_tile=False`` gives up that
    accuracy for warp-specialized kernels (3-7% faster on an H100 at D=128). ``v_order``
    (:data:`V_ORDERS`): how v's keys are stored along its sequence axis; "wgmma" (a key
    count that is a multiple of 16) spares the kernels moving P between threads, and every
    FP8 kernel but Triton's warp-specialized ones reads it (:func:`v_order_for`).
    """
    if not isinstance(sink_tile, bool):
        raise InputError(f"sink_tile must be True or False, got {sink_tile!r}")
    _validate(q, k, v, scaling, hadamard, fmt, block_q, block_k, seed)
    _check_v_order(v_order, k.shape[2])  # before any work; Fp8Inputs checks it again
    _check_choice("backend", backend, BACKENDS)
    if backend == "triton":
        _check_fusable(q, k)
    fused = backend == "triton" or (backend == "auto" and _fusable(q, k))
    quantize = _kernel_quantizer(q, seed if hadamard else None) if fused else \
        _torch_quantizer(random_hadamard_signs(q.shape[3], seed, q.device) if hadamard else None, check_finite)
    fmax, dtype = _FMT_MAX[fmt], fp8_dtype(fmt)
    (q8, q_scale), (k8, k_scale) = quantize("q", q, scaling, block_q, fmax, dtype, False), \
        quantize("k", k, scaling, block_k, fmax, dtype, False)
    v8, v_scale = quantize("v", v, scaling, block_k, fmax, dtype, v_order)
    if fused and check_finite:  # one host-device sync for all three
        _check_finite({name: (x, s) for name, x, s in (("q", q, q_scale), ("k", k, k_scale), ("v", v, v_scale))})
    return Fp8Inputs(q=q8, k=k8, v=v8, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, scaling=scaling,
                     hadamard=hadamard, fmt=fmt, block_q=block_q, block_k=block_k, seed=seed,
                     sources=(q, k) if sink_tile else None, v_order=v_order)


def _check_v_order(v_order: str, n_keys: int) -> None:
    _check_choice("v_order", v_order, V_ORDERS)
    if v_order == "wgmma" and n_keys % 16:
        raise InputError(f"v_order='wgmma' permutes keys within groups of 16: {n_keys} keys are not a multiple "
                         "of 16; use v_order='natural'")


def v_order_for(warp_specialize: bool, n_keys: int) -> str:
    """The V order to quantize into for a kernel (``warp_specialize``: a Triton
    warp-specialized one, which reads "natural" only) over ``n_keys`` keys: "wgmma" where
    both allow it."""
    return "wgmma" if not warp_specialize and n_keys % 16 == 0 else "natural"


def _fusable(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether "auto" takes the fused passes: CUDA fp16/bf16 inputs whose Hadamard matrix fits
    shared memory (padded D <= 128, or any D on Hopper) and whose row chunks fit the grid."""
    try:
        _check_fusable(q, k)
    except InputError:
        return False
    return q.shape[3] <= 128 or (q.device.type == "cuda" and torch.cuda.get_device_capability(q.device) >= (9, 0))


def _check_fusable(q: torch.Tensor, k: torch.Tensor) -> None:
    dtype = str(q.dtype).removeprefix("torch.")
    if dtype not in _KERNEL_DTYPES:
        raise InputError(f"backend='triton' quantizes float16 or bfloat16 inputs, got {dtype}")
    if not q.is_cuda and not interpreter_active():
        raise InputError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before Python started); "
                         "use backend='torch' for CPU tensors")
    if max(q.shape[2], k.shape[2]) > _MAX_FUSED_ROWS:
        raise InputError(f"backend='triton' takes sequences up to {_MAX_FUSED_ROWS} rows; use backend='torch'")


def tile_blocks(block_m: int, block_n: int) -> tuple[int, int]:
    """(block_q, block_k) for a kernel with these tiles: FlashAttention-3's 128-row scaling
    blocks, grown to the tile where the tile is larger (a tile reads one descale)."""
    return max(128, block_m), max(128, block_n)


def empty_fp8_inputs(q_shape: tuple, kv_shape: tuple, device: torch.device | str, fmt: str = "e4m3",
                     scaling: str = "per_block", block_q: int = 128, block_k: int = 128,
                     sink_tile: bool = False, v_order: str = "natural") -> Fp8Inputs:
    """Uninitialized FP8 inputs laid out exactly as :func:`quantize_fp8` returns them (V
    sequence-contiguous in ``v_order``, descales with the strides of ``scaling``, with
    ``sink_tile`` the 16-bit q and k kept beside them): what compiling a kernel for such
    inputs needs, without their data or a quantization pass."""
    _check_choice("scaling", scaling, SCALINGS)
    dtype = fp8_dtype(fmt)

    def descale(shape, block):
        batch, heads, n, _ = shape
        groups = {"per_tensor": (1, 1, 1), "per_head": (batch, heads, 1)}.get(scaling, (batch, heads, -(-n // block)))
        return torch.empty(groups, device=device, dtype=torch.float32).expand(batch, heads, -(-n // block))

    return Fp8Inputs(q=_fp8_like(q_shape, device, dtype, False), k=_fp8_like(kv_shape, device, dtype, False),
                     v=_fp8_like(kv_shape, device, dtype, True), q_scale=descale(q_shape, block_q),
                     k_scale=descale(kv_shape, block_k), v_scale=descale(kv_shape, block_k), scaling=scaling,
                     hadamard=False, fmt=fmt, block_q=block_q, block_k=block_k, seed=0,
                     sources=(torch.empty(q_shape, device=device, dtype=torch.float16),
                              torch.empty(kv_shape, device=device, dtype=torch.float16)) if sink_tile else None,
                     v_order=v_order)


def _fp8_like(shape: tuple, device: torch.device | str, dtype: torch.dtype, seq_contiguous: bool) -> torch.Tensor:
    """An empty FP8 (B, H, N, D) tensor: contiguous, or with the sequence axis contiguous and
    its rows padded to 16 bytes (what a TMA descriptor over the transposed tensor needs)."""
    batch, heads, n, d = shape
    if not seq_contiguous:
        return torch.empty(batch, heads, n, d, device=device, dtype=dtype)
    padded = -(-n // 16) * 16
    return torch.empty(batch, heads, d, padded, device=device, dtype=dtype)[..., :n].transpose(2, 3)


def _torch_quantizer(signs: torch.Tensor | None, check_finite: bool):
    """Eager float32 quantization of one tensor (rotating it when ``signs`` and not V)."""

    def quantize(name, x, scaling, block, fmax, dtype, v_order):
        is_v = bool(v_order)  # Q and K pass False, V its order
        xt = hadamard_transform(x, signs) if signs is not None and not is_v else x.float()
        if check_finite:
            _check_finite({name: (x, xt)})
        x8, scale = _quantize(xt, scaling, block, fmax, dtype)
        if not is_v:
            return x8.contiguous(), scale
        out = _fp8_like(x.shape, x.device, dtype, True)
        if v_order == "wgmma":
            out[:, :, wgmma_positions(x.shape[2], x.device)] = x8
        else:
            out.copy_(x8)
        return out, scale

    return quantize


def _kernel_quantizer(q: torch.Tensor, seed: int | None):
    """Fused Triton kernels per tensor (fa_autotune.fp8.kernels: one launch for per-block
    scaling, two otherwise); Q and K rotated when ``seed`` is given. Non-finite maxima give
    non-finite descales, checked by the caller."""
    m = signed_hadamard(q.shape[3], seed, q.device, q.dtype) if seed is not None else None
    wide = seed is not None and padded_dim(q.shape[3]) == 256
    halves = hadamard_halves(q.shape[3], seed, q.device, q.dtype) if wide else None

    def quantize(name, x, scaling, block, fmax, dtype, v_order):
        is_v, wgmma = bool(v_order), v_order == "wgmma"  # Q and K pass False, V its order
        batch, heads, n, _ = x.shape
        out = _fp8_like(x.shape, x.device, dtype, is_v)
        if scaling == "per_block":  # one launch: maxima, descales, cast
            return out, kernels.quantize_blocks(x, None if is_v else m, block, fmax, out, wgmma,
                                                halves=None if is_v else halves)
        amax = kernels.chunk_amax(x, None if is_v else m, kernels.CHUNK)
        scale = _scale_of(_group_amax(amax, scaling, block // kernels.CHUNK), fmax, batch, heads, -(-n // block))
        return kernels.scale_cast(x, None if is_v else m, scale, block, fmax, out, wgmma), scale

    return quantize


def _group_amax(chunk_amax: torch.Tensor, scaling: str, chunks_per_block: int) -> torch.Tensor:
    """Per-group maxima from per-chunk maxima, as (B, H, groups)."""
    if scaling == "per_tensor":
        return chunk_amax.amax().view(1, 1, 1)
    if scaling == "per_head":
        return chunk_amax.amax(dim=-1, keepdim=True)
    batch, heads, n_chunks = chunk_amax.shape
    nblk = -(-n_chunks // chunks_per_block)
    padded = torch.nn.functional.pad(chunk_amax, (0, nblk * chunks_per_block - n_chunks))
    return padded.view(batch, heads, nblk, chunks_per_block).amax(dim=-1)


def _quantize(
    x: torch.Tensor, scaling: str, block: int, fmax: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 copy of float32 ``x`` (its own strides) and its (B, H, nblk) descale."""
    scale = _descale(x, scaling, block, fmax)
    row_scale = _row_scale(scale, x.shape[2], block)
    return (x / row_scale.unsqueeze(-1)).clamp_(-fmax, fmax).to(dtype), scale


def _descale(x: torch.Tensor, scaling: str, block: int, fmax: float) -> torch.Tensor:
    """amax / fmax per group, as (B, H, nblk); reduces row maxima, never pads x itself."""
    batch, heads, n, _ = x.shape
    return _scale_of(_group_amax(x.abs().amax(dim=-1), scaling, block), fmax, batch, heads, -(-n // block))


def _scale_of(amax: torch.Tensor, fmax: float, batch: int, heads: int, nblk: int) -> torch.Tensor:
    """Descales from group maxima: all-zero groups get 1; tiny amax must not underflow to 0; a
    group holding NaN or inf gets NaN, which every score (or PV product) it scales carries
    to the output, as attention()'s output carries a NaN input (a NaN group once got 1, an
    inf one inf, and FP8 attention a finite answer: the FP8 cast and the kernels' NaN-blind
    maxima can turn a bad value into a finite one or a row into "no key seen")."""
    tiny = torch.finfo(torch.float32).tiny
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)).clamp_min_(tiny)
    scale = torch.where(torch.isfinite(amax), scale, torch.full_like(amax, float("nan")))
    return scale.expand(batch, heads, nblk)


def _row_scale(scale: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """The (B, H, N) descale of each row: row n reads block n // block."""
    rows = torch.arange(n, device=scale.device) // block
    return scale.index_select(2, rows)


def _dequantize(x8: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
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


def _check_finite(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Check the float32 tensors about to be scaled; look at the input only to explain a failure."""
    if bool(torch.stack([torch.isfinite(t).all() for _, t in pairs.values()]).all()):
        return  # one host-device sync when all is well
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

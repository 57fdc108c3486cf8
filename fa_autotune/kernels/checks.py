"""Whether a kernel config can run given tensors: the rules Triton and the hardware impose
beyond what :class:`~fa_autotune.spec.config.KernelConfig` checks on its own (TMA layouts,
warp specialization, FP8). Every failure is a :class:`ConfigError` naming the parameter."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from .fwd import d_rest, q_regs_error, wide_steps

_TMA_ALIGN = 16  # bytes: TMA wants 16-byte aligned bases and row strides
# Lazy rescaling lets P reach 2**rescale_threshold before P is cast to V's dtype: the largest
# threshold whose power of two each narrow format still holds (fp16 65504, e4m3 448, e5m2 57344).
_RESCALE_LIMIT = {"float16": 15, "float8_e4m3fn": 8, "float8_e5m2": 15}


@dataclass(frozen=True)
class Layout:
    """What the rules of :func:`why_not` need to know of a call's q, k and v, read once: the
    device, its compute capability, why a TMA descriptor cannot address each tensor as the
    kernels read it (None where it can; FP8 V sequence-contiguous), and each tensor's span of
    one head in elements (what 32-bit pointer offsets must reach)."""

    device: str
    capability: tuple[int, int] | None
    tma: tuple[str | None, str | None, str | None]
    spans: tuple[int, int, int]

    @classmethod
    def of(cls, problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> "Layout":
        tma = tuple(_tma_reason(name, t) for name, t in zip("qkv", _tma_views(problem, q, k, v)))
        spans = tuple(_span(t.shape[2], t.shape[3], t.stride(2), t.stride(3)) for t in (q, k, v))
        return cls(q.device.type, _capability(q.device), tma, spans)

    @property
    def tma_ok(self) -> bool:
        return not any(self.tma)


def why_not(config: KernelConfig, problem: Problem, layout: Layout) -> ConfigError | None:
    """The first rule ``config`` breaks on tensors of ``layout`` (a :class:`ConfigError`
    naming the parameter), or None where it can run them. Pure: the dispatcher chooses among
    configs with it, no exception raised and caught."""
    capability = layout.capability
    if config.access == "tensor_desc":
        if capability is not None and capability < (9, 0):
            return ConfigError("access", "'tensor_desc' (TMA) needs a Hopper GPU (sm_90) or newer")
        reason = next((r for r in layout.tma if r), None)
        if reason:
            return ConfigError("access", reason)
    if config.language == "gluon":
        reason = _gluon_reason(problem.dtype, layout.device, capability, fp8=problem.kind == "fwd")
        if reason:
            return ConfigError("language", reason)
        if config.BLOCK_N == 256 and not problem.is_fp8:
            return ConfigError("BLOCK_N", f"language='gluon' takes 256-key steps with FP8 inputs only (P in 8 bits "
                               f"beside the 64 x 256 score tile); {problem.dtype} needs BLOCK_N 64 or 128")
        if not problem.is_fp8 and wide_steps(config, problem.head_dim, 2):
            if config.overlap or config.half_step:
                name = "overlap" if config.overlap else "half_step"
                return ConfigError(name, f"language='gluon' takes 128-key steps at head dim {problem.head_dim} in "
                                   f"turn only (two 64-key score halves beside a 192-column accumulator): use "
                                   f"{name}=false or BLOCK_N=64")
        if not problem.is_fp8:
            error = q_regs_error(config, problem.head_dim, problem.head_dim_pad,
                                 d_rest(problem.head_dim, problem.head_dim_pad))
            if error:
                return error
    elif config.access != "tensor_desc":
        for name, span in zip("qkv", layout.spans):
            if span > MAX_OFFSET:
                return ConfigError("access", _offsets_message(name, span, config.access))
    if config.warp_specialize:
        error = _warp_specialize_error(config, problem, capability)
        if error:
            return error
    if problem.is_fp8:
        error = _fp8_error(config, capability)
        if error:
            return error
    limit = _RESCALE_LIMIT.get(problem.dtype)
    if limit is not None and config.rescale_threshold > limit:
        return ConfigError("rescale_threshold", f"{config.rescale_threshold} lets probabilities reach "
                           f"2**{config.rescale_threshold}, past {problem.dtype}'s range; use at most {limit}")
    return None


def check_config(config: KernelConfig, problem: Problem, *tensors: torch.Tensor) -> None:
    """Raise :class:`ConfigError` (naming the parameter) if ``config`` cannot run these tensors."""
    error = why_not(config, problem, Layout.of(problem, *tensors[:3]))
    if error is not None:
        raise error


def check_gluon_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> None:
    """Raise :func:`gluon_backward_error`'s error, if any."""
    error = gluon_backward_error(q, k, v, dout)
    if error is not None:
        raise error


def gluon_backward_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> ConfigError | None:
    """Why the Gluon dK/dV pass cannot run these tensors, or None: it reads Q, K, V and dO
    through TMA on Hopper, in fp16/bf16 (dK and dV are stored through TMA too, into buffers of
    their own when their layout cannot be)."""
    if q.device.type != "meta":  # meta tensors: ahead-of-time compilation, no device to check
        reason = _gluon_reason(str(q.dtype).removeprefix("torch."), q.device.type, _capability(q.device))
        if reason:
            return ConfigError("language", reason)
    reason = next((r for r in (_tma_reason(name, t) for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)))
                   if r), None)
    return ConfigError("access", reason) if reason else None


MAX_OFFSET = 2**31 - 1  # pointer and block-pointer kernels index within one head in 32 bits


def check_offsets(name: str, rows: int, cols: int, stride_row: int, stride_col: int, access: str) -> None:
    """One head of ``name`` must be addressable with 32-bit offsets by pointer and
    block-pointer kernels (heads and batches are offset in 64 bits): past that, loads would
    wrap around and read the wrong memory."""
    span = _span(rows, cols, stride_row, stride_col)
    if span > MAX_OFFSET:
        raise ConfigError("access", _offsets_message(name, span, access))


def _span(rows: int, cols: int, stride_row: int, stride_col: int) -> int:
    return max(rows - 1, 0) * abs(stride_row) + max(cols - 1, 0) * abs(stride_col)


def _offsets_message(name: str, span: int, access: str) -> str:
    return (f"{name}: one head spans {span} elements, past the 32-bit offsets of access={access!r} kernels; use "
            "access='tensor_desc' (Hopper, TMA) or store the heads outermost (batch, heads, seqlen, head_dim)")


def _gluon_reason(dtype: str, device: str, capability: tuple[int, int] | None, fp8: bool = False) -> str | None:
    """The Gluon kernels are written for Hopper's wgmma and TMA, in fp16/bf16 (``fp8``: the
    forward's FP8 inputs too)."""
    if device != "cuda":
        return ("language='gluon' runs on Hopper GPUs only; Triton's interpreter cannot run Gluon "
                "(use language='triton')")
    if capability is not None and capability[0] != 9:
        return f"language='gluon' kernels use Hopper's wgmma (sm_90), this GPU is sm_{capability[0]}{capability[1]}"
    if dtype not in ("float16", "bfloat16") + (("float8_e4m3fn", "float8_e5m2") if fp8 else ()):
        return f"language='gluon' runs float16 and bfloat16{' and FP8' if fp8 else ''}, not {dtype}"
    return None


def _warp_specialize_error(config: KernelConfig, problem: Problem,
                           capability: tuple[int, int] | None) -> ConfigError | None:
    """Triton 3.6 warp-specializes one unmasked K/V loop correctly; measured on an H200,
    a masked loop returned NaN and a second loop after it failed to compile."""
    if capability is not None and capability < (9, 0):
        return ConfigError("warp_specialize", "warp specialization needs a Hopper GPU (sm_90) or newer")
    if problem.causal:
        return ConfigError("warp_specialize", "causal masking cannot be warp-specialized (Triton 3.6 miscompiles it)")
    if problem.seqlen_k % config.BLOCK_N:
        return ConfigError(
            "warp_specialize", f"needs seqlen_k ({problem.seqlen_k}) to be a multiple of BLOCK_N ({config.BLOCK_N})"
        )
    return None


def _fp8_error(config: KernelConfig, capability: tuple[int, int] | None) -> ConfigError | None:
    """FP8 kernels exist for the Q-outer loop with one Q tile per program; Hopper's FP8
    MMA (or Ada's) does the dots."""
    if config.loop_order != "q_outer":
        return ConfigError("loop_order", "FP8 inputs run with loop_order='q_outer' only")
    if config.language == "gluon" and config.half_step:
        return ConfigError("half_step", "the Gluon kernel's half steps hold P in 16 bits; FP8 runs without them")
    if config.language == "gluon" and config.q_regs:
        return ConfigError("q_regs", "the Gluon kernel holds Q in registers for 16-bit Q K^T products; FP8 reads Q "
                           "from shared memory")
    if config.q_tiles != 1:
        return ConfigError("q_tiles", "FP8 inputs need q_tiles=1 (one Q descale per program)")
    if config.BLOCK_N < 32:
        return ConfigError("BLOCK_N", f"FP8 needs BLOCK_N >= 32 (the PV product's FP8 MMA reduces over 32), "
                           f"got {config.BLOCK_N}")
    if capability is not None and capability < (8, 9):
        return ConfigError("config", f"FP8 needs an sm_89 (Ada) or sm_90 (Hopper) GPU, got "
                           f"sm_{capability[0]}{capability[1]}")
    return None


def check_fp8_scales(config: KernelConfig, q_scale, k_scale, v_scale, block_q: int, block_k: int) -> None:
    """Per-block descales are read once per tile, so a tile must not straddle two blocks;
    a PV product accumulated in place can only be descaled once, so V needs one descale."""
    if per_block(q_scale) and block_q % config.BLOCK_M:
        raise ConfigError("BLOCK_M", f"{config.BLOCK_M} does not divide the Q scaling block ({block_q} rows)")
    if per_block(k_scale) and block_k % config.BLOCK_N:
        raise ConfigError("BLOCK_N", f"{config.BLOCK_N} does not divide the K/V scaling block ({block_k} rows)")
    if config.fp8_pv == "inplace" and per_block(v_scale):
        raise ConfigError("fp8_pv", "'inplace' needs one V descale per head (per_tensor or per_head scaling); "
                          "per-block V descales need 'separate'")


def per_block(scale) -> bool:
    """Whether a (batch, heads, blocks) descale tensor holds more than one descale per head."""
    return scale.shape[2] > 1 and scale.stride(2) != 0


def _check_tma_layout(name: str, t: torch.Tensor) -> None:
    reason = _tma_reason(name, t)
    if reason:
        raise ConfigError("access", reason)


def _tma_reason(name: str, t: torch.Tensor) -> str | None:
    """What a TMA descriptor asserts of the tensor it addresses: every stride of a size-1 axis
    too (the descriptor checks them all; such a tensor gets the fallback, not an assertion)."""
    size = t.element_size()
    if t.stride(3) != 1:
        return f"'tensor_desc' needs {name}'s head dim contiguous (stride 1), got strides {t.stride()}"
    for axis, label in ((0, "batch"), (1, "head"), (2, "row")):
        if (t.stride(axis) * size) % _TMA_ALIGN:
            return f"'tensor_desc' needs 16-byte aligned strides; {name}'s {label} stride is {t.stride(axis) * size} bytes"
    if t.data_ptr() % _TMA_ALIGN:
        return f"'tensor_desc' needs {name} to start on a 16-byte boundary"
    return None


def tma_layout_ok(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address ``t`` (B, H, N, D) as it is."""
    return _tma_reason("tensor", t) is None


def cache_tma_ok(k_cache: torch.Tensor, v_cache: torch.Tensor, paged: bool) -> bool:
    """Whether a decode kernel can read a KV cache through TMA boxes: contiguous (not paged),
    16-bit, non-empty, every stride non-zero and the layout one a descriptor addresses."""
    return (not paged and k_cache.element_size() > 1 and k_cache.numel() > 0
            and min(k_cache.stride() + v_cache.stride()) > 0 and tma_layout_ok(k_cache) and tma_layout_ok(v_cache))


def _tma_views(problem: Problem, q, k, v) -> tuple:
    """The tensors as the TMA descriptors read them: FP8 V as [D, N] tiles (sequence contiguous)."""
    return (q, k, v.transpose(2, 3)) if problem.is_fp8 else (q, k, v)


def check_tma_output(out: torch.Tensor) -> None:
    """An output a kernel stores through TMA (B, H, N, D): the same layout rules as its inputs."""
    _check_tma_layout("the output", out)


def tma_output_reason(out: torch.Tensor) -> str | None:
    """Why a kernel cannot store ``out`` (B, H, N, D) through TMA, or None."""
    return _tma_reason("the output", out)


def _capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)

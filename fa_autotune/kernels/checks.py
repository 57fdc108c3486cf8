"""Whether a kernel config can run given tensors: the rules Triton and the hardware impose
beyond what :class:`~fa_autotune.spec.config.KernelConfig` checks on its own (TMA layouts,
warp specialization, FP8). Every failure is a :class:`ConfigError` naming the parameter."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..spec.config import KernelConfig
from ..spec.problem import Problem

_TMA_ALIGN = 16  # bytes: TMA wants 16-byte aligned bases and row strides
# Lazy rescaling lets P reach 2**rescale_threshold before P is cast to V's dtype: the largest
# threshold whose power of two each narrow format still holds (fp16 65504, e4m3 448, e5m2 57344).
_RESCALE_LIMIT = {"float16": 15, "float8_e4m3fn": 8, "float8_e5m2": 15}


def check_config(config: KernelConfig, problem: Problem, *tensors: torch.Tensor) -> None:
    """Raise :class:`ConfigError` (naming the parameter) if ``config`` cannot run these tensors."""
    device = tensors[0].device
    capability = _capability(device)
    if config.access == "tensor_desc":
        if capability is not None and capability < (9, 0):
            raise ConfigError("access", "'tensor_desc' (TMA) needs a Hopper GPU (sm_90) or newer")
        for name, t in zip("qkv", _tma_views(problem, *tensors)):
            _check_tma_layout(name, t)
    if config.language == "gluon":
        _check_gluon(problem.dtype, device, capability)
    elif config.access != "tensor_desc":
        for name, t in zip("qkv", tensors[:3]):
            check_offsets(name, t.shape[2], t.shape[3], t.stride(2), t.stride(3), config.access)
    if config.warp_specialize:
        _check_warp_specialize(config, problem, capability)
    if problem.is_fp8:
        _check_fp8(config, capability, *tensors)
    limit = _RESCALE_LIMIT.get(problem.dtype)
    if limit is not None and config.rescale_threshold > limit:
        raise ConfigError("rescale_threshold", f"{config.rescale_threshold} lets probabilities reach "
                          f"2**{config.rescale_threshold}, past {problem.dtype}'s range; use at most {limit}")


def check_gluon_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> None:
    """The Gluon dK/dV pass reads Q, K, V and dO through TMA on Hopper, in fp16/bf16 (dK
    and dV are stored through TMA too, into buffers of their own when their layout cannot be)."""
    if q.device.type != "meta":  # meta tensors: ahead-of-time compilation, no device to check
        _check_gluon(str(q.dtype).removeprefix("torch."), q.device, _capability(q.device))
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        _check_tma_layout(name, t)


MAX_OFFSET = 2**31 - 1  # pointer and block-pointer kernels index within one head in 32 bits


def check_offsets(name: str, rows: int, cols: int, stride_row: int, stride_col: int, access: str) -> None:
    """One head of ``name`` must be addressable with 32-bit offsets by pointer and
    block-pointer kernels (heads and batches are offset in 64 bits): past that, loads would
    wrap around and read the wrong memory."""
    span = max(rows - 1, 0) * abs(stride_row) + max(cols - 1, 0) * abs(stride_col)
    if span > MAX_OFFSET:
        raise ConfigError("access", f"{name}: one head spans {span} elements, past the 32-bit offsets of "
                          f"access={access!r} kernels; use access='tensor_desc' (Hopper, TMA) or store the "
                          "heads outermost (batch, heads, seqlen, head_dim)")


def _check_gluon(dtype: str, device: torch.device, capability: tuple[int, int] | None) -> None:
    """The Gluon kernels are written for Hopper's wgmma and TMA, in fp16/bf16."""
    if device.type != "cuda":
        raise ConfigError("language", "language='gluon' runs on Hopper GPUs only; Triton's interpreter cannot run "
                          "Gluon (use language='triton')")
    if capability is not None and capability[0] != 9:
        raise ConfigError("language", f"language='gluon' kernels use Hopper's wgmma (sm_90), this GPU is "
                          f"sm_{capability[0]}{capability[1]}")
    if dtype not in ("float16", "bfloat16"):
        raise ConfigError("language", f"language='gluon' runs float16 and bfloat16, not {dtype}")


def _check_warp_specialize(config: KernelConfig, problem: Problem, capability: tuple[int, int] | None) -> None:
    """Triton 3.6 warp-specializes one unmasked K/V loop correctly; measured on an H200,
    a masked loop returned NaN and a second loop after it failed to compile."""
    if capability is not None and capability < (9, 0):
        raise ConfigError("warp_specialize", "warp specialization needs a Hopper GPU (sm_90) or newer")
    if problem.causal:
        raise ConfigError("warp_specialize", "causal masking cannot be warp-specialized (Triton 3.6 miscompiles it)")
    if problem.seqlen_k % config.BLOCK_N:
        raise ConfigError(
            "warp_specialize", f"needs seqlen_k ({problem.seqlen_k}) to be a multiple of BLOCK_N ({config.BLOCK_N})"
        )


def _check_fp8(config: KernelConfig, capability: tuple[int, int] | None, q, k, v) -> None:
    """FP8 kernels exist for the Q-outer loop with one Q tile per program; Hopper's FP8
    MMA (or Ada's) does the dots."""
    if config.loop_order != "q_outer":
        raise ConfigError("loop_order", "FP8 inputs run with loop_order='q_outer' only")
    if config.q_tiles != 1:
        raise ConfigError("q_tiles", "FP8 inputs need q_tiles=1 (one Q descale per program)")
    if config.BLOCK_N < 32:
        raise ConfigError("BLOCK_N", f"FP8 needs BLOCK_N >= 32 (the PV product's FP8 MMA reduces over 32), got {config.BLOCK_N}")
    if capability is not None and capability < (8, 9):
        raise ConfigError("config", f"FP8 needs an sm_89 (Ada) or sm_90 (Hopper) GPU, got sm_{capability[0]}{capability[1]}")


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
    """What a TMA descriptor asserts of the tensor it addresses: every stride of a size-1 axis
    too (the descriptor checks them all; such a tensor gets the fallback, not an assertion)."""
    size = t.element_size()
    if t.stride(3) != 1:
        raise ConfigError("access", f"'tensor_desc' needs {name}'s head dim contiguous (stride 1), got strides {t.stride()}")
    for axis, label in ((0, "batch"), (1, "head"), (2, "row")):
        if (t.stride(axis) * size) % _TMA_ALIGN:
            raise ConfigError(
                "access", f"'tensor_desc' needs 16-byte aligned strides; {name}'s {label} stride is {t.stride(axis) * size} bytes"
            )
    if t.data_ptr() % _TMA_ALIGN:
        raise ConfigError("access", f"'tensor_desc' needs {name} to start on a 16-byte boundary")


def tma_layout_ok(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address ``t`` (B, H, N, D) as it is (_check_tma_layout)."""
    try:
        _check_tma_layout("tensor", t)
    except ConfigError:
        return False
    return True


def _tma_views(problem: Problem, q, k, v) -> tuple:
    """The tensors as the TMA descriptors read them: FP8 V as [D, N] tiles (sequence contiguous)."""
    return (q, k, v.transpose(2, 3)) if problem.is_fp8 else (q, k, v)


def check_tma_output(out: torch.Tensor) -> None:
    """An output a kernel stores through TMA (B, H, N, D): the same layout rules as its inputs."""
    _check_tma_layout("the output", out)


def tma_compatible(problem: Problem, q, k, v) -> bool:
    """Whether q, k, v meet TMA's layout rules (so a dispatched TMA config can run them)."""
    try:
        for t in _tma_views(problem, q, k, v):
            _check_tma_layout("tensor", t)
    except ConfigError:
        return False
    return True


def _capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)

"""The public entry point: ``attention``, a drop-in for SDPA's forward."""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping

from .config import KernelConfig
from .defaults import default_config
from .launch import allocate_outputs, check_config, resolve_scale, run, tma_compatible
from .problem import problem_from_tensors

if TYPE_CHECKING:
    import torch

_DEFAULTS: dict[tuple, KernelConfig] = {}


def attention(
    q: "torch.Tensor",
    k: "torch.Tensor",
    v: "torch.Tensor",
    causal: bool = False,
    scale: float | None = None,
    config: Mapping[str, Any] | KernelConfig | None = None,
    *,
    causal_align: str = "top_left",
    return_lse: bool = False,
):
    """Scaled dot-product attention forward on (batch, heads, seqlen, head_dim) tensors.

    Returns what ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True)`` returns. ``causal_align="bottom_right"`` aligns the diagonal to the
    last key instead (flash-attn / KV-cache convention); query rows that then see no key
    get zeros. ``return_lse=True`` also returns the natural-log log-sum-exp of each row's
    scores, shape (batch, heads, seqlen_q), fp32. ``config`` runs exactly that kernel
    variant (a mapping of template parameters); ``None`` picks one for the problem.
    CPU tensors run in Triton's interpreter (slow; for tests).
    """
    problem = problem_from_tensors(q, k, v, causal=causal, causal_align=causal_align)
    sm_scale = resolve_scale(scale, problem.head_dim)
    if config is None:
        chosen = _default_for(problem, q, k, v)
    else:
        chosen = KernelConfig.from_mapping(config)
    check_config(chosen, problem, q, k, v)
    out, lse = allocate_outputs(q, problem, return_lse)
    run(chosen, problem, q, k, v, sm_scale, out, lse)
    return (out, lse) if return_lse else out


def _default_for(problem, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor") -> KernelConfig:
    key = (problem, q.device)
    cfg = _DEFAULTS.get(key)
    if cfg is None:
        capability, sms = None, 1
        if q.device.type == "cuda":
            import torch

            props = torch.cuda.get_device_properties(q.device)
            capability, sms = (props.major, props.minor), props.multi_processor_count
        cfg = _DEFAULTS.setdefault(key, default_config(problem, capability, sms))
    if cfg.access == "tensor_desc" and not tma_compatible(q, k, v):
        return _without_tma(cfg)
    return cfg


@lru_cache(maxsize=256)
def _without_tma(cfg: KernelConfig) -> KernelConfig:
    """The same variant on block pointers, for layouts TMA cannot address."""
    return cfg.with_(access="block_ptr")

"""fa_autotune as a Hugging Face transformers attention implementation.

    import fa_autotune.integrations.transformers as fa_hf
    fa_hf.register()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa_autotune")

Prefill runs :func:`fa_autotune.attention` (causal as SDPA's ``is_causal``, which is what
transformers asks for when it builds no mask); a single new token per sequence runs the
KV-cache kernel of
:func:`fa_autotune.attention_with_kvcache` over the layer's keys and values. transformers
builds the attention mask as for SDPA (registered alongside): none where the batch has no
padding, else a boolean mask. A mask that is causal attention over each sequence's first
``L_b`` keys (a static cache's unused slots, right padding of the keys) runs with per-sequence
lengths; any other mask (left padding, custom masks) raises an ``InputError`` naming it, or,
where nothing can be read back (torch.compile, CUDA-graph capture: transformers compiles
static-cache generation), turns the output NaN; never ignored. Inference only: no dropout,
no gradients.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from ..runtime.api import attention
from ..runtime.kvcache import attention_with_kvcache

NAME = "fa_autotune"
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "head_mask")


def register(name: str = NAME) -> str:
    """Register the attention function (and SDPA's mask builder) under ``name`` in
    transformers' ``AttentionInterface``; returns the name to pass as ``attn_implementation``."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as exc:  # transformers is an optional extra
        raise ImportError("fa_autotune.integrations.transformers needs transformers >= 4.53 "
                          "(pip install 'fa-autotune[transformers]')") from exc
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q (B, Hq, Nq, D), k/v (B, Hkv, Nk, D) (the
    cache already updated), returns ((B, Nq, Hq, D), None)."""
    for option in _UNSUPPORTED:
        if kwargs.get(option) is not None and kwargs.get(option) is not False:
            raise InputError(f"attn_implementation='{NAME}' does not support {option}={kwargs[option]!r}; "
                             "use attn_implementation='sdpa' for this model")
    if kwargs.get("output_attentions"):
        raise InputError(f"attn_implementation='{NAME}' returns no attention weights (output_attentions=True)")
    if dropout and module.training:
        raise InputError(f"attn_implementation='{NAME}' has no attention dropout (dropout={dropout}); call "
                         "model.eval() or use attn_implementation='sdpa' for training")
    n_q, n_k = query.shape[2], key.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if attention_mask is not None:
        lengths, mismatch = _lengths_of(attention_mask, query.shape[0], n_q, n_k, is_causal)
        out = attention_with_kvcache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                     cache_seqlens=lengths, softmax_scale=scaling, causal=bool(is_causal and n_q > 1),
                                     check_lengths=False)
        if mismatch is not None:  # traced or captured: no host check possible, so a wrong mask turns out NaN
            out = out + torch.where(mismatch, float("nan"), 0.0).to(out.dtype)
        return out, None
    if n_q == 1:  # decode: the KV-cache kernel over the whole cache, read once per KV group
        out = attention_with_kvcache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                     cache_seqlens=n_k, softmax_scale=scaling, check_lengths=False)
        return out, None
    # No mask: SDPA's is_causal, aligned top-left (transformers hands a static cache's prefill
    # over as all its slots with the prompt first and no mask, relying on that alignment).
    out = attention(query, key, value, causal=bool(is_causal), scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _lengths_of(mask: torch.Tensor, batch: int, n_q: int, n_k: int,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sequence key counts L_b when ``mask`` (boolean, (B or 1, 1, Nq, >= Nk)) is exactly
    (causal) attention over each sequence's first L_b keys; else an InputError. Under
    torch.compile or CUDA-graph capture nothing can be read back: then also a device flag
    that is true when the mask is not of that form (the caller poisons the output with it)."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        raise InputError(f"attn_implementation='{NAME}' takes the boolean (batch, 1, q, k) masks transformers builds "
                         f"for it, got {mask.dtype} of shape {tuple(mask.shape)}")
    rows = mask[:, 0, :, :n_k].expand(batch, n_q, n_k)
    lengths = rows[:, -1].sum(-1).to(torch.int32)  # the last query sees the most keys
    keys = torch.arange(n_k, device=mask.device)
    limit = lengths[:, None] - (n_q - 1 - torch.arange(n_q, device=mask.device))[None, :] if causal else \
        lengths[:, None].expand(batch, n_q)
    expected = keys[None, None, :] < limit[:, :, None]
    if torch.compiler.is_compiling() or (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
        return lengths.contiguous(), (rows != expected).any()
    if not torch.equal(rows, expected):
        raise InputError(f"attn_implementation='{NAME}' runs attention over each sequence's first keys only: this "
                         "mask (left padding, or a custom pattern) is not that. Pad on the right, run the batch "
                         "without padding, or use attn_implementation='sdpa'")
    return lengths.contiguous(), None

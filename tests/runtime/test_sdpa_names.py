"""SDPA's keyword names where fa_autotune means the same (calls port unchanged), a clear error
where it does not, and a public namespace that lists the API and nothing else."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fa_autotune
from fa_autotune import InputError, attention
from helpers import make_qkv


def test_is_causal_scale_and_enable_gqa_give_what_sdpa_gives():
    q, k, v = make_qkv(1, 4, 2, 24, 24, 32, dtype=torch.float32)
    for is_causal in (False, True):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.2, enable_gqa=True)
        for kwargs in (dict(is_causal=is_causal, scale=0.2, enable_gqa=True),
                       dict(is_causal=is_causal, scale=0.2, attn_mask=None, dropout_p=0.0)):
            got = attention(q, k, v, **kwargs)
            assert torch.allclose(got, want, atol=1e-5), kwargs
        assert torch.equal(attention(q, k, v, is_causal=is_causal), attention(q, k, v, causal=is_causal))
    same_heads = make_qkv(1, 2, 2, 16, 16, 32, dtype=torch.float32)
    assert torch.allclose(attention(*same_heads, enable_gqa=False),
                          F.scaled_dot_product_attention(*same_heads), atol=1e-5)


def test_sdpa_names_reach_the_backward():
    """is_causal under autograd is the causal backward, not the full one."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 16, 16, 32, dtype=torch.float32))
    attention(q, k, v, is_causal=True).sum().backward()
    mine = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    for a, b in zip(mine, (q.grad, k.grad, v.grad)):
        assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(causal=True, is_causal=True), "causal or its SDPA name is_causal, not both"),
    (dict(causal=False, is_causal=True), "not both"),
    (dict(attn_mask=torch.ones(16, 16, dtype=torch.bool)), "attn_mask is not supported"),
    (dict(dropout_p=0.1), "dropout"),
    (dict(dropout_p="0"), "dropout"),
    (dict(enable_gqa=False), "enable_gqa=False but q has 4 heads and k/v 2"),
    (dict(enable_gqa="yes"), "enable_gqa must be True or False"),
    (dict(is_causal=1), "causal must be True or False"),
])
def test_what_sdpa_means_differently_raises(kwargs, match):
    q, k, v = make_qkv(1, 4, 2, 16, 16, 32)
    with pytest.raises(InputError, match=match):
        attention(q, k, v, **kwargs)
    with pytest.raises(InputError, match=match):  # FP8 takes the same names
        fa_autotune.attention_fp8(q, k, v, **kwargs)


def test_varlen_and_kvcache_take_scale_and_is_causal():
    q, k, v = (torch.randn(24, h, 32, dtype=torch.float16) for h in (4, 2, 2))
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)
    want = fa_autotune.attention_varlen(q, k, v, cu, cu, 14, 14, softmax_scale=0.2, causal=True)
    assert torch.equal(fa_autotune.attention_varlen(q, k, v, cu, cu, 14, 14, scale=0.2, is_causal=True), want)
    assert not torch.equal(fa_autotune.attention_varlen(q, k, v, cu, cu, 14, 14, softmax_scale=0.2), want)
    for kwargs in (dict(softmax_scale=0.2, scale=0.2), dict(causal=True, is_causal=True)):
        with pytest.raises(InputError, match="not both"):
            fa_autotune.attention_varlen(q, k, v, cu, cu, 14, 14, **kwargs)
    qc = torch.randn(2, 3, 4, 32, dtype=torch.float16)
    k_cache, v_cache = (torch.randn(2, 12, 2, 32, dtype=torch.float16) for _ in range(2))
    want = fa_autotune.attention_with_kvcache(qc, k_cache, v_cache, cache_seqlens=7, softmax_scale=0.2, causal=True)
    assert torch.equal(fa_autotune.attention_with_kvcache(qc, k_cache, v_cache, cache_seqlens=7, scale=0.2,
                                                          is_causal=True), want)
    assert not torch.equal(fa_autotune.attention_with_kvcache(qc, k_cache, v_cache, cache_seqlens=7,
                                                              softmax_scale=0.2), want)
    for kwargs in (dict(softmax_scale=0.2, scale=0.2), dict(causal=False, is_causal=True)):
        with pytest.raises(InputError, match="not both"):
            fa_autotune.attention_with_kvcache(qc, k_cache, v_cache, cache_seqlens=7, **kwargs)


def test_public_namespace_lists_the_api_only():
    names = dir(fa_autotune)
    for public in ("attention", "attention_fp8", "attention_varlen", "attention_with_kvcache", "explain",
                   "quantize_fp8", "InputError", "ConfigError", "KernelConfig", "Fp8Recipe"):
        assert public in names and public in fa_autotune.__all__
        assert getattr(fa_autotune, public) is not None
    for private in ("Any", "annotations", "_typing"):
        assert private not in names
    assert not hasattr(fa_autotune, "Any") and not hasattr(fa_autotune, "annotations")
    assert sorted(fa_autotune.__all__) == names


def test_explain_takes_is_causal_as_attention_does():
    q, k, v = (torch.randn(1, 2, 16, 16, dtype=torch.float16) for _ in range(3))
    assert fa_autotune.explain(q, k, v, is_causal=True) == fa_autotune.explain(q, k, v, causal=True)
    with pytest.raises(InputError, match="not both"):
        fa_autotune.explain(q, k, v, causal=True, is_causal=True)

"""The real rendered kernels, run in Triton's interpreter (or on the GPU when present),
against a float32 reference: every loop order x causal mode x GQA x odd lengths x head dims."""
from __future__ import annotations

import math

import pytest
import torch

from fa_autotune import attention
from helpers import assert_close_to_reference, make_qkv

# Small tiles keep the interpreter fast and make every length cross several tiles.
LOOP_CONFIGS = {
    "q_outer": dict(loop_order="q_outer", BLOCK_M=32, BLOCK_N=16),
    "kv_outer": dict(loop_order="kv_outer", BLOCK_M=16, BLOCK_N=32, q_tiles=2),
    "split_kv": dict(loop_order="split_kv", BLOCK_M=16, BLOCK_N=16, num_splits=3),
}
# (causal, align, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim)
SHAPES = [
    pytest.param(False, "top_left", 3, 3, 37, 37, 64, id="full-odd37-d64"),
    pytest.param(True, "top_left", 4, 2, 113, 113, 80, id="causal-gqa-113-d80"),
    pytest.param(True, "bottom_right", 4, 1, 19, 70, 32, id="causal-br-mqa-q19-k70-d32"),
    pytest.param(True, "top_left", 2, 2, 70, 19, 16, id="causal-tl-q70-k19-d16"),
    pytest.param(True, "bottom_right", 2, 2, 50, 21, 96, id="causal-br-q50-k21-d96-emptyrows"),
    pytest.param(False, "top_left", 2, 1, 1, 129, 128, id="decode-q1-k129-d128"),
]


@pytest.mark.parametrize("causal_mode", ["split", "masked"])
@pytest.mark.parametrize("loop_order", list(LOOP_CONFIGS))
@pytest.mark.parametrize("causal, align, hq, hkv, nq, nk, d", SHAPES)
def test_matrix_fp16(device, loop_order, causal_mode, causal, align, hq, hkv, nq, nk, d):
    q, k, v = make_qkv(2, hq, hkv, nq, nk, d, torch.float16, device)
    config = dict(LOOP_CONFIGS[loop_order], causal_mode=causal_mode)
    out, lse = attention(q, k, v, causal=causal, config=config, causal_align=align, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close_to_reference(out, q, k, v, causal=causal, causal_align=align, lse=lse)


@pytest.mark.parametrize("loop_order", list(LOOP_CONFIGS))
@pytest.mark.parametrize("causal", [False, True])
def test_fp32(device, loop_order, causal):
    q, k, v = make_qkv(1, 2, 1, 45, 45, 48, torch.float32, device)
    out = attention(q, k, v, causal=causal, config=LOOP_CONFIGS[loop_order])
    assert_close_to_reference(out, q, k, v, causal=causal)


@pytest.mark.parametrize("access", ["pointer", "block_ptr", "tensor_desc"])
@pytest.mark.parametrize("loop_order", list(LOOP_CONFIGS))
def test_access_modes(device, access, loop_order):
    q, k, v = make_qkv(1, 4, 2, 53, 77, 64, torch.float16, device)
    out = attention(q, k, v, causal=True, config=dict(LOOP_CONFIGS[loop_order], access=access))
    assert_close_to_reference(out, q, k, v, causal=True)


@pytest.mark.parametrize("loop_order", list(LOOP_CONFIGS))
def test_flash_attn_layout_views(device, loop_order):
    """(B, N, H, D) storage viewed as (B, H, N, D): no copies, output in the same layout."""
    q, k, v = make_qkv(2, 4, 2, 41, 41, 32, torch.float16, device, layout="bnhd")
    assert not q.is_contiguous()
    out = attention(q, k, v, causal=True, config=LOOP_CONFIGS[loop_order])
    assert out.stride() == q.stride()
    assert_close_to_reference(out, q, k, v, causal=True)


def test_matches_sdpa_semantics(device):
    """Same answer as SDPA's is_causal=True with enable_gqa=True and a custom scale."""
    q, k, v = make_qkv(2, 4, 2, 33, 47, 64, torch.float32, device)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    out = attention(q, k, v, causal=True, scale=0.3, config=LOOP_CONFIGS["q_outer"])
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_default_config(device):
    q, k, v = make_qkv(1, 2, 2, 100, 100, 64, torch.float16, device)
    assert_close_to_reference(attention(q, k, v, causal=True), q, k, v, causal=True)


def test_default_config_decode_uses_split_kv(device):
    q, k, v = make_qkv(1, 4, 1, 1, 1500, 64, torch.float16, device)
    assert_close_to_reference(attention(q, k, v), q, k, v)


def test_seqlen_one(device):
    q, k, v = make_qkv(1, 2, 2, 1, 1, 16, torch.float16, device)
    out = attention(q, k, v, causal=True, config=LOOP_CONFIGS["q_outer"])
    torch.testing.assert_close(out, v, atol=1e-3, rtol=1e-3)  # one key: the output is v itself


def test_every_output_element_written(device):
    """NaN-poisoned memory under the output never leaks through."""
    q, k, v = make_qkv(1, 2, 2, 29, 29, 24, torch.float16, device)
    for loop_order, cfg in LOOP_CONFIGS.items():
        torch.manual_seed(1)
        out = attention(q, k, v, config=cfg)
        assert torch.isfinite(out).all(), loop_order


def test_empty_inputs(device):
    q, k, v = make_qkv(0, 2, 2, 8, 8, 16, torch.float16, device)
    assert attention(q, k, v).shape == (0, 2, 8, 16)
    q, k, v = make_qkv(1, 2, 2, 0, 8, 16, torch.float16, device)
    out, lse = attention(q, k, v, return_lse=True)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


def test_no_keys_gives_zeros_like_sdpa(device):
    q, k, v = make_qkv(1, 2, 2, 5, 0, 16, torch.float32, device)
    out, lse = attention(q, k, v, return_lse=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, expected)
    assert torch.all(lse == -math.inf)


# FlashAttention-3/4 structure knobs of the Q-outer template, alone and combined.
STRUCTURE = {
    "two-q-tiles": dict(q_tiles=2),
    "lazy-rescale": dict(rescale_threshold=8),
    "exp2-poly": dict(exp2_poly=True),
    "persistent-seq": dict(persistent=1),
    "persistent-head": dict(persistent=2, tile_order="head"),
    "head-major": dict(tile_order="head"),
    "all": dict(q_tiles=2, rescale_threshold=4, exp2_poly=True, persistent=1, tile_order="head", maxnreg=128),
}


@pytest.mark.parametrize("knobs", list(STRUCTURE.values()), ids=list(STRUCTURE))
@pytest.mark.parametrize("causal, align, hq, hkv, nq, nk, d", [SHAPES[0], SHAPES[1], SHAPES[4]])
def test_structure_knobs(device, knobs, causal, align, hq, hkv, nq, nk, d):
    q, k, v = make_qkv(2, hq, hkv, nq, nk, d, torch.float16, device)
    config = dict(LOOP_CONFIGS["q_outer"], BLOCK_M=16, **knobs)
    out, lse = attention(q, k, v, causal=causal, config=config, causal_align=align, return_lse=True)
    assert_close_to_reference(out, q, k, v, causal=causal, causal_align=align, lse=lse)


def test_lazy_rescale_survives_growing_scores(device):
    """Scores that grow along the keys force rescaling past the threshold: the stale-max
    shortcut must still give exact softmax weights and LSE (and never overflow fp16 P)."""
    q, k, v = make_qkv(1, 2, 2, 40, 96, 32, torch.float16, device)
    k = k * torch.linspace(0.1, 6.0, 96, device=k.device, dtype=torch.float32)[None, None, :, None].to(k.dtype)
    out, lse = attention(q, k, v, config=dict(LOOP_CONFIGS["q_outer"], rescale_threshold=2), return_lse=True)
    assert_close_to_reference(out, q, k, v, causal=False, lse=lse)

"""On the GPU (``pytest -m gpu``): the correctness matrix at realistic sizes in fp16 and
bf16, the Hopper-only knobs, and memory that stays linear in sequence length."""
from __future__ import annotations

import pytest
import torch

from fa_autotune import ConfigError, attention
from helpers import assert_close_to_reference, make_qkv

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)

CONFIGS = {
    "q_outer-tma-split": dict(access="tensor_desc", causal_mode="split"),
    "q_outer-ptr-masked": dict(access="pointer", causal_mode="masked", num_stages=2),
    "q_outer-blk-split": dict(access="block_ptr", causal_mode="split", BLOCK_N=32),
    "kv_outer-tma-split": dict(loop_order="kv_outer", access="tensor_desc", q_tiles=4, num_stages=2),
    "kv_outer-ptr-masked": dict(loop_order="kv_outer", access="pointer", causal_mode="masked", q_tiles=2, num_stages=2),
    "split_kv-tma-split": dict(loop_order="split_kv", BLOCK_M=64, access="tensor_desc", num_splits=4),
    "split_kv-blk-masked": dict(loop_order="split_kv", BLOCK_M=16, access="block_ptr", causal_mode="masked", num_splits=8),
}
# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, align)
SHAPES = {
    "causal-gqa-1000-d128": (2, 8, 2, 1000, 1000, 128, True, "top_left"),
    "full-4097-d64": (2, 4, 4, 4097, 4097, 64, False, "top_left"),
    "causal-br-q300-k2000-d80": (1, 8, 8, 300, 2000, 80, True, "bottom_right"),
    "decode-q1-k8192-d128-mqa": (4, 16, 1, 1, 8192, 128, False, "top_left"),
}


def _needs_hopper(config: dict) -> bool:
    return config.get("access") == "tensor_desc" or config.get("warp_specialize", False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matrix(name, shape, dtype):
    config = CONFIGS[name]
    if _needs_hopper(config) and not HOPPER:
        config = dict(config, access="block_ptr", warp_specialize=False)
    b, hq, hkv, nq, nk, d, causal, align = SHAPES[shape]
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dtype, "cuda")
    out, lse = attention(q, k, v, causal=causal, causal_align=align, config=config, return_lse=True)
    assert_close_to_reference(out, q, k, v, causal=causal, causal_align=align, lse=lse)


@pytest.mark.skipif(not HOPPER, reason="warp specialization and TMA need sm_90")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "config",
    [
        dict(access="tensor_desc", warp_specialize=True, BLOCK_N=128, num_stages=2),
        dict(access="tensor_desc", warp_specialize=True, BLOCK_N=64, num_stages=2),
        dict(access="tensor_desc", warp_specialize=True, BLOCK_M=64, BLOCK_N=64, num_stages=2),
        # persistent grids: 132 or 264 programs loop over 512 tiles
        dict(access="tensor_desc", warp_specialize=True, BLOCK_N=128, num_stages=2, persistent=1),
        dict(access="tensor_desc", warp_specialize=True, BLOCK_N=64, num_stages=2, persistent=2, tile_order="head"),
        dict(access="tensor_desc", warp_specialize=True, BLOCK_M=64, BLOCK_N=64, num_stages=2, persistent=1, q_tiles=2),
    ],
)
def test_hopper_knobs(config, dtype):
    """With the LSE too: warp-specialized data partitioning once wrote the second consumer's
    LSE rows 64 past their place (templates/_attn_macros.jinja, epilogue)."""
    q, k, v = make_qkv(2, 16, 16, 2048, 2048, 128, dtype, "cuda")
    out, lse = attention(q, k, v, config=config, return_lse=True)
    assert_close_to_reference(out, q, k, v, lse=lse)


@pytest.mark.skipif(not HOPPER, reason="warp specialization needs sm_90")
def test_warp_specialize_refused_where_triton_miscompiles():
    q, k, v = make_qkv(1, 4, 4, 1000, 1000, 128, torch.float16, "cuda")
    config = dict(access="tensor_desc", warp_specialize=True, num_stages=2)
    with pytest.raises(ConfigError, match="warp_specialize"):
        attention(q, k, v, causal=True, config=config)
    with pytest.raises(ConfigError, match="multiple of BLOCK_N"):
        attention(q, k, v, config=config)
    with pytest.raises(ConfigError, match="num_stages=2"):
        attention(q, k, v, config=dict(config, num_stages=3))


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_default_config_and_layouts(layout):
    q, k, v = make_qkv(2, 16, 4, 1536, 1536, 128, torch.bfloat16, "cuda", layout=layout)
    out = attention(q, k, v, causal=True)
    assert out.stride() == q.stride()
    assert_close_to_reference(out, q, k, v, causal=True)


def test_matches_sdpa_fp16():
    q, k, v = make_qkv(2, 8, 8, 2048, 2048, 128, torch.float16, "cuda")
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = attention(q, k, v, causal=True)
    assert (out.float() - expected.float()).abs().max() < 5e-3


def test_memory_is_linear_in_sequence_length():
    """At N=65536 a materialised score matrix would need 137 GB; we need ~the output."""
    q, k, v = make_qkv(1, 8, 8, 65536, 65536, 128, torch.float16, "cuda")
    from fa_autotune.tune.measure import peak_extra_bytes

    attention(q, k, v, causal=True)  # compile outside the measurement
    out, extra = peak_extra_bytes(lambda: attention(q, k, v, causal=True))
    assert extra <= 2 * out.numel() * out.element_size()


def test_torch_compile_fullgraph_inductor():
    import fa_autotune

    class Block(torch.nn.Module):
        def forward(self, x, k, v):
            return fa_autotune.attention(torch.nn.functional.silu(x), k, v, causal=True) * 2

    q, k, v = make_qkv(2, 8, 2, 512, 512, 64, torch.bfloat16, "cuda")
    torch._dynamo.reset()
    compiled = torch.compile(Block(), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), Block()(q, k, v), atol=2e-2, rtol=2e-2)


def test_cuda_graph_capture_and_replay():
    q, k, v = make_qkv(2, 8, 8, 1000, 1000, 128, torch.float16, "cuda")
    attention(q, k, v, causal=True)  # compile and plan outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention(q, k, v, causal=True)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out, q, k, v, causal=True)


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_name() == "NVIDIA H200"),
                    reason="the shipped file is for the H200")
def test_shipped_h200_configs_are_used(monkeypatch, tmp_path):
    import fa_autotune
    from fa_autotune.runtime import dispatch

    monkeypatch.setenv("FA_AUTOTUNE_DB", f"sqlite:///{tmp_path / 'none.sqlite'}")
    monkeypatch.delenv("FA_AUTOTUNE_CONFIG_DIR", raising=False)
    dispatch.DISPATCHER.reset()
    q, k, v = make_qkv(4, 16, 16, 4096, 4096, 128, torch.bfloat16, "cuda")
    info = fa_autotune.explain(q, k, v, causal=True)
    assert info["source"] == "shipped" and info["distance"] == 0
    assert_close_to_reference(fa_autotune.attention(q, k, v, causal=True), q, k, v, causal=True)
    q, k, v = make_qkv(2, 16, 16, 3000, 3000, 128, torch.bfloat16, "cuda")
    info = fa_autotune.explain(q, k, v, causal=True)
    assert info["source"] == "shipped" and info["distance"] > 0  # nearest tuned problem
    dispatch.DISPATCHER.reset()


STRUCTURE = {
    "two-q-tiles-tma": dict(access="tensor_desc", BLOCK_M=64, BLOCK_N=64, q_tiles=2, num_stages=2),
    "lazy-poly-ptr": dict(access="pointer", rescale_threshold=8, exp2_poly=True),
    "persistent-head-tma": dict(access="tensor_desc", persistent=2, tile_order="head", num_stages=2),
    "w8-maxnreg": dict(access="pointer", num_warps=8, maxnreg=128),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(STRUCTURE))
@pytest.mark.parametrize("shape", ["causal-gqa-1000-d128", "causal-br-q300-k2000-d80"])
def test_structure_knobs(name, shape, dtype):
    config = STRUCTURE[name]
    if _needs_hopper(config) and not HOPPER:
        config = dict(config, access="block_ptr")
    b, hq, hkv, nq, nk, d, causal, align = SHAPES[shape]
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dtype, "cuda")
    out = attention(q, k, v, causal=causal, causal_align=align, config=config)
    assert_close_to_reference(out, q, k, v, causal=causal, causal_align=align)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scaling", ["per_tensor", "per_head", "per_block"])
@pytest.mark.parametrize("access", ["tensor_desc", "pointer"])
def test_fp8_modes(fmt, scaling, access):
    """Each FP8 recipe against float32 on the unquantized inputs, with FP8 tensor cores."""
    from fa_autotune import attention_fp8
    from fa_autotune.tune.reference import TOLERANCE, compare, reference_attention

    if access == "tensor_desc" and not HOPPER:
        access = "block_ptr"
    q, k, v = make_qkv(2, 8, 2, 1000, 1000, 128, torch.float16, "cuda")
    out = attention_fp8(q, k, v, causal=True, scaling=scaling, hadamard=True, fmt=fmt,
                        config=dict(access=access, BLOCK_N=128, num_warps=8, num_stages=2))
    ref, _ = reference_attention(q, k, v, causal=True)
    report = compare(out.float(), ref)
    assert report.finite and report.rel <= TOLERANCE["float8_e4m3fn" if fmt == "e4m3" else "float8_e5m2"]


@pytest.mark.skipif(not HOPPER, reason="warp specialization needs sm_90")
@pytest.mark.parametrize("fp8_pv", ["separate", "inplace"])
@pytest.mark.parametrize("persistent", [0, 1])
def test_fp8_warp_specialized_128x256(persistent, fp8_pv):
    """The FP8 default's kernel family (128x256 tiles, TMA, warp-specialized, persistent or
    not) on inputs whose 256-row V blocks differ 100-fold: per-block + Hadamard (each block
    its own descale) for separate PV products, per-head + Hadamard for in-place ones."""
    from fa_autotune import attention_fp8
    from fa_autotune.tune.reference import TOLERANCE, compare, reference_attention

    q, k, v = make_qkv(2, 8, 8, 2048, 2048, 128, torch.float16, "cuda")
    v = v * torch.logspace(-1, 1, 8, device="cuda").repeat_interleave(256)[None, None, :, None].half()
    config = dict(BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc", warp_specialize=True,
                  persistent=persistent, fp8_pv=fp8_pv)
    scaling = "per_block" if fp8_pv == "separate" else "per_head"
    out = attention_fp8(q, k, v, config=config, scaling=scaling, block_k=256)
    ref, _ = reference_attention(q, k, v)
    report = compare(out.float(), ref)
    assert report.finite and report.rel <= TOLERANCE["float8_e4m3fn"]


@pytest.mark.parametrize("scaling", ["per_tensor", "per_head", "per_block"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("blocks", [dict(), dict(block_k=256, v_order="wgmma")], ids=["k128", "k256-wgmma"])
def test_fused_fp8_quantization_matches_eager(scaling, dtype, head_dim, blocks):
    """The Triton quantization passes with the GPU's own FP8 conversion, against the float32
    eager path: same scales, FP8 codes equal but for rare one-step rounding differences
    (D=256: the per-block pass's shallower pipeline, which fits in shared memory there;
    256-key blocks: whole blocks held in 16 warps' registers, V gathered into the wgmma
    order)."""
    from fa_autotune.fp8.quantize import quantize_fp8

    q, k, v = make_qkv(2, 8, 2, 1008, 1008, head_dim, dtype, "cuda")
    q[..., 3] *= 20
    fused = quantize_fp8(q, k, v, scaling=scaling, backend="triton", **blocks)
    eager = quantize_fp8(q, k, v, scaling=scaling, backend="torch", **blocks)
    for name in ("q_scale", "k_scale", "v_scale"):
        torch.testing.assert_close(getattr(fused, name), getattr(eager, name), rtol=1e-5, atol=0)
    for name in ("q", "k", "v"):
        a, b = getattr(fused, name).float(), getattr(eager, name).float()
        diff = (a - b).abs()
        assert bool((diff <= a.abs().clamp_min(2 ** -6) * 2 ** -2).all()), name
        assert float((diff > 0).float().mean()) < 0.01, name


def test_tuner_warm_compile_uses_the_fp8_inputs():
    """The tuner's GPU compile step compiles each config for the layout it will be timed on:
    FP8 with V sequence-contiguous, so TMA and warp-specialized FP8 configs compile (without
    the sink tile, which those cannot hold), and with the default recipe's sink tile its
    16-bit sources beside the descales."""
    from fa_autotune.tune.compile import compile_for_tuning
    from fa_autotune.spec.config import KernelConfig
    from fa_autotune.spec.problem import Problem
    from fa_autotune.spec.recipe import Fp8Recipe

    problem = Problem(1, 2, 2, 1024, 1024, 128, "float8_e4m3fn")
    config = KernelConfig(BLOCK_M=128, BLOCK_N=256 if HOPPER else 128, num_warps=4, num_stages=2,
                          access="tensor_desc" if HOPPER else "block_ptr", warp_specialize=HOPPER)
    result = compile_for_tuning(config, problem, recipe=Fp8Recipe(sink_tile=False))
    assert result.status == "ok", result.error
    plain = config.with_(warp_specialize=False, num_warps=8)
    result = compile_for_tuning(plain, problem)  # the default recipe: the sink tile
    assert result.status == "ok", result.error

"""FP8 attention: the real rendered FP8 kernels (Triton's interpreter runs FP8 dots) for
every scaling mode and format against a float32 reference of the unquantized inputs, the
outlier case incoherent processing exists for, and the errors a user can hit."""
from __future__ import annotations

import pytest
import torch

import fa_autotune
from fa_autotune import ConfigError, InputError, attention_fp8, quantize_fp8
from fa_autotune.tune.reference import TOLERANCE, compare, reference_attention
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.inputs import FP8_INPUT_KINDS, fp8_source_inputs
from helpers import make_qkv

SMALL = dict(BLOCK_M=32, BLOCK_N=32)


def _error(out, q, k, v, causal=False, causal_align="top_left"):
    ref, _ = reference_attention(q, k, v, causal=causal, causal_align=causal_align)
    report = compare(out.float(), ref)
    assert report.finite, "output has NaN/Inf"
    return report.rel


@pytest.mark.parametrize("fmt, dtype", [("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2")])
@pytest.mark.parametrize("scaling", ["per_tensor", "per_head", "per_block"])
@pytest.mark.parametrize("causal", [False, True])
def test_each_scaling_mode_matches_float32(device, fmt, dtype, scaling, causal):
    q, k, v = make_qkv(2, 4, 2, 77, 77, 64, torch.float16, device)
    inputs = quantize_fp8(q, k, v, scaling=scaling, fmt=fmt, block_q=32, block_k=32)
    out, lse = attention_fp8(inputs, causal=causal, config=SMALL, out_dtype=torch.float16, return_lse=True)
    assert out.dtype == torch.float16 and out.shape == q.shape and lse.shape == q.shape[:3]
    assert _error(out, q, k, v, causal) <= TOLERANCE[dtype]
    _, ref_lse = reference_attention(q, k, v, causal=causal)
    assert torch.allclose(lse, ref_lse, atol=2 * TOLERANCE[dtype])  # one score's FP8 error at most


@pytest.mark.parametrize("causal", [False, True])
def test_per_block_scales_far_apart(device, causal):
    """V blocks whose magnitudes differ by 10^4: each V tile's descale must reach its PV
    product, and K's blocks change the score scale, so any slip there is a large error,
    not a rounding one."""
    q, k, v = make_qkv(1, 2, 2, 100, 100, 32, torch.float16, device)
    for i, factor in enumerate((1.0, 100.0, 0.01, 10.0)):
        v[:, :, 32 * i:32 * (i + 1)] *= factor
        k[:, :, 32 * i:32 * (i + 1)] *= factor ** 0.25
    inputs = quantize_fp8(q, k, v, scaling="per_block", block_q=32, block_k=32)
    assert inputs.v_scale.amax() / inputs.v_scale.amin() > 1e3
    out = attention_fp8(inputs, causal=causal, config=dict(BLOCK_M=16, BLOCK_N=32), out_dtype=torch.float16)
    assert _error(out, q, k, v, causal) <= TOLERANCE["float8_e4m3fn"]


@pytest.mark.parametrize("scaling", ["per_tensor", "per_head"])
@pytest.mark.parametrize("rescale_threshold", [0, 4])
def test_inplace_pv_product(device, scaling, rescale_threshold):
    """fp8_pv='inplace' accumulates raw PV products and descales V once in the epilogue:
    the same result as separate PV products for one V descale per head (heads 1000x apart
    here, so a wrong head's descale shows), refused for per-block V descales, and a
    dispatched config falls back to 'separate' for them."""
    from fa_autotune.runtime.api import _fp8_usable
    from fa_autotune.spec.problem import Problem

    q, k, v = make_qkv(1, 2, 2, 100, 100, 32, torch.float16, device)
    v[:, 1] *= 1000.0
    config = dict(BLOCK_M=16, BLOCK_N=32, fp8_pv="inplace", rescale_threshold=rescale_threshold)
    x = quantize_fp8(q, k, v, scaling=scaling)
    for causal in (False, True):
        inplace = attention_fp8(x, causal=causal, config=config, out_dtype=torch.float16)
        separate = attention_fp8(x, causal=causal, config=dict(config, fp8_pv="separate"), out_dtype=torch.float16)
        report = compare(inplace.float(), separate.float())
        assert report.finite and report.rel < 5e-3
    blocks = quantize_fp8(q, k, v, scaling="per_block", block_q=32, block_k=32)
    with pytest.raises(ConfigError, match="fp8_pv"):
        attention_fp8(blocks, config=config)
    problem = Problem(1, 2, 2, 100, 100, 32, "float8_e4m3fn")
    assert _fp8_usable(fa_autotune.KernelConfig(**config), problem, blocks, explicit=False).fp8_pv == "separate"


def test_convenience_path_quantizes_like_quantize_fp8(device):
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, torch.float16, device)
    direct = attention_fp8(q, k, v, config=SMALL, scaling="per_head", hadamard=True, fmt="e4m3")
    via = attention_fp8(quantize_fp8(q, k, v, scaling="per_head", hadamard=True, fmt="e4m3"), config=SMALL,
                        out_dtype=torch.float16)
    assert direct.dtype == torch.float16 and torch.equal(direct, via)


def test_bottom_right_gqa_and_default_config(device):
    q, k, v = make_qkv(1, 4, 1, 20, 70, 48, torch.float16, device)
    out = attention_fp8(q, k, v, causal=True, causal_align="bottom_right", config=dict(SMALL, BLOCK_M=16), block_q=16)
    assert _error(out, q, k, v, True, "bottom_right") <= TOLERANCE["float8_e4m3fn"]
    q, k, v = make_qkv(1, 2, 2, 130, 130, 64, torch.float16, device)
    assert _error(attention_fp8(q, k, v), q, k, v) <= TOLERANCE["float8_e4m3fn"]


def test_dispatched_config_adapts_to_small_scaling_blocks(device):
    """The default FP8 tiles (128 rows) shrink into 64-row scaling blocks instead of failing."""
    q, k, v = make_qkv(1, 2, 2, 256, 256, 64, torch.float16, device)
    x = quantize_fp8(q, k, v, scaling="per_block", block_q=64, block_k=64)
    assert _error(attention_fp8(x, out_dtype=torch.float16), q, k, v) <= TOLERANCE["float8_e4m3fn"]
    out = attention_fp8(q, k, v, scaling="per_block", block_q=64, block_k=64)
    assert _error(out, q, k, v) <= TOLERANCE["float8_e4m3fn"]


def _with_outlier_channels(q, k, channels=(3, 17, 40, 61), factor=20.0):
    """A few channels of Q and K scaled x20, like the outlier features of LLM activations."""
    q, k = q.clone(), k.clone()
    q[..., list(channels)] *= factor
    k[..., list(channels)] *= factor
    return q, k


def test_block_scaling_with_hadamard_halves_the_outlier_error(device):
    """FlashAttention-3's claim, on our kernels: per-block scaling with incoherent
    processing has at most half the error of plain per-tensor scaling on outlier inputs."""
    torch.manual_seed(0)
    q, k, v = make_qkv(1, 4, 4, 128, 128, 64, torch.float32, device)
    q, k = _with_outlier_channels(q * 0.25, k * 0.25)
    plain = _error(attention_fp8(q, k, v, config=SMALL, scaling="per_tensor", hadamard=False), q, k, v)
    incoherent = _error(attention_fp8(q, k, v, config=SMALL, scaling="per_block", hadamard=True, block_q=32,
                                      block_k=32), q, k, v)
    assert incoherent <= 0.5 * plain, f"per-block + Hadamard {incoherent:.4f} vs per-tensor {plain:.4f}"


def test_plain_attention_refuses_fp8_tensors(device):
    q, k, v = make_qkv(1, 2, 2, 16, 16, 32, torch.float16, device)
    inputs = quantize_fp8(q, k, v)
    with pytest.raises(InputError, match="attention_fp8"):
        fa_autotune.attention(inputs.q, inputs.k, inputs.v)


@pytest.mark.parametrize("config, parameter", [
    ({"loop_order": "kv_outer", "BLOCK_M": 32, "BLOCK_N": 32}, "loop_order"),
    ({"q_tiles": 2, "BLOCK_M": 16, "BLOCK_N": 32}, "q_tiles"),
    ({"BLOCK_M": 64, "BLOCK_N": 32}, "BLOCK_M"),  # straddles the 32-row Q scaling blocks
    ({"BLOCK_M": 32, "BLOCK_N": 64}, "BLOCK_N"),
    ({"BLOCK_M": 32, "BLOCK_N": 32, "rescale_threshold": 9}, "rescale_threshold"),  # P up to 512 > e4m3's 448
])
def test_unusable_configs_name_the_parameter(device, config, parameter):
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, torch.float16, device)
    inputs = quantize_fp8(q, k, v, scaling="per_block", block_q=32, block_k=32)
    with pytest.raises(ConfigError) as info:
        attention_fp8(inputs, config=config)
    assert info.value.parameter == parameter


def test_bad_scales_and_output_dtype_are_clear_errors(device):
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, torch.float16, device)
    inputs = quantize_fp8(q, k, v, scaling="per_block", block_q=32, block_k=32)
    from dataclasses import replace

    with pytest.raises(InputError, match="k_scale must be a float32 tensor of shape"):
        attention_fp8(replace(inputs, k_scale=inputs.k_scale[:, :, :1]), config=SMALL)
    with pytest.raises(InputError, match="out_dtype"):
        attention_fp8(inputs, config=SMALL, out_dtype=torch.float32)
    with pytest.raises(InputError, match="not both"):
        attention_fp8(inputs, k, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fused-quantizer", "torch-quantizer"])
@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("scaling", ["per_block", "per_head"])
def test_nan_and_inf_inputs_reach_the_output(device, dtype, name, value, scaling):
    """A NaN or inf in q, k or v makes every output row non-finite that attention()'s is
    (the quantizer once gave a NaN group a descale of 1.0, and FP8 attention a finite
    answer): no silent finite output from a broken input."""
    q, k, v = make_qkv(1, 2, 2, 48, 48, 32, dtype, device)
    inputs = {"q": q, "k": k, "v": v}
    inputs[name][0, 0, 5, 3] = value
    for causal in (False, True):
        ref = fa_autotune.attention(*inputs.values(), causal=causal)
        broken = ~torch.isfinite(ref)
        assert broken.any()  # the case tests something
        out = attention_fp8(*inputs.values(), causal=causal, scaling=scaling, config=SMALL)
        assert not torch.isfinite(out.float())[broken].any()


def _sink_inputs(device, hq=4, hkv=2, n_q=100, n_k=100, d=64, seed=0):
    """Attention sinks as trained LLMs have them: the first 4 keys with norms 40x the rest,
    their values 10x (fp16, so the sink tile's 16-bit dot runs in the interpreter)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, n_q, d, generator=gen)
    k, v = (torch.randn(1, hkv, n_k, d, generator=gen) for _ in range(2))
    k[:, :, :4] *= 40.0
    v[:, :, :4] *= 10.0
    return tuple(t.half().to(device) for t in (q, k, v))


@pytest.mark.parametrize("causal, align, n_q", [(False, "top_left", 100), (True, "top_left", 100),
                                                (True, "bottom_right", 70)])
@pytest.mark.parametrize("scaling", ["per_tensor", "per_block"])
def test_sink_tile_keeps_attention_sinks_accurate(device, causal, align, n_q, scaling):
    """With sinks every recipe is off by 0.13-0.15 without the sink tile (FP8's rounding of Q
    and K, amplified by the sinks' scores); scoring the first K tile from the 16-bit q and k,
    as the default recipe does, brings it under 0.06, GQA, causal in both alignments and a
    ragged last tile included, quantized here or ahead."""
    q, k, v = _sink_inputs(device, n_q=n_q)
    options = dict(causal=causal, causal_align=align, config=SMALL, scaling=scaling, block_q=32, block_k=32)
    plain = _error(attention_fp8(q, k, v, sink_tile=False, **options), q, k, v, causal, align)
    sink = _error(attention_fp8(q, k, v, **options), q, k, v, causal, align)
    assert plain > 0.1 and sink <= 0.06, (plain, sink)
    assert quantize_fp8(q, k, v, sink_tile=False).sources is None
    inputs = quantize_fp8(q, k, v, scaling=scaling, block_q=32, block_k=32)
    assert inputs.sources[0] is q and inputs.sources[1] is k  # kept, not copied
    ahead = attention_fp8(inputs, causal=causal, causal_align=align, config=SMALL)
    assert _error(ahead, q, k, v, causal, align) <= 0.06
    off = attention_fp8(inputs, causal=causal, causal_align=align, config=SMALL, sink_tile=False)
    assert _error(off, q, k, v, causal, align) > 0.1


@pytest.mark.parametrize("kind", FP8_INPUT_KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_default_recipe_is_accurate_on_every_kind_of_input(device, kind, causal):
    """Issue 42's bar: attention_fp8 with nothing but the inputs (the default recipe: per
    block, Hadamard, sink tile) stays within 0.06 of float32 on the tuner's outlier-channel
    inputs and on its attention-sink inputs."""
    problem = Problem(1, 4, 2, 96, 128, 64, "float8_e4m3fn", causal)
    q, k, v = (t.to(device) for t in fp8_source_inputs(problem, "cpu", seed=1, kind=kind))
    out = attention_fp8(q, k, v, causal=causal, config=SMALL, block_q=32, block_k=32)
    assert _error(out, q.float(), k.float(), v.float(), causal) <= 0.06


def test_sink_tile_shorter_than_a_tile_and_without_sinks(device):
    """Fewer keys than one K tile: the sink tile is the whole row. Without sinks the sink tile
    changes nothing that matters (within the FP8 tolerance, no worse than without it)."""
    q, k, v = _sink_inputs(device, n_q=20, n_k=20)
    out = attention_fp8(q, k, v, causal=True, config=SMALL, sink_tile=True)
    assert _error(out, q, k, v, True) <= 0.06
    q, k, v = make_qkv(1, 2, 2, 77, 77, 64, torch.float16, device)
    plain = _error(attention_fp8(q, k, v, config=SMALL), q, k, v)
    sink = _error(attention_fp8(q, k, v, config=SMALL, sink_tile=True), q, k, v)
    assert sink <= TOLERANCE["float8_e4m3fn"] and sink <= plain * 1.05


def test_sink_tile_mistakes_are_clear_errors(device):
    q, k, v = make_qkv(1, 2, 2, 40, 40, 32, torch.float16, device)
    with pytest.raises(InputError, match="quantize_fp8\\(..., sink_tile=True\\)"):
        attention_fp8(quantize_fp8(q, k, v, block_q=32, block_k=32, sink_tile=False), config=SMALL, sink_tile=True)
    with pytest.raises(InputError, match="sink_tile must be"):
        attention_fp8(q, k, v, config=SMALL, sink_tile="yes")
    with pytest.raises(InputError, match="sink_tile must be"):
        quantize_fp8(q, k, v, sink_tile=1)


def test_sink_tile_sources_are_checked(device):
    """The sink tile's q and k are the tensors the FP8 ones came from."""
    import dataclasses

    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, torch.float16, device)
    inputs = quantize_fp8(q, k, v, block_q=32, block_k=32, sink_tile=True)
    for sources, match in (((q[:, :, :32], k), "sink tile's q must be .* shape \\(1, 2, 64, 32\\)"),
                           ((q, k.to(torch.int16)), "sink tile's k must be"),
                           ((q, k.float()), "share a dtype"),
                           ((q, "k"), "got str")):
        with pytest.raises(InputError, match=match):
            attention_fp8(dataclasses.replace(inputs, sources=sources), config=SMALL)


@pytest.mark.parametrize("n_q", [100, 20])
@pytest.mark.parametrize("scaling, pv", [("per_block", "separate"), ("per_head", "inplace")])
def test_warp_specialized_sink_tile_runs_a_second_kernel(device, monkeypatch, n_q, scaling, pv):
    """A warp-specialized FP8 config (the H200's non-causal choice) keeps its specialization
    with the sink tile: it skips the first K tile, and a second kernel scores that tile from
    the 16-bit q and k and merges it into the output by the LSE. As accurate as the
    unspecialized kernel's
    inline sink tile, with the same LSE, GQA and a ragged last Q tile included (warp
    specialization is non-causal, keys a multiple of BLOCK_N); as accurate when dispatched."""
    from fa_autotune.runtime import api, dispatch
    from fa_autotune.spec.config import KernelConfig
    from fa_autotune.spec.recipe import Fp8Recipe

    q, k, v = _sink_inputs(device, n_q=n_q, n_k=96)
    inputs = quantize_fp8(q, k, v, scaling=scaling, block_q=32, block_k=32)
    specialized = dict(SMALL, access="tensor_desc", causal_mode="split", num_stages=2, warp_specialize=True,
                       persistent=1, fp8_pv=pv)
    options = dict(out_dtype=torch.float16)
    side, side_lse = attention_fp8(inputs, config=specialized, return_lse=True, **options)
    inline, inline_lse = attention_fp8(inputs, config=dict(specialized, warp_specialize=False, persistent=0),
                                       return_lse=True, **options)
    assert torch.allclose(side_lse, inline_lse, atol=1e-3)
    error = _error(side, q, k, v)
    plain = attention_fp8(inputs, config=specialized, sink_tile=False, **options)
    assert error <= min(0.06, 1.1 * _error(inline, q, k, v)), (error, _error(inline, q, k, v))
    assert _error(plain, q, k, v) > 2 * error  # the second kernel is what fixes it

    chosen = dispatch.Choice(KernelConfig(**specialized), "database", None, 0.0, "test", Fp8Recipe(scaling, True, True))
    monkeypatch.setattr(dispatch.DISPATCHER, "choose_fp8", lambda *a, **kw: chosen)
    monkeypatch.setattr(api, "_PLANS", {})  # no plan kept from another test
    ran = []
    real = api.prepare
    monkeypatch.setattr(api, "prepare", lambda config, *args: ran.append(config) or real(config, *args))
    out = attention_fp8(q, k, v, block_q=32, block_k=32, **options)
    assert ran[-1].warp_specialize and _error(out, q, k, v) <= 0.06


def test_repeated_calls_reuse_their_plan(device, monkeypatch):
    """attention_fp8 keeps a call's plan (dispatch, checks, prepared launch) under its shapes,
    strides, dtypes, devices and options, as attention() does: the second call neither
    dispatches nor prepares, gives the same output, and any change of those makes a new plan."""
    from fa_autotune.runtime import api

    calls = {"prepare": 0, "choose": 0}
    real_prepare, real_choice = api.prepare, api._fp8_choice
    monkeypatch.setattr(api, "prepare", lambda *a, **kw: calls.__setitem__("prepare", calls["prepare"] + 1)
                        or real_prepare(*a, **kw))
    monkeypatch.setattr(api, "_fp8_choice", lambda *a, **kw: calls.__setitem__("choose", calls["choose"] + 1)
                        or real_choice(*a, **kw))
    monkeypatch.setattr(api, "_PLANS", {})
    q, k, v = _sink_inputs(device, n_q=64, n_k=64)
    x = quantize_fp8(q, k, v, block_q=32, block_k=32)
    for args, options in (((q, k, v), dict(block_q=32, block_k=32)), ((x,), {})):
        first = attention_fp8(*args, **options)
        seen = dict(calls)
        second = attention_fp8(*args, **options)
        assert calls == seen and torch.equal(first, second)
        assert _error(second, q, k, v) <= 0.06
        for changed in (dict(causal=True), dict(sink_tile=False), dict(return_lse=True), dict(out_dtype=torch.float16)):
            out = attention_fp8(*args, **options, **changed)
            assert calls["prepare"] > seen["prepare"], changed
            seen = dict(calls)
            again = attention_fp8(*args, **options, **changed)
            assert calls == seen
            if changed.get("return_lse"):
                assert torch.equal(out[0], again[0]) and torch.equal(out[1], again[1])
            else:
                assert torch.equal(out, again)
    # an explicit config is not kept (it is parsed, checked and run on the general path)
    ran = []
    real_run = api.run
    monkeypatch.setattr(api, "run", lambda *a: ran.append(a[0]) or real_run(*a))
    attention_fp8(x, config=SMALL)
    attention_fp8(x, config=SMALL)
    assert len(ran) == 2
    with pytest.raises(InputError, match="sink_tile=True needs"):  # a refused call is never kept
        attention_fp8(quantize_fp8(q, k, v, block_q=32, block_k=32, sink_tile=False), sink_tile=True)


def test_a_dispatcher_reset_forgets_kept_plans(device, monkeypatch):
    """After DISPATCHER.reset() (a tune or an import in this process) the next call consults
    the dispatcher again instead of running a plan kept on its earlier choice (the KV cache's
    plans go too)."""
    from fa_autotune.runtime import api, dispatch, kvcache

    monkeypatch.setattr(api, "_PLANS", {})
    monkeypatch.setattr(kvcache, "_PLANS", {("kept",): None})
    q, k, v = _sink_inputs(device, n_q=64, n_k=64)
    attention_fp8(q, k, v, block_q=32, block_k=32)
    assert api._PLANS
    dispatch.DISPATCHER.reset()
    assert not api._PLANS and not kvcache._PLANS


@pytest.mark.parametrize("causal", [False, True])
def test_v_in_the_wgmma_order_reaches_the_pv_product(device, causal):
    """V stored in the wgmma order gives the natural order's attention (the kernel relabels P's
    keys alike; the interpreter runs that reshape), while the same bytes read as natural
    order do not: the flag is what makes it right. attention_fp8 quantizing q, k, v itself
    picks the wgmma order for a kernel that reads it, the natural one for Triton's
    warp-specialized kernels (which refuse the other by name)."""
    import dataclasses

    from fa_autotune.fp8.quantize import v_order_for

    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, torch.float16, device)
    v[:, :, 5::7] *= 8.0  # keys that differ, so a key read in another's place shows
    args = dict(scaling="per_block", block_q=32, block_k=32)
    natural, wgmma = quantize_fp8(q, k, v, v_order="natural", **args), quantize_fp8(q, k, v, v_order="wgmma", **args)
    run = lambda x: attention_fp8(x, causal=causal, config=SMALL, out_dtype=torch.float16).float()
    a, b = run(natural), run(wgmma)
    torch.testing.assert_close(a, b, atol=2e-3, rtol=0)
    assert _error(b, q, k, v, causal) <= TOLERANCE["float8_e4m3fn"]
    misread = run(dataclasses.replace(wgmma, v_order="natural"))
    assert (misread - a).abs().max() > 0.1
    assert (v_order_for(False, 64), v_order_for(True, 64), v_order_for(False, 72)) == ("wgmma", "natural", "natural")

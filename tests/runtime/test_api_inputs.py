"""Bad input gets a clear error before any kernel runs."""
from __future__ import annotations

import pytest
import torch

import fa_autotune
from fa_autotune import ConfigError, InputError, attention
from helpers import make_qkv


def qkv(**kw):
    return make_qkv(1, 4, 2, 16, 16, 32, **kw)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda q, k, v: (q.float(), k, v), "share one dtype"),
        (lambda q, k, v: (q.to(torch.int32), k, v), "dtype torch.int32"),
        (lambda q, k, v: (q.double(), k.double(), v.double()), "dtype torch.float64"),
        (lambda q, k, v: (q[0], k, v), "4 dims"),
        (lambda q, k, v: (q, k[..., :16], v), "same shape"),
        (lambda q, k, v: (q, k[..., :16], v[..., :16]), "head_dim differs"),
        (lambda q, k, v: (q[..., :8], k[..., :8], v[..., :8]), "head_dim 8 is not supported"),
        (lambda q, k, v: (q, torch.randn(1, 3, 16, 32, dtype=torch.float16), torch.randn(1, 3, 16, 32, dtype=torch.float16)), "multiple of heads_kv"),
        (lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])), "batch differs"),
        (lambda q, k, v: (q.numpy(), k, v), "must be a torch.Tensor"),
        (lambda q, k, v: (q.to("meta"), k.to("meta"), v.to("meta")), "device meta"),
        (lambda q, k, v: (q.to("meta"), k, v), "one device"),
    ],
)
def test_bad_tensors(mutate, message):
    q, k, v = qkv()
    with pytest.raises(InputError, match=message):
        attention(*mutate(q, k, v))


def test_head_dim_too_large():
    q, k, v = make_qkv(1, 1, 1, 4, 4, 288)
    with pytest.raises(InputError, match="head_dim 288"):
        attention(q, k, v)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1", True, 0.0, -0.125, [0.1]])
def test_bad_scale(scale):
    with pytest.raises(InputError, match="scale"):
        attention(*qkv(), scale=scale)


def test_bad_causal_arguments():
    with pytest.raises(InputError, match="causal must be"):
        attention(*qkv(), causal="yes")
    with pytest.raises(InputError, match="causal_align"):
        attention(*qkv(), causal=True, causal_align="middle")


def test_causal_is_checked_whatever_ran_before():
    """causal=1 is refused the same after a causal=True call with these shapes: 1 == True in
    the plan cache's key, which must not stand in for validation (forward and backward)."""
    from fa_autotune.runtime.api import attention_backward

    q, k, v = qkv()
    for causal in (1, 1.0):
        with pytest.raises(InputError, match="causal must be"):
            attention(q, k, v, causal=causal)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    attention_backward(q, k, v, out, lse, out, causal=True)
    for causal in (1, 1.0):
        with pytest.raises(InputError, match="causal must be"):
            attention(q, k, v, causal=causal)
        with pytest.raises(InputError, match="causal must be"):
            attention_backward(q, k, v, out, lse, out, causal=causal)
    attention(q, k, v, causal=False)
    with pytest.raises(InputError, match="causal must be"):
        attention(q, k, v, causal=0)


@pytest.mark.parametrize(
    "config, parameter",
    [
        ({"BLOCK_M": 48}, "BLOCK_M"),
        ({"BLOCK_N": 512}, "BLOCK_N"),
        ({"num_warps": 3}, "num_warps"),
        ({"num_stages": 0}, "num_stages"),
        ({"loop_order": "diagonal"}, "loop_order"),
        ({"access": "magic"}, "access"),
        ({"causal_mode": "none"}, "causal_mode"),
        ({"num_splits": 4}, "num_splits"),
        ({"q_tiles": 3}, "q_tiles"),
        ({"rescale_threshold": 16}, "rescale_threshold"),  # P up to 2**16 overflows fp16
        ({"tile_order": "diagonal"}, "tile_order"),
        ({"loop_order": "kv_outer", "persistent": 1}, "persistent"),
        ({"maxnreg": 100}, "maxnreg"),
        ({"loop_order": "kv_outer", "warp_specialize": True}, "warp_specialize"),
        ({"warp_specialize": 1}, "warp_specialize"),
        ({"loop_order": "split_kv", "num_splits": 2, "warp_specialize": True}, "warp_specialize"),
        ({"access": "pointer", "warp_specialize": True}, "warp_specialize"),
        ({"access": "tensor_desc", "causal_mode": "masked", "warp_specialize": True}, "warp_specialize"),
        ({"BLOCK_M": "64"}, "BLOCK_M"),
        ({"block_m": 64}, "block_m"),
    ],
)
def test_bad_configs_name_the_parameter(config, parameter):
    with pytest.raises(ConfigError) as info:
        attention(*qkv(), config=config)
    assert info.value.parameter == parameter
    assert isinstance(info.value, ValueError)


def test_tensor_desc_needs_aligned_rows():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 20)  # 40-byte rows: TMA cannot address them
    with pytest.raises(ConfigError, match="16-byte") as info:
        attention(q, k, v, config={"access": "tensor_desc", "BLOCK_M": 16, "BLOCK_N": 16})
    assert info.value.parameter == "access"


def test_tensor_desc_needs_contiguous_head_dim():
    q, k, v = qkv()
    q = q.transpose(2, 3).contiguous().transpose(2, 3)
    with pytest.raises(ConfigError, match="head dim contiguous"):
        attention(q, k, v, config={"access": "tensor_desc", "BLOCK_M": 16, "BLOCK_N": 16})


def test_config_not_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        attention(*qkv(), config=[("BLOCK_M", 64)])


def test_warp_specialize_refused_for_causal_and_ragged_lengths():
    q, k, v = make_qkv(1, 2, 2, 40, 40, 32)
    with pytest.raises(ConfigError, match="causal"):
        attention(q, k, v, causal=True, config={"warp_specialize": True, "BLOCK_N": 16, "access": "tensor_desc", "num_stages": 2})
    with pytest.raises(ConfigError, match="multiple of BLOCK_N"):
        attention(q, k, v, config={"warp_specialize": True, "BLOCK_N": 16, "access": "tensor_desc", "num_stages": 2})


GLUON = {"language": "gluon", "access": "tensor_desc", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gluon_refused_where_it_cannot_run(dtype):
    """The interpreter cannot run Gluon: a Gluon config on CPU tensors is a clear error, not a
    silent Triton run (fp32 is refused too: the kernels are fp16/bf16)."""
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, dtype=dtype)
    with pytest.raises(ConfigError, match="gluon") as info:
        attention(q, k, v, config=GLUON)
    assert info.value.parameter == "language"


def test_gluon_default_falls_back_to_triton(monkeypatch):
    """A dispatched Gluon default (Hopper) that cannot read these tensors runs the Triton
    default instead: here CPU tensors, as if the dispatcher saw a Hopper GPU."""
    from fa_autotune.runtime import api, dispatch
    from fa_autotune.spec.target import GpuInfo

    hopper = GpuInfo("NVIDIA H200", "9.0", 132, 1, "1")
    monkeypatch.setattr(api, "gpu_of", lambda device_type, index: hopper)
    monkeypatch.setattr(dispatch, "gpu_of", lambda device_type, index: hopper)
    monkeypatch.setenv("FA_AUTOTUNE_DISABLE_TUNED", "1")
    q, k, v = make_qkv(1, 2, 2, 64, 64, 128)
    problem = api._plain_problem(q, k, v, True, "top_left")
    choice = api._dispatched(problem, q, k, v)
    assert choice.source == "default" and choice.config.language == "triton"
    api.check_config(choice.config, problem, q, k, v)  # runnable on these tensors


# ---- never a silently wrong answer (issue 14)
def test_bf16_on_the_cpu_is_refused():
    """The interpreter's bf16 dot products are wrong: refused, not returned as garbage."""
    q, k, v = (torch.randn(1, 2, 32, 32, dtype=torch.bfloat16) for _ in range(3))
    for call in (lambda: attention(q, k, v), lambda: fa_autotune.explain(q, k, v),
                 lambda: attention(q, k, v, config={"BLOCK_M": 16, "BLOCK_N": 16})):
        with pytest.raises(InputError, match="bfloat16 tensors on the CPU"):
            call()


def test_inputs_requiring_grad_get_a_graph_or_a_clear_error():
    """attention() is differentiable; attention_fp8 has no backward and says so (never an
    output that silently cuts the graph)."""
    q, k, v = make_qkv(1, 2, 2, 16, 16, 32)
    for grad in ("q", "k", "v"):
        args = {"q": q, "k": k, "v": v}
        args[grad] = args[grad].clone().requires_grad_()
        assert attention(args["q"], args["k"], args["v"]).grad_fn is not None
        with pytest.raises(InputError, match="has no backward"):
            fa_autotune.attention_fp8(args["q"], args["k"], args["v"])
        with torch.no_grad():  # inference on parameters-like tensors records nothing
            assert attention(args["q"], args["k"], args["v"]).grad_fn is None


def test_explain_is_valid_json_without_a_match():
    import json

    q, k, v = make_qkv(1, 2, 2, 16, 16, 32)
    info = fa_autotune.explain(q, k, v)
    assert info["distance"] is None and json.loads(json.dumps(info, allow_nan=False)) == info


def test_heads_past_32_bit_offsets_are_refused():
    """Pointer kernels address one head in 32 bits: a head spanning more is a clear error
    (dispatched or explicit), never a wrapped-around read."""
    q, k, v = make_qkv(1, 2, 2, 4, 4, 32)
    wide = torch.empty(0, dtype=q.dtype).set_(q.untyped_storage(), 0, (1, 2, 4, 32), (0, 32, 2**30, 1))  # never read
    for config in (None, {"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 16, "BLOCK_N": 16, "access": "block_ptr"}):
        with pytest.raises(ConfigError, match="32-bit offsets"):
            attention(wide, k, v, config=config)

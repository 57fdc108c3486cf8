"""attention()'s backward: gradients of q, k, v in Triton's interpreter against float32
autograd through a plain PyTorch attention (fp32 inputs are exact there)."""
from __future__ import annotations

import math

from types import SimpleNamespace

import pytest
import torch

import fa_autotune
from fa_autotune.kernels.bwd import BackwardPlan
from fa_autotune.runtime.api import attention_backward
from fa_autotune.spec.config import KernelConfig


def scores_and_values(q, k, v, causal=False, causal_align="top_left", scale=None):
    """The scaled, masked scores Q K^T and V with K/V heads repeated for GQA, in plain PyTorch."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        n_q, n_k = q.shape[2], k.shape[2]
        offset = n_k - n_q if causal_align == "bottom_right" else 0
        visible = torch.arange(n_k, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None] + offset
        scores = scores.masked_fill(~visible, -math.inf)
    return scores, v


def reference(q, k, v, causal=False, causal_align="top_left", scale=None):
    scores, v = scores_and_values(q, k, v, causal, causal_align, scale)
    return torch.softmax(scores, -1).nan_to_num(0.0) @ v


def grads(fn, q, k, v, dout, **kwargs):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    fn(*leaves, **kwargs).backward(dout)
    return [t.grad for t in leaves]


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


CASES = {  # (batch, heads_q, heads_kv, n_q, n_k, head_dim, causal, align)
    "full": (2, 2, 2, 24, 24, 16, False, "top_left"),
    "causal-gqa-ragged": (2, 4, 2, 37, 53, 40, True, "bottom_right"),
    "causal-mqa-nq-gt-nk": (1, 4, 1, 45, 29, 32, True, "top_left"),
    "bottom-right-rows-see-nothing": (1, 2, 1, 50, 20, 16, True, "bottom_right"),
    "head-dim-80": (1, 2, 2, 19, 33, 80, False, "top_left"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_float32_autograd(case, device):
    b, hq, hkv, n_q, n_k, d, causal, align = CASES[case]
    q = torch.randn(b, hq, n_q, d, device=device)
    k = torch.randn(b, hkv, n_k, d, device=device)
    v = torch.randn(b, hkv, n_k, d, device=device)
    dout = torch.randn(b, hq, n_q, d, device=device)
    ours = grads(fa_autotune.attention, q, k, v, dout, causal=causal, causal_align=align)
    want = grads(reference, q, k, v, dout, causal=causal, causal_align=align)
    for name, a, w in zip("qkv", ours, want):
        assert torch.isfinite(a).all() and rel(a, w) < 1e-5, f"d{name}: {rel(a, w):.2e}"


def test_fp16_flash_attn_layout_scale_and_lse(device):
    """(B, N, H, D) views, a custom scale, return_lse alongside: fp16 gradients within twice
    the error of the same computation in fp16 PyTorch."""
    q, k, v = (torch.randn(2, 33, h, 64, device=device, dtype=torch.float16).transpose(1, 2) for h in (4, 2, 2))
    dout = torch.randn(2, 4, 33, 64, device=device, dtype=torch.float16)
    out, lse = fa_autotune.attention(*(t.requires_grad_() for t in (q, k, v)), causal=True, scale=0.2,
                                     return_lse=True)
    assert out.grad_fn is not None and lse.grad_fn is not None  # the LSE is differentiable too
    out.backward(dout)
    exact = grads(reference, q.float(), k.float(), v.float(), dout.float(), causal=True, scale=0.2)
    half = grads(reference, q.detach(), k.detach(), v.detach(), dout, causal=True, scale=0.2) \
        if device == "cuda" else exact
    for t, w, h in zip((q, k, v), exact, half):
        assert rel(t.grad, w) <= max(2 * rel(h, w), 2e-3)


@pytest.mark.parametrize("causal_mode, dq_atomic, dq_pass", [
    ("split", False, {}), ("masked", False, {}), ("split", True, {}),
    ("split", False, dict(dq_block_m=32, dq_block_n=16)),  # the dQ pass on its own tiles (transposed)
    ("masked", False, dict(dq_block_m=16, dq_block_n=16, dq_warps=2, dq_stages=2)),
])
def test_masking_modes_and_atomic_dq_of_the_backward_template(causal_mode, dq_atomic, dq_pass, device):
    q = torch.randn(1, 4, 40, 32, device=device)  # GQA 2:1, so dK/dV sum over two query heads
    k, v = (torch.randn(1, 2, 56, 32, device=device) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = fa_autotune.attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True)
    config = KernelConfig(loop_order="backward", BLOCK_M=16, BLOCK_N=32, num_stages=1, causal_mode=causal_mode,
                          dq_atomic=dq_atomic, **dq_pass)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    BackwardPlan(config, q, k, v, out, dout, dq, dk, dv, 32 ** -0.5, 56 - 40, True)(q, k, v, out, dout, lse, dq, dk, dv)
    want = grads(reference, q, k, v, dout, causal=True, causal_align="bottom_right")
    for a, w in zip((dq, dk, dv), want):
        assert rel(a, w) < 1e-5


def test_backward_through_torch_compile(device):
    """Under torch.compile the forward is the custom op and its registered autograd runs
    the backward kernels."""
    q, k, v = (torch.randn(1, 2, 24, 16, device=device) for _ in range(3))
    dout = torch.randn_like(q)
    compiled = torch.compile(lambda q, k, v: fa_autotune.attention(q, k, v, causal=True), backend="aot_eager",
                             fullgraph=True)
    ours = grads(compiled, q, k, v, dout)
    want = grads(reference, q, k, v, dout, causal=True)
    for a, w in zip(ours, want):
        assert rel(a, w) < 1e-5


def test_backward_of_empty_and_wrong_shapes(device):
    q = torch.randn(1, 2, 0, 16, device=device)
    k = v = torch.randn(1, 2, 8, 16, device=device)
    out, lse = fa_autotune.attention(q, k, v, return_lse=True)
    dq, dk, dv = attention_backward(q, k, v, out, lse, torch.empty_like(out))
    assert dq.shape == q.shape and not dk.any() and not dv.any()
    with pytest.raises(fa_autotune.InputError, match="output gradient"):
        attention_backward(q, k, v, out, lse, torch.empty(1, 2, 3, 16, device=device))


def test_backward_plans_are_kept_per_layout(device, monkeypatch):
    """A second backward of the same layout reuses its config and launch plan (no dispatch,
    no JIT path); another layout, or a base address TMA could not read, gets its own; the
    gradients stay those of a fresh plan."""
    from fa_autotune.runtime import api

    built = []

    class Counting(BackwardPlan):
        def __init__(self, *args, **kwargs):
            built.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(api, "_PLANS", {})
    monkeypatch.setattr(api, "BackwardPlan", Counting)
    q, k, v = (torch.randn(1, 2, 20, 16, device=device) for _ in range(3))
    out, lse = fa_autotune.attention(q, k, v, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    first = attention_backward(q, k, v, out, lse, dout, causal=True)
    again = attention_backward(q, k, v, out, lse, dout, causal=True)
    assert len(built) == 1 and all(torch.equal(a, b) for a, b in zip(first, again))
    attention_backward(q, k, v, out, lse, dout, causal=False)  # another problem
    shifted = torch.randn(1 * 2 * 20 * 16 + 1, device=device)[1:].view(1, 2, 20, 16)  # 4-byte aligned only
    shifted.copy_(q)
    moved = attention_backward(shifted, k, v, out, lse, dout, causal=True)
    assert len(built) == 3 and all(torch.equal(a, b) for a, b in zip(first, moved))
    with pytest.raises(fa_autotune.InputError, match="output gradient"):  # checked before any plan is kept
        attention_backward(q, k, v, out, lse, dout[:, :, :5], causal=True)
    with pytest.raises(fa_autotune.InputError, match="dout must be a tensor"):
        attention_backward(q, k, v, out, lse, dout.tolist(), causal=True)
    with pytest.raises(fa_autotune.InputError, match="scale must be a finite number"):
        attention_backward(q, k, v, out, lse, dout, causal=True, scale=[0.1])


def test_deterministic_backward_avoids_atomics(device, monkeypatch):
    """A dispatched atomic-dQ config is replaced by the two-pass one under deterministic=True:
    two backward passes then agree bit for bit."""
    from fa_autotune.runtime import api

    atomic = KernelConfig(loop_order="backward", BLOCK_M=16, BLOCK_N=16, num_stages=1, dq_atomic=True)
    monkeypatch.setattr(api, "backward_default", lambda problem, capability, gluon=True: atomic)
    monkeypatch.setattr(api, "_PLANS", {})  # no plan kept from another test
    q = torch.randn(1, 2, 33, 16, device=device)
    k, v = torch.randn(1, 2, 40, 16, device=device), torch.randn(1, 2, 40, 16, device=device)
    dout = torch.randn_like(q)
    runs = [grads(fa_autotune.attention, q, k, v, dout, deterministic=True) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    chosen = api._backward_config(fa_autotune.Problem(1, 2, 2, 33, 40, 16, "float32", kind="bwd"), q, k, v, dout, True)
    assert chosen == atomic.with_(dq_atomic=False)
    want = grads(reference, q, k, v, dout)
    assert all(rel(a, w) < 1e-5 for a, w in zip(runs[0], want))



def test_deterministic_gluon_backward_keeps_its_dq_pass(monkeypatch):
    """deterministic=True on a Gluon pass with dQ inside (128 query rows a step at D <= 64)
    runs the Gluon pass of 64 rows beside the Triton dQ pass, with the same consumers."""
    from fa_autotune.runtime import api
    from fa_autotune.spec.defaults import GLUON_BACKWARD, GLUON_BACKWARD_TWO_PASS

    inside = GLUON_BACKWARD.with_(BLOCK_M=128, num_stages=2, consumers=1)
    monkeypatch.setattr(api.DISPATCHER, "choose", lambda problem, device_type, index: SimpleNamespace(config=inside))
    monkeypatch.setattr(api, "gluon_backward_error", lambda *tensors: None)  # as if TMA could read them
    q, k, v = (torch.randn(1, 2, 64, 64, dtype=torch.float16) for _ in range(3))
    problem = fa_autotune.Problem(1, 2, 2, 64, 64, 64, "float16", kind="bwd")
    assert api._backward_config(problem, q, k, v, q, False) == inside
    two_pass = api._backward_config(problem, q, k, v, q, True)
    assert two_pass == GLUON_BACKWARD_TWO_PASS.with_(consumers=1) and not two_pass.dq_atomic
    split = GLUON_BACKWARD_TWO_PASS.with_(group_split=4)  # dK/dV by atomics: each group in one program
    monkeypatch.setattr(api.DISPATCHER, "choose", lambda problem, device_type, index: SimpleNamespace(config=split))
    assert api._backward_config(problem, q, k, v, q, False) == split
    assert api._backward_config(problem, q, k, v, q, True) == GLUON_BACKWARD_TWO_PASS


def assert_within_twice_pytorch_error(got, exact, same_precision) -> None:
    """flash-attn's backward rule: each of dQ, dK, dV finite and off the float32 gradient by
    at most twice what PyTorch's same-precision gradient is off."""
    for name, a, w, p in zip("qkv", got, exact, same_precision):
        assert torch.isfinite(a).all(), f"d{name} has NaN/Inf"
        assert rel(a, w) <= 2 * rel(p, w) + 1e-4, f"d{name}: {rel(a, w):.2e} vs PyTorch {rel(p, w):.2e}"


GPU_CASES = [  # (n_q, n_k, head_dim, causal, align, heads_q, heads_kv)
    (113, 203, 32, True, "bottom_right", 8, 2),
    (203, 113, 40, True, "top_left", 8, 8),
    (1023, 1023, 64, True, "top_left", 16, 4),
    (2048, 1024, 96, False, "top_left", 8, 1),
    (1024, 2048, 128, True, "bottom_right", 16, 4),
    (512, 512, 256, True, "top_left", 4, 4),
    (300, 700, 80, False, "top_left", 6, 3),
    (333, 777, 96, True, "bottom_right", 4, 2),  # D=96's split S and dP on masked steps
    (257, 257, 128, True, "top_left", 14, 2),  # a group of 7: uneven parts when split
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"nq{c[0]}-nk{c[1]}-d{c[2]}-{'causal-' + c[4] if c[3] else 'full'}")
def test_gpu_gradients_within_twice_pytorch_error(case, dtype):
    """flash-attn's own criterion: against float32, the kernels' gradient error is at most
    twice that of the same computation in PyTorch at the input precision."""
    n_q, n_k, d, causal, align, hq, hkv = case
    q = torch.randn(2, hq, n_q, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, hkv, n_k, d, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn_like(q)
    ours = grads(fa_autotune.attention, q, k, v, dout, causal=causal, causal_align=align)
    exact = grads(reference, q.float(), k.float(), v.float(), dout.float(), causal=causal, causal_align=align)
    same_precision = grads(reference, q, k, v, dout, causal=causal, causal_align=align)
    assert_within_twice_pytorch_error(ours, exact, same_precision)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_backward_passes_on_two_streams_match_serial_and_cuda_graphs():
    """The dQ pass runs on a side stream next to dK/dV: same bits as running them one after
    the other, and a captured CUDA graph replays it (fork and join inside the capture)."""
    torch.manual_seed(0)
    q = torch.randn(2, 8, 1000, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = fa_autotune.attention(q, k, v, causal=True, return_lse=True)
    config = KernelConfig(loop_order="backward", BLOCK_M=64, BLOCK_N=64, num_stages=2, dq_block_m=128, dq_warps=8)
    results = []
    for concurrent in (False, True):
        got = [torch.empty_like(t) for t in (q, k, v)]
        plan = BackwardPlan(config, q, k, v, out, dout, *got, 128 ** -0.5, 0, True)
        plan(q, k, v, out, dout, lse, *got, concurrent=concurrent)
        results.append(got)
    torch.cuda.synchronize()
    for a, b in zip(*results):
        assert torch.equal(a, b)
    eager = attention_backward(q, k, v, out, lse, dout, causal=True)
    static_dout = dout.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as CUDA graphs require
        attention_backward(q, k, v, out, lse, static_dout, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attention_backward(q, k, v, out, lse, static_dout, causal=True)
    static_dout.copy_(dout * 2)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.allclose(a.float(), 2 * b.float(), rtol=2e-2, atol=2e-2)


GLUON_BWD = dict(loop_order="backward", language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=64,
                 dq_block_m=128, dq_block_n=64, dq_warps=8, dq_stages=3)
# dQ added up in fp32 inside the Gluon pass (no dQ pass, so no dQ pass shape)
DQ_ATOMIC = dict(dq_atomic=True, dq_block_m=0, dq_block_n=0, dq_warps=0, dq_stages=0)


def _plan_gradients(config: KernelConfig, case: tuple, dtype: torch.dtype):
    """A backward plan of `config` run on fresh inputs of `case` (n_q, n_k, d, causal, align,
    heads_q, heads_kv) into NaN-filled gradients: the plan, its inputs (q, k, v, dout), the
    gradients it wrote, and float32's and PyTorch's same-precision gradients."""
    n_q, n_k, d, causal, align, hq, hkv = case
    q = torch.randn(2, hq, n_q, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, hkv, n_k, d, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = fa_autotune.attention(q, k, v, causal=causal, causal_align=align, return_lse=True)
    got = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    offset = n_k - n_q if align == "bottom_right" else 0
    plan = BackwardPlan(config, q, k, v, out, dout, *got, d ** -0.5, offset, causal)
    plan(q, k, v, out, dout, lse, *got)
    exact = grads(reference, q.float(), k.float(), v.float(), dout.float(), causal=causal, causal_align=align)
    same_precision = grads(reference, q, k, v, dout, causal=causal, causal_align=align)
    return plan, (q, k, v, dout), got, exact, same_precision


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="the Gluon dK/dV pass needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("changes", [{}, dict(num_stages=3), dict(causal_mode="masked"), dict(consumers=1),
                                     dict(DQ_ATOMIC), dict(DQ_ATOMIC, causal_mode="masked", consumers=1),
                                     dict(persistent=1), dict(DQ_ATOMIC, persistent=1, dynamic=True),
                                     dict(DQ_ATOMIC, group_split=2), dict(group_split=4, causal_mode="masked"),
                                     dict(DQ_ATOMIC, group_split=8, persistent=1, dynamic=True)],
                         ids=["s2", "s3", "masked", "one-consumer", "dq-atomic", "dq-atomic-masked-one-consumer",
                              "persistent", "dq-atomic-persistent-dynamic", "dq-atomic-group-split2",
                              "group-split4-masked", "dq-atomic-group-split8-persistent-dynamic"])
@pytest.mark.parametrize("case", [c for c in GPU_CASES if c[2] <= 128],
                         ids=lambda c: f"nq{c[0]}-nk{c[1]}-d{c[2]}-{'causal-' + c[4] if c[3] else 'full'}")
def test_gpu_gluon_backward_within_twice_pytorch_error(case, changes, dtype):
    """The Gluon dK/dV pass (named, with the Triton preprocess and dQ pass, or with dQ added
    up inside it): the same criterion as the Triton backward, every gradient finite."""
    _, _, got, exact, same_precision = _plan_gradients(KernelConfig(**dict(GLUON_BWD, **changes)), case, dtype)
    assert_within_twice_pytorch_error(got, exact, same_precision)


ROWS_128 = dict(DQ_ATOMIC, BLOCK_M=128, num_stages=2)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="the Gluon dK/dV pass needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("changes", [ROWS_128, dict(ROWS_128, persistent=1, dynamic=True),
                                     dict(ROWS_128, group_split=2), dict(ROWS_128, consumers=1),
                                     dict(ROWS_128, causal_mode="masked")],
                         ids=["rows128", "rows128-persistent-dynamic", "rows128-group-split2", "rows128-one-consumer",
                              "rows128-masked"])
@pytest.mark.parametrize("case", [c for c in GPU_CASES if c[2] <= 64] + [(777, 333, 64, False, "top_left", 4, 2)],
                         ids=lambda c: f"nq{c[0]}-nk{c[1]}-d{c[2]}-{'causal-' + c[4] if c[3] else 'full'}")
def test_gpu_gluon_backward_128_row_steps_within_twice_pytorch_error(case, changes, dtype):
    """128 query rows a step (the Hopper default up to D=64), dQ added up inside: with two
    consumers each adds half of dQ's rows over both warpgroups' keys (with one, all of it);
    the same criterion as every backward, every gradient finite."""
    _, _, got, exact, same_precision = _plan_gradients(KernelConfig(**dict(GLUON_BWD, **changes)), case, dtype)
    assert_within_twice_pytorch_error(got, exact, same_precision)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="the Gluon dK/dV pass needs a Hopper GPU")
@pytest.mark.parametrize("changes", [dict(DQ_ATOMIC), {}, dict(DQ_ATOMIC, persistent=1, dynamic=True),
                                     dict(DQ_ATOMIC, group_split=4)],
                         ids=["dq-atomic", "dq-pass", "dq-atomic-persistent-dynamic", "dq-atomic-group-split4"])
def test_gpu_gluon_backward_stages_gradients_tma_cannot_store(changes):
    """dK and dV given as views TMA cannot store into (rows 136 bytes apart) go through
    buffers of the plan's own, copied in: right, and the columns beside them untouched."""
    q = torch.randn(2, 8, 200, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = fa_autotune.attention(q, k, v, causal=True, return_lse=True)
    wide = [torch.full((2, 2, 300, 68), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    got = [torch.full_like(q, float("nan")), wide[0][..., :64], wide[1][..., :64]]
    plan = BackwardPlan(KernelConfig(**dict(GLUON_BWD, **changes)), q, k, v, out, dout, *got, 64 ** -0.5, 0, True)
    plan(q, k, v, out, dout, lse, *got)
    exact = grads(reference, q.float(), k.float(), v.float(), dout.float(), causal=True)
    same_precision = grads(reference, q, k, v, dout, causal=True)
    assert_within_twice_pytorch_error(got, exact, same_precision)
    assert all(torch.isnan(t[..., 64:]).all() for t in wide)


WIDE_CASES = [  # (n_q, n_k, head_dim, causal, align, heads_q, heads_kv): past D=128
    (512, 512, 256, True, "top_left", 4, 4),
    (1000, 1000, 192, True, "top_left", 8, 2),  # ragged last key block and query tile
    (300, 700, 256, True, "bottom_right", 4, 2),
    (700, 300, 160, True, "bottom_right", 4, 4),  # rows that see no key
    (640, 640, 256, False, "top_left", 8, 1),
    (257, 389, 192, False, "top_left", 14, 2),  # a group of 7
    (333, 420, 176, True, "bottom_right", 6, 3),  # the second consumer's 64 columns past D (D_REST 64)
]


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                    reason="the Gluon dK/dV pass needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("changes", [{}, dict(num_stages=1), dict(group_split=2), dict(causal_mode="masked")],
                         ids=["default", "s1", "group-split2", "masked"])
@pytest.mark.parametrize("case", WIDE_CASES,
                         ids=lambda c: f"nq{c[0]}-nk{c[1]}-d{c[2]}-g{c[5] // c[6]}-{'causal-' + c[4] if c[3] else 'full'}")
def test_gpu_wide_gluon_backward_within_twice_pytorch_error(case, changes, dtype):
    """Past head dim 128 (kernels.gluon_bwd_wide: both consumers on one key block, the
    products split by key columns and head-dim halves), run by its plan and through
    attention()'s autograd: flash-attn's criterion, every gradient finite."""
    from fa_autotune.spec.defaults import GLUON_WIDE_BACKWARD

    plan, (q, k, v, dout), got, exact, same_precision = _plan_gradients(GLUON_WIDE_BACKWARD.with_(**changes),
                                                                         case, dtype)
    assert plan.dkdv.kernel.__name__.endswith("_dkdv_wide")
    causal, align = case[3], case[4]
    through_autograd = grads(fa_autotune.attention, q, k, v, dout, causal=causal, causal_align=align)
    for name, a, b, w, p in zip("qkv", got, through_autograd, exact, same_precision):
        for label, t in (("plan", a), ("autograd", b)):
            assert torch.isfinite(t).all(), f"d{name} ({label}) has NaN/Inf"
            assert rel(t, w) <= 2 * rel(p, w) + 1e-4, f"d{name} ({label}): {rel(t, w):.2e} vs PyTorch {rel(p, w):.2e}"


def test_wide_gluon_backward_refuses_what_it_cannot_run():
    """Ahead of any GPU (meta tensors): past head dim 128 the Gluon backward runs the wide
    kernel (a program per 64-key block) and refuses, naming the parameter, what that kernel
    cannot be (dQ in its own pass, one consumer, 128-row steps, a persistent grid, a Q ring
    of 3); the backward the API picks there never is one of those (deterministic=True: Triton)."""
    from fa_autotune.errors import ConfigError
    from fa_autotune.spec.defaults import GLUON_BACKWARD_TWO_PASS, GLUON_WIDE_BACKWARD

    q, k, v = (torch.empty(2, 4, 300, 192, device="meta", dtype=torch.bfloat16) for _ in range(3))
    plan = BackwardPlan(GLUON_WIDE_BACKWARD, q, k, v, q, q, q, k, v, 0.125, 0, True)
    assert plan.dkdv.grid == (5, 8)  # 300 keys in blocks of 64, (batch, KV head) pairs
    for bad, name in ((GLUON_BACKWARD_TWO_PASS, "dq_atomic"), (GLUON_WIDE_BACKWARD.with_(consumers=1), "consumers"),
                      (GLUON_WIDE_BACKWARD.with_(BLOCK_M=128), "BLOCK_M"),
                      (GLUON_WIDE_BACKWARD.with_(persistent=1, dynamic=True), "persistent"),
                      (GLUON_WIDE_BACKWARD.with_(num_stages=3), "num_stages")):
        with pytest.raises(ConfigError) as error:
            BackwardPlan(bad, q, k, v, q, q, q, k, v, 0.125, 0, True)
        assert error.value.parameter == name and "past head dim 128" in str(error.value)


def test_gluon_backward_stages_only_gradients_tma_cannot_store():
    """Ahead of any GPU (meta tensors): dK and dV go to the Gluon pass as they are when a TMA
    descriptor can address them in the inputs' dtype; rows whose stride is not a 16-byte
    multiple (also on a size-1 axis) or another dtype get buffers of the plan's own."""
    from fa_autotune.spec.defaults import GLUON_BACKWARD

    q, k, v = (torch.empty(2, 4, 96, 64, device="meta", dtype=torch.bfloat16) for _ in range(3))
    plan = BackwardPlan(GLUON_BACKWARD, q, k, v, q, q, q, k, v, 0.125, 0, True)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    assert plan.staged_gradients(dk, dv) == (dk, dv)
    narrow = torch.empty(2, 4, 96, 68, device="meta", dtype=torch.bfloat16)[..., :64]  # rows 136 bytes apart
    one_head = torch.empty_strided((2, 1, 96, 64), (6144, 6148, 64, 1), device="meta", dtype=torch.bfloat16)
    for bad in (narrow, one_head, dk.float()):
        staged = plan.staged_gradients(bad, dv)
        assert all(t is not bad and t.shape == (2, bad.shape[1], 96, 64) and t.dtype == torch.bfloat16
                   for t in staged[:1])
        assert staged[1] is not dv  # both go through buffers together


def test_gluon_backward_refuses_what_it_cannot_run(device):
    """On the CPU (no Gluon there) and for fp32 the named Gluon backward is a clear error
    before any kernel runs."""
    from fa_autotune.errors import ConfigError

    q = torch.randn(1, 2, 64, 64, device=device)
    out, dout = torch.randn_like(q), torch.randn_like(q)
    grads_out = [torch.empty_like(q) for _ in range(3)]
    with pytest.raises(ConfigError, match="language"):
        BackwardPlan(KernelConfig(**GLUON_BWD), q, q, q, out, dout, *grads_out, 0.125, 0, False)


def reference_with_lse(q, k, v, causal=False, causal_align="top_left", scale=None):
    """The output and the natural-log LSE of each row, through plain PyTorch (float32)."""
    scores, v = scores_and_values(q, k, v, causal, causal_align, scale)
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


def lse_loss_grads(fn, q, k, v, w_out, w_lse, **kwargs):
    """Gradients of sum(out * w_out) + sum(lse * w_lse) (either weight may be None)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = fn(*leaves, **kwargs)
    loss = sum((t * w).sum() for t, w in ((out, w_out), (lse, w_lse)) if w is not None)
    loss.backward()
    return [t.grad for t in leaves]


LSE_CASES = {name: CASES[name] for name in ("full", "causal-gqa-ragged", "causal-mqa-nq-gt-nk", "head-dim-80")}


@pytest.mark.parametrize("case", list(LSE_CASES))
@pytest.mark.parametrize("terms", ["out+lse", "lse"])
def test_lse_gradient_matches_float32_autograd(case, terms, device):
    """A loss that uses the returned LSE (ring attention merging partial results) gets its
    gradient through it: delta - dLSE in the kernels' row term, natural log, any scale."""
    b, hq, hkv, n_q, n_k, d, causal, align = LSE_CASES[case]
    q = torch.randn(b, hq, n_q, d, device=device)
    k = torch.randn(b, hkv, n_k, d, device=device)
    v = torch.randn(b, hkv, n_k, d, device=device)
    w_out = torch.randn(b, hq, n_q, d, device=device) if terms == "out+lse" else None
    w_lse = torch.randn(b, hq, n_q, device=device)
    ours = lse_loss_grads(lambda *t, **kw: fa_autotune.attention(*t, return_lse=True, **kw), q, k, v, w_out, w_lse,
                          causal=causal, causal_align=align, scale=0.3)
    want = lse_loss_grads(reference_with_lse, q, k, v, w_out, w_lse, causal=causal, causal_align=align, scale=0.3)
    for name, a, w in zip("qkv", ours, want):
        if name == "v" and terms == "lse":  # the LSE does not depend on V
            assert a is not None and not a.any()
            continue
        assert torch.isfinite(a).all() and rel(a, w) < 1e-5, f"d{name}: {rel(a, w):.2e}"


def test_lse_gradient_through_attention_backward_and_torch_compile(device):
    """attention_backward takes dlse (checked like the LSE), and the torch.compile path folds
    it in as the eager one does."""
    q, k, v = (torch.randn(1, 2, 24, 16, device=device) for _ in range(3))
    w_out, w_lse = torch.randn_like(q), torch.randn(1, 2, 24, device=device)
    want = lse_loss_grads(reference_with_lse, q, k, v, w_out, w_lse, causal=True)
    compiled = torch.compile(lambda q, k, v: fa_autotune.attention(q, k, v, causal=True, return_lse=True),
                             backend="aot_eager", fullgraph=True)
    for a, w in zip(lse_loss_grads(compiled, q, k, v, w_out, w_lse), want):
        assert rel(a, w) < 1e-5
    out, lse = fa_autotune.attention(q, k, v, causal=True, return_lse=True)
    direct = attention_backward(q, k, v, out, lse, w_out, causal=True, dlse=w_lse)
    for a, w in zip(direct, want):
        assert rel(a, w) < 1e-5
    with pytest.raises(fa_autotune.InputError, match="dlse must be a float32 tensor of shape"):
        attention_backward(q, k, v, out, lse, w_out, causal=True, dlse=w_lse[:, :1])


def test_double_backward_raises_instead_of_a_silent_zero(device):
    """create_graph=True gives gradients that carry a graph; differentiating them (a gradient
    penalty) raises, naming why, rather than adding nothing. Plain create_graph=True use
    without a second differentiation through attention still works."""
    q, k, v = (torch.randn(1, 2, 16, 16, device=device, requires_grad=True) for _ in range(3))
    out = fa_autotune.attention(q, k, v, causal=True)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    assert dq.requires_grad
    want = grads(lambda *t: reference(*t, causal=True), q.detach(), k.detach(), v.detach(), 2 * out.detach())[0]
    assert rel(dq.detach(), want) < 1e-5  # the first-order gradient itself is right
    with pytest.raises(fa_autotune.InputError, match="no double backward"):
        dq.square().sum().backward()
    out, lse = fa_autotune.attention(q, k, v, return_lse=True)
    grads_ = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v), create_graph=True)
    with pytest.raises(fa_autotune.InputError, match="no double backward"):
        torch.autograd.grad(sum(g.square().sum() for g in grads_), (q, k, v))



@pytest.mark.parametrize("dq_atomic", [False, True])
def test_lse_gradient_in_both_dq_schemes_of_the_backward_template(dq_atomic, device):
    """The dLSE fold reaches the dQ added up inside the dK/dV pass as well as the separate dQ
    pass (a strided dLSE, as autograd may hand one over)."""
    q = torch.randn(1, 4, 40, 32, device=device)
    k, v = (torch.randn(1, 2, 56, 32, device=device) for _ in range(2))
    w_out = torch.randn_like(q)
    w_lse = torch.randn(1, 40, 4, device=device).transpose(1, 2)
    out, lse = fa_autotune.attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True)
    config = KernelConfig(loop_order="backward", BLOCK_M=16, BLOCK_N=32, num_stages=1, dq_atomic=dq_atomic)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    BackwardPlan(config, q, k, v, out, w_out, dq, dk, dv, 32 ** -0.5, 56 - 40, True)(
        q, k, v, out, w_out, lse, dq, dk, dv, dlse=w_lse)
    want = lse_loss_grads(reference_with_lse, q, k, v, w_out, w_lse, causal=True, causal_align="bottom_right")
    for a, w in zip((dq, dk, dv), want):
        assert rel(a, w) < 1e-5

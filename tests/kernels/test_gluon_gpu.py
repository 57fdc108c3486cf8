"""The Gluon FlashAttention-3 kernels on the GPU (``pytest -m gpu``; Hopper only: the
interpreter cannot run Gluon): the same correctness matrix as the Triton kernels, in fp16
and bf16, for every schedule knob."""
from __future__ import annotations

import pytest
import torch

from fa_autotune import ConfigError, attention
from helpers import assert_close_to_reference, make_qkv

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                       reason="Gluon's FlashAttention-3 kernels need a Hopper GPU"),
]
BASE = dict(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2)
KNOBS = {
    "2c-overlap": {},
    "2c-plain": dict(overlap=False),
    "2c-pingpong-persistent": dict(pingpong=True, persistent=1),
    # ping-pong in the steps-in-turn schedule; with a dynamic grid, turns carry across tiles
    "2c-plain-pingpong": dict(overlap=False, pingpong=True),
    "2c-plain-pingpong-one-loop-dynamic": dict(overlap=False, pingpong=True, one_loop=True, persistent=1, dynamic=True),
    "2c-pingpong-dynamic": dict(pingpong=True, persistent=1, dynamic=True),
    # 64-key steps under 2 x 64-row tiles: with turns, both warpgroups take every step of the tile
    "2c-n64-plain-pingpong": dict(BLOCK_N=64, overlap=False, pingpong=True),
    "2c-plain-persistent": dict(overlap=False, persistent=1),
    "3c-n64-persistent": dict(consumers=3, consumer_regs=160, BLOCK_N=64, persistent=1),
    "2c-one-loop-persistent": dict(one_loop=True, persistent=1),
    "2c-dynamic": dict(persistent=1, dynamic=True),
    "2c-plain-one-loop-dynamic": dict(overlap=False, one_loop=True, persistent=1, dynamic=True),
    "2c-plain-one-loop": dict(one_loop=True, overlap=False),
    "2c-plain-half": dict(overlap=False, half_step=True),
    "2c-plain-one-loop-dynamic-emu8": dict(overlap=False, one_loop=True, persistent=1, dynamic=True, exp2_emu=8),
    "2c-emu4": dict(exp2_emu=4),
    "3c-n64-dynamic": dict(consumers=3, consumer_regs=160, BLOCK_N=64, persistent=1, dynamic=True),
    "3c-n64-emu16": dict(consumers=3, consumer_regs=160, BLOCK_N=64, persistent=1, exp2_emu=16),
    # three consumers taking turns round robin (named barriers 8, 9, 10)
    "3c-n64-pingpong-persistent": dict(consumers=3, consumer_regs=160, BLOCK_N=64, persistent=1, pingpong=True),
    "3c-n64-plain-pingpong-dynamic": dict(consumers=3, consumer_regs=160, BLOCK_N=64, persistent=1, dynamic=True,
                                          overlap=False, pingpong=True),
    "2c-n64-s3": dict(BLOCK_N=64, num_stages=3),
    # 64-key steps under 2 x 64-row tiles: each warpgroup stops at its own diagonal
    "2c-n64-dynamic": dict(BLOCK_N=64, persistent=1, dynamic=True),
    "2c-n64-plain": dict(BLOCK_N=64, overlap=False),  # two loops; a warpgroup past N_Q runs neither
    "2c-n64-plain-one-loop-dynamic": dict(BLOCK_N=64, overlap=False, one_loop=True, persistent=1, dynamic=True),
    # conditional rescaling (a warp skips the accumulator's rescale while its rows keep their max)
    "2c-lazy8-persistent": dict(rescale_threshold=8, persistent=1),
    "2c-plain-pingpong-one-loop-lazy4": dict(overlap=False, pingpong=True, one_loop=True, rescale_threshold=4),
    "3c-n64-pingpong-lazy8": dict(consumers=3, consumer_regs=160, BLOCK_N=64, persistent=1, pingpong=True,
                                  rescale_threshold=8),
    # Q K^T's Q held in registers from each tile's second step on (at 224 registers P in 16
    # bits; at D=128 some of these spill in their step loops, which costs speed, not results)
    "2c-qregs": dict(q_regs=True),
    "2c-qregs-r224-pingpong-dynamic": dict(q_regs=True, consumer_regs=224, pingpong=True, persistent=1, dynamic=True),
    "2c-qregs-r224-one-loop-lazy8": dict(q_regs=True, consumer_regs=224, one_loop=True, persistent=1,
                                         rescale_threshold=8),
    "1c-m128": dict(consumers=1, BLOCK_M=128, consumer_regs=240),
    "1c-m64-masked": dict(consumers=1, causal_mode="masked", num_stages=3),
}
# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, align)
SHAPES = {
    "causal-gqa-1000-d128": (2, 8, 2, 1000, 1000, 128, True, "top_left"),
    "full-4097-d64": (2, 4, 4, 4097, 4097, 64, False, "top_left"),
    "causal-br-q300-k2000-d80": (1, 8, 8, 300, 2000, 80, True, "bottom_right"),
    "causal-br-q50-k21-d96-emptyrows": (2, 4, 4, 50, 21, 96, True, "bottom_right"),
    "causal-tl-q700-k190-d128-mqa": (1, 8, 1, 700, 190, 128, True, "top_left"),
    "full-q1-k3000-d128": (3, 8, 2, 1, 3000, 128, False, "top_left"),
    "causal-768tiles-d128": (4, 16, 16, 1500, 1500, 128, True, "top_left"),  # persistent: ~6 tiles a program
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("knob", list(KNOBS))
def test_matrix(knob, shape, dtype):
    check_against_reference(SHAPES[shape], KNOBS[knob], dtype)


def check_against_reference(shape: tuple, knobs: dict, dtype: torch.dtype) -> None:
    """One Gluon config (BASE with knobs) on one (b, hq, hkv, nq, nk, d, causal, align) shape:
    output and LSE against the float32 reference."""
    b, hq, hkv, nq, nk, d, causal, align = shape
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dtype, "cuda")
    out, lse = attention(q, k, v, causal=causal, causal_align=align, config=dict(BASE, **knobs), return_lse=True)
    assert_close_to_reference(out, q, k, v, causal=causal, causal_align=align, lse=lse)


# Half diagonal steps (half_step, searched at D <= 64): the plain knob above also runs them at
# D=80-128 causal; these are the D <= 64 kernels the tuner ships, over diagonals that fall on
# either half of a 128-key tile, bottom-right alignment, empty rows and GQA / MQA.
HALF_KNOBS = {
    "plain-persistent": dict(overlap=False, half_step=True, persistent=1),
    "pingpong-one-loop-persistent": dict(overlap=False, pingpong=True, one_loop=True, half_step=True, persistent=1),
    "pingpong-two-loops-persistent": dict(overlap=False, pingpong=True, half_step=True, persistent=1),
    "one-loop-dynamic-emu16-sec16": dict(overlap=False, one_loop=True, persistent=1, dynamic=True, exp2_emu=16,
                                         section=16, half_step=True),
}
HALF_SHAPES = {
    "gqa-1000-d64": (2, 8, 2, 1000, 1000, 64, "top_left"),
    "br-q300-k2000-d64": (1, 8, 8, 300, 2000, 64, "bottom_right"),
    "br-q50-k21-d32-emptyrows": (2, 4, 4, 50, 21, 32, "bottom_right"),
    "tl-q700-k190-d48-mqa": (1, 8, 1, 700, 190, 48, "top_left"),
    "1536-d64": (4, 16, 16, 1536, 1536, 64, "top_left"),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", list(HALF_SHAPES))
@pytest.mark.parametrize("knob", list(HALF_KNOBS))
def test_half_steps(knob, shape, dtype):
    b, hq, hkv, nq, nk, d, align = HALF_SHAPES[shape]
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dtype, "cuda")
    out, lse = attention(q, k, v, causal=True, causal_align=align, config=dict(BASE, **HALF_KNOBS[knob]),
                         return_lse=True)
    assert_close_to_reference(out, q, k, v, causal=True, causal_align=align, lse=lse)


# Three consumers at D <= 64 (as the space searches them: 128-key steps, 160 registers) taking
# turns round robin: the shipped D=64 kernels at N >= 4096 without a mask and N=16384 causal.
THREE_KNOBS = {
    "plain-pingpong-persistent": dict(consumers=3, consumer_regs=160, overlap=False, pingpong=True, persistent=1),
    "pingpong-persistent": dict(consumers=3, consumer_regs=160, pingpong=True, persistent=1),
    "plain-pingpong-one-loop-dynamic": dict(consumers=3, consumer_regs=160, overlap=False, pingpong=True,
                                            one_loop=True, persistent=1, dynamic=True),
}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", list(HALF_SHAPES))
@pytest.mark.parametrize("knob", list(THREE_KNOBS))
def test_three_consumers_in_turn(knob, shape, dtype, causal):
    b, hq, hkv, nq, nk, d, align = HALF_SHAPES[shape]
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dtype, "cuda")
    out, lse = attention(q, k, v, causal=causal, causal_align=align, config=dict(BASE, **THREE_KNOBS[knob]),
                         return_lse=True)
    assert_close_to_reference(out, q, k, v, causal=causal, causal_align=align, lse=lse)


# Head dims past 128 (192 padded to 256 inside the kernel): one Q buffer per consumer, 64-key
# steps two deep, O staged in the Q buffer and the Q buffer released after O's store.
WIDE_KNOBS = {
    "overlap": dict(BLOCK_N=64),
    "plain": dict(BLOCK_N=64, overlap=False),
    "lazy8": dict(BLOCK_N=64, rescale_threshold=8),
    "pingpong": dict(BLOCK_N=64, pingpong=True),
    "plain-one-loop": dict(BLOCK_N=64, overlap=False, one_loop=True),
}
WIDE_SHAPES = {
    "causal-gqa-1000-d256": (2, 8, 2, 1000, 1000, 256, True, "top_left"),
    "full-2049-d192": (2, 4, 4, 2049, 2049, 192, False, "top_left"),
    "causal-br-q300-k2000-d160": (1, 8, 8, 300, 2000, 160, True, "bottom_right"),
    "causal-br-q50-k21-d256-emptyrows": (2, 4, 4, 50, 21, 256, True, "bottom_right"),
    "full-q1-k3000-d256-mqa": (3, 8, 1, 1, 3000, 256, False, "top_left"),
}
# Q's two column parts (128 + the rest) in registers: head dims whose Q K^T splits (not D=256)
QREG_KNOBS = {
    "qregs-lazy8": dict(BLOCK_N=64, q_regs=True, rescale_threshold=8),
    "qregs-pingpong": dict(BLOCK_N=64, q_regs=True, pingpong=True),
}
QREG_SHAPES = {"causal-gqa-1000-d192": (2, 8, 2, 1000, 1000, 192, True, "top_left"),
               "full-2049-d192": WIDE_SHAPES["full-2049-d192"],
               "causal-br-q300-k2000-d160": WIDE_SHAPES["causal-br-q300-k2000-d160"],
               "causal-br-q50-k21-d192-emptyrows": (2, 4, 4, 50, 21, 192, True, "bottom_right")}


# 128-key steps at head dims 129-192 (kernels.fwd.wide_steps): unpadded column chunks, V in a
# ring of 64-key halves, steps in turn (with and without turns, lazy rescaling, one loop, one stage)
WIDE_STEP_KNOBS = {
    "plain": dict(overlap=False),
    "plain-pingpong-lazy8": dict(overlap=False, pingpong=True, rescale_threshold=8),
    "plain-one-loop-lazy8": dict(overlap=False, one_loop=True, rescale_threshold=8),
    "plain-s1": dict(overlap=False, num_stages=1),
    "1c-plain-masked": dict(consumers=1, overlap=False, causal_mode="masked"),
}
WIDE_STEP_SHAPES = {
    "causal-gqa-1000-d192": (2, 8, 2, 1000, 1000, 192, True, "top_left"),
    "full-2049-d192": (2, 4, 4, 2049, 2049, 192, False, "top_left"),
    "causal-br-q300-k2000-d160": (1, 8, 8, 300, 2000, 160, True, "bottom_right"),
    "causal-br-q50-k21-d192-emptyrows": (2, 4, 4, 50, 21, 192, True, "bottom_right"),
    "full-q1-k3000-d136-mqa": (3, 8, 1, 1, 3000, 136, False, "top_left"),
}


WIDE_CASES = {f"n{n}-{knob}-{shape}": (knobs[knob], shapes[shape])
              for n, knobs, shapes in ((64, WIDE_KNOBS, WIDE_SHAPES), (64, QREG_KNOBS, QREG_SHAPES),
                                       (128, WIDE_STEP_KNOBS, WIDE_STEP_SHAPES))
              for knob in knobs for shape in shapes}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_wide_head_dims(case, dtype):
    knobs, shape = WIDE_CASES[case]
    check_against_reference(shape, knobs, dtype)


@pytest.mark.parametrize("d", [192, 256])
def test_wide_head_dims_varlen(d):
    """Packed sequences at D=192 and 256 (the varlen kernel stages O in its Q buffer too; ragged
    last tiles store with a row mask, at D=192 both accumulator parts). Q in registers is
    refused there: the varlen kernel stages Q as one 256-column part."""
    from fa_autotune import attention_varlen

    lengths = [1, 300, 777, 64, 1500]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda", dtype=torch.int32)
    total, h, hk = int(cu[-1]), 8, 2
    q, k, v = (torch.randn(total, n, d, device="cuda", dtype=torch.bfloat16) for n in (h, hk, hk))
    with pytest.raises(ConfigError, match="q_regs"):
        attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), config=dict(BASE, BLOCK_N=64, q_regs=True))
    for causal in (False, True):
        out = attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal,
                               config=dict(BASE, BLOCK_N=64))
        for i, n in enumerate(lengths):
            s = slice(int(cu[i]), int(cu[i + 1]))
            one = lambda t: t[s].transpose(0, 1).unsqueeze(0)  # noqa: E731
            assert_close_to_reference(one(out), one(q), one(k), one(v), causal=causal, causal_align="bottom_right")


LAZY_KNOBS = {
    "overlap-persistent": dict(persistent=1),
    "plain-pingpong-half-dynamic": dict(overlap=False, pingpong=True, half_step=True, persistent=1, dynamic=True),
    "3c-pingpong-emu8": dict(consumers=3, consumer_regs=160, pingpong=True, persistent=1, exp2_emu=8),
}


@pytest.mark.parametrize("threshold", [1, 8, 15])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("knob", list(LAZY_KNOBS))
def test_lazy_rescale_with_growing_scores(knob, dtype, threshold):
    """Conditional rescaling where row maxima keep growing: keys grow along the sequence, and
    query rows alternate in blocks of 16 (a warp's rows of a 64-row tile) between flat scores
    (every warp of theirs keeps its max: the rescale skipped) and sharp ones (maxima move by
    more than the threshold again and again: rescaled), at 1, 8 and fp16's limit of 15."""
    b, hq, hkv, nq, nk, d = 2, 4, 2, 1000, 3000, 64
    q, k, v = make_qkv(b, hq, hkv, nq, nk, d, dtype, "cuda")
    k = k * torch.linspace(0.25, 4.0, nk, device="cuda", dtype=dtype).view(1, 1, nk, 1)
    sharp = (torch.arange(nq, device="cuda") // 16 % 2).to(dtype) * 3.0 + 0.05
    q = q * sharp.view(1, 1, nq, 1)
    for causal in (False, True):
        out, lse = attention(q, k, v, causal=causal, causal_align="bottom_right",
                             config=dict(BASE, rescale_threshold=threshold, **LAZY_KNOBS[knob]), return_lse=True)
        assert_close_to_reference(out, q, k, v, causal=causal, causal_align="bottom_right", lse=lse)


@pytest.mark.parametrize("persistent", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_flash_attn_layout_and_long_sequences(dtype, persistent):
    """(B, N, H, D) storage viewed as (B, H, N, D): the rank-4 descriptors read any TMA-legal
    strides, and the output keeps the layout."""
    q, k, v = make_qkv(2, 16, 4, 4096, 4096, 128, dtype, "cuda", layout="bnhd")
    out = attention(q, k, v, causal=True, config=dict(BASE, persistent=persistent))
    assert out.stride() == q.stride()
    assert_close_to_reference(out, q, k, v, causal=True)


@pytest.mark.parametrize("section, n", [(1, 700), (2, 701), (4, 702)])
def test_causal_grid_in_l2_sections(monkeypatch, section, n):
    """Causal grids walk sections of heads (sized from L2): sections of one head, of two and
    of four (which does not divide the 15 heads, so the last section is narrower) cover
    every tile once, on a full grid and on a persistent one (static and dynamic). Distinct lengths keep each case's
    launch plan apart from the others'."""
    from fa_autotune.kernels import fwd

    monkeypatch.setattr(fwd, "l2_section", lambda *args: section)
    q, k, v = make_qkv(3, 5, 5, n, n, 128, torch.float16, "cuda")
    for grid in (dict(persistent=0), dict(persistent=1), dict(persistent=1, dynamic=True)):
        out, lse = attention(q, k, v, causal=True, config=dict(BASE, **grid), return_lse=True)
        assert_close_to_reference(out, q, k, v, causal=True, lse=lse)


def test_every_output_element_written():
    q, k, v = make_qkv(2, 4, 4, 333, 333, 64, torch.float16, "cuda")
    out = torch.full_like(q, float("nan"))
    from fa_autotune.kernels.fwd import run
    from fa_autotune.kernels.launch import resolve_scale
    from fa_autotune.spec.config import KernelConfig
    from fa_autotune.spec.problem import problem_from_tensors

    problem = problem_from_tensors(q, k, v, causal=True)
    run(KernelConfig(**BASE, persistent=1), problem, q, k, v, resolve_scale(None, 64), out, None)
    assert torch.isfinite(out).all()
    assert_close_to_reference(out, q, k, v, causal=True)


def test_unreadable_layout_degrades_to_triton(monkeypatch, tmp_path):
    """A dispatched Gluon config cannot take a head dim that is not contiguous (TMA): the
    dispatcher runs the built-in Triton default instead of failing."""
    import fa_autotune
    from fa_autotune.kernels.checks import Layout
    from fa_autotune.runtime import api
    from fa_autotune.runtime.select import runnable

    q, k, v = make_qkv(1, 4, 4, 256, 256, 64, torch.float16, "cuda")
    q = q.transpose(2, 3).contiguous().transpose(2, 3)
    problem = api._plain_problem(q, k, v, False, "top_left")
    assert runnable(fa_autotune.KernelConfig(**BASE), problem, Layout.of(problem, q, k, v)) is None
    assert_close_to_reference(attention(q, k, v), q, k, v)


# FP8 (e4m3 Q, K and V^T tiles, both products in FP8): each Gluon schedule against the Triton
# FP8 kernel on the same quantized inputs (per-block and per-head descales, with and without
# the sink tile, which a kernel after the Gluon one scores), and both against float32.
FP8_KNOBS = {
    "2c-overlap-persistent": dict(persistent=1),
    "2c-plain": dict(overlap=False),
    "2c-dynamic": dict(persistent=1, dynamic=True),
    "2c-lazy8": dict(rescale_threshold=8),
    "2c-n64-s3-pingpong": dict(BLOCK_N=64, num_stages=3, pingpong=True),
    "3c-n64-plain-one-loop": dict(consumers=3, consumer_regs=160, BLOCK_N=64, overlap=False, one_loop=True),
    "2c-n256-plain-emu8": dict(BLOCK_N=256, overlap=False, persistent=1, exp2_emu=8),
    "2c-n256-pp-persistent": dict(BLOCK_N=256, overlap=False, pingpong=True, persistent=1),  # the FP8 default
    "2c-n256-pp-dynamic": dict(BLOCK_N=256, overlap=False, pingpong=True, persistent=1, dynamic=True),
}
FP8_SHAPES = {name: SHAPES[name] for name in ("causal-gqa-1000-d128", "causal-br-q300-k2000-d80",
                                              "causal-tl-q700-k190-d128-mqa")}
FP8_SHAPES.update({"full-1536-d64": (1, 4, 4, 1536, 1536, 64, False, "top_left"),
                   "causal-br-q50-k100-d128-emptyrows": (2, 4, 4, 50, 100, 128, True, "bottom_right")})


# Past D=128 (192 padded to 256): the wide schedule's one Q buffer per consumer, O staged apart
# from it (FP8 Q is half O's bytes), 64-key steps or 128-key ones in turn.
FP8_WIDE_KNOBS = {"wide-n64-lazy8": dict(BLOCK_N=64, rescale_threshold=8),
                  "wide-n128-plain": dict(BLOCK_N=128, overlap=False, rescale_threshold=8),
                  "wide-n64-persistent": dict(BLOCK_N=64, persistent=1),
                  "wide-n128-plain-emu8": dict(BLOCK_N=128, overlap=False, exp2_emu=8)}  # the FP8 default past 128
FP8_WIDE_SHAPES = {"full-1024-d256": (1, 4, 4, 1024, 1024, 256, False, "top_left"),
                   "causal-gqa-1000-d256": WIDE_SHAPES["causal-gqa-1000-d256"][:6] + (True, "top_left"),
                   "causal-br-q300-k2000-d192": (1, 8, 8, 300, 2000, 192, True, "bottom_right")}
FP8_SHAPES.update(FP8_WIDE_SHAPES)
FP8_KNOBS.update(FP8_WIDE_KNOBS)
FP8_CASES = [(knob, shape) for knob in FP8_KNOBS for shape in FP8_SHAPES
             if (knob in FP8_WIDE_KNOBS) == (shape in FP8_WIDE_SHAPES)]


@pytest.mark.parametrize("scaling, sink", [("per_block", True), ("per_block", False), ("per_head", True)])
@pytest.mark.parametrize("knob, shape", FP8_CASES)
def test_fp8(knob, shape, scaling, sink):
    from fa_autotune import attention_fp8, quantize_fp8
    from fa_autotune.fp8.quantize import v_order_for
    from fa_autotune.tune.reference import compare, reference_attention

    b, hq, hkv, nq, nk, d, causal, align = FP8_SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, nq, d, generator=gen, device="cuda")
    k, v = (torch.randn(b, hkv, nk, d, generator=gen, device="cuda") for _ in range(2))
    k[:, :, :4] *= 40.0  # attention sinks: what the sink tile is for
    v[:, :, :4] *= 10.0
    q, k, v = (t.half() for t in (q, k, v))
    config = dict(BASE, **FP8_KNOBS[knob])  # the Triton kernel's sink tile as wide as the Gluon one's
    # V in the wgmma order where the key count allows (2000, 1536, 1024 keys), else in order
    x = quantize_fp8(q, k, v, scaling=scaling, sink_tile=sink, block_q=128, block_k=max(128, config["BLOCK_N"]),
                     v_order=v_order_for(False, nk))
    # per-head runs write fp16 (out_dtype), the others bf16
    options = dict(causal=causal, causal_align=align, return_lse=True,
                   out_dtype=torch.float16 if scaling == "per_head" else torch.bfloat16)
    out, lse = attention_fp8(x, config=config, **options)
    triton_out, triton_lse = attention_fp8(x, config=dict(BLOCK_M=64, BLOCK_N=config["BLOCK_N"], num_warps=4,
                                                          num_stages=2), **options)
    ref, _ = reference_attention(q.float(), k.float(), v.float(), causal=causal, causal_align=align)
    ours, theirs = compare(out, ref), compare(triton_out, ref)
    assert ours.finite and ours.rel <= 1.1 * theirs.rel + 2e-3, (ours.rel, theirs.rel)
    assert not sink or ours.rel <= 0.06, ours.rel
    seen = torch.isfinite(triton_lse)  # rows that see a key (bottom-right: the first may see none)
    assert torch.equal(seen, torch.isfinite(lse))
    assert torch.allclose(lse[seen], triton_lse[seen], atol=2e-2), (lse - triton_lse)[seen].abs().max()
    assert (out[~seen] == 0).all()

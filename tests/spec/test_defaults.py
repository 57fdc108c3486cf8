"""The built-in configs: FlashAttention-3 in Gluon where it was measured to win (Hopper,
fp16/bf16, D > 64), the Triton kernels elsewhere and as the Gluon kernel's stand-in."""
from __future__ import annotations

import pytest

from fa_autotune.kernels.bwd import wide_backward_error
from fa_autotune.spec.defaults import (GLUON_BACKWARD, GLUON_BACKWARD_TWO_PASS, GLUON_DEFAULT, GLUON_FP8,
                                       GLUON_FP8_WIDE, GLUON_WIDE,
                                       GLUON_WIDE_BACKWARD, backward_default, default_config, defaults_for,
                                       gluon_candidates)
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.space import load_space
from fa_autotune.spec.target import GpuInfo

HOPPER = GpuInfo("NVIDIA H200", "9.0", 132, 1, "1")
AMPERE = GpuInfo("NVIDIA A100", "8.0", 108, 1, "1")


def _kernels(space: str, problem: Problem) -> set:
    """The kernel configs of a space's Hopper grid on ``problem`` (its candidates' configs)."""
    return {candidate.config for candidate in load_space(space).for_arch("sm90").grid(problem)}


@pytest.mark.parametrize("head_dim", [80, 96, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_hopper_prefill_defaults_to_gluon(head_dim, dtype):
    problem = Problem(2, 16, 4, 4096, 4096, head_dim, dtype, causal=True)
    assert default_config(problem, (9, 0)) == GLUON_DEFAULT
    first, second = defaults_for(problem, HOPPER)
    assert first.language == "gluon" and second.language == "triton"
    assert second == default_config(problem, (9, 0), gluon=False)


@pytest.mark.parametrize("problem, capability", [
    (Problem(2, 16, 16, 4096, 4096, 64, "float16"), (9, 0)),  # D=64: the Triton kernel won
    (Problem(2, 16, 16, 4096, 4096, 256, "float16"), (8, 0)),
    (Problem(2, 16, 16, 4096, 4096, 128, "float32"), (9, 0)),
    (Problem(2, 16, 16, 4096, 4096, 128, "float8_e4m3fn"), (8, 9)),  # FP8 on Ada
    (Problem(2, 16, 16, 4096, 4096, 64, "float8_e4m3fn"), (9, 0)),  # FP8 D=64: not measured in Gluon
    (Problem(2, 16, 16, 1, 4096, 128, "float16"), (9, 0)),  # decode: split-KV
    (Problem(2, 16, 16, 4096, 4096, 128, "float16"), (8, 0)),
    (Problem(2, 16, 16, 4096, 4096, 128, "float16"), (10, 0)),  # Gluon's wgmma is Hopper's
    (Problem(2, 16, 16, 4096, 4096, 128, "float16"), None),  # the interpreter
])
def test_triton_elsewhere(problem, capability):
    assert default_config(problem, capability).language == "triton"


@pytest.mark.parametrize("head_dim", [136, 192, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wide_head_dims_default_to_gluon_past_128(head_dim, dtype):
    """Past D=128 the Gluon kernel with one Q buffer per consumer and 64-key steps (a
    persistent grid's two Q buffers do not fit beside the ring); its warm start stays in the
    Hopper space and never asks for a persistent grid."""
    problem = Problem(2, 16, 4, 4096, 4096, head_dim, dtype, causal=True)
    assert default_config(problem, (9, 0)) == GLUON_WIDE
    first, second = defaults_for(problem, HOPPER)
    assert first == GLUON_WIDE and second.language == "triton"
    candidates = gluon_candidates(problem, (9, 0))
    assert candidates[0] == GLUON_WIDE and not any(c.persistent for c in candidates)
    grid = _kernels("fwd", problem)
    assert all(c in grid for c in candidates), [c.name for c in candidates if c not in grid]


@pytest.mark.parametrize("head_dim", [96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_fp8_defaults_to_gluon(head_dim, causal):
    """FP8 on Hopper past D=64 (measured at 128 and 256; D=64 keeps the Triton default): the
    Gluon kernel with 256-key steps in turn (dynamic on causal grids) up to D=128, 128-key
    steps in turn with part of the exp2 on the FMA units past it; the Triton FP8 default
    behind it; its warm start in the Hopper space."""
    problem = Problem(2, 16, 4, 4096, 4096, head_dim, "float8_e4m3fn", causal=causal)
    expected = GLUON_FP8_WIDE if head_dim > 128 else GLUON_FP8.with_(dynamic=causal)
    assert default_config(problem, (9, 0)) == expected
    first, second = defaults_for(problem, HOPPER)
    assert first == expected and second.language == "triton"
    candidates = gluon_candidates(problem, (9, 0))
    assert candidates[0] == expected and len(set(candidates)) == len(candidates)
    if head_dim in (128, 256) and (head_dim, causal) != (256, True):  # the grids take 7-28 s each
        grid = _kernels("fwd", problem)
        assert all(c in grid for c in candidates), [c.name for c in candidates if c not in grid]


def test_one_default_where_gluon_is_not_picked():
    assert len(defaults_for(Problem(2, 16, 16, 4096, 4096, 128, "float16"), AMPERE)) == 1


@pytest.mark.parametrize("problem", [Problem(2, 16, 16, 1024, 1024, 128, "bfloat16", causal=True),
                                     Problem(2, 32, 32, 4096, 4096, 64, "float16"),
                                     Problem(2, 32, 8, 1000, 1000, 64, "float16", causal=True)],
                         ids=lambda p: p.key)
def test_gluon_warm_start_candidates_are_in_the_hopper_space(problem):
    """The Gluon structures a Hopper tune measures first: the default first, dynamic
    scheduling on causal grids, three consumers only at D <= 64 (with and without a mask in
    turns, without a mask also free-running); each a point of the shipped search space for
    that problem (the warm start enqueues only those)."""
    from fa_autotune.spec.defaults import gluon_candidates

    candidates = gluon_candidates(problem, (9, 0))
    assert candidates[0] == GLUON_DEFAULT and len(set(candidates)) == len(candidates)
    assert any(c.dynamic for c in candidates) == problem.causal
    assert any(c.consumers == 3 for c in candidates) == (problem.head_dim <= 64)
    assert any(c.consumers == 3 and not c.pingpong for c in candidates) == (not problem.causal
                                                                            and problem.head_dim <= 64)
    assert any(c.pingpong for c in candidates) == (problem.head_dim <= 64)
    assert any(c.exp2_emu for c in candidates) == (problem.head_dim <= 64)
    assert any(c.half_step for c in candidates) == (problem.causal and problem.head_dim <= 64)
    assert any(c.rescale_threshold for c in candidates) == (problem.head_dim > 64)
    grid = _kernels("fwd", problem)
    assert all(c in grid for c in candidates), [c.name for c in candidates if c not in grid]
    assert gluon_candidates(problem, (8, 0)) == gluon_candidates(problem, None) == []
    assert gluon_candidates(Problem(2, 16, 16, 1024, 1024, 128, "float32"), (9, 0)) == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_hopper_backward_defaults_to_gluon(dtype):
    """The Gluon backward on Hopper in fp16/bf16 up to D=128, dQ added up inside it (128 query
    rows a step up to D=64, 64 past it), every length, one program per SM taking tiles from a
    counter without a mask (causal grids keep a program per tile); the Triton kernels for
    fp32, other GPUs, the interpreter, and (gluon=False) inputs the Gluon pass cannot read;
    past D=128 the wide Gluon kernel (both consumers on one key block)."""
    d64, d128 = (Problem(4, 16, 16, 4096, 4096, d, dtype, causal=True, kind="bwd") for d in (64, 128))
    full = Problem(4, 16, 16, 4096, 4096, 128, dtype, kind="bwd")
    in_space = _kernels if dtype == "bfloat16" else lambda space, problem: {backward_default(problem, (9, 0))}
    # (the Hopper grid, 1-2 s to build, is the same for both 16-bit dtypes: searched once)
    assert backward_default(full, (9, 0)) == GLUON_BACKWARD.with_(persistent=1, dynamic=True)
    assert backward_default(full, (9, 0)) in in_space("bwd", full)
    assert backward_default(d64, (9, 0)) == GLUON_BACKWARD.with_(BLOCK_M=128, num_stages=2)
    assert backward_default(d128, (9, 0)) == GLUON_BACKWARD and GLUON_BACKWARD.dq_atomic
    assert not GLUON_BACKWARD_TWO_PASS.dq_atomic and GLUON_BACKWARD_TWO_PASS.language == "gluon"
    assert default_config(d128, (9, 0)) == GLUON_BACKWARD
    first, second = defaults_for(d128, HOPPER)
    assert first == GLUON_BACKWARD and second == backward_default(d128, (9, 0), gluon=False)
    for problem in (d64, d128):  # the tuner's space holds them
        assert backward_default(problem, (9, 0)) in in_space("bwd", problem)
    short = Problem(16, 32, 8, 1024, 1024, 64, dtype, kind="bwd")
    assert backward_default(short, (9, 0)).language == "gluon"
    # causal GQA: a query head per program (the power of two covering the group, at most 8)
    for hq, hkv, split in ((32, 8, 4), (28, 4, 8), (24, 8, 4), (64, 4, 8), (32, 16, 2)):
        gqa = Problem(1, hq, hkv, 3000, 3000, 128, dtype, causal=True, kind="bwd")
        assert backward_default(gqa, (9, 0)) == GLUON_BACKWARD.with_(group_split=split), (hq, hkv)
        assert backward_default(gqa, (9, 0)) in in_space("bwd", gqa)
    assert backward_default(short, (9, 0)).group_split == 1  # without a mask: one program per group
    tiny = Problem(4, 16, 16, 4096, 4096, 16, dtype, kind="bwd")  # dQ halves of 8 columns: never run on a GPU
    assert backward_default(tiny, (9, 0)).language == "triton"
    # past D=128 (192 padded to 256): the wide kernel, both consumers on one key block; causal GQA split
    for d in (160, 192, 256):
        wide = Problem(4, 8, 8, 4096, 4096, d, dtype, causal=True, kind="bwd")
        assert backward_default(wide, (9, 0)) == GLUON_WIDE_BACKWARD
        assert backward_default(wide, (9, 0)) in in_space("bwd", wide)
        assert wide_backward_error(GLUON_WIDE_BACKWARD) is None
    gqa = Problem(1, 32, 4, 4096, 4096, 256, dtype, causal=True, kind="bwd")
    assert backward_default(gqa, (9, 0)) == GLUON_WIDE_BACKWARD.with_(group_split=8)
    assert all(wide_backward_error(c) is None for c in in_space("bwd", gqa)
               if c.language == "gluon")
    d256 = Problem(4, 8, 8, 4096, 4096, 256, dtype, kind="bwd")
    for problem, capability, gluon in ((d128, (9, 0), False), (d128, (8, 0), True), (d128, None, True),
                                       (Problem(4, 16, 16, 4096, 4096, 128, "float32", kind="bwd"), (9, 0), True),
                                       (d256, (8, 0), True), (d256, (9, 0), False)):
        config = backward_default(problem, capability, gluon=gluon)
        assert config.language == "triton" and config.loop_order == "backward", (problem.key, capability)


def test_decode_candidates_read_a_contiguous_cache_through_tma_on_hopper():
    """The decode warm start: the default (pointers) first, then on Hopper the same tiles
    through TMA descriptors for a contiguous cache; pages and Ampere stay on pointers."""
    from fa_autotune.spec.defaults import decode_candidates

    contiguous = Problem(128, 32, 8, 1, 1024, 128, "bfloat16", kind="decode")
    paged = Problem(128, 32, 8, 1, 1024, 128, "bfloat16", kind="decode", page_size=16)
    hopper = decode_candidates(contiguous, (9, 0))
    assert hopper[0].access == "pointer" and len(set(hopper)) == len(hopper)
    tma = [c for c in hopper if c.access == "tensor_desc"]
    assert {c.with_(access="pointer") for c in tma} == {c for c in hopper if c.access == "pointer"}
    assert all(c.access == "pointer" for c in decode_candidates(paged, (9, 0)) + decode_candidates(contiguous, (8, 0)))
    rows_of_40_bytes = Problem(4, 8, 2, 1, 1024, 20, "float16", kind="decode")  # no 16-byte rows: no TMA
    assert all(c.access == "pointer" for c in decode_candidates(rows_of_40_bytes, (9, 0)))
    # Both wide tiles (128 keys, one program per SM 3 deep or two per SM 2 deep) through TMA.
    wide = {(c.BLOCK_N, c.num_stages, c.num_splits) for c in tma if c.BLOCK_N == 128}
    assert wide == {(128, 3, 1), (128, 2, 1)}, wide

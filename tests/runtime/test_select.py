"""The config that runs, chosen by one pure function: layouts written by hand (no tensors, no
GPU), every fallback a value, the error of the last default where nothing can run."""
from __future__ import annotations

import pytest
import torch

from fa_autotune.errors import ConfigError
from fa_autotune.kernels.checks import Layout, check_config, why_not
from fa_autotune.runtime.dispatch import Choice
from fa_autotune.runtime.select import runnable, select
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem

HOPPER = (9, 0)
ALIGNED = Layout("cuda", HOPPER, (None, None, None), (1000, 1000, 1000))
MISALIGNED = Layout("cuda", HOPPER, (None, "'tensor_desc' needs k to start on a 16-byte boundary", None),
                    (1000, 1000, 1000))
PROBLEM = Problem(2, 8, 8, 1024, 1024, 64, "float16")
WS = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, access="tensor_desc", warp_specialize=True,
                  persistent=1)
GLUON = KernelConfig(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=128, num_stages=2, consumers=2,
                     consumer_regs=240)
TRITON = KernelConfig(BLOCK_M=64, BLOCK_N=64)


def _choice(config: KernelConfig) -> Choice:
    return Choice(config, "shipped", PROBLEM, 0.0, "tuning_db/nvidia-h200.attn_fwd.json")


def test_a_tma_config_on_unaligned_tensors_runs_its_tiles_on_block_pointers():
    """No TMA: the same tiles on block pointers, unspecialized and without the persistent grid
    chosen for the producer warps; the dispatcher's source and match are kept."""
    chosen = select(PROBLEM, MISALIGNED, _choice(WS), [TRITON])
    assert chosen.config == WS.with_(access="block_ptr", warp_specialize=False, persistent=0)
    assert chosen.source == "shipped" and chosen.matched == PROBLEM
    assert select(PROBLEM, ALIGNED, _choice(WS), [TRITON]).config == WS


def test_warp_specialization_goes_where_the_problem_masks():
    causal = Problem(2, 8, 8, 1024, 1024, 64, "float16", causal=True)
    assert why_not(WS, causal, ALIGNED).parameter == "warp_specialize"
    assert runnable(WS, causal, ALIGNED) == WS.with_(warp_specialize=False, persistent=0)


def test_a_gluon_choice_that_cannot_run_falls_to_the_first_default_that_can():
    """Gluon has no variants: on a CPU layout (the interpreter) or unaligned tensors it is
    dropped whole, and the built-in defaults are tried in order."""
    cpu = Layout("cpu", None, (None, None, None), (1000, 1000, 1000))
    assert runnable(GLUON, PROBLEM, cpu) is None and runnable(GLUON, PROBLEM, MISALIGNED) is None
    chosen = select(PROBLEM, cpu, _choice(GLUON), [GLUON, TRITON])
    assert chosen.config == TRITON and (chosen.source, chosen.matched, chosen.origin) == ("default", None, "built-in")


def test_gluon_runs_fp8_forward_without_half_steps():
    """The Gluon forward takes FP8 inputs on Hopper (both products in FP8) at every head dim;
    its half steps hold P in 16 bits, so an FP8 config with them is refused by name, as are
    an FP8 backward and a float32 forward."""
    fp8 = Problem(2, 8, 8, 1024, 1024, 128, "float8_e4m3fn", causal=True)
    assert why_not(GLUON, fp8, ALIGNED) is None
    assert why_not(GLUON.with_(overlap=False, half_step=True), fp8, ALIGNED).parameter == "half_step"
    assert "FP8" in str(why_not(GLUON, Problem(2, 8, 8, 1024, 1024, 128, "float32"), ALIGNED))
    wide = Problem(2, 8, 8, 1024, 1024, 192, "float8_e4m3fn")
    assert why_not(GLUON.with_(BLOCK_N=64), wide, ALIGNED) is None
    bwd = GLUON.with_(loop_order="backward", BLOCK_N=64)
    assert why_not(bwd, fp8.with_kind("bwd"), ALIGNED).parameter in ("language", "loop_order")


def test_gluon_256_key_steps_are_fp8_only():
    """256-key steps hold a 64 x 256 fp32 score tile per consumer: P fits beside it in 8 bits
    and only in the steps-in-turn schedule, so a 16-bit problem, the overlap and the
    backward are refused by name."""
    wide = GLUON.with_(BLOCK_N=256, overlap=False)
    assert why_not(wide, Problem(2, 8, 8, 1024, 1024, 128, "float8_e4m3fn"), ALIGNED) is None
    error = why_not(wide, PROBLEM, ALIGNED)
    assert error.parameter == "BLOCK_N" and "FP8 inputs only" in str(error)
    for changes in (dict(overlap=True), dict(consumers=3, consumer_regs=160)):
        with pytest.raises(ConfigError, match="256-key steps") as raised:
            wide.with_(**changes)
        assert raised.value.parameter == "BLOCK_N"
    with pytest.raises(ConfigError, match="BLOCK_N=256"):
        wide.with_(loop_order="backward")


def test_gluon_128_key_steps_at_head_dim_192_run_in_turn_only():
    """At head dims 129-192 in 16 bits a 128-key Gluon step holds two 64-key score halves
    beside a 192-column accumulator (kernels.fwd.wide_steps): the intra-warpgroup overlap and
    half steps are refused by name; 64-key steps, FP8 and D=128 keep them."""
    d192 = Problem(2, 8, 8, 1024, 1024, 192, "bfloat16", causal=True)
    plain = GLUON.with_(BLOCK_N=128, overlap=False)
    assert why_not(plain, d192, ALIGNED) is None and why_not(plain.with_(pingpong=True), d192, ALIGNED) is None
    error = why_not(GLUON.with_(BLOCK_N=128, overlap=True), d192, ALIGNED)
    assert error.parameter == "overlap" and "head dim 192" in str(error) and "BLOCK_N=64" in str(error)
    assert why_not(GLUON.with_(BLOCK_N=128, overlap=False, half_step=True), d192, ALIGNED).parameter == "half_step"
    assert why_not(GLUON.with_(BLOCK_N=64, overlap=True), d192, ALIGNED) is None
    assert why_not(GLUON.with_(BLOCK_N=128, overlap=True), Problem(2, 8, 8, 1024, 1024, 128, "bfloat16"),
                   ALIGNED) is None
    assert why_not(GLUON.with_(BLOCK_N=128, overlap=True), d192.with_dtype("float8_e4m3fn"), ALIGNED) is None


def test_where_nothing_runs_the_last_defaults_reason_is_raised():
    """A head too long for 32-bit offsets and no TMA: pointer kernels cannot address it."""
    far = Layout("cuda", HOPPER, (None, "'tensor_desc' needs q's head dim contiguous (stride 1)", None),
                 (2**31, 1000, 1000))
    with pytest.raises(ConfigError, match="32-bit offsets") as raised:
        select(PROBLEM, far, _choice(GLUON), [GLUON, TRITON])
    assert raised.value.parameter == "access"


def test_why_not_is_what_check_config_raises():
    """The one rule set: check_config raises exactly why_not's error on the tensors' layout."""
    q = torch.randn(1, 2, 64, 32, dtype=torch.float16).transpose(2, 3).contiguous().transpose(2, 3)
    k = v = torch.randn(1, 2, 64, 32, dtype=torch.float16)
    problem = Problem(1, 2, 2, 64, 64, 32, "float16")
    config = TRITON.with_(access="tensor_desc")
    layout = Layout.of(problem, q, k, v)
    assert layout.tma[0] and not layout.tma_ok and layout.device == "cpu" and layout.capability is None
    error = why_not(config, problem, layout)
    with pytest.raises(ConfigError) as raised:
        check_config(config, problem, q, k, v)
    assert str(raised.value) == str(error) and "head dim contiguous" in str(error)
    assert why_not(TRITON, problem, layout) is None


def test_an_fp8_cache_runs_128_key_steps_where_they_fit():
    """A dispatched decode config over an FP8 cache takes 128-key steps, 3 stages, 4 warps over
    pointers (as many bytes a step as the 16-bit cache's 64 keys), its split count kept; a tile of
    more than 64 query rows, D > 128 or a balanced split keeps its own tiles."""
    from fa_autotune.runtime.select import for_fp8_cache

    decode = KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=4, num_splits=16,
                          access="tensor_desc")
    gqa = Problem(1, 32, 8, 1, 131072, 128, "bfloat16", kind="decode")
    assert for_fp8_cache(decode, gqa) == decode.with_(BLOCK_N=128, num_stages=3, access="pointer")
    for problem, config in ((Problem(1, 32, 8, 1, 4096, 256, "bfloat16", kind="decode"), decode),
                            (Problem(1, 32, 1, 4, 4096, 128, "bfloat16", kind="decode"), decode),
                            (gqa, decode.with_(num_splits=1, persistent=1))):
        assert for_fp8_cache(config, problem) == config

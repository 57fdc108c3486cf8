"""The static shared-memory estimate against the compiler (ahead of time for sm_90): exact
estimates within SLACK of what Triton allocates, lower bounds never above it, and `fits`
never ruling out a config that compiles within the limit."""
from __future__ import annotations

import pytest

from fa_autotune.kernels import resources
from fa_autotune.kernels.aot import HOPPER, SHARED_MEMORY_LIMIT, compile_many
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem

LIMIT = SHARED_MEMORY_LIMIT[HOPPER]


def _problem(d: int, causal: bool = False, dtype: str = "bfloat16", n: int = 4096, b: int = 4, h: int = 16) -> Problem:
    return Problem(b, h, h, n, n, d, dtype, causal=causal)


def _gluon(**kw) -> KernelConfig:
    base = {"language": "gluon", "access": "tensor_desc", "BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 2,
            "consumers": 2, "consumer_regs": 240}
    return KernelConfig.from_mapping(dict(base, **kw))


def _triton(**kw) -> KernelConfig:
    return KernelConfig.from_mapping(dict({"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8}, **kw))


CASES = [
    pytest.param(_gluon(), _problem(128), id="gluon-d128"),
    pytest.param(_gluon(num_stages=3, persistent=1, dynamic=True), _problem(128), id="gluon-d128-persistent-s3"),
    pytest.param(_gluon(num_stages=4), _problem(128), id="gluon-d128-s4-too-big"),
    pytest.param(_gluon(BLOCK_N=64, num_stages=4, persistent=1), _problem(96, causal=True), id="gluon-d96"),
    pytest.param(_gluon(BLOCK_N=64), _problem(256), id="gluon-d256-o-in-q"),
    pytest.param(_gluon(overlap=False, half_step=True), _problem(64, causal=True), id="gluon-d64-half-step"),
    pytest.param(_gluon(consumers=3, consumer_regs=160, num_stages=3), _problem(64), id="gluon-d64-3c"),
    pytest.param(_triton(), _problem(128), id="triton-ptr"),
    pytest.param(_triton(access="tensor_desc", q_tiles=2, num_stages=2), _problem(128), id="triton-tma-2q"),
    pytest.param(_triton(BLOCK_M=64, BLOCK_N=128, num_stages=4, q_tiles=2), _problem(128), id="triton-too-big"),
    pytest.param(_triton(loop_order="split_kv", num_splits=4, access="tensor_desc"), _problem(64, n=1024, b=1, h=8),
                 id="triton-split-kv"),
    pytest.param(_triton(BLOCK_N=128, num_stages=3), _problem(128, dtype="float8_e4m3fn"), id="triton-fp8"),
    pytest.param(_triton(access="tensor_desc", warp_specialize=True, num_stages=2, q_tiles=2), _problem(64),
                 id="triton-warp-specialized-lower-bound"),
]


@pytest.mark.parametrize("config, problem", CASES)
def test_estimate_matches_the_compiler(config, problem):
    (result,) = compile_many([config], problem, HOPPER, jobs=1)
    assert result.status in ("ok", "out_of_resources"), result.error
    actual = result.shared_bytes
    estimate = resources.shared_bytes(config, problem, HOPPER)
    assert estimate is not None
    if resources.is_exact(config):
        assert estimate <= actual <= estimate + resources.SLACK, (estimate, actual)
    else:
        assert estimate <= actual, (estimate, actual)
    assert resources.fits(config, problem, HOPPER) == (estimate <= LIMIT)
    if result.status == "ok":  # what compiles is never ruled out
        assert resources.fits(config, problem, HOPPER)


def test_no_estimate_where_no_rule_is_known():
    """KV-outer loops, backward and decode kernels, other GPUs: the compiler decides."""
    assert resources.shared_bytes(_triton(loop_order="kv_outer"), _problem(64, n=1024), HOPPER) is None
    assert resources.shared_bytes(_triton(), _problem(128), (8, 0)) is None
    assert resources.fits(_triton(BLOCK_M=128, BLOCK_N=128, num_stages=4), _problem(256), (8, 0))


def test_sm90_constraints_rule_out_what_does_not_compile_past_head_dim_128():
    """What `search_spaces/fwd.yaml`'s two sm90 constraints on `head_dim_pad` rest on: at D=192
    a warp-specialized Triton kernel can overflow shared memory although the static lower bound
    lets it through, and 128 registers with 8 warps fails in ptxas. If Triton ever compiles
    them, this fails and the constraints deserve another look."""
    from fa_autotune.spec.space import load_space

    problem = _problem(192, dtype="float16")
    warp_specialized = _triton(BLOCK_N=64, num_warps=4, num_stages=2, access="tensor_desc", warp_specialize=True)
    capped = _triton(BLOCK_N=64, num_stages=2, access="tensor_desc", maxnreg=128)
    assert resources.fits(warp_specialized, problem, HOPPER) and resources.fits(capped, problem, HOPPER)
    ws, reg = compile_many([warp_specialized, capped], problem, HOPPER, jobs=1)
    assert ws.status == "out_of_resources" and ws.shared_bytes > LIMIT, (ws.status, ws.error)
    assert reg.status == "compile_error", reg.status
    names = {candidate.name for candidate in load_space("fwd").for_arch("sm90").grid(problem)}
    assert not any("_ws" in name or "_r128" in name for name in names)
    assert warp_specialized.name.replace("_ws", "") in names and capped.name.replace("_r128", "") in names

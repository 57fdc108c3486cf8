"""Launches and plans: the arguments a plan hands each kernel, the rendered interface it
relies on, and the Triton versions the direct launch path is allowed on."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import torch
import triton

from fa_autotune.errors import ConfigError, TemplateError
from fa_autotune.kernels import fwd, launch as launching
from fa_autotune.kernels.render import load_module
from fa_autotune.spec.config import KernelConfig


def _tensors(nq=40, nk=40, d=32, dtype=torch.float16):
    q = torch.randn(2, 4, nq, d, dtype=dtype)
    k, v = torch.randn(2, 2, nk, d, dtype=dtype), torch.randn(2, 2, nk, d, dtype=dtype)
    return q, k, v, torch.empty_like(q)


@pytest.mark.parametrize("config, tensors", [
    (KernelConfig(BLOCK_M=16, BLOCK_N=16), 8),  # Q, K, V, Out, Lse + three (None) descales
    (KernelConfig(BLOCK_M=16, BLOCK_N=16, q_tiles=2), 5),
    (KernelConfig(loop_order="kv_outer", BLOCK_M=16, BLOCK_N=16, q_tiles=2), 8),  # + three fp32 scratch buffers
], ids=["q_outer", "q_outer-two-tiles", "kv_outer"])
def test_each_kernel_gets_exactly_the_parameters_it_declares(kernel_cache, config, tensors):
    q, k, v, out = _tensors()
    plan = fwd.prepare(config, q, k, v, out, None, 0.125, 0, True)
    ((launch, args),) = [(l, a + l.fixed) for l, a in plan.launches(q, k, v, out, None)]
    runtime = [n for n in launch.kernel.arg_names if n not in launching.FLAGS]
    assert len(args) == len(runtime) and args[:3] == (q, k, v)
    named = dict(zip(runtime, args))
    assert named["N_Q"] == 40 and named["GROUP"] == 2 and named["stride_qn"] == 32
    assert named["qk_scale"] == pytest.approx(0.125 * launching.LOG2E)
    assert named["Lse"] is None and set(launch.flags) <= set(launch.kernel.arg_names)
    assert launch.flags["WRITE_LSE"] is False and launch.flags["IS_CAUSAL"] is True
    if "FP8" in launch.flags:  # an FP8-capable kernel called without descales: they are None
        assert launch.flags["FP8"] == 0 and named["QScale"] is None and named["Q_SCALE_BLOCK"] is None
    assert sum(isinstance(a, torch.Tensor) for a in args) == tensors - args[:tensors].count(None)


def test_split_kv_runs_a_main_and_a_combine_kernel(kernel_cache):
    q, k, v, out = _tensors(nq=1, nk=300)
    lse = torch.empty(2, 4, 1)
    plan = fwd.prepare(KernelConfig(loop_order="split_kv", BLOCK_M=16, BLOCK_N=16, num_splits=4), q, k, v, out,
                            lse, 0.1, 0, False)
    (main, main_args), (combine, combine_args) = plan.launches(q, k, v, out, lse)
    assert main.grid == (2 * 4, 4) and combine.grid == (2 * 4,)
    assert main_args[3] is combine_args[0] and combine_args[2:4] == (out, lse)  # partials flow main -> combine
    assert "WRITE_LSE" not in main.flags and combine.flags["WRITE_LSE"] is True  # only where it is used


def test_fp8_scales_need_an_fp8_capable_kernel(kernel_cache):
    q, k, v, out = _tensors()
    scales = (torch.ones(2, 4, 1), torch.ones(2, 2, 1), torch.ones(2, 2, 1), 128, 128)
    with pytest.raises(ConfigError, match="q_tiles"):
        fwd.prepare(KernelConfig(BLOCK_M=16, BLOCK_N=16, q_tiles=2), q, k, v, out, None, 0.1, 0, False, scales)
    with pytest.raises(ConfigError, match="q_outer"):
        fwd.prepare(KernelConfig(loop_order="kv_outer", BLOCK_M=16, BLOCK_N=16), q, k, v, out, None, 0.1, 0,
                         False, scales)


def test_a_kernel_that_breaks_the_interface_is_refused(kernel_cache):
    kernel = load_module(KernelConfig(BLOCK_M=16, BLOCK_N=16)).KERNELS["main"]
    with pytest.raises(TemplateError, match="takes"):
        launching.Launch(kernel, (1,), ("Q", "K", "Out"), {}, {}, {})
    with pytest.raises(TemplateError, match="does not know"):
        launching.Launch(kernel, (1,), ("Q", "K", "V", "Out", "Lse", "QScale", "KScale", "VScale"), {}, {}, {})


def test_direct_launch_only_on_the_tested_triton_range():
    """The direct path uses Triton's private launcher; pyproject admits only Triton versions it
    was tested on, and the installed one is among them."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (spec,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("triton")]
    lower, upper = re.fullmatch(r"triton>=(\d+\.\d+),<(\d+\.\d+)", spec.split(";")[0].strip()).groups()
    assert [f"{lower}."] == list(launching.DIRECT_LAUNCH_TRITON) and float(upper) - float(lower) == pytest.approx(0.1)
    assert triton.__version__.startswith(launching.DIRECT_LAUNCH_TRITON) == launching._DIRECT


def test_l2_sections_hold_as_many_heads_as_fit_in_the_budget(monkeypatch):
    """A causal Gluon grid walks sections of heads whose K/V fit in part of L2: GQA heads share
    their K/V, a head larger than the budget still makes a section of one, and the CPU
    stand-in (no L2) takes every head at once. A dynamic grid walks sections of
    DYNAMIC_SECTION heads whatever their size."""
    class Props:
        L2_cache_size = 64 << 20

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props)
    monkeypatch.setattr(launching, "L2_SECTION_FRACTION", 0.5)
    cuda = torch.device("cuda", 0)
    kv = 2 * 1024 * 128 * 2  # K and V of one head: 512 KiB at N=1024, D=128, 2-byte elements
    assert launching.l2_section(cuda, 256, 1, 1024, 128, 2) == (32 << 20) // kv == 64
    assert launching.l2_section(cuda, 256, 4, 1024, 128, 2) == 256  # four query heads per K/V head
    assert launching.l2_section(cuda, 10, 1, 1024, 128, 2) == 10  # never more than the grid's heads
    assert launching.l2_section(cuda, 64, 1, 1 << 20, 128, 2) == 1  # one head's K/V beyond the budget
    assert launching.l2_section(torch.device("cpu"), 256, 1, 1024, 128, 2) == 256
    assert launching.l2_section(cuda, 256, 1, 1024, 128, 2, True) == launching.DYNAMIC_SECTION == 8
    assert launching.l2_section(cuda, 64, 1, 1 << 20, 128, 2, True) == 8  # past L2 as well
    assert launching.l2_section(cuda, 5, 1, 1024, 128, 2, True) == 5
    monkeypatch.setattr(launching, "L2_SECTION_FRACTION", 0)
    assert launching.l2_section(cuda, 256, 1, 1024, 128, 2) == 256


def test_a_configs_section_overrides_the_l2_rule():
    """A causal persistent Gluon config's ``section`` reaches the kernel as SECTION (forward,
    backward, packed sequences); 0 leaves it to the L2 rule (all heads on a CPU
    stand-in)."""
    from fa_autotune.kernels.bwd import BackwardPlan
    from fa_autotune.kernels.fwd import prepare
    from fa_autotune.kernels.varlen import VarlenPlan
    from fa_autotune.spec.defaults import GLUON_BACKWARD, GLUON_DEFAULT

    q, k, v = (torch.empty(2, 12, 300, 128, device="meta", dtype=torch.float16) for _ in range(3))

    def section(launch) -> int:
        names = [n for n in launch.kernel.arg_names if n not in launching.FLAGS]
        return dict(zip(names[len(names) - len(launch.fixed):], launch.fixed))["SECTION"]

    for config, expected in ((GLUON_DEFAULT.with_(persistent=1), 24),
                             (GLUON_DEFAULT.with_(persistent=1, section=4), 4)):
        plan = prepare(config, q, k, v, torch.empty_like(q), None, 0.1, 0, True)
        (launch, _), = plan.launches(q, k, v, torch.empty_like(q), None, None)
        assert section(launch) == expected, config.name
    for config, expected in ((GLUON_BACKWARD.with_(persistent=1, dynamic=True), 24),
                             (GLUON_BACKWARD.with_(persistent=1, dynamic=True, section=16), 16)):
        plan = BackwardPlan(config, q, k, v, q, q, q, k, v, 0.1, 0, True)
        assert section(plan.dkdv) == expected, config.name
    packed = torch.empty(600, 12, 128, device="meta", dtype=torch.float16)  # two sequences of 300
    cu = torch.tensor([0, 300, 600], dtype=torch.int32)
    varlen = VarlenPlan(GLUON_DEFAULT.with_(persistent=1, section=4), packed, packed, packed, cu, 300, 0.1, True,
                        torch.empty_like(packed), None)
    assert section(varlen.launch) == 4


def test_d_rest_covers_the_real_columns_from_a_swizzle_row():
    """The Gluon forward's second Q K^T product: from column pad / 2, a power of two of at least
    16 columns that covers the head dim, only where it reads fewer columns than the pad and
    only for pads of 128 and more (slices on a 128-byte row)."""
    from fa_autotune.kernels.fwd import d_rest

    cases = {64: 0, 80: 16, 96: 32, 112: 0, 128: 0, 136: 16, 160: 32, 176: 64, 192: 64, 200: 0, 256: 0}
    for head_dim, rest in cases.items():
        pad = max(16, triton.next_power_of_2(head_dim))
        assert d_rest(head_dim, pad) == rest, head_dim
        if rest:
            assert pad // 2 + rest >= head_dim and pad // 2 + rest < pad and rest & (rest - 1) == 0
    assert d_rest(48, 64) == 0 and d_rest(24, 32) == 0
    # FP8 (1-byte columns): the halves meet on a 128-byte row only from a pad of 256, and a
    # product reduces over at least 32 of them
    fp8 = {96: 0, 128: 0, 136: 32, 160: 32, 192: 64, 256: 0}
    assert {d: d_rest(d, max(32, triton.next_power_of_2(d)), 1) for d in fp8} == fp8


def test_varlen_keeps_one_accumulator_part():
    """The varlen kernel splits Q K^T as the dense one does but keeps O in one part (its
    two-part ragged store is not yet GPU-tested): D=192 runs padded there."""
    from fa_autotune.kernels.fwd import d_rest
    from fa_autotune.kernels.varlen import varlen_d_rest

    assert varlen_d_rest(96, 128) == d_rest(96, 128) == 32 and varlen_d_rest(80, 128) == 16
    assert d_rest(192, 256) == 64 and varlen_d_rest(192, 256) == 0 and varlen_d_rest(256, 256) == 0

"""Ahead-of-time: rendered variants compile for Hopper (sm_90) with no GPU present, use
wgmma, and fit in shared memory; impossible ones are reported as statuses."""
from __future__ import annotations


import ast
import re

import pytest
import triton

from fa_autotune.errors import ConfigError
from fa_autotune.kernels.aot import SHARED_MEMORY_LIMIT, compile_many, sass_loops
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.defaults import GLUON_BACKWARD
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.recipe import Fp8Recipe
from helpers import shared_once

CAUSAL = Problem(1, 16, 16, 4096, 4096, 128, "float16", causal=True)
FULL = Problem(1, 16, 4, 4096, 4096, 128, "bfloat16", causal=False)
PADDED = Problem(2, 8, 8, 1000, 1000, 80, "float16", causal=True)
FP8_E4M3 = Problem(1, 16, 4, 4096, 4096, 128, "float8_e4m3fn", causal=True)
FP8_E5M2 = Problem(1, 16, 16, 4096, 4096, 128, "float8_e5m2", causal=False)
FP8_FULL = Problem(4, 16, 16, 4096, 4096, 128, "float8_e4m3fn", causal=False)
WS = dict(access="tensor_desc", warp_specialize=True, num_stages=2)

SAMPLE = [
    (CAUSAL, KernelConfig(access="pointer", causal_mode="split")),
    (CAUSAL, KernelConfig(access="block_ptr", causal_mode="masked")),
    (FULL, KernelConfig(access="tensor_desc", warp_specialize=True, num_stages=2, BLOCK_N=64)),
    (FULL, KernelConfig(access="tensor_desc", causal_mode="split", warp_specialize=True, BLOCK_N=128, num_stages=2)),
    (FULL, KernelConfig(loop_order="split_kv", BLOCK_M=64, access="tensor_desc", num_splits=4)),
    (CAUSAL, KernelConfig(loop_order="split_kv", BLOCK_M=64, access="pointer", causal_mode="masked", num_splits=2)),
    (CAUSAL, KernelConfig(loop_order="kv_outer", q_tiles=2, access="block_ptr", num_stages=2)),
    (FULL, KernelConfig(loop_order="kv_outer", q_tiles=2, access="tensor_desc", causal_mode="masked", num_stages=2)),
    (PADDED, KernelConfig(access="tensor_desc", BLOCK_M=64, num_warps=4, num_stages=2)),
    (FP8_E4M3, KernelConfig(access="tensor_desc", BLOCK_N=128, num_warps=8, num_stages=2)),
    (FP8_E5M2, KernelConfig(access="pointer", BLOCK_N=64, num_warps=4, num_stages=3)),
    (FP8_E5M2, KernelConfig(access="tensor_desc", BLOCK_N=128, num_warps=4, num_stages=2, rescale_threshold=8)),
    # persistent grids under warp specialization, and the FP8 defaults
    (FULL, KernelConfig(**WS, BLOCK_N=128, persistent=2, tile_order="head")),
    (FP8_FULL, KernelConfig(**WS, BLOCK_N=256, persistent=1)),
    (FP8_FULL, KernelConfig(**WS, BLOCK_N=256, persistent=1, fp8_pv="inplace")),
    (FP8_E4M3, KernelConfig(access="pointer", BLOCK_M=64, BLOCK_N=128, num_stages=3, fp8_pv="inplace")),
]


@pytest.fixture(scope="session")
def results(tmp_path_factory):
    def compile_sample():
        # FP8: the default recipe, per-head scaling where P V accumulates in place (one V descale a head)
        by_problem: dict[tuple[Problem, Fp8Recipe | None], list[KernelConfig]] = {}
        for problem, config in SAMPLE:
            recipe = Fp8Recipe("per_head") if config.fp8_pv == "inplace" else None
            by_problem.setdefault((problem, recipe), []).append(config)
        out = {}
        for (problem, recipe), configs in by_problem.items():
            for config, result in zip(configs, compile_many(configs, problem, jobs=2, recipe=recipe)):
                out[(problem, config)] = result
        return out

    return shared_once(tmp_path_factory, "aot-sample", compile_sample)


@pytest.mark.parametrize("problem, config", SAMPLE, ids=[f"{c.name}-{p.key}" for p, c in SAMPLE])
def test_variant_compiles_for_hopper(results, problem, config):
    result = results[(problem, config)]
    assert result.status == "ok", result.error
    assert result.uses_wgmma, "expected Hopper wgmma instructions in the PTX"
    assert 0 < result.shared_bytes <= SHARED_MEMORY_LIMIT[(9, 0)]
    # split-KV: main + combine; FP8 warp-specialized: main + the sink tile's kernel
    expected = 2 if config.loop_order == "split_kv" or (problem.is_fp8 and config.warp_specialize) else 1
    assert len(result.kernels) == expected


def test_impossible_variants_become_statuses():
    """Too much shared memory and a config the runtime refuses (a causal warp-specialized
    loop, which Triton 3.6 miscompiles) come back as statuses; a ptxas failure does too
    (`test_a_ptxas_failure_is_one_line_not_the_kernels_ptx`)."""
    too_big = KernelConfig(BLOCK_M=256, BLOCK_N=128, num_stages=4, access="tensor_desc")
    ws_two_loops = KernelConfig(access="tensor_desc", causal_mode="split", warp_specialize=True, num_stages=2)
    big, ws = compile_many([too_big, ws_two_loops], CAUSAL, jobs=2)
    assert big.status == "out_of_resources" and big.shared_bytes > SHARED_MEMORY_LIMIT[(9, 0)]
    assert ws.status == "invalid_config" and ws.error.startswith("warp_specialize:"), ws.error


@pytest.mark.parametrize("problem, operands", [(FP8_E4M3, "e4m3.e4m3"), (FP8_E5M2, "e5m2.e5m2"),
                                               (FP8_FULL, "e4m3.e4m3")])
def test_fp8_kernels_use_fp8_tensor_cores(results, problem, operands):
    """Both products (QK^T and PV) run as FP8 wgmma, not upcast to fp16; the only 16-bit
    product is the sink tile's scores (the default recipe's), inline or in the kernel that
    follows a warp-specialized one."""
    for (p, config), result in results.items():
        if p == problem:
            kernel, *side = result.kernels
            assert kernel.kernel == config.name and kernel.mma, kernel
            assert [k.kernel for k in side] == ([config.name + "_sink"] if config.warp_specialize else [])
            for report in result.kernels:
                fp8 = [kind for kind in report.mma if kind.endswith(operands)]
                half = [kind for kind in report.mma if kind.endswith(".f16.f16")]
                assert fp8 and len(fp8) + len(half) == len(report.mma), report.mma
                assert len(half) == (0 if report is kernel and config.warp_specialize else 1), report.mma


QUANTIZE_AOT = '''
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fa_autotune.fp8 import kernels as qk
from fa_autotune.kernels.aot import resource_usage

ints = lambda *names: {n: "i32" for n in names}
consts = lambda *names: {n: "constexpr" for n in names}
out = {}
for dtype in ("fp16", "bf16"):
    for rotate in (False, True):
        sig = {"x_ptr": f"*{dtype}", "m_ptr": f"*{dtype}", "amax_ptr": "*fp32",
               **ints("stride_b", "stride_h", "stride_n", "stride_d", "heads", "N", "n_chunks"), "inv_sqrt_n": "fp32",
               **consts("D", "DP", "ROWS", "ROTATE", "INTERPRET")}
        k = triton.compile(ASTSource(qk._chunk_amax, sig, dict(D=80, DP=128, ROWS=64, ROTATE=rotate, INTERPRET=False)),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        out[f"amax {dtype} {rotate}"] = ["wgmma" in k.asm["ptx"], k.metadata.shared]
        common = {"x_ptr": f"*{dtype}", "m_ptr": f"*{dtype}", "scale_ptr": "*fp32", "out_ptr": "*fp8e4nv",
                  **ints("stride_b", "stride_h", "stride_n", "stride_d", "o_stride_b", "o_stride_h", "o_stride_n",
                         "o_stride_d", "s_stride_b", "s_stride_h", "s_stride_n", "heads", "N"),
                  "inv_sqrt_n": "fp32", "fmax": "fp32",
                  **consts("BLOCK", "D", "DP", "ROWS", "ROTATE", "INTERPRET", "MBITS", "EMIN")}
        c = dict(BLOCK=128, D=80, DP=128, ROWS=64, ROTATE=rotate, INTERPRET=False, MBITS=3, EMIN=-6)
        k = triton.compile(ASTSource(qk._scale_cast, common, c), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4})
        out[f"cast {dtype} {rotate}"] = ["wgmma" in k.asm["ptx"], k.metadata.shared]
        # per-block scaling in one launch, specialized as the JIT specializes contiguous tensors
        # (unit strides, 16-byte alignment: what lets Triton pipeline the loads); V goes out
        # sequence-contiguous in the wgmma order
        blocks = dict(common, n_blocks="i32", total="i32", WGMMA_ORDER="constexpr", STAGES="constexpr",
                      HALVES="constexpr", FULL="constexpr")
        names = list(blocks)
        for block, d in ((16, 80), (64, 80), (256, 80), (128, 128), (256, 128), (128, 256), (256, 256)):
            launch = qk.block_launch(block, max(128, d), rotate, halves=True, transposed=not rotate)  # V: transposed
            c = dict(c, BLOCK=block, ROWS=launch.rows, D=d, DP=max(128, d), STAGES=launch.stages,
                     WGMMA_ORDER=not rotate, HALVES=launch.halves, FULL=launch.halves, stride_d=1,
                     **({"o_stride_n": 1} if not rotate else {"o_stride_d": 1}))
            sig = dict(blocks, stride_d="constexpr", **{("o_stride_n" if not rotate else "o_stride_d"): "constexpr"})
            aligned = {(names.index(n),): [["tt.divisibility", 16]]
                       for n in ("x_ptr", "m_ptr", "scale_ptr", "out_ptr", "stride_b", "stride_h", "stride_n", "N",
                                 "o_stride_b", "o_stride_h", "o_stride_d" if not rotate else "o_stride_n")}
            k = triton.compile(ASTSource(qk._quantize_blocks, sig, c, aligned), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": launch.warps})
            stores = re.findall(r"st\\.global\\.(v4\\.b32|b32|b16|b8)", k.asm["ptx"])
            # 16 rows are below wgmma's 64: the rotation takes mma.sync there
            out[f"blocks {dtype} {rotate} {block} d{d}"] = [("wgmma" if block >= 64 else "mma.sync") in k.asm["ptx"],
                                                            k.metadata.shared, resource_usage(k.asm["cubin"])[1],
                                                            sorted(set(stores))]
print(json.dumps(out))
'''


def test_fused_quantization_kernels_compile_for_hopper(tmp_path):
    """The FP8 quantization kernels compile for sm_90 (fp16 and bf16, rotated or not: the
    maxima and cast passes, and per-block scaling in one launch for blocks of 16-256 rows at
    D=80, 128 and 256, as the JIT specializes it) within shared memory; the Hadamard rotation
    runs on the tensor cores (wgmma); the per-block kernel holds its tiles without spilling
    and stores 16 bytes at a time, V in the wgmma order included (its keys are gathered on
    the load side)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", QUANTIZE_AOT], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report) == 36
    for name, (wgmma, shared, *blocks) in report.items():
        rotated = name.split()[2] == "True"
        assert wgmma == rotated, name
        assert shared <= SHARED_MEMORY_LIMIT[(9, 0)], name
        if blocks:
            stack, stores = blocks
            assert stack == 0, name
            assert "v4.b32" in stores and not {"b8", "b16"} & set(stores), (name, stores)


GLUON = dict(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64)
GLUON_SAMPLE = [
    (CAUSAL, KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1)),
    (PADDED, KernelConfig(**GLUON, BLOCK_N=64, num_stages=3, overlap=False)),
    (FULL, KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, pingpong=True, persistent=1, consumer_regs=232)),
    (CAUSAL, KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, one_loop=True, dynamic=True)),
    (PADDED, KernelConfig(**GLUON, BLOCK_N=64, num_stages=2, overlap=False, one_loop=True)),
    (CAUSAL, KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, overlap=False,
                          one_loop=True, exp2_emu=8)),
    (Problem(2, 32, 32, 4096, 4096, 64, "bfloat16", causal=True),
     KernelConfig(**GLUON, BLOCK_N=64, num_stages=4, persistent=1, causal_mode="masked")),
    (Problem(2, 32, 32, 4096, 4096, 64, "bfloat16", causal=True),
     KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, overlap=False, one_loop=True,
                  exp2_emu=16, section=16, half_step=True)),
    (Problem(2, 32, 32, 4096, 4096, 64, "bfloat16", causal=True),
     KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, overlap=False, one_loop=True, half_step=True,
                  pingpong=True)),
    (Problem(2, 32, 32, 4096, 4096, 64, "bfloat16"),  # turns round three consumers: barriers 8, 9, 10
     KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, overlap=False, pingpong=True, consumers=3,
                  consumer_regs=160)),
    (FULL, KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, rescale_threshold=8)),
    (Problem(2, 32, 32, 4096, 4096, 64, "bfloat16", causal=True),
     KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, pingpong=True, consumers=3, consumer_regs=160,
                  rescale_threshold=8)),
]


@pytest.fixture(scope="session")
def gluon_results(tmp_path_factory):
    def compile_sample():
        by_problem: dict[Problem, list[KernelConfig]] = {}
        for problem, config in GLUON_SAMPLE:
            by_problem.setdefault(problem, []).append(config)
        out = {}
        for problem, configs in by_problem.items():  # both cores: the other worker waits for this
            for config, result in zip(configs, compile_many(configs, problem, jobs=min(2, len(configs)))):
                out[(problem, config)] = result
        return out

    return shared_once(tmp_path_factory, "aot-gluon", compile_sample)


@pytest.mark.parametrize("problem, config", GLUON_SAMPLE, ids=[f"{c.name}-{p.key}" for p, c in GLUON_SAMPLE])
def test_gluon_variants_have_fa3_structure(gluon_results, problem, config):
    """Each Gluon variant compiles for sm_90 into FlashAttention-3's parts: a producer that
    gives up registers (setmaxnreg.dec) to consumers that take them (inc to
    consumer_regs), TMA bulk copies, mbarrier waits and async wgmma, with host-encoded
    descriptors (no tensormap built on the device) and within Hopper's shared memory."""
    result = gluon_results[(problem, config)]
    assert result.status == "ok", result.error
    (kernel,) = result.kernels
    counts = dict(kernel.instructions)
    budgets = [int(b.split()[1]) for b in kernel.setmaxnreg if b.startswith("dec")]
    assert min(budgets) <= 512 - config.consumers * config.consumer_regs  # the producer's
    assert f"inc {config.consumer_regs}" in kernel.setmaxnreg
    assert counts["wgmma.mma_async"] > 0 and counts["cp.async.bulk.tensor"] >= 4
    assert counts["mbarrier.try_wait"] > 0 and counts["tensormap.replace"] == 0
    assert 0 < kernel.shared_bytes <= SHARED_MEMORY_LIMIT[(9, 0)]
    assert (counts["add.rm.ftz.f32"] > 0) == bool(config.exp2_emu)  # the FMA-unit exp2, only when asked
    assert any(m.startswith(f"m64n{config.BLOCK_N}k16") for m in kernel.mma)
    assert (counts["atom.global"] > 0) == config.dynamic  # a dynamic grid's tile counter
    assert_turns_clear_of_triton(kernel.named_barriers, config.pingpong, counts["bar.arrive"], config.consumers)
    # conditional rescaling: one vote per rescale and, behind it, one warp-uniform branch per 16
    # accumulator values a thread holds (a vote split per row would let a warp skip rows that moved)
    per_vote = config.BLOCK_M * max(16, triton.next_power_of_2(problem.head_dim)) // 128 // 16
    assert counts["vote.sync.any.pred"] > 0 if config.rescale_threshold else counts["vote.sync.any.pred"] == 0
    assert counts["bra.uni KEPT"] == per_vote * counts["vote.sync.any.pred"]


GLUON_FP8 = [
    (FP8_FULL, KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1), Fp8Recipe(sink_tile=False)),
    (FP8_E4M3, KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True), Fp8Recipe()),
    (FP8_E5M2, KernelConfig(**GLUON, BLOCK_N=64, num_stages=3, overlap=False), Fp8Recipe("per_head")),
    (FP8_FULL, KernelConfig(**GLUON, BLOCK_N=256, num_stages=2, persistent=1, overlap=False, exp2_emu=8), Fp8Recipe()),
]


@pytest.mark.parametrize("problem, config, recipe", GLUON_FP8, ids=[f"{c.name}-{p.key}" for p, c, _ in GLUON_FP8])
def test_gluon_fp8_kernels_run_both_products_in_fp8(problem, config, recipe):
    """The Gluon FlashAttention-3 kernel on FP8 inputs: Q K^T and P V both as FP8 wgmma (P
    quantized in registers, V read as V^T tiles), the consumers' registers raised, no spill
    in the K/V steps;
    with the sink tile the Triton kernel that scores it follows, for the same key width."""
    (result,) = compile_many([config], problem, jobs=1, recipe=recipe, sass=True)
    assert result.status == "ok", result.error
    kernel, *side = result.kernels
    operands = "e5m2.e5m2" if problem.dtype == "float8_e5m2" else "e4m3.e4m3"
    assert kernel.kernel == config.name and kernel.mma and all(m.endswith(operands) for m in kernel.mma), kernel.mma
    assert {f"m64n{config.BLOCK_N}k32.f32.{operands}", f"m64n128k32.f32.{operands}"} <= set(kernel.mma)
    assert f"inc {config.consumer_regs}" in kernel.setmaxnreg
    # the K/V steps (QGMMA loops) store nothing to local memory; a causal dynamic grid with the
    # sink tile reloads one spilled scalar a step (an L1 hit), nothing more
    steps = [ops for _, _, ops in sass_loops(kernel.sass, innermost=True) if ops["QGMMA"]]
    assert steps and all(ops["STL"] == 0 and ops["LDL"] <= (config.dynamic and recipe.sink_tile) for ops in steps)
    assert [k.kernel for k in side] == ([f"attn_fwd_qouter_m128n{config.BLOCK_N}_w4s2_tma_ws_cband_pers1_sink"]
                                        if recipe.sink_tile else [])


def assert_turns_clear_of_triton(barriers, pingpong: bool, arrives: int, consumers: int = 2) -> None:
    """Ping-pong's turns are named barriers 8 + WG, one per consumer warpgroup, of two
    warpgroups' 256 threads (a bar.sync of that warpgroup, a bar.arrive of the one before it);
    Triton's own (warp specialization: a warpgroup's 128 threads, or the whole CTA) all sit
    below them, and none is named by a register."""
    turns = {(8 + wg, 256) for wg in range(consumers)}
    assert (arrives > 0) == pingpong
    assert turns <= set(barriers) if pingpong else not turns & set(barriers)
    triton = [b for b in barriers if b not in turns]
    assert triton and all(0 <= i < 8 for i, _ in triton), barriers


def test_gluon_variants_past_shared_memory_are_statuses():
    """Two Q buffers, an output buffer and three 128x128 K/V stages need 256 KB."""
    config = KernelConfig(**GLUON, BLOCK_N=128, num_stages=3, persistent=1)
    (result,) = compile_many([config], CAUSAL, jobs=1)
    assert result.status == "out_of_resources" and result.kernels[0].shared_bytes > SHARED_MEMORY_LIMIT[(9, 0)]


@pytest.mark.parametrize("head_dim", [192, 256])
def test_wide_gluon_kernels_fit_without_spills(head_dim):
    """Past D=128 (192 padded to 256) the Gluon forward stages O in its Q buffer: one Q buffer
    per consumer and a 2-deep ring of 64-key K/V tiles fit Hopper's shared memory with no
    separate O buffer, the wgmmas run 256 columns wide, and the K/V step loops keep the
    64 x 256 fp32 accumulator in registers (no local loads or stores); a persistent grid's
    second Q buffer does not fit, which the tuner records as a status."""
    from fa_autotune.spec.defaults import GLUON_WIDE

    problem = Problem(2, 16, 4, 4096, 4096, head_dim, "bfloat16", causal=True)
    wide, turns, persistent = GLUON_WIDE, GLUON_WIDE.with_(pingpong=True), GLUON_WIDE.with_(persistent=1)
    results = compile_many([wide, turns, persistent], problem, jobs=2, sass=True)
    for config, result in zip((wide, turns), results):
        assert result.status == "ok", result.error
        (kernel,) = result.kernels
        counts = dict(kernel.instructions)
        assert f"inc {config.consumer_regs}" in kernel.setmaxnreg and counts["cp.async.bulk.tensor"] >= 4
        # S over 64 keys; O in one 256-wide part, or at D=192 parts of 128 and 64 columns
        parts = {"m64n256k16.f32.bf16.bf16"} if head_dim == 256 else {"m64n128k16.f32.bf16.bf16"}
        assert parts | {"m64n64k16.f32.bf16.bf16"} == set(kernel.mma)
        # two 64 x 256 Q tiles and two 64 x 256 K and V stages, and barriers: no O buffer
        assert 4 * 64 * 256 * 2 + 2 * 64 * 256 * 2 < kernel.shared_bytes <= 6 * 64 * 256 * 2 + 1024
        assert kernel.step_loop_local_memory == 0
    assert results[2].status == "out_of_resources"


@pytest.mark.parametrize("head_dim", [192, 160])
def test_wide_steps_fit_unpadded_and_take_128_keys_a_step(head_dim):
    """At head dims 129-192 a 128-key Gluon step (kernels.fwd.wide_steps) stages Q, K, V and
    O unpadded, as three 64-column chunks: two 64 x 192 Q tiles, two 128-key K stages and three
    64-key V halves (216 KB) fit where padded tiles would need 328 KB. Each step loop issues
    48 HGMMA 64x64x16 (S over two key halves and three column chunks, P V over the same), the
    work of two padded 64-key steps without their zero columns, with nothing spilled; the
    estimate the sampler prunes by matches the compiler's figure."""
    from fa_autotune.kernels.resources import SLACK, shared_bytes
    from fa_autotune.spec.defaults import GLUON_WIDE

    problem = Problem(2, 16, 4, 4096, 4096, head_dim, "bfloat16", causal=True)
    plain = GLUON_WIDE.with_(BLOCK_N=128, overlap=False)
    results = compile_many([plain, plain.with_(pingpong=True)], problem, jobs=2, sass=True)
    for config, result in zip((plain, plain.with_(pingpong=True)), results):
        assert result.status == "ok", result.error
        (kernel,) = result.kernels
        assert kernel.mma == ("m64n64k16.f32.bf16.bf16",) and f"inc {config.consumer_regs}" in kernel.setmaxnreg
        assert dict(kernel.instructions)["cp.async.bulk.tensor"] >= 12  # chunk by chunk
        need = (2 * 64 + 2 * 128 + 3 * 64) * 192 * 2
        assert need == shared_bytes(config, problem, (9, 0)) <= kernel.shared_bytes <= need + SLACK
        steps = [ops["HGMMA"] for _, _, ops in sass_loops(kernel.sass, innermost=True) if ops["HGMMA"]]
        assert steps and set(steps) == {48}, steps
        assert set(re.findall(r"HGMMA\.64x(\d+)x16", kernel.sass)) == {"64"}
        assert kernel.step_loop_local_memory == 0


@pytest.mark.parametrize("head_dim, pad, config", [(192, 256, "wide"), (96, 128, "default")])
def test_gluon_products_read_only_the_real_head_dim_columns(head_dim, pad, config):
    """Past a padded head dim (fwd.d_rest) the Gluon forward's Q K^T runs over the first
    half and the next power of two of columns, and where that second part is at least 64
    columns wide (D=192) O accumulates in two parts of those widths: the tensor-core work (the
    N widths of every HGMMA, summed over the kernel's SASS) is then head_dim / pad of the same
    kernel's at the padded head dim; at D=96 (a 32-column part: the PV product stays whole)
    only Q K^T's half of it shrinks. The K/V step loops still touch no local memory."""
    from fa_autotune.spec.defaults import GLUON_DEFAULT, GLUON_WIDE

    cfg = GLUON_WIDE if config == "wide" else GLUON_DEFAULT
    trimmed, padded = (compile_many([cfg], Problem(2, 16, 16, 4096, 4096, d, "bfloat16"), jobs=1, sass=True)[0]
                       for d in (head_dim, pad))
    work = [sum(int(n) for n in re.findall(r"HGMMA\.64x(\d+)x16", r.kernels[0].sass)) for r in (trimmed, padded)]
    if head_dim == 192:
        assert work[0] * pad == work[1] * head_dim, work
    else:  # Q K^T and PV do equal work per step at D = BLOCK_N: half the work scales
        assert work[0] * 2 * pad == work[1] * (pad + head_dim), work
    assert trimmed.kernels[0].step_loop_local_memory == 0


def _step_loop_text(sass: str) -> str:
    """The SASS lines of the innermost loops that issue wgmma (the K/V steps)."""
    spans = [(a, b) for a, b, ops in sass_loops(sass, innermost=True) if ops["HGMMA"]]
    lines = re.findall(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*)$", sass, re.M)
    return "\n".join(text for address, text in lines if any(a <= int(address, 16) <= b for a, b in spans))


def test_gluon_q_in_registers_reads_only_k_from_shared_memory():
    """q_regs at D=192 (the shipped 64-key kernel with lazy rescaling): from each tile's second
    step on Q K^T takes Q's two column parts from registers, so each of its HGMMA reads only K
    from shared memory (an m64n64k16 product reading both operands there needs the SM's whole
    shared-memory bandwidth); without it every step's products read Q there. The step loops
    spill nothing and issue fewer instructions than with Q in shared memory. FP8 keeps Q in
    shared memory, and so does D=256 (one 256-column part of Q would spill beside the
    accumulator): a config asking otherwise is refused by name."""
    from fa_autotune.spec.defaults import GLUON_WIDE

    problem = Problem(2, 16, 16, 8192, 8192, 192, "bfloat16")
    smem, regs = compile_many([GLUON_WIDE, GLUON_WIDE.with_(q_regs=True)], problem, jobs=2, sass=True)
    a_from_regs = re.compile(r"HGMMA\.64x64x16\.F32\.BF16 R\d+, R\d+, gdesc\[UR\d+\], ")  # S: K^T, not V (.tnspB)
    a_from_smem = re.compile(r"HGMMA\.64x64x16\.F32\.BF16 R\d+, gdesc\[UR\d+\]")
    steps = {}
    for name, result in (("smem", smem), ("regs", regs)):
        assert result.status == "ok", result.error
        (kernel,) = result.kernels
        assert kernel.step_loop_local_memory == 0
        steps[name] = (_step_loop_text(kernel.sass), sum(sum(ops.values()) for _, _, ops in
                                                        sass_loops(kernel.sass, innermost=True) if ops["HGMMA"]))
    assert a_from_smem.search(steps["smem"][0]) and not a_from_regs.search(steps["smem"][0])
    assert a_from_regs.search(steps["regs"][0]) and not a_from_smem.search(steps["regs"][0])
    assert steps["regs"][1] < steps["smem"][1], (steps["regs"][1], steps["smem"][1])
    fp8 = Problem(2, 16, 16, 8192, 8192, 128, "float8_e4m3fn")
    d256 = Problem(2, 16, 16, 8192, 8192, 256, "bfloat16")  # Q as one 256-column part: it would spill
    gluon = KernelConfig(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2,
                         q_regs=True)
    for config, refused_problem in ((gluon, fp8), (GLUON_WIDE.with_(q_regs=True), d256)):
        (refused,) = compile_many([config], refused_problem, jobs=1)
        assert refused.status == "invalid_config" and "q_regs" in refused.error, refused.error


def test_fp8_causal_masked_steps_keep_their_registers():
    """The causal FP8 default (256-key steps in turn) hides the keys right of the diagonal by
    integer arithmetic (`_hide_from`): as compares, the masked step's 128 predicates a thread
    were parked in bit fields and spilled (2049 instructions against 844 for an unmasked
    step, 50 local loads and stores, 104 bytes of stack). Now the masked step stays within
    1.5x of the unmasked one and nothing is spilled anywhere in the kernel."""
    from fa_autotune.spec.defaults import GLUON_FP8

    problem = Problem(2, 16, 16, 8192, 8192, 128, "float8_e4m3fn", causal=True)
    (result,) = compile_many([GLUON_FP8.with_(dynamic=True)], problem, jobs=1, sass=True)
    assert result.status == "ok", result.error
    kernel = result.kernels[0]
    assert kernel.stack_bytes == 0 and kernel.step_loop_local_memory == 0
    steps = sorted(sum(ops.values()) for _, _, ops in sass_loops(kernel.sass, innermost=True) if ops["QGMMA"])
    assert steps and steps[-1] < 1.5 * steps[0], steps


def test_reports_registers_and_spills():
    """The report reads ptxas's allotment from the cubin: FlashAttention-3's two 64-row
    consumers keep their accumulators in registers (no local loads or stores in the K/V step
    loops; a frame of a few words holds a per-tile value outside them), while one consumer
    holding 128 rows spills hundreds of bytes (why the search space leaves it out)."""
    two = KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1)
    one = KernelConfig(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=128, BLOCK_N=128, num_stages=2,
                       consumers=1)
    fits, spills = (compile_many([c], CAUSAL, jobs=1, sass=True)[0].kernels[0] for c in (two, one))
    assert fits.registers and fits.stack_bytes <= 32 and fits.step_loop_local_memory == 0
    assert spills.stack_bytes > 512 and spills.step_loop_local_memory > 0


@pytest.mark.parametrize("config, sequences", [
    (KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2), 4),
    (KernelConfig(BLOCK_M=64, BLOCK_N=64, access="block_ptr", q_tiles=2), 4),
    (KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1), 4),
    # one sequence: Triton makes the batch size a constant 1 (the producer searches the tile
    # table; a search loop over a constant range failed to lower)
    (KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1), 1),
    (KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True), 1),
    (KernelConfig(**GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, overlap=False, pingpong=True), 4),
], ids=lambda v: v.name if isinstance(v, KernelConfig) else f"{v}seq")
def test_varlen_kernels_compile_for_hopper(tmp_path, config, sequences):
    """attention_varlen's kernel (the Q-outer body over packed sequences; a Gluon config's
    own varlen kernel) compiles for sm_90 in a fresh process, with wgmma; the Gluon one
    keeps FlashAttention-3's structure (register hand-over, TMA loads) and its K/V step
    loops touch no local memory."""
    import subprocess
    import sys

    script = tmp_path / "compile_varlen.py"
    script.write_text(f"""
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
from fa_autotune.kernels.aot import _specialize, disassemble, named_barriers, sass_loops
from fa_autotune.kernels.varlen import VarlenPlan
from fa_autotune.spec.config import KernelConfig
config = KernelConfig.from_mapping({config.to_dict()!r})
q = torch.empty(3000, 16, 128, device="meta", dtype=torch.bfloat16)
k = torch.empty(3500, 4, 128, device="meta", dtype=torch.bfloat16)
cu = torch.empty({sequences + 1}, device="meta", dtype=torch.int32)
out, lse = torch.empty_like(q), torch.empty(16, 3000, device="meta")
plan = VarlenPlan(config, q, k, k, cu, 1024, 0.1, True, out, lse)
launch, args = plan.launches(q, k, k, cu, cu, out, lse)[-1]
signature, consts, attrs = _specialize(launch, args + launch.fixed)
source = (GluonASTSource if isinstance(launch.kernel, GluonJITFunction) else ASTSource)
compiled = triton.compile(source(launch.kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=launch.options)
ptx = compiled.asm["ptx"]
loops = sass_loops(disassemble(compiled.asm["cubin"]), innermost=True)
local = sum(ops["LDL"] + ops["STL"] for _, _, ops in loops if ops["HGMMA"]) if loops else -1
print("wgmma" in ptx, compiled.metadata.shared, "setmaxnreg" in ptx, "cp.async.bulk.tensor" in ptx,
      ptx.count("bar.arrive"), repr(named_barriers(ptx)).replace(" ", ""), local)
""")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    uses_wgmma, shared, setmaxnreg, tma, arrives, barriers, local = result.stdout.split()
    assert uses_wgmma == "True" and 0 < int(shared) <= SHARED_MEMORY_LIMIT[(9, 0)]
    if config.language == "gluon":
        assert setmaxnreg == tma == "True"
        # no spill reloaded in the K/V steps (the tile count loaded before the partitions and
        # the dynamic loop's bottom read once cost one every step); -1: cuobjdump missing
        assert int(local) in (0, -1), f"{local} local loads/stores in the K/V step loops"
        assert_turns_clear_of_triton(ast.literal_eval(barriers), config.pingpong, int(arrives), config.consumers)


DECODE_CASES = [
    (Problem(1, 32, 8, 1, 131072, 128, "bfloat16", kind="decode"), dict(num_splits=16, num_stages=4)),
    (Problem(8, 32, 8, 1, 32768, 128, "bfloat16", kind="decode", page_size=16), dict(num_splits=8, num_stages=2)),
    (Problem(4, 32, 4, 4, 4096, 128, "float16", causal=True, causal_align="bottom_right", kind="decode", page_size=128),
     dict(BLOCK_M=32, num_splits=1, causal_mode="masked", num_stages=3)),
    (Problem(2, 8, 8, 1, 1000, 80, "float16", kind="decode"), dict(BLOCK_N=32, num_splits=3, num_stages=5)),
    # balanced splits (persistent): the units scan, the stream-K main kernel, the combine
    (Problem(16, 32, 8, 1, 16384, 128, "bfloat16", kind="decode"), dict(BLOCK_N=128, num_stages=3, persistent=1)),
    (Problem(4, 32, 4, 4, 4096, 128, "float16", causal=True, causal_align="bottom_right", kind="decode", page_size=16),
     dict(BLOCK_M=32, num_stages=2, persistent=4)),
    # a contiguous cache through TMA boxes: fixed split, none, balanced; D=80 in a 128-column box
    (Problem(1, 32, 8, 1, 131072, 128, "bfloat16", kind="decode"), dict(num_splits=16, num_stages=4, access="tensor_desc")),
    (Problem(128, 32, 8, 1, 1024, 128, "bfloat16", kind="decode"), dict(BLOCK_N=128, num_stages=3, access="tensor_desc")),
    (Problem(2, 8, 8, 1, 1000, 80, "float16", kind="decode"), dict(BLOCK_N=32, num_splits=3, access="tensor_desc")),
    (Problem(4, 32, 4, 4, 4096, 128, "float16", causal=True, causal_align="bottom_right", kind="decode"),
     dict(BLOCK_M=32, num_stages=2, persistent=2, access="tensor_desc")),
]


@pytest.mark.parametrize("problem, changes", DECODE_CASES, ids=lambda v: getattr(v, "key", ""))
def test_decode_variants_compile_for_hopper(problem, changes):
    """KV-cache kernels (attend, combine when split, append; the units scan when balanced)
    compile for sm_90 with their K/V tiles loaded asynchronously (cp.async, or TMA boxes:
    cp.async.bulk.tensor) and no spills, paged or not, and fit in shared memory."""
    from fa_autotune.kernels.plans import bind, example

    config = KernelConfig(loop_order="decode", BLOCK_M=changes.pop("BLOCK_M", 16), **changes)
    (result,) = compile_many([config], problem, jobs=1)
    assert result.status == "ok", result.error
    names = {k.kernel for k in result.kernels}
    assert config.name in names and (f"{config.name}_combine" in names) == (config.num_splits > 1 or config.persistent > 0)
    assert (f"{config.name}_units" in names) == bool(config.persistent)
    main = next(k for k in result.kernels if k.kernel == config.name)  # balanced or not: pipelined, no spills
    counts = dict(main.instructions)
    tma = config.access == "tensor_desc"
    assert (counts["cp.async.bulk.tensor"] > 0) == tma and (counts["cp.async.cg.shared.global"] > 0) != tma
    assert main.stack_bytes in (0, None)
    assert 0 < result.shared_bytes <= SHARED_MEMORY_LIMIT[(9, 0)]
    bound = bind(config, problem, example(config, problem, "meta", append=True))
    launches = [launch.kernel.__name__ for launch, _ in bound.launches()]
    assert launches[0] == f"{config.name}_append" and config.name in launches


def test_decode_paged_kernel_pipelines_its_tile_loads():
    """The sm_90 PTX of a paged decode kernel issues its K/V tiles with cp.async (the page
    lookup does not turn the loads synchronous), and 7 stages need the shared memory of
    three K and V buffers in flight (3 x 2 x 64 x 128 x 2 bytes)."""
    problem = Problem(1, 32, 8, 1, 65536, 128, "bfloat16", kind="decode", page_size=16)
    config = KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=64, num_stages=7, num_splits=16)
    (result,) = compile_many([config], problem, jobs=1)
    main = next(k for k in result.kernels if k.kernel == config.name)
    assert dict(main.instructions)["cp.async.cg.shared.global"] >= 32
    assert main.shared_bytes >= 3 * 2 * 64 * 128 * 2


@pytest.mark.parametrize("problem, changes", [
    (Problem(2, 16, 4, 2048, 2048, 128, "bfloat16", causal=True), dict(BLOCK_M=64, BLOCK_N=64, num_stages=2)),
    (Problem(1, 8, 8, 1000, 1500, 80, "float16", causal=True, causal_align="bottom_right"),
     dict(BLOCK_M=32, BLOCK_N=64, causal_mode="masked", num_stages=3)),
    (Problem(1, 8, 8, 512, 512, 256, "bfloat16"), dict(BLOCK_M=32, BLOCK_N=32, num_stages=2)),
    (Problem(2, 16, 4, 2048, 2048, 128, "float16", causal=True), dict(BLOCK_M=64, BLOCK_N=64, dq_atomic=True)),
    (Problem(4, 32, 32, 4096, 4096, 64, "bfloat16", causal=True),  # the H200 default at D=64
     dict(BLOCK_M=32, BLOCK_N=128, num_stages=3, dq_block_m=128, dq_block_n=64, dq_warps=8, dq_stages=3)),
], ids=["d128-gqa-causal", "d80-bottom-right", "d256", "d128-atomic-dq", "d64-own-dq-pass"])
def test_backward_variants_compile_for_hopper(problem, changes):
    """The three backward kernels compile for sm_90 and fit; 64 x 64 tiles use wgmma (a dot of
    fewer than a warpgroup's 64 rows gets mma.sync)."""
    config = KernelConfig(loop_order="backward", **changes)
    (result,) = compile_many([config], problem.with_kind("bwd"), jobs=1)
    assert result.status == "ok", result.error
    parts = ("preprocess", "dkdv") if config.dq_atomic else ("preprocess", "dkdv", "dq")
    assert {k.kernel for k in result.kernels} == {f"{config.name}_{part}" for part in parts}
    if config.dq_atomic:  # dQ shares added with fp32 atomics
        dkdv = next(k for k in result.kernels if k.kernel.endswith("_dkdv"))
        assert dkdv.ptx_lines > 0
    assert result.shared_bytes <= SHARED_MEMORY_LIMIT[(9, 0)]
    if min(config.BLOCK_M, config.BLOCK_N) >= 64:
        assert result.uses_wgmma


GLUON_BWD = dict(loop_order="backward", language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=64,
                 num_stages=2)


@pytest.mark.parametrize("config,head_dim", [
    (KernelConfig(**GLUON_BWD, dq_block_m=128, dq_block_n=64, dq_warps=8, dq_stages=3), 128),
    (GLUON_BACKWARD, 128),
    (GLUON_BACKWARD.with_(BLOCK_M=128, num_stages=2), 64),
    (GLUON_BACKWARD.with_(persistent=1, dynamic=True), 128),
    (GLUON_BACKWARD.with_(group_split=4), 128),
    (GLUON_BACKWARD.with_(group_split=2, persistent=1, dynamic=True), 128),
], ids=["dq-pass", "dq-atomic", "dq-atomic-128rows-d64",
        "dq-atomic-persistent-dynamic", "dq-atomic-group-split4", "dq-atomic-group-split2-persistent-dynamic"])
def test_gluon_backward_compiles_for_hopper(config, head_dim):
    """The Gluon dK/dV pass compiles for sm_90 into FlashAttention-3's parts (a producer that
    gives registers to two consumers, TMA loads of K, V, Q and dO, mbarrier waits, async
    wgmma) beside the Triton preprocess and dQ pass of its Triton sibling, within shared
    memory; with dq_atomic (the Hopper defaults) there is no dQ pass, the Gluon pass adds dQ
    up in fp32 itself (five matrix products a step, the adds as TMA bulk reduces), and its
    step loops keep their values in registers (at D=128 they once spilled 193 instructions a
    step, which halved its speed; a GQA causal variant now reloads about a dozen values a
    step, in loops of 700-1100 instructions); with 128 query rows a step each consumer adds
    half of dQ's rows, so no product is narrower than the head dim. dK and dV leave through
    TMA stores, or with the GQA group split over programs (group_split) as fp32 atomic adds and
    no TMA store."""
    from fa_autotune.kernels.bwd import triton_backward

    problem = Problem(2, 16, 4, 2048, 2048, head_dim, "bfloat16", causal=True, kind="bwd")
    (result,) = compile_many([config], problem, jobs=1, sass=config.dq_atomic)
    assert result.status == "ok", result.error
    sibling = triton_backward(config).name
    passes = {f"{sibling}_preprocess", f"{config.name}_dkdv"} | (set() if config.dq_atomic else {f"{sibling}_dq"})
    assert {k.kernel for k in result.kernels} == passes
    dkdv = next(k for k in result.kernels if k.kernel.endswith("_dkdv"))
    counts = dict(dkdv.instructions)
    assert "inc 240" in dkdv.setmaxnreg and any(b.startswith("dec") for b in dkdv.setmaxnreg)
    assert counts["wgmma.mma_async"] > 0 and counts["cp.async.bulk.tensor"] >= 4 and counts["mbarrier.try_wait"] > 0
    assert (counts["cp.reduce.async.bulk.tensor"] > 0) == config.dq_atomic  # dQ's bulk reduce-add
    if config.group_split == 1:
        assert counts["cp.async.bulk.tensor.4d.global.shared"] >= 4  # dK and dV of both consumers, stored by TMA
        assert counts["atom.global"] == int(config.dynamic)  # no per-thread atomics; a dynamic grid's tile counter
    else:  # dK and dV added into fp32 buffers: per-thread atomics, no TMA store
        assert counts["cp.async.bulk.tensor.4d.global.shared"] == 0
        assert counts["atom.global"] >= 2 * 64 + int(config.dynamic)
    assert 0 < dkdv.shared_bytes <= SHARED_MEMORY_LIMIT[(9, 0)]
    if config.dq_atomic:  # a few words of the GQA and tile loops' state at most
        spills = dkdv.stack_bytes, dkdv.step_loop_local_memory
        assert spills[0] <= 96 and spills[1] <= 12, spills
    if config.dq_atomic and config.BLOCK_M == 128:  # each consumer adds half of dQ's rows at full width
        assert {shape.split("k")[0] for shape in dkdv.mma} == {f"m64n{head_dim}"}, dkdv.mma


@pytest.mark.parametrize("head_dim, group_split", [(256, 1), (192, 2)], ids=["d256", "d192-group-split2"])
def test_wide_gluon_backward_compiles_for_hopper(head_dim, group_split):
    """Past head dim 128 the Gluon backward is the wide kernel (both consumers on one 64-key
    block): it compiles for sm_90 within shared memory (about 208 KB), with setmaxnreg, wgmma
    of 32 key columns for S and dP, 128 head-dim columns for dK and dV and 64 for dQ's chunks
    (added by TMA bulk reduces), and nothing spilled (at D=256 each consumer holds 128 fp32
    accumulator registers); dK and dV leave by TMA stores, or split (group_split) by atomics."""
    from fa_autotune.spec.defaults import GLUON_WIDE_BACKWARD

    config = GLUON_WIDE_BACKWARD.with_(group_split=group_split)
    problem = Problem(2, 16, 4, 2048, 2048, head_dim, "bfloat16", causal=True, kind="bwd")
    (result,) = compile_many([config], problem, jobs=1, sass=True)
    assert result.status == "ok", result.error
    (dkdv,) = [k for k in result.kernels if k.kernel == f"{config.name}_dkdv_wide"]
    counts = dict(dkdv.instructions)
    assert "inc 240" in dkdv.setmaxnreg and any(b.startswith("dec") for b in dkdv.setmaxnreg)
    assert {"m64n32k16.f32.bf16.bf16", "m64n128k16.f32.bf16.bf16", "m64n64k16.f32.bf16.bf16"} <= set(dkdv.mma)
    assert counts["cp.reduce.async.bulk.tensor"] > 0 and counts["mbarrier.try_wait"] > 0
    assert (counts["cp.async.bulk.tensor.4d.global.shared"] > 0) == (group_split == 1)
    assert 200 * 1024 <= dkdv.shared_bytes <= SHARED_MEMORY_LIMIT[(9, 0)]
    assert dkdv.stack_bytes == 0 and dkdv.step_loop_local_memory == 0


def test_gluon_backward_skips_the_padded_head_dim_columns_in_s_and_dp():
    """At D=96 and 80 (padded to 128, kernels.fwd.d_rest 32 and 16) the Gluon backward's S and
    dP reduce over 64 + 32 (or 64 + 16) columns: each step loop holds 2 x 2 (or 2 x 3) fewer
    16-deep HGMMA than the same kernel at D=128, the other three products unchanged, and
    nothing spills."""
    loops = {}
    for d in (128, 96, 80):
        problem = Problem(2, 16, 4, 2048, 2048, d, "bfloat16", causal=True, kind="bwd")
        (result,) = compile_many([GLUON_BACKWARD], problem, jobs=1, sass=True)
        assert result.status == "ok", result.error
        (dkdv,) = [k for k in result.kernels if k.kernel.endswith("_dkdv")]
        assert dkdv.stack_bytes <= 96 and dkdv.step_loop_local_memory <= 12
        loops[d] = [ops["HGMMA"] for _, _, ops in sass_loops(dkdv.sass, innermost=True) if ops["HGMMA"]]
    assert loops[128] and all(len(loops[d]) == len(loops[128]) for d in (96, 80)), loops
    assert [n - 4 for n in loops[128]] == loops[96] and [n - 6 for n in loops[128]] == loops[80], loops


def test_wide_gluon_backward_multiplies_only_the_real_head_dim_columns():
    """At D=192 (padded to 256, kernels.fwd.d_rest 64) the wide backward's S and dP reduce
    over 128 + 64 columns and the second consumer's dV, dK and dQ products cover its 64 real
    columns: the tensor-core work (the N widths of every HGMMA, summed over the SASS) is
    192/256 of the same kernel's at D=256, with nothing spilled."""
    from fa_autotune.spec.defaults import GLUON_WIDE_BACKWARD

    trimmed, padded = (compile_many([GLUON_WIDE_BACKWARD], Problem(2, 16, 16, 2048, 2048, d, "bfloat16", causal=True,
                                                                    kind="bwd"), jobs=1, sass=True)[0]
                       for d in (192, 256))
    kernels = [[k for k in r.kernels if k.kernel.endswith("_dkdv_wide")][0] for r in (trimmed, padded)]
    work = [sum(int(n) for n in re.findall(r"HGMMA\.64x(\d+)x16", k.sass)) for k in kernels]
    assert work[0] * 256 == work[1] * 192, work
    assert kernels[0].stack_bytes == 0 and kernels[0].step_loop_local_memory == 0


def test_wide_gluon_backward_evens_out_its_consumers_at_d192():
    """At D=192 the wide backward's second consumer owns 64 real columns of dK and dV
    against the first's 128; dQ's three 64-column chunks are dealt 1 + 2 so that the two
    consumers' step loops do about the same tensor-core work (the N widths of their HGMMA:
    2048 against 1792 a step, where each consumer's own dQ columns gave 2304 against 1536).
    At D=256 both own 128 columns, and their loops match."""
    from fa_autotune.spec.defaults import GLUON_WIDE_BACKWARD

    def step_loop_widths(head_dim: int) -> list[int]:
        result = compile_many([GLUON_WIDE_BACKWARD], Problem(2, 16, 16, 2048, 2048, head_dim, "bfloat16",
                                                              causal=True, kind="bwd"), jobs=1, sass=True)[0]
        sass = [k for k in result.kernels if k.kernel.endswith("_dkdv_wide")][0].sass
        lines = [(int(a, 16), t) for a, t in re.findall(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", sass, re.M)]
        return sorted(sum(int(n) for a, t in lines if lo <= a <= hi for n in re.findall(r"HGMMA\.64x(\d+)x16", t))
                      for lo, hi, ops in sass_loops(sass, innermost=True) if ops["HGMMA"])

    d192, d256 = step_loop_widths(192), step_loop_widths(256)
    assert len(d192) == 4 and d192[-1] / d192[0] <= 1.2, d192  # masked and unmasked steps, two consumers
    assert sum(d192) * 256 == sum(d256) * 192 and len(set(d256)) == 1, (d192, d256)


def test_wide_gluon_backward_dq_chunks_cover_every_real_column_once():
    """Every head dim the wide backward runs (129-256, padded to 256): the two consumers' dQ
    chunks (kernels.gluon_bwd_wide._dq_chunks) tile the columns from 0 to the last real one's
    chunk without overlap, and each consumer takes at least one (its last chunk releases P and
    dS for the next step: none would deadlock it)."""
    from fa_autotune.kernels.fwd import d_rest
    from fa_autotune.kernels.gluon_bwd_wide import DQ_COLS, _dq_chunks

    step = DQ_COLS.value
    for head_dim in range(129, 257):
        rest = d_rest(head_dim, 256)
        (first0, n0), (first1, n1) = (_dq_chunks.fn(wg, 256, rest) for wg in (0, 1))
        columns = [first0 + j * step for j in range(n0)] + [first1 + j * step for j in range(n1)]
        assert n0 >= 1 and n1 >= 1 and columns == list(range(0, len(columns) * step, step)), (head_dim, columns)
        assert head_dim <= len(columns) * step <= 256, (head_dim, columns)


SINK_AOT = '''
import json, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fa_autotune.fp8.quantize import empty_fp8_inputs
from fa_autotune.kernels.aot import _mma_kinds, _setmaxnreg, _specialize, resource_usage
from fa_autotune.kernels.fwd import prepare
from fa_autotune.spec.config import KernelConfig
out = {}
# the shipped H200 FP8 non-causal config (warp-specialized 128x256): a side kernel scores the sink tile
shipped = KernelConfig(BLOCK_M=128, BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc",
                       causal_mode="split", warp_specialize=True, persistent=1)
for name, config, causal in (("pointer", KernelConfig(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3), True),
                             ("tensor_desc", KernelConfig(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3,
                                                          access="tensor_desc"), False),
                             ("shipped-ws", shipped, False)):
    x = empty_fp8_inputs((2, 16, 4096, 128), (2, 4, 4096, 128), "meta", block_q=128, block_k=config.BLOCK_N,
                         sink_tile=True)
    o = torch.empty(2, 16, 4096, 128, device="meta", dtype=torch.bfloat16)
    launches = prepare(config, x.q, x.k, x.v, o, None, 0.088, 0, causal, x.scales).launches(
        x.q, x.k, x.v, o, None, x.scales)
    out[name] = []
    for launch, args in launches:
        signature, consts, attrs = _specialize(launch, args + launch.fixed)
        compiled = triton.compile(ASTSource(launch.kernel, signature, consts, attrs),
                                  target=GPUTarget("cuda", 90, 32), options=launch.options)
        ptx = compiled.asm["ptx"]
        out[name].append({"kernel": launch.kernel.__name__, "sink": launch.flags.get("SINK_TILE"),
                          "shared": compiled.metadata.shared, "mma": sorted(_mma_kinds(ptx)),
                          "setmaxnreg": len(_setmaxnreg(ptx)), "stack": resource_usage(compiled.asm["cubin"])[1]})
print(json.dumps(out))
'''


def test_fp8_sink_tile_compiles_for_hopper(tmp_path):
    """The FP8 kernel with a sink tile (first K tile scored from 16-bit Q and K) compiles for
    sm_90 on pointers and TMA: both FP8 products stay e4m3 wgmma, the sink tile's product a
    16-bit one, within shared memory and without a spill. A warp-specialized config keeps its
    specialization (setmaxnreg, FP8 products only) and a second kernel holds the 16-bit
    product (Triton 3.6's warp-specialization pass fails on it inside the main kernel)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "sink_aot.py"
    script.write_text(SINK_AOT)
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    reports = json.loads(result.stdout.splitlines()[-1])
    assert {name: [r["kernel"].endswith("_sink") for r in rs] for name, rs in reports.items()} == {
        "pointer": [False], "tensor_desc": [False], "shipped-ws": [False, True]}
    for name, kernels in reports.items():
        for report in kernels:
            kinds = report["mma"]
            assert 0 < report["shared"] <= SHARED_MEMORY_LIMIT[(9, 0)] and report["stack"] in (0, None), report
            fp8 = any(k.endswith("e4m3.e4m3") for k in kinds)
            half = any(k.endswith("f16.f16") for k in kinds)
            if report["kernel"].endswith("_sink"):  # the sink tile and the merge: 16-bit scores, FP8 PV
                assert half and fp8, kinds
            elif name == "shipped-ws":  # specialized, FP8 products only
                assert report["sink"] is True and report["setmaxnreg"] > 0 and fp8 and not half, report
            else:  # the sink tile inline
                assert report["sink"] is True and fp8 and half and report["setmaxnreg"] == 0, report


WS_LSE_AOT = '''
import json, re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fa_autotune.kernels.aot import _specialize
from fa_autotune.kernels.fwd import prepare
from fa_autotune.spec.config import KernelConfig
config = KernelConfig(access="tensor_desc", warp_specialize=True, BLOCK_N=128, num_stages=2, causal_mode="split")
q = torch.empty(2, 16, 2048, 128, device="meta", dtype=torch.float16)
lse = torch.empty(2, 16, 2048, device="meta", dtype=torch.float32)
((launch, args),) = prepare(config, q, q, q, torch.empty_like(q), lse, 0.088, 0, False).launches(
    q, q, q, torch.empty_like(q), lse)
signature, consts, attrs = _specialize(launch, args + launch.fixed)
ttgir = triton.compile(ASTSource(launch.kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options=launch.options).asm["ttgir"]
parts = []
for part in re.split(r"\\n\\s*partition\\d+\\(", ttgir)[1:]:
    ranges = re.findall(r"%(?:lse_rows|offs_m)\\w* = tt.make_range \\{[^}]*end = (\\d+) : i32, start = (\\d+)", part)
    shifted = re.findall(r"(%\\w+) = arith.addi %start_m\\w*, %c64", part)
    splats = [name for name in shifted if re.search(r"tt.splat " + re.escape(name) + r" ", part)]
    parts.append({"ranges": ranges, "splat_of_shifted_start": splats})
print(json.dumps(parts))
'''


def test_warp_specialized_lse_rows_are_not_shifted_twice(tmp_path):
    """A warp-specialized Triton forward writing its LSE, compiled for sm_90: each consumer
    partition stores the LSE of its own 64 rows (aranges 0-64 and 64-128 from the tile's
    first row), and no partition adds its shifted tile start to an already shifted arange
    (Triton 3.6's data partitioning does that to ``start_m + arange``, which put the second
    consumer's LSE 64 rows too far; the epilogue now adds the arange to a scalar base)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "ws_lse_aot.py"
    script.write_text(WS_LSE_AOT)
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    parts = [p for p in json.loads(result.stdout.splitlines()[-1]) if p["ranges"]]
    assert sorted(tuple(map(int, r)) for p in parts for r in p["ranges"]) == [(64, 0), (128, 64)], parts
    assert not any(p["splat_of_shifted_start"] for p in parts), parts


FP8_CACHE_AOT = '''
import json, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fa_autotune.kernels.aot import _specialize, disassemble, resource_usage
from fa_autotune.kernels.checks import cache_tma_ok
import fa_autotune.kernels.decode as decode
from fa_autotune.kernels.decode import DecodePlan
from fa_autotune.runtime.select import runnable_decode
from fa_autotune.spec.config import KernelConfig
out = {}
B, H, HKV, D, N = 8, 32, 8, 128, 32768
PAIRS = decode.v_pairs  # meta tensors: what sm_90 runs (the packed cvt)
for pairs, name, changes, page in (
        (pairs, name, changes, page) for pairs in (0, 1)
        for name, changes, page in (("split16", dict(num_splits=16, num_stages=4, access="tensor_desc"), 0),
                                    ("paged-balanced", dict(BLOCK_N=128, num_stages=3, persistent=1), 16),
                                    ("paged", dict(BLOCK_N=128, num_stages=3), 64))):
    decode.v_pairs = lambda config, v, head_dim, pairs=pairs: pairs and PAIRS(config, v, head_dim)  # 0: as bytes
    q = torch.empty(B, 1, H, D, device="meta", dtype=torch.bfloat16)
    shape = (B * N // page, page, HKV, D) if page else (B, N, HKV, D)
    k8, v8 = (torch.empty(shape, device="meta", dtype=torch.float8_e4m3fn) for _ in range(2))
    table = torch.empty(B, N // page, device="meta", dtype=torch.int32) if page else None
    config = runnable_decode(KernelConfig(loop_order="decode", BLOCK_M=16, **changes), cache_tma_ok(k8, v8, bool(page)))
    new = torch.empty(B, 1, HKV, D, device="meta", dtype=torch.bfloat16)
    kd = vd = torch.empty(B, HKV, device="meta", dtype=torch.float32)
    lengths = torch.empty(B, device="meta", dtype=torch.int32)
    plan = DecodePlan(config, q, k8, v8, new, new, torch.empty_like(q), None, table, 0.088, False, (kd, vd))
    for launch, args in plan.launches(q, k8, v8, new, new, lengths, table, 0, torch.empty_like(q), None, kd, vd):
        signature, consts, attrs = _specialize(launch, args + launch.fixed)
        compiled = triton.compile(ASTSource(launch.kernel, signature, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                  options=launch.options)
        ptx = compiled.asm["ptx"]
        regs, stack = resource_usage(compiled.asm["cubin"])
        out[f"{launch.kernel.__name__}/{name}/pairs{pairs}"] = {
            "access": plan.config.access, "shared": compiled.metadata.shared, "registers": regs, "stack": stack,
            "cvt_fp8": ptx.count("e4m3"), "ldsm": ptx.count("ldmatrix"),
            "byte_loads": disassemble(compiled.asm["cubin"]).count("LDS.U8")}
print(json.dumps(out))
'''


def test_fp8_cache_decode_compiles_for_hopper(tmp_path):
    """KV-cache kernels over an e4m3 cache compile for sm_90 (a split, a paged balanced grid
    and a paged 128-key grid, with the append): FP8 tiles upcast, new rows converted to e4m3;
    a TMA config runs on pointers over FP8 (the selection says so before the plan). V read as
    16-bit column pairs (V_PAIRS, what sm_89+ runs) is staged and loaded with ldmatrix as a
    16-bit V is: no FP8 byte gathered into an MMA operand one at a time (no LDS.U8), nothing
    spilled, fewer registers than V read as bytes (V_PAIRS 0: 255 at 128-key steps, the
    balanced grid spilling), and no more shared memory."""
    import json
    import subprocess
    import sys

    script = tmp_path / "fp8_cache_aot.py"
    script.write_text(FP8_CACHE_AOT)
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    reports = json.loads(result.stdout.splitlines()[-1])
    assert {key.split("/")[0].rsplit("_", 1)[-1] for key in reports} >= {"append", "combine", "units"}
    mains = {}
    for key, report in reports.items():
        name, case, pairs = key.split("/")
        assert report["access"] == "pointer", (key, report)
        assert 0 <= report["shared"] <= SHARED_MEMORY_LIMIT[(9, 0)], (key, report)
        if name.endswith("_append"):
            assert report["cvt_fp8"] > 0, (key, report)  # new rows quantized to e4m3
        elif not name.endswith(("_combine", "_units")):
            mains[case, pairs] = report
        if pairs == "pairs1" or not name.endswith("_sk1"):
            assert report["stack"] in (0, None), (key, report)
    assert len(mains) == 6
    for case in ("split16", "paged-balanced", "paged"):
        plain, packed = mains[case, "pairs0"], mains[case, "pairs1"]
        assert plain["byte_loads"] > 0 and packed["byte_loads"] == 0, (case, plain, packed)
        assert packed["ldsm"] > plain["ldsm"] and packed["shared"] <= plain["shared"], (case, plain, packed)
        assert packed["registers"] < plain["registers"], (case, plain, packed)


PTXAS_FAILURE = '''
import json
from fa_autotune.kernels.aot import compile_variant
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.recipe import Fp8Recipe

# 128 x 256 FP8 tiles on 8 warps capped at 128 registers: ptxas needs 154 (seen in a tune)
config = KernelConfig(BLOCK_M=128, BLOCK_N=256, num_warps=8, num_stages=2, access="tensor_desc", maxnreg=128)
problem = Problem(4, 16, 16, 4096, 4096, 128, "float8_e4m3fn", True)
result = compile_variant(config, problem, recipe=Fp8Recipe("per_tensor", False, False))
print(json.dumps([result.status, result.error]))
'''


def test_a_ptxas_failure_is_one_line_not_the_kernels_ptx(tmp_path):
    """When ptxas refuses a variant, Triton prints the kernel's whole PTX (thousands of lines)
    before raising: a tune showed it on the terminal for every such trial. The compile keeps
    that print off stdout and the status carries ptxas's own reason, not its last line (the
    repro command with the name of a temporary file)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "ptxas_failure.py"
    script.write_text(PTXAS_FAILURE)
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and "Generated by LLVM" not in result.stdout + result.stderr, result.stdout[:500]
    status, error = json.loads(lines[0])
    assert status == "compile_error"
    assert error.startswith("PTXASError ptxas fatal") and "Insufficient registers" in error, error


def test_compile_error_message_names_the_innermost_cause():
    """A failed compile is reported by one line naming what failed and where: Triton chains a
    CompilationError per inlined function whose own text ends in a source caret; the tuner's
    status must carry the innermost cause, not "^"."""
    from fa_autotune.kernels.aot import compile_error_message

    inner = RuntimeError("at 44:52:\n    dq = gl.zeros([64, n])\n    ^\nAttributeError(\"'int' object has no "
                         "attribute 'type'\")")
    outer = RuntimeError("at 3:4:\n    gl.warp_specialize(\n    ^")
    outer.__cause__ = inner
    message = compile_error_message(outer)
    assert message == "RuntimeError at 44:52: AttributeError(\"'int' object has no attribute 'type'\")", message
    assert compile_error_message(ValueError("shape must be a power of 2")) == "ValueError shape must be a power of 2"
    ptxas = RuntimeError("Internal Triton PTX codegen error\n`ptxas` stderr:\nptxas /tmp/k.ptx, line 7; error   : "
                         "Unknown symbol 'x'\nptxas fatal   : Ptx assembly aborted due to errors\nRepro command: ptxas k")
    assert compile_error_message(ptxas) == "RuntimeError ptxas /tmp/k.ptx, line 7; error   : Unknown symbol 'x'"


def test_compiler_prints_are_dropped_only_when_the_compile_fails(capsys):
    """What Triton prints during a compile that fails (its PTX dump) never reaches stdout; a
    compile that succeeds prints what it printed (dumps a user asked for), after it."""
    from fa_autotune.kernels.aot import compiler_prints_kept

    with pytest.raises(RuntimeError):
        with compiler_prints_kept():
            print("// Generated by LLVM NVPTX Back-End")
            raise RuntimeError("ptxas fatal   : no")
    assert capsys.readouterr().out == ""
    with compiler_prints_kept():
        print("asked-for dump")
    assert capsys.readouterr().out == "asked-for dump\n"


@pytest.mark.parametrize("config", [KernelConfig(**GLUON, BLOCK_N=256, num_stages=2, persistent=1, overlap=False),
                                    KernelConfig(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3)],
                         ids=["gluon-n256", "triton-m64n128"])
def test_fp8_v_in_the_wgmma_order_hands_p_over_in_registers(config):
    """With V's keys in the wgmma order the PV product's P is relabelled into the columns each
    thread already holds: its K/V step loops shuffle only for the row max and sum (8 a
    thread per 128 keys, where the natural order needs at least 20), and an unmasked step runs
    at least 5% fewer instructions (7-8% here). Triton's warp-specialized kernels refuse that order by name."""
    from fa_autotune.fp8.quantize import empty_fp8_inputs
    import torch

    from fa_autotune.kernels.fwd import prepare

    loops = {}
    for n in (4096, 4104):  # a key count that is a multiple of 16 is quantized in the wgmma order
        problem = Problem(2, 16, 16, n, n, 128, "float8_e4m3fn")
        (result,) = compile_many([config], problem, jobs=1, recipe=Fp8Recipe(sink_tile=False), sass=True)
        assert result.status == "ok", result.error
        steps = [ops for _, _, ops in sass_loops(result.kernels[0].sass, innermost=True) if ops["QGMMA"]]
        loops[n] = min(steps, key=lambda ops: sum(ops.values()))
    per_128 = {n: ops["SHFL"] * 128 // config.BLOCK_N for n, ops in loops.items()}
    assert per_128[4096] <= 8 < 20 <= per_128[4104], per_128
    assert sum(loops[4096].values()) < 0.95 * sum(loops[4104].values())
    ws = KernelConfig(**WS, BLOCK_M=128, BLOCK_N=256, persistent=1)
    x = empty_fp8_inputs((1, 2, 1024, 128), (1, 2, 1024, 128), "meta", block_k=256, v_order="wgmma")
    o = torch.empty(1, 2, 1024, 128, device="meta", dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match="v_order='natural'") as raised:
        prepare(ws, x.q, x.k, x.v, o, None, 0.088, 0, False, x.scales)
    assert raised.value.parameter == "warp_specialize"



def test_v_pairs_where_the_words_line_up(monkeypatch):
    """The decode kernel's V_PAIRS flag: an FP8 V read as 16-bit column pairs by the packed
    cvt on CUDA sm_89+ and ahead of time (meta tensors; 1 e4m3, 2 e5m2), by integer
    arithmetic in the interpreter (3, 4), as bytes (0) on older GPUs, for 16-bit caches, odd
    or <= 16 head dims, rows or data not 16-byte aligned, and TMA configs."""
    import torch

    from fa_autotune.kernels import decode

    config = KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=64)
    e4m3, e5m2 = (torch.empty(2, 64, 8, 128, dtype=dt) for dt in (torch.float8_e4m3fn, torch.float8_e5m2))
    monkeypatch.setattr(decode, "interpreter_active", lambda: True)
    assert decode.v_pairs(config, e4m3, 128) == 3 and decode.v_pairs(config, e5m2, 128) == 4
    assert decode.v_pairs(config, e4m3.half(), 128) == 0
    assert decode.v_pairs(config, e4m3[..., :96], 96) == 3  # 96 columns of rows 128 bytes apart: aligned
    assert decode.v_pairs(config, torch.empty(2, 64, 8, 72, dtype=torch.float8_e4m3fn), 72) == 0  # rows 72 B apart
    assert decode.v_pairs(config, torch.empty(2, 64, 1, 15, dtype=torch.float8_e4m3fn), 15) == 0
    assert decode.v_pairs(config, torch.empty(2, 64, 1, 16, dtype=torch.float8_e4m3fn), 16) == 0
    odd = torch.empty(2 * 64 * 8 * 128 + 16, dtype=torch.uint8)[1:1 + 2 * 64 * 8 * 128]
    assert decode.v_pairs(config, odd.view(torch.float8_e4m3fn).view(2, 64, 8, 128), 128) == 0  # data at an odd byte
    assert decode.v_pairs(config.with_(access="tensor_desc"), e4m3, 128) == 0
    monkeypatch.setattr(decode, "interpreter_active", lambda: False)
    meta = torch.empty(2, 64, 8, 128, dtype=torch.float8_e5m2, device="meta")
    assert decode.v_pairs(config, meta, 128) == 2
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert decode.v_pairs(config, e4m3, 128) == 1 and decode.v_pairs(config, e5m2, 128) == 2
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert decode.v_pairs(config, e5m2, 128) == 0


def test_compile_variant_refuses_what_a_launch_would(tmp_path):
    """Ahead of time, a forward config the runtime's rules (`checks.why_not` on the target
    GPU) refuse comes back ``invalid_config`` naming the parameter, as the tuner's GPU compile
    does, rather than a kernel the runtime would never launch: the 128-key Gluon steps at
    D=192 with the intra-warpgroup overlap."""
    import json
    import subprocess
    import sys

    script = tmp_path / "refuse.py"
    script.write_text(
        "import json\n"
        "from fa_autotune.kernels.aot import compile_variant\n"
        "from fa_autotune.spec.defaults import GLUON_WIDE\n"
        "from fa_autotune.spec.problem import Problem\n"
        "p = Problem(2, 16, 16, 1024, 1024, 192, 'bfloat16', False)\n"
        "r = compile_variant(GLUON_WIDE.with_(BLOCK_N=128, overlap=True), p)\n"
        "print(json.dumps([r.status, r.error]))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    status, error = json.loads(result.stdout.splitlines()[-1])
    assert status == "invalid_config" and error.startswith("overlap:"), (status, error)

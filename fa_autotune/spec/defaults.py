"""Built-in configs: the last link of the dispatch chain, used when nothing is tuned.

Chosen to be correct everywhere and reasonable on Hopper: the D=64 and D=128 picks won
the sweep in benchmarks/results/2026-11-29-h200-kernel-smoke.md. The tuner exists to beat them.
"""
from __future__ import annotations

from .config import KernelConfig
from .problem import Problem
from .target import GpuInfo

# Below this many Q tiles x heads, one program per Q tile leaves most SMs idle and the
# K/V sequence is split across programs instead (Flash-Decoding).
_SPLIT_KV_MAX_QROWS = 64


# FlashAttention-3 in Gluon on Hopper, fp16/bf16 with 64 < D <= 128: two 64-row consumer
# warpgroups over 128-row K/V steps, a persistent grid with two Q buffers. On an H200 it ran
# 0.99-1.02x cuDNN on the non-causal D=128 llm-prefill problems and 1.12-1.16x the D=128 geomean
# of the Triton winners tuned before it (benchmarks/results/2026-12-01-h200-gluon-bench-llm-prefill.md).
GLUON_DEFAULT = KernelConfig(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=128, num_warps=4,
                             num_stages=2, persistent=1)


def default_config(problem: Problem, capability: tuple[int, int] | None = None, sm_count: int = 132,
                   gluon: bool = True) -> KernelConfig:
    """A safe, decent config for ``problem`` on a GPU of ``capability`` (None: interpreter);
    ``gluon=False`` gives the Triton one where the Gluon kernel would be picked (for inputs
    the Gluon kernel cannot read)."""
    d = problem.head_dim_pad
    hopper = capability is not None and capability >= (9, 0)
    access = "tensor_desc" if hopper else "pointer"
    if problem.is_fp8:  # FP8 runs Q-outer only; its tiles take half the shared memory of fp16
        return _fp8_default(problem, d, hopper)
    if problem.seqlen_q <= _SPLIT_KV_MAX_QROWS and problem.seqlen_k >= 1024:
        block_m = 16 if problem.seqlen_q <= 16 else 64
        programs = problem.batch * problem.heads_q * -(-problem.seqlen_q // block_m)
        splits = max(1, min(32, -(-2 * sm_count // max(programs, 1)), problem.seqlen_k // 256))
        return KernelConfig(
            loop_order="split_kv", BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=2,
            access=access, num_splits=splits,
        )
    if d <= 64:  # H200 sweep: plain pointers with 8 warps beat TMA at D=64
        return KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, access="pointer")
    if gluon and capability is not None and capability[0] == 9 and 64 < d <= 128 \
            and problem.dtype in ("float16", "bfloat16"):
        return GLUON_DEFAULT
    if d <= 128:
        return KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, access=access)
    return KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, access=access)


def _fp8_default(problem: Problem, d: int, hopper: bool) -> KernelConfig:
    """H200 sweeps at D=128 (benchmarks/results/2026-11-30-h200-fp8-*.md): 128x256 tiles
    warp-specialized over TMA on a persistent grid where Triton 3.6 allows it (no causal
    mask, whole K/V tiles); elsewhere 64x128 with 4 warps over plain pointers on Hopper,
    128x128 with 8 warps and 2 stages (less shared memory) before it."""
    if d > 128:
        return KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, access="tensor_desc" if hopper else "pointer")
    if hopper and not problem.causal and problem.seqlen_k % 256 == 0:
        return KernelConfig(BLOCK_M=128, BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc",
                            warp_specialize=True, persistent=1)
    if hopper:
        return KernelConfig(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3, access="pointer")
    return KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, access="pointer")


def default_for(problem: Problem, gpu: GpuInfo, gluon: bool = True) -> KernelConfig:
    """The built-in config for ``problem`` on ``gpu`` (the interpreter included)."""
    return default_config(problem, gpu.capability_tuple, max(gpu.sm_count, 1), gluon)


def defaults_for(problem: Problem, gpu: GpuInfo) -> list[KernelConfig]:
    """The built-in configs to try in turn: the default, then its Triton stand-in if it is a
    Gluon kernel (which runs on Hopper with TMA-readable inputs only)."""
    first, second = default_for(problem, gpu), default_for(problem, gpu, gluon=False)
    return [first] if first == second else [first, second]

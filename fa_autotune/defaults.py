"""Built-in configs: the last link of the dispatch chain, used when nothing is tuned.

Chosen to be correct everywhere and reasonable on Hopper: the D=64 and D=128 picks won
the sweep in benchmarks/results/2026-11-29-h200-kernel-smoke.md. The tuner exists to beat them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .config import KernelConfig
from .problem import Problem

if TYPE_CHECKING:
    from .target import GpuInfo

# Below this many Q tiles x heads, one program per Q tile leaves most SMs idle and the
# K/V sequence is split across programs instead (Flash-Decoding).
_SPLIT_KV_MAX_QROWS = 64


def default_config(problem: Problem, capability: tuple[int, int] | None = None, sm_count: int = 132) -> KernelConfig:
    """A safe, decent config for ``problem`` on a GPU of ``capability`` (None: interpreter)."""
    d = problem.head_dim_pad
    hopper = capability is not None and capability >= (9, 0)
    access = "tensor_desc" if hopper else "pointer"
    if problem.is_fp8:  # FP8 runs Q-outer only; its tiles take half the shared memory of fp16
        block = 128 if d <= 128 else 64
        return KernelConfig(BLOCK_M=block, BLOCK_N=block, num_warps=8 if block == 128 else 4, num_stages=2,
                            access=access)
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
    if d <= 128:
        return KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, access=access)
    return KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, access=access)


def default_for(problem: Problem, gpu: "GpuInfo") -> KernelConfig:
    """The built-in config for ``problem`` on ``gpu`` (the interpreter included)."""
    return default_config(problem, gpu.capability_tuple, max(gpu.sm_count, 1))

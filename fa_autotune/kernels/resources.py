"""Shared memory a forward variant needs, known before compiling it: what lets the tuner's
sampler skip configs that cannot fit instead of spending trials on them.

The figures are the buffers each template allocates, as Triton 3.6 lays them out for
Hopper (sm_90): a K and a V tile per pipeline stage and the Q tile(s) for Triton's
Q-outer and split-KV kernels; for Gluon, the Q buffers (two per consumer on a persistent
grid), O's staging buffer (in the Q buffers past head dim 128), the half-step P buffers
and the K/V ring (at head dims 129-192 with 128-key steps, unpadded column chunks and V in a
ring of 64-key halves: kernels.fwd.wide_steps). Barriers and the compiler's scratch add at
most :data:`SLACK` bytes. ``tests/kernels/test_resources.py`` checks the estimates against
the compiler. Where no such rule holds (KV-outer loops, warp-specialized Triton kernels,
decode and backward kernels, other architectures) the estimate is None and the compiler
decides.
"""
from __future__ import annotations

from ..spec.config import KernelConfig
from ..spec.problem import Problem
from .aot import SHARED_MEMORY_LIMIT
from .fwd import WIDE_CHUNKS, WIDE_COLS, WIDE_KEYS, wide_steps

SLACK = 1024  # barriers, tile indices and layout-conversion scratch (bytes), measured at most 1024
_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def shared_bytes(config: KernelConfig, problem: Problem, capability: tuple[int, int]) -> int | None:
    """The shared memory ``config``'s kernel allocates on ``problem``, less :data:`SLACK`;
    None where no rule is known (the compiler then decides)."""
    size = _ELEMENT_BYTES.get(problem.dtype)
    if capability[0] != 9 or size is None or problem.backward or problem.decode:
        return None
    d = problem.head_dim_pad
    kv = 2 * config.num_stages * config.BLOCK_N * d * size  # one K and one V tile per stage
    if wide_steps(config, problem.head_dim, size):  # unpadded column chunks, V in 64-key halves
        cols = WIDE_COLS * WIDE_CHUNKS
        q = (2 if config.persistent else 1) * config.consumers * config.BLOCK_M * cols * size
        halves = 2 * config.num_stages + max(2 * config.num_stages - 1, 2)
        return q + halves * WIDE_KEYS * cols * size
    if config.language == "gluon":
        q = (2 if config.persistent else 1) * config.consumers * config.BLOCK_M * d * size
        o = config.consumers * config.BLOCK_M * d * size if d <= 128 else 0
        p = config.consumers * config.BLOCK_M * config.BLOCK_N * size if config.half_step else 0
        return q + o + p + kv
    if config.loop_order in ("q_outer", "split_kv"):
        base = kv + config.q_tiles * config.BLOCK_M * d * size
        # Warp-specialized kernels stage more than that, by an amount with no simple rule:
        # only a lower bound is known, which rules out what cannot fit even so.
        return base
    return None


def is_exact(config: KernelConfig) -> bool:
    """Whether :func:`shared_bytes` is the whole allocation (within :data:`SLACK`) or only
    a lower bound (warp-specialized Triton kernels)."""
    return not (config.language == "triton" and config.warp_specialize)


def fits(config: KernelConfig, problem: Problem, capability: tuple[int, int]) -> bool:
    """False only where the static estimate shows ``config`` cannot fit the block's shared
    memory on ``capability``; True where it fits or nothing is known."""
    need = shared_bytes(config, problem, capability)
    if need is None:
        return True
    limit = SHARED_MEMORY_LIMIT.get(capability)
    if limit is None:
        return True
    # An exact estimate may be up to SLACK short of the compiler's figure: only configs
    # over the limit even without it are ruled out, so nothing that fits is ever lost.
    return need <= limit

"""TMA's bulk reduce for Gluon kernels on Hopper.

Triton 3.6's Gluon builder has the op (``create_async_tma_reduce``: PTX
``cp.reduce.async.bulk.tensor``) but ``hopper.tma`` has no Python wrapper for it. The
backward's dQ needs it: FlashAttention-3 adds each step's share of dQ into an fp32 buffer
from shared memory with one bulk reduce instead of per-thread atomics, which cost the Gluon
pass 1.5-1.7x its time on an H200 (benchmarks/results/2026-12-01-h200-bwd-sweep-gluon/atomic.md).
Generated kernels import this module; it holds no kernel of its own.
"""
from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin

__all__ = ["async_reduce_add"]


@builtin
def async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add shared-memory tile ``src`` into the global box of ``tensor_desc`` at ``coord``
    (element-wise, in the descriptor's dtype; rows outside the tensor are clipped, as a TMA
    store clips them). Asynchronous like ``tma.async_copy_shared_to_global``: wait with
    ``tma.store_wait`` before writing ``src`` again."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)

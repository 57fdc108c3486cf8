"""What every launch plan shares: :class:`Launch` (one kernel with its grid, flags, options
and scalars fixed, called with the tensors of one call, through Triton's direct launcher path
where it can), the Gluon TMA descriptors, L2 sections and SM counts that grids are sized by,
TMA scratch, the softmax scale, and launch failures as errors naming the variant.

Rendered modules (:class:`~fa_autotune.kernels.render.KernelModule`) hold kernels and
constants only; one plan per family fixes all that depends on shapes, strides and dtypes:
:mod:`.fwd` (dense forward), :mod:`.decode` (KV-cache steps), :mod:`.bwd` (backward) and
:mod:`.varlen` (packed sequences). Each hands out its launches through one method,
``launches(*tensors)``, and runs them when called; :mod:`.plans` builds the plan of a
config on a problem for the ahead-of-time compiler, the tuner's compile step, the
correctness gate and the timing alike.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Callable, Protocol, Sequence

import torch
import triton
from triton import knobs
from triton.compiler.errors import CompilationError
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.runtime.errors import OutOfResources

from ..errors import InputError, KernelCompileError, KernelResourceError, TemplateError
from ..spec.config import KernelConfig
from ..spec.target import interpreter_active

LOG2E = 1.4426950408889634
# Launch flags, passed by keyword; a kernel declares those it uses after its other parameters.
FLAGS = ("HEAD_DIM", "HEAD_DIM_PAD", "IS_CAUSAL", "EVEN_N", "WRITE_LSE", "DOT_PRECISION", "FP8", "TILE_M", "PAGE_SIZE",
         "TAIL_ROWS", "TAIL_HEADS", "D_REST", "SINK_TILE", "SINK_M", "ATOMIC_DKV", "WIDE", "V_PAIRS")
_FP8_SCALES = ("QScale", "KScale", "VScale")
_NO_SCALES = (None, None, None)
_GLUON_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32,
                 torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}

# The direct path hands arguments straight to a compiled kernel's launcher, skipping Triton's
# per-call argument binding (about 12 us of host time per call: benchmarks/results/2026-11-30-h200-dispatch-overhead/results.md).
# It uses Triton's private launcher interface, so only on the versions it was tested with;
# elsewhere every call goes through the public ``kernel[grid](...)``.
DIRECT_LAUNCH_TRITON = ("3.6.",)
_DIRECT = triton.__version__.startswith(DIRECT_LAUNCH_TRITON)


class Launch:
    """One kernel with its grid, flags, options and scalars fixed; called with the tensors
    of one call. The first call goes through Triton's JIT (compiling if needed); later
    calls take the direct path while nothing the kernel was specialised on can differ: no
    launch hooks registered, every tensor 16-byte aligned (the scalars are fixed).
    ``warmup=True`` only compiles."""

    def __init__(self, kernel: Any, grid: tuple, tensors: Sequence[str], scalars: dict[str, Any],
                 flags: dict[str, Any], options: dict[str, Any]) -> None:
        names = list(kernel.arg_names)
        runtime = [n for n in names if n not in FLAGS]
        if tuple(runtime[: len(tensors)]) != tuple(tensors):
            raise TemplateError(f"{kernel.__name__} takes {runtime[:len(tensors)]} first, the plan passes "
                                f"{list(tensors)}")
        unknown = [n for n in runtime[len(tensors):] if n not in scalars]
        if unknown:
            raise TemplateError(f"{kernel.__name__} declares scalars the plan does not know: {unknown}")
        self.kernel, self.grid = kernel, grid
        self.fixed = tuple(scalars[n] for n in runtime[len(tensors):])
        self.flags = {name: value for name, value in flags.items() if name in names}
        self.options = dict(options)
        self.meta = {**self.flags, **self.options}
        self.constexprs = tuple(self.meta[name] for name in names if name in self.meta)
        self.grid3 = (tuple(grid) + (1, 1))[:3]
        self.compiled = None
        self.tensor_slots: tuple[int, ...] = ()

    def __call__(self, *tensors: Any, warmup: bool = False) -> Any:
        args = tensors + self.fixed
        if warmup:
            return self.kernel.warmup(*args, grid=self.grid, **self.meta)
        compiled = self.compiled
        if (compiled is not None and not _hooks_registered()
                and not any(args[i].data_ptr() & 15 for i in self.tensor_slots)):
            stream = self.current_stream(self.current_device())
            compiled.run(*self.grid3, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *args, *self.constexprs)
            return compiled
        compiled = self.kernel[self.grid](*args, **self.meta)
        slots = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        if _DIRECT and compiled is not None and hasattr(compiled, "packed_metadata") \
                and not any(args[i].data_ptr() & 15 for i in slots):
            from triton.runtime import driver

            self.current_device = driver.active.get_current_device
            self.current_stream = driver.active.get_current_stream
            self.compiled, self.tensor_slots = compiled, slots
        return compiled


def _hooks_registered() -> bool:
    """Profilers register launch hooks; the direct path would skip them, so it steps aside."""
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


class Plan(Protocol):
    """A launch plan for one layout of its tensors: ``launches`` gives each launch of one call
    with its per-call arguments (the scalars each ``Launch`` fixed come after them); calling
    the plan runs them (``warmup``: compile only) and returns the compiled kernels."""

    def launches(self, *tensors: Any) -> list[tuple[Launch, tuple]]: ...

    def __call__(self, *tensors: Any, warmup: bool = False) -> list: ...


def explained(config: KernelConfig, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with Triton's resource and compile failures raised as errors naming the variant."""
    def call():
        try:
            return fn()
        except Exception as exc:
            failure = explain_launch_failure(config, exc)
            if failure is exc:
                raise
            raise failure from exc
    return call


def _tile_counter(config: KernelConfig, device: torch.device) -> tuple:
    """A dynamic Gluon grid's tile counter: zeroed for each launch (a memset on the stream,
    so graph replays and concurrent streams each count from zero); none otherwise."""
    return (torch.zeros(1, dtype=torch.int32, device=device),) if config.dynamic else ()


def _gluon_descriptors(dtype: torch.dtype, head_dim_pad: int, rows: dict[str, int],
                       transposed: frozenset[str] = frozenset()) -> Callable[..., tuple]:
    """A function of the named tensors giving their rank-4 Gluon TMA descriptors (boxes of
    ``rows[name]`` rows by head_dim_pad columns, the tensors' own strides; a kernel that
    stages column chunks passes the chunk's width as head_dim_pad), in ``rows``' order; a
    name in ``transposed`` is read as (head dim, rows) boxes of its (B, H, D, N) view (FP8's
    sequence-contiguous V). Each box's layout is of its tensor's dtype (FP8 inputs write a
    16-bit output), ``dtype``'s prepared ahead."""
    blocks = {name: [1, 1, head_dim_pad, n] if name in transposed else [1, 1, n, head_dim_pad]
              for name, n in rows.items()}
    layouts = {(name, dtype): gl.NVMMASharedLayout.get_default_for(block, _GLUON_DTYPES[dtype])
               for name, block in blocks.items()}

    def layout(name: str, t: torch.Tensor):
        key = (name, t.dtype)
        if key not in layouts:
            layouts[key] = gl.NVMMASharedLayout.get_default_for(blocks[name], _GLUON_DTYPES[t.dtype])
        return layouts[key]

    def descriptors(**tensors: torch.Tensor) -> tuple:
        views = ((name, tensors[name].transpose(2, 3) if name in transposed else tensors[name]) for name in rows)
        return tuple(GluonTensorDescriptor(t, list(t.shape), list(t.stride()), blocks[name], layout(name, t))
                     for name, t in views)

    return descriptors


L2_SECTION_FRACTION = 0.5
"""Share of the L2 cache that the K/V of one section of a causal Gluon grid may fill (the
rest serves Q, O and the other sections' stragglers); FlashAttention-3 uses 32 of 50 MB."""


DYNAMIC_SECTION = 8
"""Heads per section of a causal Gluon grid that takes its tiles from a counter. Measured on an
H200 (benchmarks/results/2026-12-02-h200-fwd-example-and-sections/results.md), sections of 4-16 heads
ran such grids 2-7% faster than the L2-sized ones (D=128 N=4096 causal 0.998x -> 1.055x cuDNN,
N=16384 1.021x -> 1.088x), the backward's 1-3% (benchmarks/results/2026-12-02-h200-bwd-persistent/results.md): with
every program fetching the next longest tile, a narrow section keeps the running tiles on a
few heads whose K and V stay in L2."""


def l2_section(device: torch.device, batch_heads: int, group: int, n_k: int, head_dim_pad: int,
               element_size: int, dynamic: bool = False) -> int:
    """Heads per section of a causal Gluon grid (query heads; KV heads for the backward, with
    ``n_k`` the Q and dO rows of a KV head's group): on a dynamic grid DYNAMIC_SECTION, else
    as many as have K and V (shared by ``group`` query heads) fitting in L2_SECTION_FRACTION of
    the L2 cache, at least one. The grid runs each section's longest tiles first, so K/V is
    re-read from L2, not HBM, while the rows of a section move down their heads (all heads at
    once on a CPU stand-in)."""
    if device.type != "cuda" or L2_SECTION_FRACTION <= 0:
        return batch_heads
    if dynamic:
        return min(batch_heads, DYNAMIC_SECTION)
    kv_per_head = 2 * n_k * head_dim_pad * element_size / max(group, 1)
    budget = torch.cuda.get_device_properties(device).L2_cache_size * L2_SECTION_FRACTION
    return max(1, min(batch_heads, int(budget // max(kv_per_head, 1))))


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the device (CPU and meta tensors get a small stand-in, so
    the interpreter's programs still loop over several tiles)."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


# ------------------------------------------------------------------ TMA scratch
def _alloc_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, device="cuda", dtype=torch.int8)


_LOCAL = threading.local()


def ensure_allocator() -> None:
    """Device-side TMA descriptors need global scratch: install an allocator unless the
    caller already set one (Triton keeps it per thread). Where Triton's private allocator
    state cannot be read, it is set once per thread."""
    if _allocator_missing():
        triton.set_allocator(_alloc_scratch)


if _DIRECT:
    from triton.runtime import _allocation

    def _allocator_missing() -> bool:
        return isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
else:
    def _allocator_missing() -> bool:
        first = not getattr(_LOCAL, "allocator_set", False)
        _LOCAL.allocator_set = True
        return first


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale (1/sqrt(head_dim) by default). Positive only: every kernel takes the
    running row max of the raw scores and scales it after (max(S) * scale, one multiply per
    row instead of one per score), which is the max of the scaled scores only for scale > 0,
    and masked scores are -inf before scaling (-inf * 0 is NaN)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise InputError(f"scale must be a finite number, got {scale!r}")
    if scale <= 0:
        raise InputError(f"scale must be positive (the kernels fold it into the running row max), got {scale!r}")
    return float(scale)


def check_interpretable(q: torch.Tensor) -> None:
    """CPU tensors need Triton's interpreter, which is chosen before Triton is imported."""
    if q.device.type == "cpu" and not interpreter_active():
        raise InputError(
            "CPU tensors run in Triton's interpreter: set TRITON_INTERPRET=1 before starting Python, or use CUDA tensors"
        )


def explain_launch_failure(config: KernelConfig, exc: Exception) -> Exception:
    """Triton's out-of-resources and compile errors as ConfigErrors naming the variant."""
    if isinstance(exc, OutOfResources):
        return KernelResourceError(
            "BLOCK_M", f"{config.name} needs more on-chip memory than the GPU has ({exc}); "
            "use smaller BLOCK_M/BLOCK_N or fewer num_stages"
        )
    if isinstance(exc, CompilationError):
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return KernelCompileError("config", f"{config.name} does not compile for this problem: {first}")
    return exc

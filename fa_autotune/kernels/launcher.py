"""The one host launcher: everything about a launch that the rendered modules do not hold.

Rendered modules (:class:`~fa_autotune.kernels.render.KernelModule`) hold kernels and
constants only. Here, once per loop order: the grid, the scratch buffers, the scalars each
kernel declares (supplied by name) and the launch itself. :func:`prepare` fixes all that
depends on shapes, strides and dtypes into a :class:`Prepared` plan that later calls hand
only tensors to; the public API, the tuner's compile step, the timing and the ahead-of-time
compiler all launch through it.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Callable, Sequence

import torch
import triton
from triton import knobs
from triton.compiler.errors import CompilationError
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor
from triton.runtime.errors import OutOfResources

from ..errors import ConfigError, InputError, KernelCompileError, KernelResourceError, TemplateError
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.target import interpreter_active
from .checks import check_gluon_backward, tma_layout_ok
from .render import KernelModule, load_module
from .tiles import tile_starts

LOG2E = 1.4426950408889634
# Launch flags, passed by keyword; a kernel declares those it uses after its other parameters.
FLAGS = ("HEAD_DIM", "HEAD_DIM_PAD", "IS_CAUSAL", "EVEN_N", "WRITE_LSE", "DOT_PRECISION", "FP8", "TILE_M", "PAGE_SIZE",
         "TAIL_ROWS", "TAIL_HEADS", "D_REST")
# Per-call tensors of each kernel, in the order its parameters list them.
_Q_OUTER = ("Q", "K", "V", "Out", "Lse")
_FP8_SCALES = ("QScale", "KScale", "VScale")
_SPLIT_MAIN = ("Q", "K", "V", "OPart", "LsePart")
_SPLIT_COMBINE = ("OPart", "LsePart", "Out", "Lse")
_KV_OUTER = ("Q", "K", "V", "Out", "Lse", "AccScratch", "MScratch", "LScratch")
_GLUON = ("q_desc", "k_desc", "v_desc", "o_desc", "Lse")
_GLUON_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}
_NO_SCALES = (None, None, None)
_DECODE = ("Q", "KCache", "VCache", "CacheSeqlens", "BlockTable", "SEQLEN", "Out", "Lse", "OPart", "LsePart")
_DECODE_COMBINE = ("OPart", "LsePart", "Out", "Lse")
_DECODE_UNITS = ("CacheSeqlens", "SEQLEN", "PairStart")  # a persistent (balanced) decode grid: the main kernel
# and the combine take PairStart after _DECODE's and _DECODE_COMBINE's tensors
_APPEND = ("KNew", "VNew", "KCache", "VCache", "CacheSeqlens", "BlockTable", "SEQLEN")

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
            raise TemplateError(f"{kernel.__name__} takes {runtime[:len(tensors)]} first, the launcher passes "
                                f"{list(tensors)}")
        unknown = [n for n in runtime[len(tensors):] if n not in scalars]
        if unknown:
            raise TemplateError(f"{kernel.__name__} declares scalars the launcher does not know: {unknown}")
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


Calls = Callable[..., list]  # (q, k, v, out, lse, scales) -> [(Launch, per-call tensors), ...]


class Prepared:
    """A launch plan for one layout: call it with (q, k, v, out, lse[, scales]) to run every
    kernel of the variant (returns the compiled kernels); :meth:`arguments` gives each
    launch's full argument list (what ahead-of-time compilation specialises on)."""

    __slots__ = ("launches", "_calls", "_tma")

    def __init__(self, launches: tuple[Launch, ...], calls: Calls, tma: bool) -> None:
        self.launches, self._calls, self._tma = launches, calls, tma

    def __call__(self, q, k, v, out, lse, scales=None, warmup: bool = False) -> list:
        if self._tma:
            ensure_allocator()
        return [launch(*tensors, warmup=warmup) for launch, tensors in self._calls(q, k, v, out, lse, scales)]

    def arguments(self, q, k, v, out, lse, scales=None) -> list[tuple[Launch, tuple]]:
        return [(launch, tensors + launch.fixed) for launch, tensors in self._calls(q, k, v, out, lse, scales)]


def prepare(config: KernelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor | None, sm_scale: float, causal_offset: int, is_causal: bool,
            scales: tuple | None = None) -> Prepared:
    """The plan of ``config`` for tensors of these shapes, strides and dtypes (FP8 inputs with
    scales = (q_scale, k_scale, v_scale, q rows per scale, k rows per scale))."""
    module = load_module(config)
    batch, heads, n_q, head_dim = q.shape
    heads_kv, n_k = k.shape[1], k.shape[2]
    head_dim_pad = max(32 if q.element_size() == 1 else 16, triton.next_power_of_2(head_dim))  # FP8 dots: K >= 32
    scalars: dict[str, Any] = {"H": heads, "GROUP": heads // heads_kv, "N_Q": n_q, "N_K": n_k,
                               "causal_offset": causal_offset, "qk_scale": sm_scale * LOG2E, "BH": batch * heads}
    for prefix, t in (("q", q), ("k", k), ("v", v), ("o", out)):
        scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bhnd"), t.stride()))
    flags = {"HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim_pad, "IS_CAUSAL": is_causal,
             "EVEN_N": n_k % config.BLOCK_N == 0, "WRITE_LSE": lse is not None,
             "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32", "D_REST": d_rest(head_dim, head_dim_pad)}
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    family = _gluon if config.language == "gluon" else _FAMILIES[config.loop_order]
    launches, calls = family(config, module, q, scalars, flags, options, scales, head_dim_pad)
    return Prepared(launches, calls, config.access == "tensor_desc")


def d_rest(head_dim: int, head_dim_pad: int) -> int:
    """The Gluon forward's split of a padded head dim: the width of a second part from column
    head_dim_pad / 2 on that covers the real columns (a power of two, at least one 16-wide
    k-step), where the two parts hold fewer columns than head_dim_pad; else 0 (one part). Q K^T
    then runs as two products and O accumulates in two parts, so the zero columns are never
    multiplied. Only for pads of 128 and more, so that both parts start on a 128-byte swizzle
    row (D=80: 64 + 16, D=96: 64 + 32, D=160: 128 + 32, D=192: 128 + 64)."""
    half = head_dim_pad // 2
    if head_dim_pad < 128 or head_dim <= half:
        return 0
    rest = max(16, triton.next_power_of_2(head_dim - half))
    return rest if half + rest < head_dim_pad else 0


def varlen_d_rest(head_dim: int, head_dim_pad: int) -> int:
    """d_rest for the Gluon varlen kernel: the split Q K^T (D_REST below 64, as at D=80 and 96,
    whose varlen kernels ran the GPU tests), not the two-part accumulator, whose ragged-tile
    store has not run on a GPU yet (tests/kernels/test_gluon_gpu.py::test_wide_head_dims_varlen
    at D=192): such head dims run padded, as D=256 does."""
    rest = d_rest(head_dim, head_dim_pad)
    return rest if rest < 64 else 0


def _q_outer(config, module: KernelModule, q, scalars, flags, options, scales, head_dim_pad):
    """FlashAttention-2: one program per Q tile (or a persistent grid looping over them);
    with one Q tile the kernel also takes FP8 inputs (FP8 flag, descales)."""
    kernel = module.KERNELS["main"]
    fp8_capable = "FP8" in kernel.arg_names
    if scales is not None:
        if not fp8_capable:
            raise ConfigError("q_tiles", "FP8 inputs need q_tiles=1 (one Q descale per program)")
        for prefix, scale in zip(("qs", "ks", "vs"), scales[:3]):
            scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bhn"), scale.stride()))
        scalars.update(Q_SCALE_BLOCK=scales[3], K_SCALE_BLOCK=scales[4])
    elif fp8_capable:  # no descales: the FP8 parameters are compile-time None
        scalars.update({f"stride_{p}{axis}": None for p in ("qs", "ks", "vs") for axis in "bhn"})
        scalars.update(Q_SCALE_BLOCK=None, K_SCALE_BLOCK=None)
    if fp8_capable:
        flags = dict(flags, FP8=scales is not None)
    batch_heads = scalars["BH"]
    tiles = triton.cdiv(scalars["N_Q"], config.BLOCK_M * config.q_tiles) * batch_heads
    grid = (min(tiles, _sm_count(q.device) * config.persistent),) if config.persistent else (tiles,)
    main = Launch(kernel, grid, _Q_OUTER + (_FP8_SCALES if fp8_capable else ()), scalars, flags, options)

    if fp8_capable:
        def calls(q, k, v, out, lse, scales):
            return [(main, (q, k, v, out, lse, *(scales[:3] if scales is not None else _NO_SCALES)))]
    else:
        def calls(q, k, v, out, lse, scales):
            return [(main, (q, k, v, out, lse))]

    return (main,), calls


def _split_kv(config, module: KernelModule, q, scalars, flags, options, scales, head_dim_pad):
    """Flash-Decoding: NUM_SPLITS programs per Q tile write partial outputs and LSEs to fp32
    scratch, a second kernel merges them."""
    if scales is not None:
        raise ConfigError("loop_order", "FP8 inputs run with loop_order='q_outer' only")
    n_q = scalars["N_Q"]
    n_q_pad = triton.cdiv(n_q, config.BLOCK_M) * config.BLOCK_M
    tiles = triton.cdiv(n_q, config.BLOCK_M) * scalars["BH"]
    scalars["N_Q_PAD"] = n_q_pad
    main = Launch(module.KERNELS["main"], (tiles, config.num_splits), _SPLIT_MAIN, scalars, flags, options)
    combine = Launch(module.KERNELS["combine"], (tiles,), _SPLIT_COMBINE, scalars, flags,
                     {"num_warps": config.num_warps})
    parts = scalars["BH"] * config.num_splits

    def calls(q, k, v, out, lse, scales):
        o_part = torch.empty((parts, n_q_pad, head_dim_pad), device=q.device, dtype=torch.float32)
        lse_part = torch.empty((parts, n_q_pad), device=q.device, dtype=torch.float32)
        return [(main, (q, k, v, o_part, lse_part)), (combine, (o_part, lse_part, out, lse))]

    return (main, combine), calls


def _kv_outer(config, module: KernelModule, q, scalars, flags, options, scales, head_dim_pad):
    """FlashAttention-1: K/V tiles outer, each program's Q tiles' softmax state in fp32 scratch."""
    if scales is not None:
        raise ConfigError("loop_order", "FP8 inputs run with loop_order='q_outer' only")
    n_q = scalars["N_Q"]
    n_q_pad = triton.cdiv(n_q, config.BLOCK_M) * config.BLOCK_M
    scalars["N_Q_PAD"] = n_q_pad
    grid = (triton.cdiv(n_q, config.BLOCK_M * config.q_tiles) * scalars["BH"],)
    main = Launch(module.KERNELS["main"], grid, _KV_OUTER, scalars, flags, options)
    rows = scalars["BH"]

    def calls(q, k, v, out, lse, scales):
        acc = torch.empty((rows, n_q_pad, head_dim_pad), device=q.device, dtype=torch.float32)
        row_max = torch.empty((rows, n_q_pad), device=q.device, dtype=torch.float32)
        row_sum = torch.empty((rows, n_q_pad), device=q.device, dtype=torch.float32)
        return [(main, (q, k, v, out, lse, acc, row_max, row_sum))]

    return (main,), calls


def _gluon(config, module: KernelModule, q, scalars, flags, options, scales, head_dim_pad):
    """FlashAttention-3 in Gluon: programs walk tiles of ``consumers * BLOCK_M`` query rows of
    one (batch, head), one tile each or, with ``persistent``, one program per SM looping; the
    producer and consumer warpgroups fork inside the kernel (the launch has 4 warps). Q, K, V
    and O go in as rank-4 TMA descriptors over (batch, head, row, dim) with the tensors' own
    strides, encoded on the host for each call."""
    if scales is not None:
        raise ConfigError("language", "FP8 inputs run with language='triton' only")
    tiles = triton.cdiv(scalars["N_Q"], config.BLOCK_M * config.consumers) * scalars["BH"]
    grid = (min(tiles, _sm_count(q.device) * config.persistent),) if config.persistent else (tiles,)
    scalars["SECTION"] = config.section or l2_section(q.device, scalars["BH"], scalars["GROUP"], scalars["N_K"],
                                                      head_dim_pad, q.element_size(), config.dynamic)
    main = Launch(module.KERNELS["main"], grid, _GLUON + (("TileCounter",) if config.dynamic else ()), scalars, flags,
                  {"num_warps": config.num_warps})
    descriptors = _gluon_descriptors(q.dtype, head_dim_pad, {"q": config.BLOCK_M, "k": config.BLOCK_N,
                                                             "v": config.BLOCK_N, "o": config.BLOCK_M})

    def calls(q, k, v, out, lse, scales):
        return [(main, (*descriptors(q=q, k=k, v=v, o=out), lse, *_tile_counter(config, q.device)))]

    return (main,), calls


def _tile_counter(config: KernelConfig, device: torch.device) -> tuple:
    """A dynamic Gluon grid's tile counter: zeroed for each launch (a memset on the stream,
    so graph replays and concurrent streams each count from zero); none otherwise."""
    return (torch.zeros(1, dtype=torch.int32, device=device),) if config.dynamic else ()


def _gluon_descriptors(dtype: torch.dtype, head_dim_pad: int, rows: dict[str, int]) -> Callable[..., tuple]:
    """A function of the named tensors giving their rank-4 Gluon TMA descriptors (boxes of
    ``rows[name]`` rows by head_dim_pad, the tensors' own strides), in ``rows``' order."""
    gl_dtype = _GLUON_DTYPES[dtype]
    blocks = {name: [1, 1, n, head_dim_pad] for name, n in rows.items()}
    layouts = {name: gl.NVMMASharedLayout.get_default_for(block, gl_dtype) for name, block in blocks.items()}

    def descriptors(**tensors: torch.Tensor) -> tuple:
        return tuple(GluonTensorDescriptor(t, list(t.shape), list(t.stride()), blocks[name], layouts[name])
                     for name, t in ((name, tensors[name]) for name in rows))

    return descriptors


_FAMILIES = {"q_outer": _q_outer, "split_kv": _split_kv, "kv_outer": _kv_outer}


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


# ------------------------------------------------------------------ KV-cache attention
def decode_tile_m(config: KernelConfig, rows: int) -> int:
    """Query rows per decode program: the power of two (>= 16, the dot's minimum) that holds
    one KV group's rows, at most BLOCK_M."""
    return min(config.BLOCK_M, max(16, triton.next_power_of_2(max(rows, 1))))


class DecodePlan:
    """Launch plan of a ``loop_order='decode'`` config for one layout of q (batch, n_q,
    heads_q, D), a contiguous (batch, seqlen, heads_kv, D) or paged (pages, page_size,
    heads_kv, D) cache, and, when appending, new k/v (batch, n_new, heads_kv, D). Called with
    the tensors of one step (and ``seqlen``, the cache length when ``cache_seqlens`` is None):
    appends, attends, combines. Nothing is read back to the host. A persistent config (a
    balanced split) first counts every row tile's key steps on the device (``units``), then
    runs ``persistent`` programs per SM over them."""

    __slots__ = ("append", "units", "main", "combine", "parts", "tile_rows", "head_dim_pad", "pairs", "box", "config")

    def __init__(self, config: KernelConfig, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 k_new: torch.Tensor | None, v_new: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor | None,
                 block_table: torch.Tensor | None, scale: float, causal: bool) -> None:
        if config.loop_order != "decode":
            raise ConfigError("loop_order", f"{config.name} is not a KV-cache kernel; use loop_order='decode'")
        batch, n_q, heads, head_dim = q.shape
        heads_kv = k_cache.shape[2]
        group = heads // heads_kv
        head_dim_pad = max(16, triton.next_power_of_2(head_dim))
        if config.access == "tensor_desc" and not (block_table is None and k_cache.numel() and tma_layout_ok(k_cache)
                                                   and tma_layout_ok(v_cache)
                                                   and min(k_cache.stride() + v_cache.stride()) > 0):
            config = config.with_(access="pointer")  # pages, or a layout TMA cannot address: the same kernel on pointers
        # TMA (contiguous caches): a [1, BLOCK_N, 1, HEAD_DIM_PAD] box of the whole cache a step.
        self.box = [1, config.BLOCK_N, 1, head_dim_pad] if config.access == "tensor_desc" else None
        self.config = config
        module = load_module(config)
        tile_m = decode_tile_m(config, n_q * group)
        page_size = k_cache.shape[1] if block_table is not None else 0
        n_new = k_new.shape[1] if k_new is not None else 0
        scalars: dict[str, Any] = {"HKV": heads_kv, "GROUP": group, "N_Q": n_q, "N_NEW": n_new,
                                   "qk_scale": scale * LOG2E,
                                   "stride_btb": block_table.stride(0) if block_table is not None else 0}
        for prefix, t in (("q", q), ("k", k_cache), ("v", v_cache), ("o", out), ("nk", k_new), ("nv", v_new)):
            strides = t.stride() if t is not None else (0, 0, 0, 0)
            scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bnhd"), strides))
        flags = {"HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim_pad, "IS_CAUSAL": causal, "WRITE_LSE": lse is not None,
                 "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32", "TILE_M": tile_m,
                 "PAGE_SIZE": page_size}
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if config.maxnreg:
            options["maxnreg"] = config.maxnreg
        tiles = triton.cdiv(n_q * group, tile_m) * batch * heads_kv
        self.units = self.combine = None
        self.pairs = tiles
        combine_rows = min(tile_m, n_q * group)  # one combine program per query row of a tile (none for padding)
        if config.persistent:
            capacity = (block_table.shape[1] * page_size if block_table is not None else k_cache.shape[1]) + n_new
            if tiles * triton.cdiv(capacity, config.BLOCK_N) >= 2 ** 31:  # the units scan counts in int32
                raise ConfigError("persistent", f"a balanced split counts its {tiles} row tiles' key steps in "
                                  f"32 bits; {capacity} cached rows each are too many: use num_splits instead")
            programs = _sm_count(q.device) * config.persistent
            scalars.update(PAIRS=tiles, PROGRAMS=programs)
            self.units = Launch(module.KERNELS["units"], (1,), _DECODE_UNITS, scalars, flags, {"num_warps": 4})
            self.main = Launch(module.KERNELS["main"], (programs,), _DECODE + ("PairStart",), scalars, flags, options)
            self.combine = Launch(module.KERNELS["combine"], (tiles, combine_rows), _DECODE_COMBINE + ("PairStart",),
                                  scalars, flags, {"num_warps": 4})
            self.parts = 2 * programs * tile_m  # two scratch slots per program
        else:
            self.main = Launch(module.KERNELS["main"], (tiles, config.num_splits), _DECODE, scalars, flags, options)
            if config.num_splits > 1:
                self.combine = Launch(module.KERNELS["combine"], (tiles, combine_rows), _DECODE_COMBINE, scalars,
                                      flags, {"num_warps": 4})
            self.parts = tiles * config.num_splits * tile_m
        self.append = None
        if n_new:
            self.append = Launch(module.KERNELS["append"], (triton.cdiv(n_new, config.BLOCK_N), batch * heads_kv),
                                 _APPEND, scalars, flags, {"num_warps": 4})
        self.tile_rows, self.head_dim_pad = tile_m, head_dim_pad

    def calls(self, q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, seqlen: int, out,
              lse) -> list[tuple[Launch, tuple]]:
        """Each launch of one step with its per-call arguments."""
        calls = []
        if self.append is not None:
            calls.append((self.append, (k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, seqlen)))
        o_part = lse_part = None
        if self.combine is not None:
            o_part = torch.empty((self.parts, self.head_dim_pad), device=q.device, dtype=torch.float32)
            lse_part = torch.empty((self.parts,), device=q.device, dtype=torch.float32)
        k_main, v_main = k_cache, v_cache
        if self.box is not None:
            k_main = TensorDescriptor(k_cache, list(k_cache.shape), list(k_cache.stride()), self.box)
            v_main = TensorDescriptor(v_cache, list(v_cache.shape), list(v_cache.stride()), self.box)
        main = (q, k_main, v_main, cache_seqlens, block_table, seqlen, out, lse, o_part, lse_part)
        combine = (o_part, lse_part, out, lse)
        if self.units is not None:
            pair_start = torch.empty((self.pairs + 1,), device=q.device, dtype=torch.int32)
            calls.append((self.units, (cache_seqlens, seqlen, pair_start)))
            main, combine = main + (pair_start,), combine + (pair_start,)
        calls.append((self.main, main))
        if self.combine is not None:
            calls.append((self.combine, combine))
        return calls

    def __call__(self, q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, seqlen: int, out, lse,
                 warmup: bool = False) -> list:
        return [launch(*args, warmup=warmup)
                for launch, args in self.calls(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, seqlen,
                                               out, lse)]


# ------------------------------------------------------------------ backward
_BWD_PRE = ("Out", "DOut", "Delta")
_BWD_DKDV = ("Q", "K", "V", "DOut", "Lse", "Delta", "DK", "DV", "DQAcc")
_BWD_DQ = ("Q", "K", "V", "DOut", "Lse", "Delta", "DQ")
_BWD_DKDV_GLUON = ("q_desc", "k_desc", "v_desc", "do_desc", "Lse", "Delta", "dk_desc", "dv_desc")


def triton_backward(config: KernelConfig) -> KernelConfig:
    """A Gluon backward's delta preprocess and dQ pass: the Triton backward's kernels with
    the same tiles and dQ pass (the Gluon template holds the dK/dV pass only)."""
    dq_m, dq_n, dq_w, dq_s = config.dq_pass()
    return KernelConfig(loop_order="backward", BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, num_warps=4,
                        num_stages=2, causal_mode=config.causal_mode, dq_block_m=dq_m, dq_block_n=dq_n,
                        dq_warps=dq_w, dq_stages=dq_s)


class BackwardPlan:
    """Launch plan of a ``loop_order='backward'`` config for one layout of q, k, v (B, H, N, D)
    and their gradients: delta = rowsum(dO * O), then dK/dV (K/V tiles outer, GQA groups
    summed in registers), then dQ (Q tiles outer; every gradient written once), or with
    ``dq_atomic`` dQ added up in fp32 inside the dK/dV pass and cast into place after it. A
    Gluon config runs its own dK/dV pass (Q, K, V and dO through TMA descriptors built per
    call) beside the Triton preprocess and dQ pass of :func:`triton_backward`, or with
    ``dq_atomic`` beside the preprocess alone (its pass adds dQ up)."""

    __slots__ = ("config", "pre", "dkdv", "dq", "rows", "acc_shape", "head_dim", "head_dim_pad", "dtype",
                 "descriptors", "acc_descriptor")

    def __init__(self, config: KernelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 dout: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, sm_scale: float,
                 causal_offset: int, is_causal: bool) -> None:
        if config.loop_order != "backward":
            raise ConfigError("loop_order", f"{config.name} is not a backward kernel; use loop_order='backward'")
        gluon = config.language == "gluon"
        if gluon:
            check_gluon_backward(q, k, v, dout)
        module = load_module(triton_backward(config) if gluon else config)
        batch, heads, n_q, head_dim = q.shape
        heads_kv, n_k = k.shape[1], k.shape[2]
        scalars: dict[str, Any] = {"H": heads, "HKV": heads_kv, "GROUP": heads // heads_kv, "N_Q": n_q, "N_K": n_k,
                                   "causal_offset": causal_offset, "qk_scale": sm_scale * LOG2E, "sm_scale": sm_scale,
                                   "BHK": batch * heads_kv}
        for prefix, t in (("q", q), ("k", k), ("v", v), ("o", out), ("do", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
            scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bhnd"), t.stride()))
        flags = {"HEAD_DIM": head_dim, "HEAD_DIM_PAD": max(16, triton.next_power_of_2(head_dim)),
                 "IS_CAUSAL": is_causal, "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32"}
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if config.maxnreg:
            options["maxnreg"] = config.maxnreg
        q_tiles = triton.cdiv(n_q, config.BLOCK_M)
        self.pre = Launch(module.KERNELS["preprocess"], (q_tiles, batch * heads), _BWD_PRE, scalars, flags,
                          {"num_warps": 4})
        self.descriptors = self.acc_descriptor = None
        self.config = config
        if gluon:
            grid = (triton.cdiv(n_k, config.BLOCK_N * config.consumers), batch * heads_kv)
            if config.persistent:  # one program per SM walking the tiles
                grid = (min(grid[0] * grid[1], _sm_count(q.device)),)
            # A causal persistent grid's L2 sections (KV heads): the config's, else the rule's
            # (on a static grid the KV heads whose group's Q and dO fit in L2).
            scalars["SECTION"] = config.section or l2_section(q.device, batch * heads_kv, 1, n_q * (heads // heads_kv),
                                                              flags["HEAD_DIM_PAD"], q.element_size(), config.dynamic)
            self.dkdv = Launch(load_module(config).KERNELS["dkdv"], grid,
                               _BWD_DKDV_GLUON + (("dq_desc",) if config.dq_atomic else ())
                               + (("TileCounter",) if config.dynamic else ()), scalars, flags,
                               {"num_warps": config.num_warps})
            self.descriptors = _gluon_descriptors(q.dtype, flags["HEAD_DIM_PAD"],
                                                  {"q": config.BLOCK_M, "k": config.BLOCK_N, "v": config.BLOCK_N,
                                                   "do": config.BLOCK_M, "dk": config.BLOCK_N, "dv": config.BLOCK_N})
            if config.dq_atomic:  # dQ's fp32 buffer, added into by TMA bulk reduces of BLOCK_M rows
                split = 2 if config.consumers == 2 else 1  # two consumers: half of the columns each
                self.acc_descriptor = _gluon_descriptors(torch.float32, flags["HEAD_DIM_PAD"] // split,
                                                         {"dq": config.BLOCK_M})
        else:
            self.dkdv = Launch(module.KERNELS["dkdv"], (triton.cdiv(n_k, config.BLOCK_N), batch * heads_kv),
                               _BWD_DKDV, scalars, flags, options)
        dq_m, _, dq_warps, dq_stages = config.dq_pass()
        self.dq = None if config.dq_atomic else Launch(
            module.KERNELS["dq"], (triton.cdiv(n_q, dq_m), batch * heads), _BWD_DQ, scalars, flags,
            {**options, "num_warps": dq_warps, "num_stages": dq_stages})
        self.rows = batch * heads * n_q
        self.acc_shape = (batch, heads, n_q, flags["HEAD_DIM_PAD"]) if config.dq_atomic else None
        self.head_dim_pad = flags["HEAD_DIM_PAD"]
        self.dtype = q.dtype
        self.head_dim = head_dim

    def calls(self, q, k, v, out, dout, lse, dq, dk, dv, acc=None) -> list[tuple[Launch, tuple]]:
        delta = torch.empty((self.rows,), device=q.device, dtype=torch.float32)
        if self.descriptors is not None:  # dk and dv: TMA-storable (see staged_gradients)
            *descs, dk_desc, dv_desc = self.descriptors(q=q, k=k, v=v, do=dout, dk=dk, dv=dv)
            counter = _tile_counter(self.config, q.device)
            if self.dq is None:  # dQ added up inside the Gluon pass
                return [(self.pre, (out, dout, delta)), (self.dkdv, (*descs, lse, delta, dk_desc, dv_desc,
                                                                     *self.acc_descriptor(dq=acc), *counter))]
            return [(self.pre, (out, dout, delta)), (self.dkdv, (*descs, lse, delta, dk_desc, dv_desc, *counter)),
                    (self.dq, (q, k, v, dout, lse, delta, dq))]
        if self.dq is None:
            return [(self.pre, (out, dout, delta)), (self.dkdv, (q, k, v, dout, lse, delta, dk, dv, acc))]
        return [(self.pre, (out, dout, delta)), (self.dkdv, (q, k, v, dout, lse, delta, dk, dv, None)),
                (self.dq, (q, k, v, dout, lse, delta, dq))]

    def __call__(self, q, k, v, out, dout, lse, dq, dk, dv, warmup: bool = False, concurrent: bool = True,
                 dlse: torch.Tensor | None = None) -> list:
        """Run the passes; on a GPU the dQ pass runs on a side stream next to the dK/dV pass
        (both only read what the preprocess wrote), so each fills the SMs the other leaves
        idle, as one fused launch would, yet each keeps its own warps. CUDA-graph safe: the
        side stream forks from and joins the caller's stream. ``dlse`` (the natural-log LSE's
        gradient, (B, H, N_Q)) is subtracted from the preprocess's delta before the other
        passes read it: d lse_i / d s_ij = P_ij, so dS = P * (dP - (delta - dlse)) in both
        the Triton and the Gluon passes, the kernels unchanged."""
        acc = None if self.acc_shape is None else torch.zeros(self.acc_shape, device=q.device, dtype=torch.float32)
        dk_out, dv_out = dk, dv
        if self.descriptors is not None:
            dk, dv = self.staged_gradients(dk, dv)
        calls = self.calls(q, k, v, out, dout, lse, dq, dk, dv, acc)
        fold = dlse is not None and not warmup
        if warmup or not concurrent or self.dq is None or q.device.type != "cuda":
            compiled = []
            for launch, args in calls:
                compiled.append(launch(*args, warmup=warmup))
                if fold and launch is self.pre:  # args: (out, dout, delta)
                    args[2].view(dlse.shape).sub_(dlse)
        else:
            (pre, pre_args), (dkdv, dkdv_args), (dq_pass, dq_args) = calls
            with torch.cuda.device(q.device):  # launches go to the current device's streams
                main = torch.cuda.current_stream()
                side = _side_stream(main)
                compiled = [pre(*pre_args)]
                if fold:  # on the main stream, before the side stream forks
                    pre_args[2].view(dlse.shape).sub_(dlse)
                side.wait_stream(main)
                compiled.append(dkdv(*dkdv_args))
                with torch.cuda.stream(side):
                    compiled.append(dq_pass(*dq_args))
                main.wait_stream(side)
        if acc is not None and not warmup:
            dq.copy_(acc[..., :self.head_dim])
        if dk is not dk_out and not warmup:
            dk_out.copy_(dk[..., :self.head_dim])
            dv_out.copy_(dv[..., :self.head_dim])
        return compiled

    def staged_gradients(self, dk: torch.Tensor, dv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """dK and dV as the Gluon pass stores them through TMA: the tensors themselves when TMA
        can address them (those the backward allocates like K and V, which the pass reads
        through TMA too), else contiguous buffers in q's dtype, padded to HEAD_DIM_PAD, copied
        (and cast) into them after the pass."""
        if all(t.dtype == self.dtype and tma_layout_ok(t) for t in (dk, dv)):
            return dk, dv
        shape = (*dk.shape[:3], self.head_dim_pad)  # in the inputs' dtype, as the descriptors store it
        return (torch.empty(shape, device=dk.device, dtype=self.dtype),
                torch.empty(shape, device=dv.device, dtype=self.dtype))


_SIDE_STREAMS: dict[tuple[int, int], "torch.cuda.Stream"] = {}


def _side_stream(main: "torch.cuda.Stream") -> "torch.cuda.Stream":
    """The side stream of the backward's dQ pass for calls on stream ``main`` (created on
    first use): one per caller stream, so a graph being captured on one stream never
    receives another caller's eager launches."""
    key = (main.device.index, main.cuda_stream)
    stream = _SIDE_STREAMS.get(key)
    if stream is None:
        stream = _SIDE_STREAMS[key] = torch.cuda.Stream(device=main.device)
    return stream


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


# ------------------------------------------------------------------ one call
_VARLEN = ("Q", "K", "V", "Out", "Lse", "CuSeqQ", "CuSeqK")
_GLUON_VARLEN = ("q_desc", "k_desc", "v_desc", "o_desc", "Out", "Lse", "CuSeqQ", "CuSeqK", "TileStart")  # + TileCounter (dynamic)


def varlen_config(*candidates: KernelConfig, gluon: bool = False) -> KernelConfig:
    """The first Q-outer Triton config among ``candidates`` (the dispatcher's choice, then the
    built-in Triton default) as a kernel that takes packed variable-length sequences: plain
    pointers, one program per tile (block pointers stay; TMA descriptors, persistent grids
    and warp specialization need per-launch bases). Neither Q-outer: 64x64 tiles. With
    ``gluon`` (a config the caller names), a Gluon config is taken as it is: its module has
    a varlen kernel of its own (rank-4 descriptors over the packed rows)."""
    if gluon and candidates and candidates[0].language == "gluon":
        return candidates[0]
    config = next((c for c in candidates if c.language == "triton" and c.loop_order == "q_outer"),
                  KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2))
    access = "pointer" if config.access == "tensor_desc" else config.access
    return config.with_(access=access, warp_specialize=False, persistent=0, tile_order="seq", fp8_pv="separate")


def run_varlen(config: KernelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
               cu_k: torch.Tensor, max_q: int, scale: float, causal: bool, out: torch.Tensor,
               lse: torch.Tensor | None, plan: "VarlenPlan | None" = None) -> "VarlenPlan | None":
    """Packed sequences (flash-attn's varlen layout): q (total_q, H, D), k/v (total_k, Hkv, D),
    sequence b in rows cu_q[b]..cu_q[b+1] (keys cu_k), validated by the caller; ``config``
    as :func:`varlen_config` gives it. LSE (H, total_q). One launch, no host synchronisation.
    Returns the plan it ran (``plan``, or a new one for this layout) for the next call."""
    if q.shape[0] == 0 or cu_q.numel() < 2 or max_q == 0:
        if lse is not None:
            lse.fill_(-math.inf)
        return plan
    check_interpretable(q)
    try:
        if plan is None:
            plan = VarlenPlan(config, q, k, v, cu_q, max_q, scale, causal, out, lse)
        plan(q, k, v, cu_q, cu_k, out, lse)
    except Exception as exc:
        failure = explain_launch_failure(config, exc)
        if failure is exc:
            raise
        raise failure from exc
    return plan


class VarlenPlan:
    """The variable-length kernel of ``config`` for one layout of packed q, k, v (and one
    batch size, longest sequence and total token count, which fix its grid and scalars);
    called with the tensors of each call (``launch`` and ``args`` are also what
    ahead-of-time compilation specialises on; a Gluon plan's launch also needs its
    ``tile_starts`` launch first, which calling the plan does). Kept by attention_varlen per layout: building it
    sends the kernel through Triton's JIT path, as the backward's plans showed (0.45 ms a
    call)."""

    __slots__ = ("launch", "descriptors", "config", "extra", "tile_starts")

    def __init__(self, config: KernelConfig, q, k, v, cu_q, max_q: int, scale: float, causal: bool, out,
                 lse) -> None:
        batch, heads, head_dim = cu_q.numel() - 1, q.shape[1], q.shape[2]
        kernel = load_module(config).KERNELS.get("varlen")
        if kernel is None:
            raise ConfigError("access", f"{config.name} has no variable-length kernel (see varlen_config)")
        head_dim_pad = max(16, triton.next_power_of_2(head_dim))
        self.config, self.descriptors, self.extra, self.tile_starts = config, None, (), None
        if config.language == "gluon":
            self.launch, self.descriptors = _gluon_varlen(config, kernel, q, k, v, cu_q, max_q, scale, causal, out,
                                                          lse, head_dim_pad)
            self.tile_starts = Launch(tile_starts, (1,), ("CuSeqQ", "TileStart"), {"B": batch, "H": heads},
                                      {"TILE_M": config.BLOCK_M * config.consumers, "TAIL_ROWS": config.BLOCK_M,
                                       "TAIL_HEADS": self.launch.flags["TAIL_HEADS"]}, {"num_warps": 4})
            return
        scalars: dict[str, Any] = {"H": heads, "GROUP": heads // k.shape[1], "MAX_N_Q": max_q, "TOTAL_Q": q.shape[0],
                                   "qk_scale": scale * LOG2E}
        for prefix, t in (("q", q), ("k", k), ("v", v), ("o", out)):  # packed: no batch stride
            scalars.update({f"stride_{prefix}b": 0, f"stride_{prefix}h": t.stride(1),
                            f"stride_{prefix}n": t.stride(0), f"stride_{prefix}d": t.stride(2)})
        fp8_capable = "FP8" in kernel.arg_names
        flags = {"HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim_pad, "IS_CAUSAL": causal, "EVEN_N": False,
                 "WRITE_LSE": lse is not None, "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32"}
        tensors = _VARLEN
        if fp8_capable:  # the same body as the dense kernel, its FP8 path compiled out
            scalars.update({f"stride_{p}{axis}": None for p in ("qs", "ks", "vs") for axis in "bhn"})
            scalars.update(Q_SCALE_BLOCK=None, K_SCALE_BLOCK=None)
            flags["FP8"] = False
            tensors = _VARLEN + _FP8_SCALES
            self.extra = _NO_SCALES
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if config.maxnreg:
            options["maxnreg"] = config.maxnreg
        grid = (triton.cdiv(max(max_q, 1), config.BLOCK_M * config.q_tiles) * max(batch, 1) * heads,)
        self.launch = Launch(kernel, grid, tensors, scalars, flags, options)

    def args(self, q, k, v, cu_q, cu_k, out, lse) -> tuple:
        if self.descriptors is None:
            return (q, k, v, out, lse, cu_q, cu_k, *self.extra)
        views = {name: t.unsqueeze(0).transpose(1, 2) for name, t in zip("qkvo", (q, k, v, out))}  # (1, heads, rows, D)
        starts = torch.empty(cu_q.numel(), dtype=torch.int32, device=q.device)  # filled by tile_starts
        return (*self.descriptors(**views), out, lse, cu_q, cu_k, starts, *_tile_counter(self.config, q.device))

    def __call__(self, q, k, v, cu_q, cu_k, out, lse) -> None:
        args = self.args(q, k, v, cu_q, cu_k, out, lse)
        if self.tile_starts is not None:
            self.tile_starts(cu_q, args[_GLUON_VARLEN.index("TileStart")])
        self.launch(*args)


def varlen_tail_heads(config: KernelConfig, group: int) -> int:
    """Query heads that share a sequence's last varlen tile when its rows fit one consumer
    warpgroup: one head per warpgroup (GQA: heads of one KV group read the same K/V), so the
    other warpgroups work on rows of their own instead of idling through the tile; 1 (no
    sharing) with one consumer or a group the consumers do not divide."""
    return config.consumers if config.consumers > 1 and group % config.consumers == 0 else 1


def _gluon_varlen(config: KernelConfig, kernel, q, k, v, cu_q, max_q: int, scale: float, causal: bool, out, lse,
                  head_dim_pad: int) -> tuple[Launch, Callable[..., tuple]]:
    """The Gluon module's varlen kernel: Q, K and V as rank-4 descriptors over (1, head,
    packed row, dim) views of the packed tensors (no copy), O through one too (a sequence's
    ragged last rows through a masked store). Its
    grid covers each sequence's own tiles (from the TileStart table the plan writes first,
    see kernels/tiles.py); the host knows only a bound on their number (every sequence at
    most one ragged tile, none longer than max_q), so programs past the real count exit."""
    batch, heads = cu_q.numel() - 1, q.shape[1]  # checked by the caller (kernels.checks.check_config)
    rows = config.BLOCK_M * config.consumers
    tiles = min(triton.cdiv(max(max_q, 1), rows) * batch, triton.cdiv(q.shape[0], rows) + batch) * heads
    grid = (min(tiles, _sm_count(q.device) * config.persistent),) if config.persistent else (max(tiles, 1),)
    group = heads // k.shape[1]
    mean_k = max(k.shape[0] // max(batch, 1), 1)  # L2 sections sized by the mean sequence's K/V
    scalars = {"H": heads, "GROUP": group, "B": batch,
               "SECTION": config.section or l2_section(q.device, max(batch, 1) * heads, group, mean_k, head_dim_pad,
                                                       q.element_size()),
               "TOTAL_Q": q.shape[0], "stride_on": out.stride(0), "stride_oh": out.stride(1), "qk_scale": scale * LOG2E}
    flags = {"HEAD_DIM": q.shape[2], "HEAD_DIM_PAD": head_dim_pad, "IS_CAUSAL": causal, "WRITE_LSE": lse is not None,
             "TAIL_HEADS": varlen_tail_heads(config, group), "D_REST": varlen_d_rest(q.shape[2], head_dim_pad)}
    launch = Launch(kernel, grid, _GLUON_VARLEN + (("TileCounter",) if config.dynamic else ()), scalars, flags,
                    {"num_warps": config.num_warps})
    return launch, _gluon_descriptors(q.dtype, head_dim_pad, {"q": config.BLOCK_M, "k": config.BLOCK_N,
                                                              "v": config.BLOCK_N, "o": config.BLOCK_M})


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


def allocate_outputs(q: torch.Tensor, problem: Problem, return_lse: bool):
    """Output in q's memory layout (a flash-attn (B, N, H, D) view stays one; FP8: bf16),
    fp32 LSE."""
    out = torch.empty_like(q, dtype=torch.bfloat16) if problem.is_fp8 else torch.empty_like(q)
    lse = None
    if return_lse:
        lse = torch.empty((problem.batch, problem.heads_q, problem.seqlen_q), device=q.device, dtype=torch.float32)
    return out, lse


def run(config: KernelConfig, problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
        out: torch.Tensor, lse: torch.Tensor | None, scales: tuple | None = None) -> None:
    """Launch ``config`` once on validated inputs, writing ``out`` (and ``lse``); FP8 inputs
    come with scales = (q_scale, k_scale, v_scale, block_q, block_k)."""
    if problem.is_empty:  # no rows to write, or softmax over no keys: SDPA's math path gives zeros
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
        return
    check_interpretable(q)
    try:
        prepare(config, q, k, v, out, lse, scale, problem.causal_offset, problem.causal, scales)(
            q, k, v, out, lse, scales)
    except Exception as exc:
        failure = explain_launch_failure(config, exc)
        if failure is exc:
            raise
        raise failure from exc


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

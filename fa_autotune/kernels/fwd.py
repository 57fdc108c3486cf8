"""The dense forward's launch plan: one function per loop order (FlashAttention-2 Q-outer,
Flash-Decoding split-KV, FlashAttention-1 KV-outer, the FlashAttention-3 Gluon kernel) gives
the launches of a config for one layout of q, k, v and out; :func:`prepare` wraps them in a
:class:`ForwardPlan` that later calls hand only tensors to."""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import triton

from ..errors import ConfigError
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from .launch import (_FP8_SCALES, _NO_SCALES, LOG2E, Launch, _gluon_descriptors, _sm_count, _tile_counter,
                     check_interpretable, ensure_allocator, explained, l2_section)
from .render import KernelModule, load_module

_Q_OUTER = ("Q", "K", "V", "Out", "Lse")
_SOURCES = ("Q16", "K16")  # FP8 with a sink tile: Q and K before quantization
_NO_SOURCES = (None, None)
_SINK_MERGE = ("Q16", "K16", "V", "Out", "LsePart", "Lse", "VScale")  # a warp-specialized kernel's sink tile
# That kernel's query rows per program (SINK_M) and warps: each program reloads the head's
# first BLOCK_N keys, so taller programs read them fewer times.
SINK_SHAPE = (64, 4)
_SPLIT_MAIN = ("Q", "K", "V", "OPart", "LsePart")
_SPLIT_COMBINE = ("OPart", "LsePart", "Out", "Lse")
_KV_OUTER = ("Q", "K", "V", "Out", "Lse", "AccScratch", "MScratch", "LScratch")
_GLUON = ("q_desc", "k_desc", "v_desc", "o_desc", "Lse")

Calls = Callable[..., list]  # (q, k, v, out, lse, scales) -> [(Launch, per-call tensors), ...]


class ForwardPlan:
    """A launch plan for one layout: call it with (q, k, v, out, lse[, scales]) to run every
    kernel of the variant (returns the compiled kernels); :meth:`launches` gives each launch
    with its per-call arguments."""

    __slots__ = ("_calls", "_tma")

    def __init__(self, calls: Calls, tma: bool) -> None:
        self._calls, self._tma = calls, tma

    def __call__(self, q, k, v, out, lse, scales=None, warmup: bool = False) -> list:
        if self._tma:
            ensure_allocator()
        return [launch(*tensors, warmup=warmup) for launch, tensors in self._calls(q, k, v, out, lse, scales)]

    def launches(self, q, k, v, out, lse, scales=None) -> list[tuple[Launch, tuple]]:
        return self._calls(q, k, v, out, lse, scales)


def prepare(config: KernelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor | None, sm_scale: float, causal_offset: int, is_causal: bool,
            scales: tuple | None = None) -> ForwardPlan:
    """The plan of ``config`` for tensors of these shapes, strides and dtypes (FP8 inputs with
    scales = Fp8Inputs.scales: descales, rows per scale, V's order, the sink tile's sources))."""
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
             "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
             "D_REST": d_rest(head_dim, head_dim_pad, q.element_size())}
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    family = _gluon if config.language == "gluon" else _FAMILIES[config.loop_order]
    calls = family(config, module, q, scalars, flags, options, scales, head_dim_pad)
    return ForwardPlan(calls, config.access == "tensor_desc")


WIDE_COLS = 64  # templates/attn_fwd_gluon.py.jinja's WIDE chunks: columns, chunks a row, keys per K/V half
WIDE_CHUNKS = 3
WIDE_KEYS = 64


def wide_steps(config: KernelConfig, head_dim: int, element_size: int) -> bool:
    """Whether the Gluon forward runs ``config`` with its WIDE layout: 128-key steps at head
    dims 129-192 in 16 bits, Q, K, V and O staged unpadded as three 64-column chunks and V in
    a ring of 64-key halves (templates/attn_fwd_gluon.py.jinja, _wide_attend). Padded to 256
    columns, such steps would need 328 KB of shared memory; chunked they take 216 KB at two
    stages, so one softmax round covers 128 keys where the padded kernel's covers 64."""
    return (config.language == "gluon" and config.loop_order == "q_outer" and config.BLOCK_N == 128
            and element_size == 2 and 128 < head_dim <= 192)


def d_rest(head_dim: int, head_dim_pad: int, element_size: int = 2) -> int:
    """The Gluon forward's split of a padded head dim: the width of a second part from column
    head_dim_pad / 2 on that covers the real columns (a power of two, at least one 16-wide
    k-step), where the two parts hold fewer columns than head_dim_pad; else 0 (one part). Q K^T
    then runs as two products and O accumulates in two parts, so the zero columns are never
    multiplied. Only where both parts start on a 128-byte swizzle row (16-bit: pads of 128
    and more; FP8, ``element_size`` 1: 256, with k-steps of 32) (D=80: 64 + 16, D=96: 64 +
    32, D=160: 128 + 32, D=192: 128 + 64)."""
    half = head_dim_pad // 2
    if half * element_size < 128 or head_dim <= half:
        return 0
    rest = max(32 // element_size, triton.next_power_of_2(head_dim - half))
    return rest if half + rest < head_dim_pad else 0


def q_regs_error(config: KernelConfig, head_dim: int, head_dim_pad: int, rest: int) -> ConfigError | None:
    """Where a ``q_regs`` config's Q cannot stay in registers: a kernel staging Q as one part
    past 128 columns (D=256, or a padded varlen kernel past D=128: ``rest`` 0) would hold 64
    registers a thread of Q beside the accumulator and spill in every step (sm_90 compiles:
    152-272 bytes of stack, local loads and stores in the step loops)."""
    if config.q_regs and head_dim_pad > 128 and not rest:
        return ConfigError("q_regs", f"Q in registers at head dim {head_dim} (staged as one {head_dim_pad}-column "
                           "part) would spill beside the accumulator: use q_regs=false")
    return None


def _q_outer(config, module: KernelModule, q, scalars, flags, options, scales, head_dim_pad):
    """FlashAttention-2: one program per Q tile (or a persistent grid looping over them);
    with one Q tile the kernel also takes FP8 inputs (FP8 flag, descales)."""
    kernel = module.KERNELS["main"]
    fp8_capable = "FP8" in kernel.arg_names
    sources = _sources(scales)
    if scales is not None and not fp8_capable:
        raise ConfigError("q_tiles", "FP8 inputs need q_tiles=1 (one Q descale per program)")
    if fp8_capable:  # the descales and the sink tile's 16-bit sources, or compile-time None
        _fp8_scalars(scalars, scales, sources)
        flags = dict(flags, FP8=fp8_flag(scales), SINK_TILE=sources[0] is not None)
        if flags["FP8"] == 2 and config.warp_specialize:
            raise ConfigError("warp_specialize", "Triton's warp specialization cannot compile the PV product's P "
                              "relabelled for V in the wgmma order: quantize with v_order='natural' for "
                              "warp-specialized configs")
    batch_heads = scalars["BH"]
    tiles = triton.cdiv(scalars["N_Q"], config.BLOCK_M * config.q_tiles) * batch_heads
    grid = (min(tiles, _sm_count(q.device) * config.persistent),) if config.persistent else (tiles,)
    main = Launch(kernel, grid, _Q_OUTER + (_FP8_SCALES + _SOURCES if fp8_capable else ()), scalars, flags, options)
    if "sink" in module.KERNELS and sources[0] is not None:
        # Warp-specialized: the main kernel skips the sink tile and writes its part's LSE; the
        # sink kernel scores that tile and merges it into the output.
        rows = scalars["N_Q"]
        main = Launch(kernel, grid, _Q_OUTER + _FP8_SCALES + _SOURCES, scalars, dict(flags, WRITE_LSE=True), options)
        sink = _sink_launch(module.KERNELS["sink"], scalars, flags)

        def calls(q, k, v, out, lse, scales):
            q16, k16 = _sources(scales)
            part = torch.empty((batch_heads, rows), device=q.device, dtype=torch.float32)
            return [(main, (q, k, v, out, part, *scales[:3], q16, k16)),
                    (sink, (q16, k16, v, out, part, lse, scales[2]))]
    elif fp8_capable:
        def calls(q, k, v, out, lse, scales):
            if scales is None:
                return [(main, (q, k, v, out, lse, *_NO_SCALES, *_NO_SOURCES))]
            return [(main, (q, k, v, out, lse, *scales[:3], *_sources(scales)))]
    else:
        def calls(q, k, v, out, lse, scales):
            return [(main, (q, k, v, out, lse))]

    return calls


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

    return calls


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

    return calls


def _gluon(config, module: KernelModule, q, scalars, flags, options, scales, head_dim_pad):
    """FlashAttention-3 in Gluon: programs walk tiles of ``consumers * BLOCK_M`` query rows of
    one (batch, head), one tile each or, with ``persistent``, one program per SM looping; the
    producer and consumer warpgroups fork inside the kernel (the launch has 4 warps). Q, K, V
    and O go in as rank-4 TMA descriptors over (batch, head, row, dim) with the tensors' own
    strides, encoded on the host for each call."""
    fp8 = scales is not None
    sources = _sources(scales)
    sink = sources[0] is not None
    _fp8_scalars(scalars, scales, sources)
    flags = dict(flags, FP8=fp8_flag(scales), SINK_TILE=sink)
    if sink:
        # The sink tile's kernel (the Triton family's, rendered for this key width) scores the
        # first BLOCK_N keys after this one, which reads the rest: keys shifted by BLOCK_N.
        merge = _sink_launch(load_module(_sink_config(config.BLOCK_N)).KERNELS["sink"], scalars, flags)
        scalars = dict(scalars, N_K=max(scalars["N_K"] - config.BLOCK_N, 0),
                       causal_offset=scalars["causal_offset"] - config.BLOCK_N)
        flags["WRITE_LSE"] = True
    wide = wide_steps(config, q.shape[-1], q.element_size())
    flags["WIDE"] = wide
    tiles = triton.cdiv(scalars["N_Q"], config.BLOCK_M * config.consumers) * scalars["BH"]
    grid = (min(tiles, _sm_count(q.device) * config.persistent),) if config.persistent else (tiles,)
    scalars["SECTION"] = config.section or l2_section(q.device, scalars["BH"], scalars["GROUP"], scalars["N_K"],
                                                      head_dim_pad, q.element_size(), config.dynamic)
    main = Launch(module.KERNELS["main"], grid, _GLUON + (("TileCounter",) if config.dynamic else ()) + _FP8_SCALES,
                  scalars, flags, {"num_warps": config.num_warps})
    if wide:  # column chunks of WIDE_COLS, K and V in 64-key halves
        descriptors = _gluon_descriptors(q.dtype, WIDE_COLS, {"q": config.BLOCK_M, "k": WIDE_KEYS, "v": WIDE_KEYS,
                                                              "o": config.BLOCK_M})
    else:
        descriptors = _gluon_descriptors(q.dtype, head_dim_pad, {"q": config.BLOCK_M, "k": config.BLOCK_N,
                                                                 "v": config.BLOCK_N, "o": config.BLOCK_M},
                                         transposed=frozenset({"v"}) if fp8 else frozenset())
    if sink:
        rows = scalars["N_Q"]

        def calls(q, k, v, out, lse, scales):
            part = torch.empty((scalars["BH"], rows), device=q.device, dtype=torch.float32)
            return [(main, (*descriptors(q=q, k=k, v=v, o=out), part, *_tile_counter(config, q.device), *scales[:3])),
                    (merge, (*_sources(scales), v, out, part, lse, scales[2]))]
    else:
        def calls(q, k, v, out, lse, scales):
            return [(main, (*descriptors(q=q, k=k, v=v, o=out), lse, *_tile_counter(config, q.device),
                            *(scales[:3] if scales is not None else _NO_SCALES)))]

    return calls


def fp8_flag(scales: tuple | None) -> int:
    """The kernels' FP8 flag for a launch's scales (Fp8Inputs.scales): 0 without FP8, 1 with
    V's keys in order, 2 with them in the wgmma order (the PV product's P relabelled alike)."""
    return 0 if scales is None else 2 if scales[5] is True else 1


def _sources(scales: tuple | None) -> tuple:
    """The sink tile's 16-bit (q, k) after Fp8Inputs.scales' six entries, or (None, None)."""
    return tuple(scales[6:8]) if scales is not None and len(scales) > 6 else _NO_SOURCES


def _fp8_scalars(scalars: dict[str, Any], scales: tuple | None, sources: tuple) -> None:
    """The descales' (b, h, n) strides and blocks and the sink tile's 16-bit sources' strides
    among a launch's scalars (compile-time None where absent)."""
    if scales is None:
        scalars.update({f"stride_{p}{axis}": None for p in ("qs", "ks", "vs") for axis in "bhn"})
        scalars.update(Q_SCALE_BLOCK=None, K_SCALE_BLOCK=None)
    else:
        for prefix, scale in zip(("qs", "ks", "vs"), scales[:3]):
            scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bhn"), scale.stride()))
        scalars.update(Q_SCALE_BLOCK=scales[3], K_SCALE_BLOCK=scales[4])
    for prefix, source in zip(("q16", "k16"), sources):
        strides = source.stride() if source is not None else (None,) * 4
        scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bhnd"), strides))


def _sink_config(block_n: int) -> KernelConfig:
    """A warp-specialized Triton config of BLOCK_N ``block_n``: its module holds the sink
    tile's kernel for that key width (what a Gluon FP8 kernel leaves to it)."""
    return KernelConfig(BLOCK_M=128, BLOCK_N=block_n, num_warps=4, num_stages=2, access="tensor_desc",
                        causal_mode="split", warp_specialize=True, persistent=1)


def _sink_launch(kernel, scalars: dict[str, Any], flags: dict[str, Any]) -> Launch:
    """The sink tile's kernel after a main kernel that skipped the first BLOCK_N keys and
    wrote its part's LSE: it scores those keys from the 16-bit q and k and merges them into
    the output by the LSE (SINK_SHAPE rows and warps per program)."""
    sink_m, sink_warps = SINK_SHAPE
    return Launch(kernel, (triton.cdiv(scalars["N_Q"], sink_m) * scalars["BH"],), _SINK_MERGE, scalars,
                  dict(flags, SINK_M=sink_m), {"num_warps": sink_warps, "num_stages": 1})


_FAMILIES = {"q_outer": _q_outer, "split_kv": _split_kv, "kv_outer": _kv_outer}


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
    explained(config, lambda: prepare(config, q, k, v, out, lse, scale, problem.causal_offset, problem.causal,
                                      scales)(q, k, v, out, lse, scales))()

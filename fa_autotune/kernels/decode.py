"""The KV-cache step's launch plan (``loop_order='decode'``): append, attend, combine."""
from __future__ import annotations

from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ..errors import ConfigError
from ..spec.config import KernelConfig
from ..spec.target import interpreter_active
from .checks import cache_tma_ok
from .launch import LOG2E, Launch, _sm_count
from .render import load_module

_DECODE = ("Q", "KCache", "VCache", "CacheSeqlens", "BlockTable", "SEQLEN", "Out", "Lse", "OPart", "LsePart",
           "KDescale", "VDescale")
_DECODE_COMBINE = ("OPart", "LsePart", "Out", "Lse")
_DECODE_UNITS = ("CacheSeqlens", "SEQLEN", "PairStart")  # a persistent (balanced) decode grid: the main kernel
# and the combine take PairStart after _DECODE's and _DECODE_COMBINE's tensors
_APPEND = ("KNew", "VNew", "KCache", "VCache", "CacheSeqlens", "BlockTable", "SEQLEN", "KDescale", "VDescale")
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def v_pairs(config: KernelConfig, v_cache: torch.Tensor, head_dim: int) -> int:
    """The decode kernel's V_PAIRS flag: an FP8 V cache read as 16-bit words of two columns
    (the template's `_v_pairs`) where the words line up: a pointer config, columns contiguous,
    every other stride and the data 16 bytes aligned, an even head dim above 16. 1 / 2: e4m3 /
    e5m2 by the packed cvt (CUDA sm_89+, and meta tensors: what compiling ahead of time for
    sm_90 builds); 3 / 4: by integer arithmetic (the interpreter); 0: as bytes."""
    code = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}.get(v_cache.dtype, 0)
    aligned = (v_cache.stride(-1) == 1 and all(st % 16 == 0 for st in v_cache.stride()[:-1])
               and v_cache.data_ptr() % 16 == 0)
    if not code or not aligned or head_dim % 2 or head_dim <= 16 or config.access == "tensor_desc":
        return 0
    if interpreter_active():
        return code + 2
    if v_cache.device.type == "cuda" and torch.cuda.get_device_capability(v_cache.device) < (8, 9):
        return 0
    return code


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
                 block_table: torch.Tensor | None, scale: float, causal: bool,
                 descales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        if config.loop_order != "decode":
            raise ConfigError("loop_order", f"{config.name} is not a KV-cache kernel; use loop_order='decode'")
        batch, n_q, heads, head_dim = q.shape
        heads_kv = k_cache.shape[2]
        group = heads // heads_kv
        head_dim_pad = max(16, triton.next_power_of_2(head_dim))
        if (k_cache.dtype in _FP8_MAX) != (descales is not None):
            raise ConfigError("config", "an FP8 cache needs its k and v descales, a 16-bit one none")
        if config.access == "tensor_desc" and not cache_tma_ok(k_cache, v_cache, block_table is not None):
            raise ConfigError("access", "TMA boxes cannot read this cache (paged, FP8, or a layout no descriptor "
                              "addresses); use access='pointer' (runtime.select.runnable_decode picks it)")
        # TMA (contiguous caches): a [1, BLOCK_N, 1, HEAD_DIM_PAD] box of the whole cache a step.
        self.box = [1, config.BLOCK_N, 1, head_dim_pad] if config.access == "tensor_desc" else None
        self.config = config
        module = load_module(config)
        tile_m = decode_tile_m(config, n_q * group)
        page_size = k_cache.shape[1] if block_table is not None else 0
        n_new = k_new.shape[1] if k_new is not None else 0
        scalars: dict[str, Any] = {"HKV": heads_kv, "GROUP": group, "N_Q": n_q, "N_NEW": n_new,
                                   "qk_scale": scale * LOG2E,
                                   "stride_btb": block_table.stride(0) if block_table is not None else 0,
                                   "FP8_MAX": _FP8_MAX.get(k_cache.dtype)}
        for prefix, descale in zip(("kd", "vd"), descales or (None, None)):  # (batch, heads_kv), any strides
            strides = descale.stride() if descale is not None else (None, None)
            scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bh"), strides))
        for prefix, t in (("q", q), ("k", k_cache), ("v", v_cache), ("o", out), ("nk", k_new), ("nv", v_new)):
            strides = t.stride() if t is not None else (0, 0, 0, 0)
            scalars.update(zip((f"stride_{prefix}{axis}" for axis in "bnhd"), strides))
        flags = {"HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim_pad, "IS_CAUSAL": causal, "WRITE_LSE": lse is not None,
                 "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32", "TILE_M": tile_m,
                 "PAGE_SIZE": page_size, "V_PAIRS": v_pairs(config, v_cache, head_dim)}
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

    def launches(self, q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, seqlen: int, out,
                 lse, k_descale=None, v_descale=None) -> list[tuple[Launch, tuple]]:
        """Each launch of one step with its per-call arguments."""
        calls = []
        if self.append is not None:
            calls.append((self.append, (k_new, v_new, k_cache, v_cache, cache_seqlens, block_table, seqlen,
                                        k_descale, v_descale)))
        o_part = lse_part = None
        if self.combine is not None:
            o_part = torch.empty((self.parts, self.head_dim_pad), device=q.device, dtype=torch.float32)
            lse_part = torch.empty((self.parts,), device=q.device, dtype=torch.float32)
        k_main, v_main = k_cache, v_cache
        if self.box is not None:
            k_main = TensorDescriptor(k_cache, list(k_cache.shape), list(k_cache.stride()), self.box)
            v_main = TensorDescriptor(v_cache, list(v_cache.shape), list(v_cache.stride()), self.box)
        main = (q, k_main, v_main, cache_seqlens, block_table, seqlen, out, lse, o_part, lse_part, k_descale, v_descale)
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
                 k_descale=None, v_descale=None, warmup: bool = False) -> list:
        return [launch(*args, warmup=warmup)
                for launch, args in self.launches(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, seqlen,
                                                  out, lse, k_descale, v_descale)]

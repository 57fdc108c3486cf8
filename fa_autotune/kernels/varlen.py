"""The variable-length (packed sequences) launch plan: the Triton Q-outer kernel's varlen
body, or a Gluon module's own varlen kernel with its tile table."""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import triton

from ..errors import ConfigError
from ..spec.config import KernelConfig
from .fwd import d_rest, q_regs_error, wide_steps
from .launch import (_FP8_SCALES, _NO_SCALES, LOG2E, Launch, _gluon_descriptors, _sm_count, _tile_counter,
                     check_interpretable, explained, l2_section)
from .render import load_module
from .tiles import tile_starts

_VARLEN = ("Q", "K", "V", "Out", "Lse", "CuSeqQ", "CuSeqK")
_GLUON_VARLEN = ("q_desc", "k_desc", "v_desc", "o_desc", "Out", "Lse", "CuSeqQ", "CuSeqK", "TileStart")  # + TileCounter (dynamic)


def varlen_d_rest(head_dim: int, head_dim_pad: int) -> int:
    """d_rest for the Gluon varlen kernel: the split Q K^T (D_REST below 64, as at D=80 and 96,
    whose varlen kernels ran the GPU tests), not the two-part accumulator, whose ragged-tile
    store has not run on a GPU yet (tests/kernels/test_gluon_gpu.py::test_wide_head_dims_varlen
    at D=192): such head dims run padded, as D=256 does."""
    rest = d_rest(head_dim, head_dim_pad)
    return rest if rest < 64 else 0


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

    def build_and_run() -> VarlenPlan:
        built = plan if plan is not None else VarlenPlan(config, q, k, v, cu_q, max_q, scale, causal, out, lse)
        built(q, k, v, cu_q, cu_k, out, lse)
        return built

    return explained(config, build_and_run)()


class VarlenPlan:
    """The variable-length kernel of ``config`` for one layout of packed q, k, v (and one
    batch size, longest sequence and total token count, which fix its grid and scalars);
    called with the tensors of each call (:meth:`launches`: a Gluon plan's tile table is
    written first, by ``tile_starts``). Kept by attention_varlen per layout: building it
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

    def launches(self, q, k, v, cu_q, cu_k, out, lse) -> list[tuple[Launch, tuple]]:
        if self.descriptors is None:
            return [(self.launch, (q, k, v, out, lse, cu_q, cu_k, *self.extra))]
        views = {name: t.unsqueeze(0).transpose(1, 2) for name, t in zip("qkvo", (q, k, v, out))}  # (1, heads, rows, D)
        starts = torch.empty(cu_q.numel(), dtype=torch.int32, device=q.device)  # filled by tile_starts
        return [(self.tile_starts, (cu_q, starts)),
                (self.launch, (*self.descriptors(**views), out, lse, cu_q, cu_k, starts,
                               *_tile_counter(self.config, q.device)))]

    def __call__(self, q, k, v, cu_q, cu_k, out, lse, warmup: bool = False) -> list:
        return [launch(*args, warmup=warmup) for launch, args in self.launches(q, k, v, cu_q, cu_k, out, lse)]


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
    if wide_steps(config, q.shape[2], q.element_size()):
        raise ConfigError("BLOCK_N", f"the Gluon varlen kernel stages tiles padded to {head_dim_pad} columns: at head "
                          f"dim {q.shape[2]} it takes 64-key steps (BLOCK_N=64); 128-key steps there are the dense "
                          f"kernel's (kernels.fwd.wide_steps)")
    error = q_regs_error(config, q.shape[2], head_dim_pad, varlen_d_rest(q.shape[2], head_dim_pad))
    if error:
        raise error
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

"""The backward's launch plan (``loop_order='backward'``): delta, dK/dV, dQ."""
from __future__ import annotations

from typing import Any

import torch
import triton

from ..errors import ConfigError
from ..spec.config import KernelConfig
from .checks import check_gluon_backward, tma_layout_ok
from .fwd import d_rest
from .gluon_bwd_wide import DQ_COLS
from .launch import LOG2E, Launch, _gluon_descriptors, _sm_count, _tile_counter, l2_section
from .render import load_module

_BWD_PRE = ("Out", "DOut", "Delta")
_BWD_DKDV = ("Q", "K", "V", "DOut", "Lse", "Delta", "DK", "DV", "DQAcc")
_BWD_DQ = ("Q", "K", "V", "DOut", "Lse", "Delta", "DQ")
_BWD_DKDV_GLUON = ("q_desc", "k_desc", "v_desc", "do_desc", "Lse", "Delta", "dk_desc", "dv_desc")
_DKV_ACC = ("DKAcc", "DVAcc")


def triton_backward(config: KernelConfig) -> KernelConfig:
    """A Gluon backward's delta preprocess and dQ pass: the Triton backward's kernels with
    the same tiles and dQ pass (the Gluon template holds the dK/dV pass only)."""
    dq_m, dq_n, dq_w, dq_s = config.dq_pass()
    return KernelConfig(loop_order="backward", BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, num_warps=4,
                        num_stages=2, causal_mode=config.causal_mode, dq_block_m=dq_m, dq_block_n=dq_n,
                        dq_warps=dq_w, dq_stages=dq_s)


def wide_backward_error(config: KernelConfig) -> ConfigError | None:
    """Why Gluon backward ``config`` cannot run past head dim 128, or None. There it is
    kernels.gluon_bwd_wide's kernel: dQ added up inside it, two consumers sharing a 64-key
    block, 64 query rows a step, a Q ring of at most 2 (208 KB of shared memory at D=256), a
    program per key block."""
    wanted = {"dq_atomic": True, "consumers": 2, "BLOCK_M": 64, "persistent": 0}
    for name, value in wanted.items():
        if getattr(config, name) != value:
            return ConfigError(name, f"past head dim 128 the Gluon backward runs with {name}={value!r} "
                                     f"(got {getattr(config, name)!r})")
    if config.num_stages > 2:
        return ConfigError("num_stages", f"past head dim 128 the Gluon backward's Q ring holds at most 2 tiles "
                                         f"(got {config.num_stages}: it would not fit in shared memory)")
    return None


class BackwardPlan:
    """Launch plan of a ``loop_order='backward'`` config for one layout of q, k, v (B, H, N, D)
    and their gradients: delta = rowsum(dO * O), then dK/dV (K/V tiles outer, GQA groups
    summed in registers), then dQ (Q tiles outer; every gradient written once), or with
    ``dq_atomic`` dQ added up in fp32 inside the dK/dV pass and cast into place after it. A
    Gluon config runs its own dK/dV pass (Q, K, V and dO through TMA descriptors built per
    call) beside the Triton preprocess and dQ pass of :func:`triton_backward`, or with
    ``dq_atomic`` beside the preprocess alone (its pass adds dQ up)."""

    __slots__ = ("config", "pre", "dkdv", "dq", "rows", "acc_shape", "dkv_shape", "head_dim", "head_dim_pad",
                 "dtype", "descriptors", "acc_descriptor")

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
        self.descriptors = self.acc_descriptor = self.dkv_shape = None
        self.config = config
        if gluon:
            # A GQA group over `splits` programs of `per_program` query heads each (dK and dV
            # added into fp32 buffers when there are several), else one program per group.
            group = heads // heads_kv
            per_program = triton.cdiv(group, min(config.group_split, group))
            splits = triton.cdiv(group, per_program)
            scalars.update(GPP=per_program, SPLITS=splits, BHK=batch * heads_kv * splits)
            wide = flags["HEAD_DIM_PAD"] > 128
            # S and dP skip a padded head dim's zero columns (D_REST: D=80, 96 and past 128)
            flags = dict(flags, ATOMIC_DKV=splits > 1, D_REST=d_rest(head_dim, flags["HEAD_DIM_PAD"]))
            if splits > 1:
                self.dkv_shape = (batch, heads_kv, n_k, flags["HEAD_DIM_PAD"])
            if wide and (error := wide_backward_error(config)) is not None:
                raise error
            grid = (triton.cdiv(n_k, config.BLOCK_N * (1 if wide else config.consumers)), batch * heads_kv * splits)
            if config.persistent:  # one program per SM walking the tiles
                grid = (min(grid[0] * grid[1], _sm_count(q.device)),)
            # A causal persistent grid's L2 sections (KV heads): the config's, else the rule's
            # (on a static grid the KV heads whose group's Q and dO fit in L2).
            scalars["SECTION"] = config.section or l2_section(q.device, batch * heads_kv * splits, 1,
                                                              n_q * per_program, flags["HEAD_DIM_PAD"],
                                                              q.element_size(), config.dynamic)
            self.dkdv = Launch(load_module(config).KERNELS["dkdv_wide" if wide else "dkdv"], grid,
                               _BWD_DKDV_GLUON + (("dq_desc",) if config.dq_atomic else ())
                               + (("TileCounter",) if config.dynamic else ()) + _DKV_ACC, scalars, flags,
                               {"num_warps": config.num_warps})
            d = flags["HEAD_DIM_PAD"]
            inputs = _gluon_descriptors(q.dtype, d, {"q": config.BLOCK_M, "k": config.BLOCK_N, "v": config.BLOCK_N,
                                                     "do": config.BLOCK_M})
            # dK and dV: stored whole by each consumer, or past D=128 a column half by each
            grads = _gluon_descriptors(q.dtype, d // 2 if wide else d, {"dk": config.BLOCK_N, "dv": config.BLOCK_N})
            self.descriptors = lambda q, k, v, do, dk, dv: inputs(q=q, k=k, v=v, do=do) + grads(dk=dk, dv=dv)
            if config.dq_atomic:  # dQ's fp32 buffer, added into by TMA bulk reduces
                # two consumers: half of the columns each (of 128-row steps half of the rows);
                # past D=128 chunks of DQ_COLS
                rows, cols = config.BLOCK_M, d
                if wide:
                    cols = DQ_COLS.value
                elif config.consumers == 2 and config.BLOCK_M == 128:
                    rows //= 2
                elif config.consumers == 2:
                    cols //= 2
                self.acc_descriptor = _gluon_descriptors(torch.float32, cols, {"dq": rows})
        else:
            self.dkdv = Launch(module.KERNELS["dkdv"], (triton.cdiv(n_k, config.BLOCK_N), batch * heads_kv),
                               _BWD_DKDV, scalars, flags, options)
        dq_m, _, dq_warps, dq_stages = config.dq_pass()
        self.dq = None if config.dq_atomic else Launch(
            module.KERNELS["dq"], (triton.cdiv(n_q, dq_m), batch * heads), _BWD_DQ, scalars, flags,
            {**options, "num_warps": dq_warps, "num_stages": dq_stages})
        self.rows = batch * heads * n_q
        # dQ's fp32 buffer: the Gluon passes add into it by TMA, whose boxes are clipped at the
        # buffer's edge, so it holds only the real columns (less to zero and a contiguous cast
        # into dQ); the Triton pass addresses HEAD_DIM_PAD columns.
        acc_cols = head_dim if gluon and head_dim % 4 == 0 else flags["HEAD_DIM_PAD"]
        self.acc_shape = (batch, heads, n_q, acc_cols) if config.dq_atomic else None
        self.head_dim_pad = flags["HEAD_DIM_PAD"]
        self.dtype = q.dtype
        self.head_dim = head_dim

    def launches(self, q, k, v, out, dout, lse, dq, dk, dv, acc=None, dkv_acc=None) -> list[tuple[Launch, tuple]]:
        """Each pass with its per-call arguments; ``acc``: dQ's fp32 buffer where the dK/dV
        pass adds dQ up, ``dkv_acc``: dK's and dV's where a GQA group is split over programs
        (zeroed by the caller; allocated uninitialized when None)."""
        if acc is None and self.acc_shape is not None:
            acc = torch.empty(self.acc_shape, device=q.device, dtype=torch.float32)
        if dkv_acc is None:
            dkv_acc = (None, None) if self.dkv_shape is None else \
                tuple(torch.empty(self.dkv_shape, device=q.device, dtype=torch.float32) for _ in range(2))
        delta = torch.empty((self.rows,), device=q.device, dtype=torch.float32)
        if self.descriptors is not None:  # dk and dv: TMA-storable (see staged_gradients)
            *descs, dk_desc, dv_desc = self.descriptors(q=q, k=k, v=v, do=dout, dk=dk, dv=dv)
            counter = _tile_counter(self.config, q.device)
            if self.dq is None:  # dQ added up inside the Gluon pass
                return [(self.pre, (out, dout, delta)), (self.dkdv, (*descs, lse, delta, dk_desc, dv_desc,
                                                                     *self.acc_descriptor(dq=acc), *counter, *dkv_acc))]
            return [(self.pre, (out, dout, delta)), (self.dkdv, (*descs, lse, delta, dk_desc, dv_desc, *counter,
                                                                 *dkv_acc)),
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
        dkv_acc = None if self.dkv_shape is None else \
            tuple(torch.zeros(self.dkv_shape, device=q.device, dtype=torch.float32) for _ in range(2))
        dk_out, dv_out = dk, dv
        if self.descriptors is not None:
            dk, dv = self.staged_gradients(dk, dv)
        calls = self.launches(q, k, v, out, dout, lse, dq, dk, dv, acc, dkv_acc)
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
        if dkv_acc is not None and not warmup:
            dk_out.copy_(dkv_acc[0][..., :self.head_dim])
            dv_out.copy_(dkv_acc[1][..., :self.head_dim])
            return compiled
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

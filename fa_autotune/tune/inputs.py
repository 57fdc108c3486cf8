"""Measurement inputs: built once per trial, shared by the correctness gate and the timing.

Fresh random data every trial (never zeros: they hide bugs). FP8 problems are judged on two
kinds of LLM-like activations (FP8_INPUT_KINDS: outlier channels, attention sinks), quantized
as the candidate's recipe says; the reference reads the unquantized inputs. Compiling needs only the layout
(:func:`fa_autotune.kernels.aot.example_inputs`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fp8.quantize import fmt_of, quantize_fp8, tile_blocks, v_order_for
from ..errors import ConfigError
from ..kernels.checks import check_config, check_fp8_scales
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.recipe import Fp8Recipe
from .reference import reference_attention

FP8_OUTLIER_CHANNELS = 4
FP8_OUTLIER_FACTOR = 20.0


def random_inputs(problem: Problem, device: str, seed: int | None = None):
    """Fresh normal q, k, v in (B, H, N, D) layout."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed())
    dtype = getattr(torch, problem.dtype)

    def one(heads: int, rows: int) -> torch.Tensor:
        shape = (problem.batch, heads, rows, problem.head_dim)
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    return one(problem.heads_q, problem.seqlen_q), one(problem.heads_kv, problem.seqlen_k), one(problem.heads_kv, problem.seqlen_k)


# What FP8 accuracy is judged on, each kind on its own inputs (together the sinks hide the
# outlier channels: every row attends to a sink): a recipe's error is the worst of them.
FP8_INPUT_KINDS = ("outliers", "sinks")
FP8_SINKS = 4  # the first keys of every head are attention sinks:
FP8_SINK_K = 40.0  # K this many times larger (scores up to ~160 against the rest's ~1)
FP8_SINK_V = 10.0  # V this many times larger


def fp8_source_inputs(problem: Problem, device: str, seed: int | None = None, kind: str = "outliers"):
    """What FP8 accuracy is judged on: float16 q, k, v (what callers quantize; the sink
    tile's product reads them) like LLM activations. ``outliers``: normal data (std 0.25)
    with FP8_OUTLIER_CHANNELS channels of Q and K FP8_OUTLIER_FACTOR times larger, what
    per-block scaling and incoherent processing are for; ``sinks``: normal data with the
    first FP8_SINKS keys' K and V FP8_SINK_K / FP8_SINK_V times larger, what the sink tile
    is for."""
    if kind not in FP8_INPUT_KINDS:
        raise ValueError(f"FP8 input kind {kind!r} is not one of {FP8_INPUT_KINDS}")
    q, k, v = random_inputs(problem.with_dtype("float32"), device, seed)
    if kind == "outliers":
        channels = torch.arange(FP8_OUTLIER_CHANNELS, device=device) * (problem.head_dim // FP8_OUTLIER_CHANNELS)
        q, k = q * 0.25, k * 0.25
        q[..., channels] *= FP8_OUTLIER_FACTOR
        k[..., channels] *= FP8_OUTLIER_FACTOR
    else:
        k[:, :, :FP8_SINKS] *= FP8_SINK_K
        v[:, :, :FP8_SINKS] *= FP8_SINK_V
    return tuple(t.to(torch.float16) for t in (q, k, v))


@dataclass(frozen=True, eq=False)
class TrialInputs:
    """What one trial's kernel and reference read: ``q, k, v`` (FP8: quantized, with
    ``scales``), ``reference`` the (unquantized) inputs the float32 reference takes."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scales: tuple | None
    reference: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    # KV-cache problems: q (B, Nq, Hq, D) and k, v the cache (contiguous, or pages in a
    # shuffled order behind ``block_table``), every sequence ``seqlen_k`` long (``lengths``,
    # on the device as attention_with_kvcache reads them); ``reference`` is dense (B, H, N, D).
    lengths: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    # Backward problems: the output gradient, and the forward's output and log-sum-exp the
    # backward kernels read (the float32 reference's, so a forward bug cannot hide there).
    dout: torch.Tensor | None = None
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None

    @classmethod
    def build(cls, config: KernelConfig, problem: Problem, device: str, seed: int | None = None,
              recipe: Fp8Recipe | None = None, kind: str = "outliers") -> "TrialInputs":
        """Fresh inputs for ``config`` on ``problem``, with ``config`` checked against them
        (a ConfigError names what it cannot run); FP8 inputs of ``kind`` (FP8_INPUT_KINDS)
        quantized as ``recipe`` says (default: Fp8Recipe())."""
        if problem.decode:
            if config.loop_order != "decode":
                raise ConfigError("loop_order", f"a KV-cache problem runs loop_order='decode' configs, not "
                                  f"{config.loop_order!r}")
            return cls.kv_cache(problem, device, seed)
        if problem.backward != (config.loop_order == "backward"):
            raise ConfigError("loop_order", "backward problems run loop_order='backward' configs, and only they do")
        if problem.backward:
            return cls.backward_inputs(problem, device, seed)
        if config.loop_order == "decode":
            raise ConfigError("loop_order", "loop_order='decode' runs KV-cache problems (attention_with_kvcache)")
        if not problem.is_fp8:
            q, k, v = random_inputs(problem, device, seed)
            check_config(config, problem, q, k, v)
            return cls(q, k, v, None, (q, k, v))
        source = fp8_source_inputs(problem, device, seed, kind)
        block_q, block_k = tile_blocks(config.BLOCK_M, config.BLOCK_N)
        recipe = recipe or Fp8Recipe()
        x = quantize_fp8(*source, scaling=recipe.scaling, hadamard=recipe.hadamard, fmt=fmt_of(problem.dtype),
                         block_q=block_q, block_k=block_k, sink_tile=recipe.sink_tile,
                         v_order=v_order_for(config.warp_specialize, problem.seqlen_k))
        check_config(config, problem, x.q, x.k, x.v)
        check_fp8_scales(config, x.q_scale, x.k_scale, x.v_scale, x.block_q, x.block_k)
        return cls(x.q, x.k, x.v, x.scales, tuple(t.float() for t in source))

    @classmethod
    def kv_cache(cls, problem: Problem, device: str, seed: int | None = None) -> "TrialInputs":
        """A KV cache holding ``seqlen_k`` keys per sequence and the dense copy the reference reads."""
        q, k, v = random_inputs(problem, device, seed)  # (B, H, N, D)
        lengths = torch.full((problem.batch,), problem.seqlen_k, device=device, dtype=torch.int32)
        q_cache = q.transpose(1, 2).contiguous()
        k_rows, v_rows = (t.transpose(1, 2).contiguous() for t in (k, v))  # (B, N, Hkv, D)
        page = problem.page_size
        if not page:
            return cls(q_cache, k_rows, v_rows, None, (q, k, v), lengths, None)
        per = -(-problem.seqlen_k // page)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed if seed is not None else torch.seed())
        order = torch.randperm(problem.batch * per, generator=gen, device=device)
        pages = []
        for rows in (k_rows, v_rows):
            padded = torch.zeros((problem.batch, per * page, problem.heads_kv, problem.head_dim), device=device,
                                 dtype=rows.dtype)
            padded[:, :problem.seqlen_k] = rows
            paged = torch.empty((problem.batch * per, page, problem.heads_kv, problem.head_dim), device=device,
                                dtype=rows.dtype)
            paged[order] = padded.reshape(problem.batch * per, page, problem.heads_kv, problem.head_dim)
            pages.append(paged)
        table = order.reshape(problem.batch, per).to(torch.int32)
        return cls(q_cache, pages[0], pages[1], None, (q, k, v), lengths, table)

    @classmethod
    def backward_inputs(cls, problem: Problem, device: str, seed: int | None = None) -> "TrialInputs":
        """q, k, v, an output gradient, and the forward's output and LSE in float32."""
        if problem.is_fp8:
            raise ConfigError("loop_order", "FP8 attention has no backward")
        q, k, v = random_inputs(problem, device, seed)
        out, lse = reference_attention(q, k, v, causal=problem.causal, causal_align=problem.causal_align)
        dout = torch.randn_like(q)
        return cls(q, k, v, None, (q, k, v), dout=dout, out=out.to(q.dtype), lse=lse)

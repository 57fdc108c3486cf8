"""Kernel families: which template a config renders and which of its parameters that template
reads (issue 40: one flat :class:`~fa_autotune.spec.config.KernelConfig` serves seven
kernels).

A config stays one record (its canonical JSON is the identity stored in databases and
exported files, and every stage from the search to the dispatcher passes the same type);
its family is a function of ``loop_order`` and ``language``, and each family names the
parameters its template reads and the ones it pins. Validation refuses a parameter that a
config's family does not read unless it holds its default: a knob that no kernel would
honour is an error naming the family, never a silent no-op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

_TILE = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "causal_mode")
_GLUON_TILE = ("BLOCK_M", "BLOCK_N", "num_stages", "causal_mode", "consumers", "consumer_regs", "persistent",
               "dynamic", "section")
_DQ_PASS = ("dq_atomic", "dq_block_m", "dq_block_n", "dq_warps", "dq_stages")


@dataclass(frozen=True)
class Family:
    """One kernel template's view of the config: ``name`` (the kernel names' prefix tells it
    too), ``template``, the ``parameters`` it reads, and ``pinned`` values of parameters it
    does not vary (its own schedule replaces them)."""

    name: str
    template: str
    summary: str
    parameters: tuple[str, ...]
    pinned: Mapping[str, Any] = field(default_factory=dict)


FAMILIES: dict[tuple[str, str], Family] = {
    ("q_outer", "triton"): Family(
        "fwd_q_outer", "attn_fwd_q_outer.py.jinja", "FlashAttention-2 forward: a program per Q tile (or a persistent "
        "grid), K/V streamed", _TILE + ("access", "warp_specialize", "q_tiles", "rescale_threshold", "exp2_poly",
                                         "persistent", "tile_order", "maxnreg", "fp8_pv")),
    ("kv_outer", "triton"): Family(
        "fwd_kv_outer", "attn_fwd_kv_outer.py.jinja", "FlashAttention-1 forward: K/V tiles outside, q_tiles Q tiles "
        "inside", _TILE + ("access", "q_tiles", "maxnreg", "fp8_pv")),
    ("split_kv", "triton"): Family(
        "fwd_split_kv", "attn_fwd_split_kv.py.jinja", "Flash-Decoding forward: the keys split over num_splits "
        "programs, merged after", _TILE + ("access", "num_splits", "maxnreg", "fp8_pv")),
    ("decode", "triton"): Family(
        "decode", "attn_decode.py.jinja", "KV-cache attention (contiguous or paged, FP8 caches): split or "
        "persistent over the cache", _TILE + ("access", "num_splits", "persistent", "maxnreg")),
    ("backward", "triton"): Family(
        "bwd", "attn_bwd.py.jinja", "Backward: a dK/dV pass over key tiles, dQ in its own pass or added with "
        "atomics", _TILE + ("maxnreg",) + _DQ_PASS, pinned={"access": "pointer"}),
    ("q_outer", "gluon"): Family(
        "fwd_gluon", "attn_fwd_gluon.py.jinja", "FlashAttention-3 forward (Hopper): a TMA producer, consumer "
        "warpgroups, overlap, ping-pong", _GLUON_TILE + ("overlap", "pingpong", "one_loop", "exp2_emu", "half_step",
                                                           "q_regs", "rescale_threshold"),
        pinned={"access": "tensor_desc", "num_warps": 4}),
    ("backward", "gluon"): Family(
        "bwd_gluon", "attn_bwd_gluon.py.jinja", "FlashAttention-3 backward (Hopper): dK/dV in consumer warpgroups, "
        "dQ added inside or in the Triton pass, GQA groups split", _GLUON_TILE + _DQ_PASS + ("group_split",),
        pinned={"access": "tensor_desc", "num_warps": 4}),
}
"""Every family, keyed by (loop_order, language)."""


def family_of(loop_order: str, language: str) -> Family | None:
    """The family of a config with this loop order and language, or None (no such kernel)."""
    return FAMILIES.get((loop_order, language))

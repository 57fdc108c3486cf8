"""The config that runs: one pure function of the problem, the layout of the caller's tensors
(:class:`~fa_autotune.kernels.checks.Layout`), the dispatcher's choice and the built-in
defaults. No tensors, no I/O, no exceptions raised to be caught: each candidate is judged by
:func:`~fa_autotune.kernels.checks.why_not`, and the first that can run is the answer."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..kernels.checks import Layout, why_not
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.recipe import default_recipe
from .dispatch import Choice


def runnable(config: KernelConfig, problem: Problem, layout: Layout) -> KernelConfig | None:
    """``config``, or the same tiles without TMA / warp specialization (and then without its
    persistent grid) where these tensors need that; None if none of them can run. A Gluon
    config has no such variants: it runs as it is or not at all."""
    if config.language == "gluon":
        return config if why_not(config, problem, layout) is None else None
    if config.access == "tensor_desc" and not layout.tma_ok:
        config = without_warp_specialization(config, access="block_ptr")
    for candidate in (config, without_warp_specialization(config)):
        if why_not(candidate, problem, layout) is None:
            return candidate
    return None


def without_warp_specialization(config: KernelConfig, **changes) -> KernelConfig:
    """The same tiles unspecialized (with ``changes``, in one step: a half-changed config may
    not validate); a persistent grid goes too, since it was chosen for the producer warps'
    overlap: the FP8 128x256 kernel ran at 0.38x on it without them
    (benchmarks/results/2026-11-30-h200-fp8-structure/results.md)."""
    if config.warp_specialize:
        changes.update(warp_specialize=False, persistent=0)
    return config.with_(**changes)


def for_fp8_cache(config: KernelConfig, problem: Problem) -> KernelConfig:
    """A dispatched KV-cache config (tuned on 16-bit caches) over an FP8 cache: 128-key steps,
    3 stages, 4 warps over pointers, its split count kept, where a tile of at most 64 query
    rows and D <= 128 leaves room (3 stages of 128 x 128). Each step then reads as many bytes
    as the 16-bit cache's 64-key step. On an H100 (32:8 heads, D 128) that ran at 1.49-1.74x
    the bf16 cache's speed against 1.02-1.73x for the 16-bit cache's config, on every
    contiguous and paged row (benchmarks/results/2026-12-05-h100-fp8-cache-and-sinks/)."""
    rows = problem.seqlen_q * problem.gqa_group
    if problem.head_dim_pad > 128 or rows > 64 or config.persistent:
        return config
    return config.with_(BLOCK_N=128, num_stages=3, num_warps=4, access="pointer")


def runnable_decode(config: KernelConfig, cache_tma: bool) -> KernelConfig:
    """A KV-cache config on its cache: the same tiles through pointers where TMA boxes cannot
    read the cache (``cache_tma`` False: pages, FP8, or a layout no descriptor addresses)."""
    if config.access == "tensor_desc" and not cache_tma:
        return config.with_(access="pointer")
    return config


def select(problem: Problem, layout: Layout, choice: Choice, defaults: Sequence[KernelConfig]) -> Choice:
    """The dispatcher's ``choice`` made runnable on ``layout`` (a borrowed config may not suit
    the tensors: TMA needs aligned rows, warp specialization no masking), else the first
    built-in default that is; where none can run, the :class:`ConfigError` of the last
    default (the most widely runnable), naming why."""
    usable = runnable(choice.config, problem, layout)
    if usable is not None:
        return replace(choice, config=usable)
    recipe = default_recipe(problem.is_fp8)
    for default in defaults:
        usable = runnable(default, problem, layout)
        if usable is not None:
            return Choice(usable, "default", None, float("inf"), "built-in", recipe)
    error = why_not(defaults[-1], problem, layout)
    if error is not None:
        raise error
    return Choice(defaults[-1], "default", None, float("inf"), "built-in", recipe)

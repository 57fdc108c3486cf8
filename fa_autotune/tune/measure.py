"""Correctness gate and timing: the two things every variant must pass through, on one
trial's :class:`~fa_autotune.tune.inputs.TrialInputs`.

Timing follows METHOD.md: CUDA events around the call (``triton.testing.do_bench``), L2
flushed between repetitions, median with the 20th/80th percentiles as spread. Outputs are
NaN-poisoned before a checked launch, so an element the kernel never writes fails.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ConfigError
from ..kernels.fwd import allocate_outputs
from ..kernels.launch import check_interpretable, resolve_scale
from ..kernels.plans import Bound, Operands, bind
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from .inputs import TrialInputs, random_inputs
from .reference import ErrorReport, compare, compare_all, reference_attention, reference_gradients


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float


def check_correct(config: KernelConfig, problem: Problem, inputs: TrialInputs) -> ErrorReport:
    """Run ``config`` once on ``inputs`` into a NaN-filled output; compare with float32
    attention on the same (for FP8: the unquantized) inputs."""
    check_interpretable(inputs.q)
    if problem.backward:
        grads = tuple(torch.full_like(t, float("nan")) for t in (inputs.q, inputs.k, inputs.v))
        _bound(config, problem, inputs, grads=grads).explained()
        refs = reference_gradients(inputs.q, inputs.k, inputs.v, inputs.dout, causal=problem.causal,
                                   causal_align=problem.causal_align)
        return compare_all(grads, refs)
    out, _ = allocate_outputs(inputs.q, problem, return_lse=False)
    out.fill_(float("nan"))
    if problem.is_empty:  # no kernel: attention() gives zeros (SDPA's math path does)
        out.zero_()
    else:
        _bound(config, problem, inputs, out=out).explained()
    if problem.decode:
        out = out.transpose(1, 2)  # (B, Nq, Hq, D) as the reference's (B, H, N, D)
    ref, _ = reference_attention(*inputs.reference, causal=problem.causal, scale=resolve_scale(None, problem.head_dim),
                                 causal_align=problem.causal_align)
    return compare(out, ref)


def _bound(config: KernelConfig, problem: Problem, inputs: TrialInputs, out: torch.Tensor | None = None,
           grads: tuple | None = None) -> Bound:
    """``config``'s plan on ``inputs`` writing ``out`` (backward: ``grads``, dq, dk, dv)."""
    return bind(config, problem, Operands(inputs.q, inputs.k, inputs.v, inputs.out if grads is not None else out,
                                          inputs.scales, inputs.lengths, inputs.block_table, inputs.dout,
                                          inputs.lse, grads))


def time_callable(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100, device: str = "cuda") -> Timing:
    """Median and 20/80 percentiles of ``fn`` in ms, L2 flushed before each repetition.

    On the CPU (Triton's interpreter) one wall-clock run stands in: such numbers time the
    interpreter, never a GPU (more runs would only make CPU tests slower), and are labelled
    so wherever they are shown.
    """
    if device == "cpu":
        start = time.perf_counter()
        fn()
        ms = (time.perf_counter() - start) * 1e3
        return Timing(ms, ms, ms)
    from triton.testing import do_bench

    median, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return Timing(float(median), float(p20), float(p80))


def time_config(config: KernelConfig, problem: Problem, inputs: TrialInputs, rep_ms: float = 100) -> Timing:
    """Time ``config``'s prepared launch on ``inputs``, as ``attention()`` runs it after its
    first call: output preallocated, FP8 inputs quantized beforehand."""
    check_interpretable(inputs.q)
    if problem.backward:
        grads = tuple(torch.empty_like(t) for t in (inputs.q, inputs.k, inputs.v))
        bound = _bound(config, problem, inputs, grads=grads)
    else:
        bound = _bound(config, problem, inputs, out=allocate_outputs(inputs.q, problem, return_lse=False)[0])
    return time_callable(bound.explained, rep_ms=rep_ms, device=inputs.q.device.type)


def peak_extra_bytes(fn: Callable[[], object]):
    """(result, peak GPU memory ``fn`` allocated beyond what was live before it)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


def sdpa_call(backend: str, problem: Problem, q, k, v):
    """SDPA restricted to one backend: (call, context factory that selects the backend)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    gqa = problem.heads_q != problem.heads_kv

    def call():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=problem.causal, enable_gqa=gqa)

    return call, (lambda: sdpa_kernel([chosen]))


def check_and_time_cudnn(problem: Problem, device: str, rep_ms: float, seed: int | None = None,
                         check: bool = True) -> tuple[Timing, ErrorReport | None]:
    """SDPA's cuDNN backend on fresh inputs of ``problem`` (the forward, or for a backward
    problem the gradients of a stored forward): the yardstick a tune reports its winners
    against, timed as :func:`time_config` times a kernel. ConfigError where cuDNN has no
    such attention (KV-cache steps, FP8, a causal mask aligned bottom-right on unequal
    lengths: SDPA's is_causal aligns top-left) or there is no GPU."""
    if device != "cuda":
        raise ConfigError("baseline", "SDPA's cuDNN backend runs on CUDA GPUs only")
    if problem.decode or problem.is_fp8:
        raise ConfigError("baseline", f"SDPA's cuDNN backend has no {'KV-cache' if problem.decode else 'FP8'} attention")
    if problem.causal and problem.causal_align == "bottom_right" and problem.seqlen_q != problem.seqlen_k:
        raise ConfigError("baseline", "SDPA's is_causal aligns the diagonal top-left")
    q, k, v = random_inputs(problem, device, seed)
    report = None
    if not problem.backward:
        call, context = sdpa_call("cudnn", problem, q, k, v)
        with context():
            if check:
                ref, _ = reference_attention(q, k, v, causal=problem.causal, causal_align=problem.causal_align)
                report = compare(call(), ref)
            return time_callable(call, rep_ms=rep_ms, device=device), report
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    dout = torch.randn_like(q)
    call, context = sdpa_call("cudnn", problem, *leaves)
    with context():
        out = call()

        def grads():
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)

        if check:
            report = compare_all(grads(), reference_gradients(q, k, v, dout, causal=problem.causal,
                                                              causal_align=problem.causal_align))
        return time_callable(grads, rep_ms=rep_ms, device=device), report

"""Correctness gate and timing: the two things every variant must pass through.

Timing follows METHOD.md: CUDA events around the call (``triton.testing.do_bench``), L2
flushed between repetitions, median with the 20th/80th percentiles as spread. Outputs are
NaN-poisoned before a checked launch, so an element the kernel never writes fails.
"""
from __future__ import annotations

import datetime as _dt
import platform
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .config import KernelConfig
from .launch import allocate_outputs, check_config, resolve_scale, run
from .problem import Problem
from .reference import ErrorReport, compare, reference_attention

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float


FP8_OUTLIER_CHANNELS = 4
FP8_OUTLIER_FACTOR = 20.0


def random_inputs(problem: Problem, device: str, seed: int | None = None):
    """Fresh normal q, k, v in (B, H, N, D) layout (never zeros: they hide bugs)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed())
    dtype = getattr(torch, problem.dtype)

    def one(heads: int, rows: int) -> "torch.Tensor":
        shape = (problem.batch, heads, rows, problem.head_dim)
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    return one(problem.heads_q, problem.seqlen_q), one(problem.heads_kv, problem.seqlen_k), one(problem.heads_kv, problem.seqlen_k)


def fp8_source_inputs(problem: Problem, device: str, seed: int | None = None):
    """What FP8 accuracy is judged on: float32 q, k, v like LLM activations, normal data
    (std 0.25) with FP8_OUTLIER_CHANNELS channels of Q and K FP8_OUTLIER_FACTOR times larger,
    the outliers that per-block scaling and incoherent processing are for."""
    import torch

    q, k, v = random_inputs(problem.with_dtype("float32"), device, seed)
    channels = torch.arange(FP8_OUTLIER_CHANNELS, device=device) * (problem.head_dim // FP8_OUTLIER_CHANNELS)
    q, k = q * 0.25, k * 0.25
    q[..., channels] *= FP8_OUTLIER_FACTOR
    k[..., channels] *= FP8_OUTLIER_FACTOR
    return q, k, v


def kernel_inputs(config: KernelConfig, problem: Problem, device: str, seed: int | None = None):
    """((q, k, v) the kernel reads, FP8 scales or None, (q, k, v) the reference reads), with
    ``config`` checked against them. FP8 problems quantize as the config's recipe says."""
    if not problem.is_fp8:
        q, k, v = random_inputs(problem, device, seed)
        check_config(config, problem, q, k, v)
        return (q, k, v), None, (q, k, v)
    from .launch import check_fp8_scales
    from .quantize import fmt_of, quantize_fp8, tile_blocks

    source = fp8_source_inputs(problem, device, seed)
    block_q, block_k = tile_blocks(config.BLOCK_M, config.BLOCK_N)
    x = quantize_fp8(*source, scaling=config.fp8_scaling, hadamard=config.fp8_hadamard, fmt=fmt_of(problem.dtype),
                     block_q=block_q, block_k=block_k)
    check_config(config, problem, x.q, x.k, x.v)
    check_fp8_scales(config, x.q_scale, x.k_scale, x.v_scale, x.block_q, x.block_k)
    return (x.q, x.k, x.v), x.scales, source


def check_config_correct(config: KernelConfig, problem: Problem, device: str, seed: int | None = None) -> ErrorReport:
    """Run ``config`` once on fresh inputs into a NaN-filled output; compare with fp32
    attention on the same (for FP8: the unquantized) inputs."""
    (q, k, v), scales, source = kernel_inputs(config, problem, device, seed)
    out, _ = allocate_outputs(q, problem, return_lse=False)
    out.fill_(float("nan"))
    scale = resolve_scale(None, problem.head_dim)
    run(config, problem, q, k, v, scale, out, None, scales)
    ref, _ = reference_attention(*source, causal=problem.causal, scale=scale, causal_align=problem.causal_align)
    return compare(out, ref)


def time_callable(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100, device: str = "cuda") -> Timing:
    """Median and 20/80 percentiles of ``fn`` in ms, L2 flushed before each repetition.

    On the CPU (Triton's interpreter) a few wall-clock runs stand in: such numbers time
    the interpreter, never a GPU, and are labelled so wherever they are shown.
    """
    if device == "cpu":
        import statistics
        import time

        fn()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        samples.sort()
        return Timing(statistics.median(samples), samples[0], samples[-1])
    from triton.testing import do_bench

    median, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return Timing(float(median), float(p20), float(p80))


def time_config(config: KernelConfig, problem: Problem, device: str = "cuda", rep_ms: float = 100) -> Timing:
    """Time ``config`` on ``problem`` (outputs preallocated, as the kernel alone costs; FP8
    inputs quantized beforehand)."""
    (q, k, v), scales, _ = kernel_inputs(config, problem, device)
    out, _ = allocate_outputs(q, problem, return_lse=False)
    scale = resolve_scale(None, problem.head_dim)
    return time_callable(lambda: run(config, problem, q, k, v, scale, out, None, scales), rep_ms=rep_ms,
                         device=device)


def peak_extra_bytes(fn: Callable[[], object]):
    """(result, peak GPU memory ``fn`` allocated beyond what was live before it)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


def tflops(problem: Problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0


def environment() -> dict:
    """Date, GPU and software versions: what every committed result must carry."""
    import torch
    import triton

    from . import __version__
    from .codegen import template_hash

    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "fa_autotune": __version__,
        "template_hash": template_hash(),
    }
    if torch.cuda.is_available():
        from .target import detect_gpu

        gpu = detect_gpu(0)
        info.update(gpu=gpu.name, capability=gpu.capability, sm_count=gpu.sm_count, memory_mb=gpu.memory_mb,
                    driver=gpu.driver)
    return info


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None

"""The tuner's compile step, run in a pool ahead of the device: configs that cannot compile
or fit stop here, before the GPU is touched.

On a GPU host it compiles through Triton's JIT with the exact specialisation the timing run
will use (so that run finds it in Triton's cache); without a GPU, ahead of time for the
target architecture.
"""
from __future__ import annotations

import time

import torch

from ..errors import ConfigError
from ..kernels.aot import HOPPER, CompileResult, KernelReport, compile_error_message, compile_variant, \
    compiler_prints_kept
from ..kernels.checks import check_config, check_fp8_scales
from ..kernels.plans import bind, example
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.recipe import Fp8Recipe


def compile_for_tuning(config: KernelConfig, problem: Problem, capability: tuple[int, int] = HOPPER,
                       recipe: Fp8Recipe | None = None) -> CompileResult:
    """Compile ``config`` for ``problem`` (FP8: on inputs quantized as ``recipe`` says);
    failures come back as statuses, never raised."""
    if not torch.cuda.is_available():
        return compile_variant(config, problem, capability, recipe=recipe)
    return _warm_jit(config, problem, recipe)


def _warm_jit(config: KernelConfig, problem: Problem, recipe: Fp8Recipe | None) -> CompileResult:
    start = time.perf_counter()
    try:  # the timing run's layout (FP8: V sequence-contiguous, descales), no data needed
        x = example(config, problem, "cuda", recipe=recipe)
        if not (problem.decode or problem.backward):
            check_config(config, problem, x.q, x.k, x.v)
            if x.scales is not None:
                check_fp8_scales(config, *x.scales[:5])  # descales and blocks (the sink tile's sources follow)
        with compiler_prints_kept():  # a compile worker's own stdout
            kernels = bind(config, problem, x)(warmup=True)
    except ConfigError as exc:
        return CompileResult(config, "invalid_config", time.perf_counter() - start, (), str(exc))
    except Exception as exc:  # compiler failures are data for the tuner
        status = "out_of_resources" if type(exc).__name__ == "OutOfResources" else "compile_error"
        return CompileResult(config, status, time.perf_counter() - start, (), compile_error_message(exc))
    limit = getattr(torch.cuda.get_device_properties(x.q.device), "shared_memory_per_block_optin", 232448)
    reports = tuple(KernelReport(kernel.name, int(kernel.metadata.shared), "wgmma" in kernel.asm.get("ptx", ""),
                                 kernel.asm.get("ptx", "").count("\n")) for kernel in kernels)
    too_big = [r for r in reports if r.shared_bytes > limit]
    if too_big:
        return CompileResult(config, "out_of_resources", time.perf_counter() - start, reports,
                             f"{too_big[0].kernel} needs {too_big[0].shared_bytes} bytes of shared memory, limit {limit}")
    return CompileResult(config, "ok", time.perf_counter() - start, reports)

"""Compile rendered variants for a GPU architecture without a GPU.

Triton lowers a kernel for any target it knows (``GPUTarget("cuda", 90, 32)`` is Hopper)
on a machine with no GPU at all. The tuner uses this to compile in a process pool and to
prune variants that cannot fit (shared memory) before the GPU is touched; CI uses it to
prove every variant family compiles to wgmma code that fits an H100/H200.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterable

from .codegen import interpreter_active, load_module
from .config import KernelConfig
from .errors import FaAutotuneError
from .problem import Problem

HOPPER = (9, 0)
# Largest dynamic shared memory one block may use, per compute capability (bytes).
SHARED_MEMORY_LIMIT = {(9, 0): 232448, (8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (10, 0): 232448}
_POINTERS = {"Q", "K", "V", "Out"}
_FP32_POINTERS = {"Lse", "OPart", "LsePart", "AccScratch", "MScratch", "LScratch", "QScale", "KScale", "VScale"}
_TRITON_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "fp8e4nv",
                 "float8_e5m2": "fp8e5"}
FP8_BLOCK = 128  # rows per descale that AOT compiles assume (quantize_fp8's default)


@dataclass(frozen=True)
class KernelReport:
    """What compiling one kernel of a variant produced."""

    kernel: str
    shared_bytes: int
    uses_wgmma: bool
    ptx_lines: int
    mma: tuple[str, ...] = ()  # distinct wgmma shapes and operand types, e.g. "m64n128k32.f32.e4m3.e4m3"


@dataclass(frozen=True)
class CompileResult:
    """Outcome of compiling every kernel of a variant for one problem and architecture."""

    config: KernelConfig
    status: str  # "ok", "out_of_resources" or "compile_error"
    seconds: float
    kernels: tuple[KernelReport, ...] = ()
    error: str = ""

    @property
    def shared_bytes(self) -> int:
        return max((k.shared_bytes for k in self.kernels), default=0)

    @property
    def uses_wgmma(self) -> bool:
        return any(k.uses_wgmma for k in self.kernels)


def _int_args(problem: Problem, config: KernelConfig) -> dict[str, int]:
    """Integer arguments of a launch on contiguous (B, H, N, D) tensors."""
    d, hq, hk, nq, nk = problem.head_dim, problem.heads_q, problem.heads_kv, problem.seqlen_q, problem.seqlen_k
    values = {"H": hq, "GROUP": problem.gqa_group, "N_Q": nq, "N_K": nk, "causal_offset": problem.causal_offset,
              "BH": problem.batch * hq}
    for prefix, heads, rows in (("q", hq, nq), ("k", hk, nk), ("v", hk, nk), ("o", hq, nq)):
        values.update({f"stride_{prefix}b": heads * rows * d, f"stride_{prefix}h": rows * d,
                       f"stride_{prefix}n": d, f"stride_{prefix}d": 1})
    values["N_Q_PAD"] = -(-nq // config.BLOCK_M) * config.BLOCK_M
    if problem.is_fp8:  # per-block descales, (B, H, blocks) contiguous; V stored sequence-contiguous
        for prefix, heads, rows in (("qs", hq, nq), ("ks", hk, nk), ("vs", hk, nk)):
            blocks = -(-rows // FP8_BLOCK)
            values.update({f"stride_{prefix}b": heads * blocks, f"stride_{prefix}h": blocks, f"stride_{prefix}n": 1})
        values.update({"stride_vn": 1, "stride_vd": nk, "Q_SCALE_BLOCK": FP8_BLOCK, "K_SCALE_BLOCK": FP8_BLOCK})
    return values


def _signature(fn, problem: Problem, config: KernelConfig, constexprs: dict) -> tuple[dict, dict, dict]:
    """Signature, constexprs and attributes specialised the way Triton's JIT would for a
    contiguous launch: ints equal to 1 become constants, multiples of 16 are marked so."""
    dtype = _TRITON_TYPES[problem.dtype]
    ints = _int_args(problem, config)
    signature, consts, attrs = {}, dict(constexprs), {}
    for index, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in _POINTERS or name in _FP32_POINTERS:
            signature[name] = f"*{dtype}" if name in _POINTERS else "*fp32"
            if name == "Out" and problem.is_fp8:
                signature[name] = "*bf16"
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale":
            signature[name] = "fp32"
        elif ints.get(name) == 1:
            signature[name] = "constexpr"
            consts[name] = 1
        else:
            signature[name] = "i32"
            if ints.get(name, 1) % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, consts, attrs


def _problem_constexprs(problem: Problem, config: KernelConfig) -> dict:
    return {
        "HEAD_DIM": problem.head_dim,
        "HEAD_DIM_PAD": problem.head_dim_pad,
        "IS_CAUSAL": problem.causal,
        "EVEN_N": problem.seqlen_k % config.BLOCK_N == 0,
        "WRITE_LSE": False,
        "DOT_PRECISION": "ieee" if problem.dtype == "float32" else "tf32",
    }


def _kernels(module, config: KernelConfig, problem: Problem) -> list:
    if problem.is_fp8:
        return [getattr(module, config.name + "_fp8")]
    names = [config.name] + ([config.name + "_combine"] if config.loop_order == "split_kv" else [])
    return [getattr(module, n) for n in names]


def compile_variant(config: KernelConfig, problem: Problem, capability: tuple[int, int] = HOPPER) -> CompileResult:
    """Compile every kernel of ``config`` for ``problem`` on ``capability``; never raises for
    a kernel that fails, it reports the failure as a status."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if interpreter_active():
        raise FaAutotuneError("ahead-of-time compilation needs TRITON_INTERPRET unset (use compile_many)")
    start = time.perf_counter()
    module = load_module(config)
    reports = []
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    limit = SHARED_MEMORY_LIMIT.get(capability, 101376)
    for fn in _kernels(module, config, problem):
        wanted = {k: v for k, v in _problem_constexprs(problem, config).items() if k in fn.arg_names}
        signature, consts, attrs = _signature(fn, problem, config, wanted)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if config.maxnreg:
            options["maxnreg"] = config.maxnreg
        try:
            compiled = triton.compile(ASTSource(fn, signature, consts, attrs), target=target, options=options)
        except Exception as exc:  # compiler failures are data for the tuner
            message = str(exc).strip().splitlines()
            return CompileResult(config, "compile_error", time.perf_counter() - start, tuple(reports),
                                 message[-1] if message else type(exc).__name__)
        ptx = compiled.asm.get("ptx", "")
        reports.append(KernelReport(fn.__name__, int(compiled.metadata.shared), "wgmma" in ptx, ptx.count("\n"),
                                    _mma_kinds(ptx)))
        if compiled.metadata.shared > limit:
            return CompileResult(config, "out_of_resources", time.perf_counter() - start, tuple(reports),
                                 f"{fn.__name__} needs {compiled.metadata.shared} bytes of shared memory, limit {limit}")
    return CompileResult(config, "ok", time.perf_counter() - start, tuple(reports))


def _mma_kinds(ptx: str) -> tuple[str, ...]:
    import re

    return tuple(sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.([\w.]+)", ptx))))


def compile_for_tuning(config: KernelConfig, problem: Problem, capability: tuple[int, int] = HOPPER) -> CompileResult:
    """The tuner's compile step: on a GPU host, compile through Triton's JIT with the exact
    specialisation the timing run will use (so that run finds it in Triton's cache);
    without a GPU, compile ahead of time for ``capability``."""
    import torch

    if not torch.cuda.is_available():
        return compile_variant(config, problem, capability)
    return _warm_jit(config, problem)


def _warm_jit(config: KernelConfig, problem: Problem) -> CompileResult:
    import torch

    from .bench import kernel_inputs
    from .errors import ConfigError
    from .launch import allocate_outputs, resolve_scale

    start = time.perf_counter()
    try:  # the timing run's inputs (FP8: quantized, V sequence-contiguous, with scales)
        (q, k, v), scales, _ = kernel_inputs(config, problem, "cuda", seed=0)
        out, _ = allocate_outputs(q, problem, return_lse=False)
        kernels = load_module(config).launch(q, k, v, out, None, resolve_scale(None, problem.head_dim),
                                             problem.causal_offset, problem.causal, warmup=True, scales=scales)
    except ConfigError as exc:
        return CompileResult(config, "invalid_config", time.perf_counter() - start, (), str(exc))
    except Exception as exc:  # compiler failures are data for the tuner
        lines = str(exc).strip().splitlines()
        status = "out_of_resources" if type(exc).__name__ == "OutOfResources" else "compile_error"
        return CompileResult(config, status, time.perf_counter() - start, (), lines[-1] if lines else type(exc).__name__)
    limit = getattr(torch.cuda.get_device_properties(q.device), "shared_memory_per_block_optin", 232448)
    reports = tuple(KernelReport(kernel.name, int(kernel.metadata.shared), "wgmma" in kernel.asm.get("ptx", ""),
                                 kernel.asm.get("ptx", "").count("\n")) for kernel in kernels)
    too_big = [r for r in reports if r.shared_bytes > limit]
    if too_big:
        return CompileResult(config, "out_of_resources", time.perf_counter() - start, reports,
                             f"{too_big[0].kernel} needs {too_big[0].shared_bytes} bytes of shared memory, limit {limit}")
    return CompileResult(config, "ok", time.perf_counter() - start, reports)


def _worker_init() -> None:
    """Compiled mode, and MLIR's crash reproducers (written straight to fd 2) kept out of
    the user's terminal: a failed compile is reported as a status with its message."""
    os.environ.pop("TRITON_INTERPRET", None)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


def _compile_job(job: tuple[KernelConfig, Problem, tuple[int, int]]) -> CompileResult:
    return compile_variant(*job)


def compile_many(
    configs: Iterable[KernelConfig], problem: Problem, capability: tuple[int, int] = HOPPER, jobs: int | None = None
) -> list[CompileResult]:
    """Compile many variants in a pool of fresh worker processes (never interpreted)."""
    import multiprocessing

    configs = list(configs)
    workers = max(1, min(jobs or os.cpu_count() or 1, len(configs)))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_init) as pool:
        return list(pool.map(_compile_job, [(c, problem, capability) for c in configs]))

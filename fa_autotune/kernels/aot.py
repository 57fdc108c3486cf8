"""Compile rendered variants for a GPU architecture without a GPU.

Triton lowers a kernel for any target it knows (``GPUTarget("cuda", 90, 32)`` is Hopper)
on a machine with no GPU at all. The tuner uses this to compile in a process pool and to
prune variants that cannot fit (shared memory) before the GPU is touched; CI uses it to
prove every variant family compiles to wgmma code that fits an H100/H200.

The arguments compiled for are the plan's own (:meth:`~fa_autotune.kernels.plans.Bound.launches`
on uninitialized tensors of the problem's layout), specialised the way Triton's JIT
specialises a launch: integers equal to 1 become constants, multiples of 16 and tensor
pointers are marked 16-divisible, None is a constant.
"""
from __future__ import annotations

import collections
import contextlib
import io
import multiprocessing
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from ..errors import ConfigError, FaAutotuneError
from ..processes import compiler_init
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.recipe import Fp8Recipe
from ..spec.target import interpreter_active
from .checks import Layout, check_fp8_scales, why_not
from .launch import Launch
from .plans import bind, example

HOPPER = (9, 0)
# Largest dynamic shared memory one block may use, per compute capability (bytes).
SHARED_MEMORY_LIMIT = {(9, 0): 232448, (8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (10, 0): 232448}
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32",
                 torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5", torch.int8: "i8"}


@dataclass(frozen=True)
class KernelReport:
    """What compiling one kernel of a variant produced."""

    kernel: str
    shared_bytes: int
    uses_wgmma: bool
    ptx_lines: int
    mma: tuple[str, ...] = ()  # distinct wgmma shapes and operand types, e.g. "m64n128k32.f32.e4m3.e4m3"
    instructions: tuple[tuple[str, int], ...] = ()  # PTX counts of the instructions in INSTRUCTIONS
    setmaxnreg: tuple[str, ...] = ()  # register budgets the partitions set, e.g. ("dec 24", "inc 240")
    registers: int | None = None  # per thread, as ptxas allotted them (None: cuobjdump missing)
    stack_bytes: int | None = None  # local stack per thread: nonzero means ptxas spilled registers
    sass: str = ""  # the disassembly, when asked for (compile_variant(..., sass=True))
    # hardware named barriers the PTX syncs or arrives on, as (id, thread count; 0: the whole
    # CTA) pairs, an id held in a register as -1: Triton's own (warp specialization takes the
    # lowest ids) and a ping-pong variant's turns (one per consumer warpgroup, 256 threads each),
    # which must not collide
    named_barriers: tuple[tuple[int, int], ...] = ()

    @property
    def step_loop_local_memory(self) -> int | None:
        """Local loads and stores (spill traffic) inside the innermost loops that issue wgmma
        (the K/V steps: HGMMA, QGMMA for FP8 operands), where a spill costs on every step;
        None without the SASS. A small stack used only outside those loops costs once per tile."""
        if not self.sass:
            return None
        loops = [ops for _, _, ops in sass_loops(self.sass, innermost=True) if ops["HGMMA"] or ops["QGMMA"]]
        return sum(ops["LDL"] + ops["STL"] for ops in loops) if loops else None


@dataclass(frozen=True)
class CompileResult:
    """Outcome of compiling every kernel of a variant for one problem and architecture."""

    config: KernelConfig
    status: str  # "ok", "invalid_config", "out_of_resources" or "compile_error"
    seconds: float
    kernels: tuple[KernelReport, ...] = ()
    error: str = ""

    @property
    def shared_bytes(self) -> int:
        return max((k.shared_bytes for k in self.kernels), default=0)

    @property
    def uses_wgmma(self) -> bool:
        return any(k.uses_wgmma for k in self.kernels)


def _specialize(launch: Launch, args: tuple) -> tuple[dict, dict, dict]:
    """Signature, constants and attributes of ``launch`` called with ``args``, as Triton's
    JIT would specialise them (tensors fresh from the allocator are 16-byte aligned)."""
    signature: dict[str, str] = {}
    consts: dict[str, Any] = {}
    attrs: dict[tuple, list] = {}
    names = launch.kernel.arg_names
    unspecialized = set(getattr(launch.kernel, "do_not_specialize", ()) or ())
    for index, (name, arg) in enumerate(zip(names, args)):
        if name in unspecialized or index in unspecialized:  # e.g. a length that changes every call
            signature[name] = "i32" if isinstance(arg, int) and -2**31 <= arg < 2**31 else "i64"
        elif arg is None or (isinstance(arg, int) and not isinstance(arg, bool) and arg == 1):
            signature[name], consts[name] = "constexpr", arg
        elif isinstance(arg, GluonTensorDescriptor):  # as Triton's JIT spells a host-side descriptor
            signature[name] = f"tensordesc<{_TRITON_TYPES[arg.base.dtype]}{list(arg.block_shape)},{arg.layout!r}>"
        elif isinstance(arg, TensorDescriptor):  # a Triton kernel's host-side descriptor (no layout)
            signature[name] = f"tensordesc<{_TRITON_TYPES[arg.base.dtype]}{list(arg.block_shape)}>"
        elif isinstance(arg, torch.Tensor):
            signature[name] = f"*{_TRITON_TYPES[arg.dtype]}"
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(arg, bool):
            signature[name] = "u1"
        elif isinstance(arg, int):
            signature[name] = "i32" if -2**31 <= arg < 2**31 else "i64"
            if arg % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(arg, float):
            signature[name] = "fp32"
        else:
            raise FaAutotuneError(f"cannot compile {name}={arg!r} ahead of time")
    for name in names[len(args):]:
        signature[name], consts[name] = "constexpr", launch.flags[name]
    return signature, consts, attrs


def compile_variant(config: KernelConfig, problem: Problem, capability: tuple[int, int] = HOPPER,
                    sass: bool = False, recipe: Fp8Recipe | None = None) -> CompileResult:
    """Compile every kernel of ``config`` for ``problem`` on ``capability``; never raises for
    a kernel that fails, it reports the failure as a status. ``sass``: keep each kernel's
    disassembly in its report (for instruction counts per loop; the tuner does not need it).
    ``recipe``: an FP8 problem's, whose descales the launch reads (default: Fp8Recipe())."""
    if interpreter_active():
        raise FaAutotuneError("ahead-of-time compilation needs TRITON_INTERPRET unset (use compile_many)")
    start = time.perf_counter()
    try:
        x = example(config, problem, "meta", recipe=recipe)
        if not (problem.decode or problem.backward):  # the rules a launch on this GPU would check first
            layout = replace(Layout.of(problem, x.q, x.k, x.v), device="cuda", capability=capability)
            error = why_not(config, problem, layout)
            if error is not None:
                raise error
            if x.scales is not None:
                check_fp8_scales(config, *x.scales[:5])
        launches = bind(config, problem, x).launches()
    except ConfigError as exc:  # the config cannot run this problem's layout at all
        return CompileResult(config, "invalid_config", time.perf_counter() - start, (), str(exc))
    reports = []
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    limit = SHARED_MEMORY_LIMIT.get(capability, 101376)
    for launch, args in launches:
        fn = launch.kernel
        signature, consts, attrs = _specialize(launch, args)
        try:
            source = (GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource)(fn, signature, consts, attrs)
            with compiler_prints_kept():
                compiled = triton.compile(source, target=target, options=launch.options)
        except Exception as exc:  # compiler failures are data for the tuner
            return CompileResult(config, "compile_error", time.perf_counter() - start, tuple(reports),
                                 compile_error_message(exc))
        ptx = compiled.asm.get("ptx", "")
        registers, stack = resource_usage(compiled.asm.get("cubin", b""))
        reports.append(KernelReport(fn.__name__, int(compiled.metadata.shared), "wgmma" in ptx, ptx.count("\n"),
                                    _mma_kinds(ptx), instruction_counts(ptx), _setmaxnreg(ptx), registers, stack,
                                    disassemble(compiled.asm.get("cubin", b"")) if sass else "",
                                    named_barriers(ptx)))
        if compiled.metadata.shared > limit:
            return CompileResult(config, "out_of_resources", time.perf_counter() - start, tuple(reports),
                                 f"{fn.__name__} needs {compiled.metadata.shared} bytes of shared memory, limit {limit}")
    return CompileResult(config, "ok", time.perf_counter() - start, tuple(reports))


# What proves a Hopper variant uses the hardware it was written for.
INSTRUCTIONS = ("wgmma.mma_async", "setmaxnreg", "cp.async.bulk.tensor", "mbarrier.try_wait", "mbarrier.arrive",
                "tensormap.replace", "cp.async.cg.shared.global", "atom.global", "cp.reduce.async.bulk.tensor",
                "add.rm.ftz.f32",  # exp2 by polynomial's floor (KernelConfig.exp2_emu)
                "cp.async.bulk.tensor.4d.global.shared",  # TMA stores (of the rank-4 views), not loads
                "bar.arrive",  # a named barrier passed without waiting (the ping-pong turns)
                "vote.sync.any.pred", "bra.uni KEPT")  # a warp's vote to skip a rescale, its branches (rescale_threshold)


def named_barriers(ptx: str) -> tuple[tuple[int, int], ...]:
    found = re.findall(r"\b(?:bar|barrier)\.(?:sync|arrive|red\.\w+)(?:\.aligned)?\s+(%?\w+)\s*(?:,\s*(\d+))?", ptx)
    return tuple(sorted({(int(i) if i.isdigit() else -1, int(n) if n else 0) for i, n in found}))


def instruction_counts(ptx: str) -> tuple[tuple[str, int], ...]:
    return tuple((name, ptx.count(name)) for name in INSTRUCTIONS)


_CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """Registers and stack bytes per thread of a cubin, read with the cuobjdump Triton ships
    (a stack means spilled registers: FlashAttention's accumulators must stay in registers).
    (None, None) where cuobjdump is missing or cannot read it."""
    if not cubin or not _CUOBJDUMP.exists():
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            result = subprocess.run([str(_CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None, None
    match = re.search(r"REG:(\d+) STACK:(\d+)", result.stdout)
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin ("" where cuobjdump is missing or cannot read it)."""
    if not cubin or not _CUOBJDUMP.exists():
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            return subprocess.run([str(_CUOBJDUMP), "-sass", f.name], capture_output=True, text=True,
                                  timeout=120).stdout
        except (OSError, subprocess.SubprocessError):
            return ""


def sass_loops(sass: str, innermost: bool = False) -> list[tuple[int, int, collections.Counter]]:
    """(first address, last address, opcode counts) of every loop in a SASS listing (the
    body of each backward branch); ``innermost``: only loops holding no other loop."""
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", sass, re.M)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    spans = []
    for i, (address, text) in enumerate(ins):
        branch = re.search(r"BRA.*0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address and int(branch.group(1), 16) in index:
            spans.append((index[int(branch.group(1), 16)], i))
    if innermost:
        spans = [(s, e) for s, e in spans if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in spans)]
    return [(ins[s][0], ins[e][0],
             collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for _, t in ins[s:e + 1]))
            for s, e in spans]


def _setmaxnreg(ptx: str) -> tuple[str, ...]:
    return tuple(f"{kind} {regs}" for kind, regs in re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))


def _mma_kinds(ptx: str) -> tuple[str, ...]:
    return tuple(sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.([\w.]+)", ptx))))


def compile_error_message(exc: BaseException) -> str:
    """One line for a failed compile: the innermost cause (Triton chains a CompilationError per
    inlined function) as `Type: message`, its last line not a source caret; for ptxas, its
    first error line that says why (its last line is the repro command)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip() and set(line.strip()) != {"^"}]
    where = next((line for line in lines if line.startswith("at ") and line.endswith(":")), "")
    reasons = [line for line in lines if re.match(r"ptxas\b.*\b(fatal|error)\s*:", line)]
    ptxas = next((line for line in reasons if "assembly aborted" not in line), reasons[0] if reasons else "")
    text = ptxas or (lines[-1] if lines and lines[-1] != where else "")
    return " ".join(part for part in (type(exc).__name__, where, text) if part)


@contextlib.contextmanager
def compiler_prints_kept() -> Iterator[io.StringIO]:
    """Hold what Triton prints while it compiles and drop it if the compile fails: on a
    failed ptxas run it prints the kernel's whole PTX (thousands of lines, "please share the
    reproducer") before it raises, and the tuner reports the failure as a status with
    compile_error_message's line. A compile that succeeds prints what it printed (dumps a
    user asked for), after it; a failed one too when TRITON_DUMP_PTXAS_LOG asks for ptxas's
    output. Swaps sys.stdout, so only for compile workers and other single-purpose processes."""
    kept = io.StringIO()
    try:
        with contextlib.redirect_stdout(kept):
            yield kept
    except BaseException:
        if triton.knobs.nvidia.dump_ptxas_log:
            print(kept.getvalue(), end="")
        raise
    print(kept.getvalue(), end="")


def _compile_job(job: tuple[KernelConfig, Problem, tuple[int, int], bool, Fp8Recipe | None]) -> CompileResult:
    return compile_variant(*job)


_POOLS: dict[int, ProcessPoolExecutor] = {}


def compile_many(
    configs: Iterable[KernelConfig], problem: Problem, capability: tuple[int, int] = HOPPER, jobs: int | None = None,
    sass: bool = False, recipe: Fp8Recipe | None = None,
) -> list[CompileResult]:
    """Compile many variants in a pool of worker processes (never interpreted), kept for the
    next call with as many workers: a worker starts in seconds (it imports torch and Triton
    afresh), a compile takes about one. A pool a crashed worker broke is dropped. ``recipe``
    as :func:`compile_variant` takes it, for every variant."""
    configs = list(configs)
    workers = max(1, min(jobs or os.cpu_count() or 1, len(configs)))
    pool = _POOLS.get(workers)
    if pool is None:
        pool = _POOLS[workers] = ProcessPoolExecutor(max_workers=workers,
                                                     mp_context=multiprocessing.get_context("spawn"),
                                                     initializer=compiler_init, initargs=(os.getpid(),))
    try:
        return list(pool.map(_compile_job, [(c, problem, capability, sass, recipe) for c in configs]))
    except BrokenProcessPool:
        _POOLS.pop(workers, None)
        pool.shutdown(wait=False, cancel_futures=True)
        raise

"""Checks and timings in a child process that can die without taking the search with it.

A variant that hangs, faults or corrupts the CUDA context only costs its own trial: the
parent waits with a timeout, kills the child on a hang or crash, records the status and
starts a fresh child for the next trial.
"""
from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError, KernelCompileError, KernelResourceError
from ..processes import device_server
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.recipe import Fp8Recipe
from .inputs import FP8_INPUT_KINDS, TrialInputs
from .measure import check_and_time_cudnn, check_correct, time_config
from .reference import worst


@dataclass(frozen=True)
class Job:
    config: KernelConfig | None  # None: time the ``baseline`` instead
    problem: Problem
    rep_ms: float = 50.0
    seed: int | None = None
    check: bool = True  # re-timing rounds after the first skip the correctness gate
    baseline: str | None = None  # "cudnn": SDPA's cuDNN backend, the yardstick a tune reports against
    recipe: Fp8Recipe | None = None  # FP8 problems: how the trial's inputs are quantized


# An FP8 result this far from float32 is broken, not merely coarse; within it, the error is
# the search's second objective, and a caller's budget filters the stored results (so a
# measurement stays reusable whatever budget a later tune names).
FP8_SANITY = 0.5


def _classify(exc: BaseException) -> str:
    if isinstance(exc, KernelResourceError):
        return "out_of_resources"
    if isinstance(exc, KernelCompileError):
        return "compile_error"
    if isinstance(exc, ConfigError):
        return "invalid_config"
    return "crashed"


def execute(job: Job, device: str) -> dict[str, Any]:
    """Correctness gate, then timing, on one set of fresh inputs; never raises."""
    start = time.perf_counter()
    try:
        result: dict[str, Any] = {}
        if job.baseline is not None:
            return _execute_baseline(job, device, start)
        inputs = TrialInputs.build(job.config, job.problem, device, job.seed, job.recipe)
        report = check_correct(job.config, job.problem, inputs) if job.check else None
        if report is not None and job.problem.is_fp8:  # judged on every kind of input: the worst counts
            for kind in FP8_INPUT_KINDS[1:]:
                other = TrialInputs.build(job.config, job.problem, device, job.seed, job.recipe, kind)
                report = worst(report, check_correct(job.config, job.problem, other))
        if report is not None:
            result = {"max_abs_error": report.max_abs if report.finite else None,
                      "rel_error": report.rel if report.finite else None}
        limit = FP8_SANITY if job.problem.is_fp8 else None
        if report is not None and not report.passes(job.problem.dtype, limit):
            why = "output has NaN/Inf" if not report.finite else f"relative error {report.rel:.2e} over tolerance"
            return dict(result, status="wrong_result", message=why, seconds=time.perf_counter() - start)
        timing = time_config(job.config, job.problem, inputs, rep_ms=job.rep_ms)
        return dict(result, status="ok", median_ms=timing.median_ms, p20_ms=timing.p20_ms, p80_ms=timing.p80_ms,
                    message="", seconds=time.perf_counter() - start)
    except Exception as exc:  # every failure is a status
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        if _classify(exc) == "crashed":
            message += "\n" + "".join(traceback.format_exception(exc)[-3:])
        return {"status": _classify(exc), "message": message[:2000], "seconds": time.perf_counter() - start}


def _execute_baseline(job: Job, device: str, start: float) -> dict[str, Any]:
    if job.baseline != "cudnn":
        raise ConfigError("baseline", f"no baseline named {job.baseline!r}")
    timing, report = check_and_time_cudnn(job.problem, device, job.rep_ms, job.seed, job.check)
    if report is not None and not report.passes(job.problem.dtype):
        return {"status": "wrong_result", "message": "SDPA's cuDNN backend disagrees with the float32 reference",
                "seconds": time.perf_counter() - start}
    return {"status": "ok", "median_ms": timing.median_ms, "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms,
            "message": "", "seconds": time.perf_counter() - start}


# What the device worker runs, by name: the child imports it only after choosing Triton's mode.
WORK = f"{__name__}:{execute.__name__}"


class DeviceWorker:
    """One child process that runs jobs in order; restarted after a timeout or crash."""

    def __init__(self, interpret: bool, server: Callable[..., None] | None = None, work: str = WORK) -> None:
        self.interpret = interpret
        self._server = server or device_server  # tests substitute a misbehaving one
        self._work = work  # "package.module:function", called as work(job, device)
        self._context = multiprocessing.get_context("spawn")
        self._process = None
        self._conn = None
        self.restarts = 0

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=self._server,
                                             args=(child, self.interpret, os.getpid(), self._work), daemon=True)
        self._process.start()
        child.close()
        self._conn = parent

    def run(self, job: Job, timeout: float) -> dict[str, Any]:
        if self._process is None or not self._process.is_alive():
            self._start()
        start = time.perf_counter()
        try:
            self._conn.send(job)
            # The first job of a fresh child also pays for importing torch and compiling.
            if not self._conn.poll(timeout):
                self._kill()
                return {"status": "timeout", "message": f"no answer within {timeout:.0f} s",
                        "seconds": time.perf_counter() - start}
            result = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            if self._process:  # the pipe closes a moment before the exit code is known
                self._process.join(timeout=5)
            code = self._process.exitcode if self._process else None
            self._kill()
            return {"status": "crashed", "message": f"worker died ({type(exc).__name__}, exit code {code})",
                    "seconds": time.perf_counter() - start}
        if result["status"] == "crashed":
            self._kill()  # a CUDA fault poisons the context: start clean
        return result

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=10)
            self.restarts += 1
        self._process = None
        self._conn = None

    def close(self) -> None:
        if self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
                self._process.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
            if self._process.is_alive():
                self._process.kill()
        self._process = None

    def __enter__(self) -> "DeviceWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

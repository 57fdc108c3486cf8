"""A hung or crashing trial costs only itself: the worker is killed and replaced."""
from __future__ import annotations

from fa_autotune.config import KernelConfig
from fa_autotune.problem import Problem
from fa_autotune.worker import DeviceWorker, Job
from helpers import crashing_server, hanging_server

JOB = Job(KernelConfig(BLOCK_M=16, BLOCK_N=16), Problem(1, 1, 1, 16, 16, 16, "float16"), rep_ms=1)


def test_timeout_kills_and_restarts():
    with DeviceWorker(interpret=True, server=hanging_server) as worker:
        result = worker.run(JOB, timeout=3)
        assert result["status"] == "timeout" and worker.restarts == 1
        assert worker.run(JOB, timeout=3)["status"] == "timeout"  # a fresh worker took the next job
        assert worker.restarts == 2


def test_crash_is_a_status_not_an_exception():
    with DeviceWorker(interpret=True, server=crashing_server) as worker:
        result = worker.run(JOB, timeout=60)
        assert result["status"] == "crashed" and "exit code 3" in result["message"]


def test_real_worker_checks_and_times():
    with DeviceWorker(interpret=True) as worker:
        result = worker.run(JOB, timeout=300)
    assert result["status"] == "ok" and result["median_ms"] > 0 and result["rel_error"] < 1e-2

"""A hung or crashing trial costs only itself: the worker is killed and replaced."""
from __future__ import annotations

from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.worker import DeviceWorker, Job
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


def test_a_trial_builds_its_inputs_once(monkeypatch):
    """The correctness gate and the timing read the same inputs, built (random data, FP8
    quantization) once per trial."""
    from fa_autotune.tune import inputs, worker
    from fa_autotune.tune.measure import Timing

    built, timed = [], []
    original = inputs.TrialInputs.build.__func__

    def counting_build(cls, *args, **kwargs):
        built.append(original(cls, *args, **kwargs))
        return built[-1]

    def recording_timing(config, problem, trial_inputs, rep_ms):
        timed.append(trial_inputs)
        return Timing(1.0, 1.0, 1.0)

    monkeypatch.setattr(inputs.TrialInputs, "build", classmethod(counting_build))
    monkeypatch.setattr(worker, "time_config", recording_timing)
    result = worker.execute(JOB, "cpu")
    assert result["status"] == "ok" and result["rel_error"] < 1e-2
    assert len(built) == 1 and timed == built


def test_the_child_resolves_its_work_by_name_after_choosing_the_mode(monkeypatch):
    """The device child imports the work it is named only once Triton's mode is set: the
    interpreter's variable is there (and gone for a GPU worker, whatever the parent has)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for interpret, device, mode in ((True, "cpu", "1"), (False, "cuda", None)):
        with DeviceWorker(interpret=interpret, work="helpers:mode_probe") as worker:
            result = worker.run(JOB, timeout=120)
        assert result == {"status": "ok", "device": device, "interpret": mode}, result


def test_work_names_are_module_and_function():
    import pytest

    from fa_autotune.processes import resolve
    from fa_autotune.tune import worker

    assert worker.WORK == "fa_autotune.tune.worker:execute" and resolve(worker.WORK) is worker.execute
    with pytest.raises(ValueError, match="package.module:function"):
        resolve("fa_autotune.tune.worker.execute")



def test_fp8_trials_are_judged_on_outliers_and_on_sinks(monkeypatch):
    """An FP8 trial's error is the worst over the kinds of input (FP8_INPUT_KINDS): a recipe
    without the sink tile is off by more than 0.1 on the sink inputs, which its outlier
    inputs alone would not show; with it, both stay within 0.06. The timing reads the
    first kind's inputs."""
    from fa_autotune import Fp8Recipe
    from fa_autotune.tune import measure, worker

    checked, timed = [], []

    def recording_check(config, problem, trial_inputs):
        checked.append(measure.check_correct(config, problem, trial_inputs))
        return checked[-1]

    def recording_timing(config, problem, trial_inputs, rep_ms):
        timed.append(trial_inputs)
        return measure.Timing(1.0, 1.0, 1.0)

    monkeypatch.setattr(worker, "check_correct", recording_check)
    monkeypatch.setattr(worker, "time_config", recording_timing)
    problem = Problem(1, 2, 2, 96, 128, 64, "float8_e4m3fn")
    results = {}
    for sink in (False, True):
        checked.clear()
        results[sink] = worker.execute(Job(KernelConfig(BLOCK_M=32, BLOCK_N=32), problem, seed=3,
                                           recipe=Fp8Recipe(sink_tile=sink)), "cpu")
        outliers, sinks = (report.rel for report in checked)
        assert results[sink]["status"] == "ok" and results[sink]["rel_error"] == max(outliers, sinks)
        assert outliers <= 0.06 and (sinks <= 0.06 if sink else sinks > 0.1), (sink, outliers, sinks)
    assert len(timed) == 2 and all(t.reference[2][:, :, :4].abs().max() < 8 for t in timed)  # V without sinks (x10)

"""Trials that all count: the sampler proposes only configs that pass the space's
constraints and the static shared-memory check, and a tune on a Hopper target (compiled
ahead of time here, timed by a stand-in worker) spends no trial on an invalid config or
one that does not fit; the end of a tune reports its winner against the config a fresh
install runs and against SDPA's cuDNN backend."""
from __future__ import annotations

import hashlib

import optuna
import pytest

from fa_autotune.kernels import resources
from fa_autotune.kernels.aot import HOPPER
from fa_autotune.spec.candidate import Candidate
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.space import load_space
from fa_autotune.spec.target import GpuInfo, detect_software
from fa_autotune.store import connect
from fa_autotune.tune import search
from fa_autotune.tune.progress import summary_line, summary_total
from fa_autotune.tune.sampling import Feasible, make_sampler
from fa_autotune.tune.search import TuneOptions, Tuner

SPACE = load_space("fwd").for_arch("sm90")
H200 = GpuInfo("NVIDIA H200", "9.0", 132, 143000, "1")
D128 = Problem(4, 16, 16, 4096, 4096, 128, "float16", causal=False)
D256 = Problem(2, 16, 16, 8192, 8192, 256, "bfloat16", causal=False)
SHIPPED = KernelConfig.from_mapping({"language": "gluon", "BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 2,
                                     "access": "tensor_desc", "consumers": 2, "consumer_regs": 240})


def _feasible(problem: Problem) -> tuple[Feasible, set[Candidate]]:
    rows = [(p, c) for p, c in SPACE.grid_rows(problem) if resources.fits(c.config, problem, HOPPER)]
    return Feasible([p for p, _ in rows]), {c for _, c in rows}


def _proposals(problem: Problem, sampler, trials: int = 30) -> list[Candidate | None]:
    """What ``sampler`` proposes over ``trials`` trials told a made-up time (None: a
    proposal the space's constraints or config checks refuse)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler)
    out = []
    for _ in range(trials):
        trial = study.ask()
        params = SPACE.suggest(lambda name, choices: trial.suggest_categorical(name, list(choices)), problem)
        try:
            config = Candidate.from_mapping(params, problem.is_fp8)
        except Exception:
            config = None
        if config is None or SPACE.violated(params, problem) is not None:
            out.append(None)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        out.append(config)
        study.tell(trial, int(hashlib.sha256(config.canonical_json().encode()).hexdigest()[:6], 16) / 1e6)
    return out


@pytest.mark.parametrize("problem", [D128, D256], ids=["d128", "d256"])
@pytest.mark.parametrize("name", ["tpe", "random"])
def test_proposals_stay_within_the_feasible_configs(problem, name):
    feasible, configs = _feasible(problem)
    assert 0 < len(configs) < len(SPACE.grid(problem))  # the static check does rule configs out
    proposed = _proposals(problem, make_sampler(name, 5, feasible))
    assert all(c in configs for c in proposed), [c and c.name for c in proposed if c not in configs]
    assert len(set(proposed)) >= 10  # still a search, not one config over and over
    # the same sampler without the filter spends many of its trials on configs that cannot run
    plain = _proposals(problem, make_sampler(name, 5))
    assert sum(c not in configs for c in plain) >= 6


def test_a_value_drawn_for_a_parameter_a_config_does_not_ask_for_rules_nothing_out():
    feasible = Feasible([{"language": "triton", "num_warps": 8}, {"language": "gluon", "consumers": 3}])
    assert feasible.consistent({"language": "gluon", "num_warps": 4})  # num_warps is not a Gluon choice
    assert not feasible.consistent({"language": "triton", "num_warps": 4})
    assert [r["language"] for r in feasible.narrow({"consumers": 2})] == ["triton"]


class _StandIn:
    """The device worker, without a device: every job passes, timed by a hash of the config;
    SDPA's cuDNN (the baseline job) takes 1 ms."""

    def __init__(self, *args, **kwargs):
        self.jobs = []

    def run(self, job, timeout):
        self.jobs.append(job)
        if job.baseline == "cudnn":
            ms = 1.0
        else:
            ms = 0.5 + int(hashlib.sha256(job.config.canonical_json().encode()).hexdigest()[:6], 16) / 2**24
        return {"status": "ok", "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "max_abs_error": 0.0, "rel_error": 0.0,
                "message": ""}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_a_hopper_tune_spends_no_trial_on_configs_that_cannot_run(tmp_path, kernel_cache, monkeypatch):
    """Compiled ahead of time for sm_90 as on a GPU host without one: every trial of the
    study compiles and fits, and the summary compares the winner with the baseline config
    and cuDNN from the same rounds."""
    monkeypatch.setattr(search, "DeviceWorker", _StandIn)
    problem = Problem(1, 2, 2, 512, 512, 128, "float16", causal=False)
    shipped = Candidate(SHIPPED)
    tuner = Tuner(connect(f"sqlite:///{tmp_path / 'db.sqlite'}"), load_space("fwd"), H200, detect_software(),
                  TuneOptions(trials=10, jobs=2, seed=1, warm_start=False),
                  baseline=lambda p, gpu: (shipped, "shipped"))
    (outcome,) = tuner.tune([problem])
    assert outcome.statuses.get("invalid_config", 0) == 0
    assert outcome.statuses.get("out_of_resources", 0) == 0
    assert outcome.statuses["ok"] >= 9 and outcome.trials == 10
    assert outcome.baseline_source == "shipped" and outcome.baseline_ms is not None
    assert outcome.cudnn_ms == 1.0 and outcome.best_ms <= outcome.baseline_ms
    line = summary_line(outcome, interpreter=False)
    assert f"vs before: {outcome.baseline_ms / outcome.best_ms:.2f}x shipped" in line
    assert f"vs cuDNN: {1.0 / outcome.best_ms:.2f}x" in line
    total = summary_total([outcome], interpreter=False)
    assert total.startswith("Total: the tuned configs run at ") and "cuDNN" in total
    assert summary_total([outcome], interpreter=True) is None


def test_the_baseline_config_is_timed_but_crowned_only_if_the_study_measured_it(tmp_path, kernel_cache, monkeypatch):
    """A shipped config outside the study's space (here: the tutorial space, Triton only) is
    timed beside the candidates for the summary, however fast, but is not the study's to crown."""
    class Fast(_StandIn):
        def run(self, job, timeout):
            result = super().run(job, timeout)
            return dict(result, median_ms=1e-3) if job.config == SHIPPED else result

    monkeypatch.setattr(search, "DeviceWorker", Fast)
    problem = Problem(1, 2, 2, 512, 512, 64, "float16", causal=False)
    options = TuneOptions(trials=3, jobs=2, seed=2, warm_start=False, sampler="random")
    tuner = Tuner(connect(f"sqlite:///{tmp_path / 'db.sqlite'}"), load_space("tutorial"), H200, detect_software(),
                  options, baseline=lambda p, gpu: (Candidate(SHIPPED), "shipped"))
    (outcome,) = tuner.tune([problem])
    assert outcome.baseline_ms == pytest.approx(1e-3)
    assert outcome.best is not None and outcome.best != Candidate(SHIPPED)


def test_a_space_where_nothing_fits_is_refused_naming_the_sizes(tmp_path, monkeypatch):
    """Refused before any trial runs, naming the problem, the smallest need and the limit."""
    from fa_autotune.spec.space import SearchSpace

    too_big = KernelConfig.from_mapping({"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 4, "q_tiles": 2})
    monkeypatch.setattr(SearchSpace, "grid_rows", lambda self, problem: [({"BLOCK_M": 128}, Candidate(too_big))])
    tuner = Tuner(connect(f"sqlite:///{tmp_path / 'db.sqlite'}"), load_space("fwd"), H200, detect_software(),
                  TuneOptions())
    with pytest.raises(search.FaAutotuneError, match="no config of the search space fits .*d256.*needs 655360 "
                                                     "bytes of shared memory, the limit is 232448"):
        tuner._feasible_rows(D256)

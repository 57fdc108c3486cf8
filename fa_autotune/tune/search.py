"""The tuner: an Optuna study per problem, every trial compiled ahead, checked, timed, stored.

One trial: the space proposes a config (Optuna's sampler, kept by :mod:`.sampling` to the
configs that pass the space's constraints and the static shared-memory check; for FP8
problems a :class:`~fa_autotune.spec.candidate.Candidate`, the config with the quantization
recipe sampled beside it, and "config" below means that pair) -> the
database answers configs it already measured on this problem, GPU and software -> compile
for the target in a process pool (what the static check cannot see stops here) -> correctness gate and
timing in a restartable child process -> one measurement row. Failures are statuses;
Optuna sees them as pruned trials so samplers learn to avoid them. What runs sharing the
database do about each other (trial owners, claims, problem marks, a killed run's trials)
live in :mod:`.leases`.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import multiprocessing
import os
import statistics
import time
from collections import Counter
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import optuna
from optuna.trial import TrialState

from ..errors import ConfigError, FaAutotuneError
from ..kernels import resources
from ..kernels.aot import HOPPER, CompileResult, SHARED_MEMORY_LIMIT
from ..processes import SigintGuard, compiler_init
from ..spec.candidate import Candidate
from ..spec.defaults import default_for, defaults_for, gluon_candidates
from ..spec.problem import TOLERANCE, Problem, distance
from ..spec.space import SearchSpace
from ..spec.target import GpuInfo, SoftwareInfo
from ..spec.tuned import FrontPoint, Winner
from ..store import Database
from ..store.records import Ids, identities, record, reusable
from ..store.tuned import save_front, save_winner, tuned_problems
from . import leases
from .compile import compile_for_tuning
from .leases import OWNER, closed_elsewhere, utcnow
from .sampling import SAMPLERS, Feasible, make_sampler
from .worker import DeviceWorker, Job

FAILED_VALUE = 1e9  # what a failed trial reports to Optuna before being pruned
NOISE_FLOOR = 0.01  # configs within 1% (or the measured spread, if larger) are tied
REPEAT_ALLOWANCE = 4  # at most this many trials per distinct config wanted
RETIME_ROUNDS = 3  # interleaved re-timing rounds per winner candidate


@dataclass(frozen=True)
class TuneOptions:
    trials: int | None = None  # trials per problem study (re-running continues up to this)
    time_budget: float | None = None  # seconds for the whole run
    sampler: str = "tpe"
    seed: int | None = None
    jobs: int = max(1, (os.cpu_count() or 2) // 2)
    study: str | None = None  # study-name prefix
    retime_top: int = 3
    trial_timeout: float = 180.0
    search_rep_ms: float = 50.0
    retime_rep_ms: float = 300.0
    warm_start: bool = True
    # False for baselines (the tutorial list in `bench`): pick and report a winner from this
    # study's own configs without making it the dispatcher's choice for the problem.
    record_best: bool = True
    # FP8 problems: relative error (against float32) a config may have to count at all.
    max_error: float | None = None
    # (k, n): this run is worker k of n started together (tune --gpus); among the problems no
    # other live run is tuning, it starts at the k-th n-th of the list, so workers spread out.
    worker: tuple[int, int] = (0, 1)

    def __post_init__(self) -> None:
        if self.max_error is not None and not 0 < self.max_error < 1:
            raise FaAutotuneError(f"--max-error must be in (0, 1), got {self.max_error}")
        if self.sampler not in SAMPLERS:
            raise FaAutotuneError(f"unknown sampler {self.sampler!r}; choose one of {SAMPLERS}")
        if self.trials is not None and self.trials < 1:
            raise FaAutotuneError("--trials must be at least 1")
        if self.time_budget is not None and not (math.isfinite(self.time_budget) and self.time_budget > 0):
            raise FaAutotuneError("--time-budget must be a positive, finite number of seconds")
        # 0 (or nan) would record every trial as timed out, which later runs then reuse
        if not (math.isfinite(self.trial_timeout) and self.trial_timeout > 0):
            raise FaAutotuneError("--trial-timeout must be a positive, finite number of seconds")
        if self.retime_top < 1:
            raise FaAutotuneError("--retime-top must be at least 1 (the winner is picked among the re-timed)")
        if self.seed is not None and self.seed < 0:
            raise FaAutotuneError("--seed must be non-negative")
        if not 0 <= self.worker[0] < self.worker[1]:
            raise FaAutotuneError(f"worker slot {self.worker[0]}/{self.worker[1]} is not k/n with 0 <= k < n")


def target_trials(options: TuneOptions, interpreter: bool, grid_size: int) -> int:
    """Distinct configs a problem's study settles before a run stops: --trials (40 on a GPU,
    8 in the interpreter when not given), never more than the grid holds."""
    if options.sampler == "grid":
        return min(grid_size, options.trials or grid_size)
    return min(options.trials or (8 if interpreter else 40), grid_size)


@dataclass
class ProblemOutcome:
    problem: Problem
    study_name: str
    trials: int = 0  # distinct configs the study has settled (kept current during the run)
    new_trials: int = 0  # trials measured by this run
    reused: int = 0  # configs answered from measurements this run did not make (earlier or other runs), each once
    statuses: Counter = field(default_factory=Counter)
    best: Candidate | None = None
    best_ms: float | None = None
    best_tflops: float | None = None
    ties: int = 0
    seconds: float = 0.0
    front: list[FrontPoint] = field(default_factory=list)  # FP8: the stored Pareto front, fastest first
    # What the winner is reported against, timed in the same interleaved rounds: the config
    # a fresh install runs for the problem (shipped file, else the built-in default) and
    # SDPA's cuDNN backend (None where not measured: interpreter, FP8, KV-cache steps).
    baseline_source: str | None = None
    baseline_ms: float | None = None
    cudnn_ms: float | None = None
    measured: set = field(default_factory=set, repr=False)  # configs this run measured
    answered: set = field(default_factory=set, repr=False)  # configs counted in ``reused``


class Reporter(Protocol):
    def start(self, problems: list[Problem], trials: int, interpreter: bool) -> None: ...
    def problem_started(self, index: int, outcome: ProblemOutcome, target: int) -> None: ...
    def trial_done(self, outcome: ProblemOutcome, status: str, config: Candidate, ms: float | None) -> None: ...
    def problem_finished(self, outcome: ProblemOutcome) -> None: ...
    def finish(self, outcomes: list[ProblemOutcome]) -> None: ...


class SilentReporter:
    def start(self, problems, trials, interpreter): pass
    def problem_started(self, index, outcome, target): pass
    def trial_done(self, outcome, status, config, ms): pass
    def problem_finished(self, outcome): pass
    def finish(self, outcomes): pass


def study_name(prefix: str | None, gpu: GpuInfo, space: SearchSpace, problem: Problem) -> str:
    """Deterministic, so re-running the same command continues the same study."""
    return f"{prefix or 'fa-autotune'}:{gpu.slug}:{space.hash}:{problem.key}"


def warm_starts(problem: Problem, gpu: GpuInfo, tuned: list[tuple[Problem, Candidate]],
                shipped: list[Candidate] = ()) -> list[Candidate]:
    """What a study measures first, in order (the caller drops what its space cannot hold):
    the default, ``shipped`` (what a fresh install runs: the winner is reported against it),
    this problem's earlier winners (a re-tune must measure the incumbent) and,
    for a causal persistent Gluon winner, the same in other L2 sections (which size wins
    depends on the heads, tiles and programs: benchmarks/results/2026-12-02-h200-fwd-example-and-sections/results.md),
    the Gluon structures worth measuring first, then the nearest tuned problems' winners. A
    D <= 64 causal winner in the steps-in-turn schedule with two consumers (as the space
    searches them: three overflowed shared memory) is measured with half steps too (+1-3.5%
    for each such structure in benchmarks/results/2026-12-02-h200-half-step/d64.md); Gluon winners
    (and those half-step forms) with the consumers taking turns on the tensor cores flipped
    (which schedule wins moves with the head dim, length and mask: benchmarks/results/2026-12-02-h200-pingpong*/),
    and Gluon winners with lazy rescaling flipped (-2 to +2% by problem: benchmarks/results/2026-12-02-h200-lazy-rescale/results.md),
    before the L2 sections. Built-in configs come with the default recipe on FP8 problems."""
    fp8 = problem.is_fp8
    winners = [c for p, c in tuned if p == problem]
    starts = [Candidate.of(c, fp8) for c in defaults_for(problem, gpu)] + list(shipped) + winners
    halves = [c.with_(half_step=True) for c in winners if problem.causal and problem.head_dim_pad <= 64
              and c.config.language == "gluon" and not c.config.overlap and c.config.BLOCK_N == 128
              and c.config.consumers == 2 and not c.config.half_step]
    starts += halves
    if not (problem.backward or problem.decode):  # the forward kernel's knobs
        starts += [c.with_(pingpong=not c.config.pingpong) for c in winners + halves
                   if c.config.language == "gluon" and c.config.consumers >= 2]
        starts += [c.with_(rescale_threshold=0 if c.config.rescale_threshold else 8) for c in winners
                   if c.config.language == "gluon"]
    starts += [c.with_(section=s) for c in winners if problem.causal and c.config.language == "gluon"
               and c.config.persistent for s in (4, 8, 16) if s != c.config.section]
    starts += [Candidate.of(c, fp8) for c in gluon_candidates(problem, gpu.capability_tuple)]
    neighbours = sorted(((distance(problem, p), c) for p, c in tuned if p != problem),
                        key=lambda item: (item[0], item[1].canonical_json()))
    # a neighbour's kernel, with its recipe where this problem takes one too
    return starts + [Candidate.from_mapping(c, fp8) for d, c in neighbours[:4] if math.isfinite(d)]


def built_in_baseline(problem: Problem, gpu: GpuInfo) -> tuple[Candidate, str]:
    """The config a problem runs with nothing tuned: the built-in default (FP8: with the
    default recipe)."""
    return Candidate.of(default_for(problem, gpu), problem.is_fp8), "default"


class Tuner:
    """``baseline``: (problem, GPU) -> (config, where it comes from), what a winner is
    reported against (the CLI passes what a fresh install's dispatcher would run)."""

    def __init__(self, db: Database, space: SearchSpace, gpu: GpuInfo, software: SoftwareInfo,
                 options: TuneOptions, reporter: Reporter | None = None,
                 baseline: Callable[[Problem, GpuInfo], tuple[Candidate, str]] = built_in_baseline) -> None:
        self.db, self.gpu, self.software, self.options = db, gpu, software, options
        self.baseline = baseline
        self.space = space.for_arch(gpu.arch)
        self.reporter = reporter or SilentReporter()
        self.target_capability = gpu.capability_tuple or HOPPER
        self._sigint = SigintGuard()  # a Ctrl-C swallowed by a finalizer still stops the run

    # ------------------------------------------------------------------ driver
    def tune(self, problems: list[Problem]) -> list[ProblemOutcome]:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        deadline = time.monotonic() + self.options.time_budget if self.options.time_budget else None
        self.reporter.start(problems, self.options.trials or 0, self.gpu.is_interpreter)
        outcomes: list[ProblemOutcome] = []
        context = multiprocessing.get_context("spawn")
        with self._sigint.installed(), \
                ProcessPoolExecutor(max_workers=self.options.jobs, mp_context=context, initializer=compiler_init,
                                    initargs=(os.getpid(),)) as pool, \
                DeviceWorker(interpret=self.gpu.is_interpreter) as worker:
            try:
                remaining = list(enumerate(problems))
                done: list[tuple[int, ProblemOutcome]] = []
                while remaining:
                    self._sigint.check()
                    share = None
                    if deadline is not None:
                        share = max(0.0, (deadline - time.monotonic()) / len(remaining))
                    index, problem = remaining.pop(self._next_problem(remaining, len(problems)))
                    try:
                        done.append((index, self._tune_problem(index, problem, pool, worker, share)))
                    except BaseException:  # the problem's mark must not keep other runs away
                        self._release_mark_of(problem)
                        raise
            except BaseException:  # Ctrl-C, an error: queued compiles are abandoned, not waited for
                _abandon(pool)
                raise
        outcomes = [outcome for _, outcome in sorted(done, key=lambda item: item[0])]
        self.reporter.finish(outcomes)
        return outcomes

    @property
    def _grace_s(self) -> float:
        return leases.grace_s(self.options.trial_timeout)

    @property
    def _claims(self) -> leases.Claims:
        """This run's claims on configs in its database (who measures what, between runs)."""
        return leases.Claims(self.db, self.options.trial_timeout)

    def _release_mark_of(self, problem: Problem) -> None:
        try:
            name = study_name(self.options.study, self.gpu, self.space, problem)
            leases.release_mark(optuna.load_study(study_name=name, storage=self.db.optuna_storage(),
                                                  sampler=self._sampler()))
        except Exception:  # no study yet, or the database is what failed: nothing to release
            pass

    def _next_problem(self, remaining: list[tuple[int, Problem]], total: int) -> int:
        """Which of ``remaining`` (index, problem) to tune next: those no other live run is
        on first, worker k of n from the k-th n-th of the list (:func:`.leases.next_problem`)."""
        if len(remaining) == 1:
            return 0
        names = [study_name(self.options.study, self.gpu, self.space, problem) for _, problem in remaining]
        return leases.next_problem(self.db.optuna_storage(), names, [index for index, _ in remaining], total,
                                   self.options.worker, self._grace_s)

    # ------------------------------------------------------------------ one problem
    def _tune_problem(self, index: int, problem: Problem, pool: ProcessPoolExecutor, worker: DeviceWorker,
                      budget: float | None) -> ProblemOutcome:
        start = time.monotonic()
        stop_at = start + budget if budget is not None else None
        name = study_name(self.options.study, self.gpu, self.space, problem)
        ids = identities(self.db, problem, self.gpu, self.software)
        # FP8: time and error, both minimized (Optuna multi-objective); otherwise time.
        objectives = {"directions": ["minimize", "minimize"]} if problem.is_fp8 else {"direction": "minimize"}
        rows = self._feasible_rows(problem)
        feasible = Feasible([params for params, _ in rows])
        grid = [candidate for _, candidate in rows]
        study = optuna.create_study(study_name=name, storage=self.db.optuna_storage(),
                                    sampler=self._sampler(feasible), load_if_exists=True, **objectives)
        leases.fail_stale_trials(study, grace_s=self._grace_s)
        leases.mark(study, self._grace_s)
        if study.trials and self.options.seed is not None:
            # A resumed study must not replay the draws of the run it continues.
            study.sampler = make_sampler(self.options.sampler, self.options.seed + len(study.trials), feasible)
        outcome = ProblemOutcome(problem, name)
        target = self._target_trials(len(grid))
        if not study.trials:
            study.set_user_attr("problem", problem.key)
            study.set_user_attr("gpu", self.gpu.name)
            self._enqueue_start(study, problem, grid, ids)
        outcome.trials = _distinct(study)
        self.reporter.problem_started(index, outcome, target)
        # Double-buffered: the next batch compiles in the pool while this one runs on the device.
        # Progress counts distinct configs; repeated proposals are answered from the database
        # and only bounded (REPEAT_ALLOWANCE) so that a small space still ends.
        current: list[_Pending] = []
        asked = 0  # bounds the asks even where failed trials do not count as finished (FP8)
        while True:
            self._sigint.check()
            room = target - _distinct(study) - len(current)
            in_time = stop_at is None or time.monotonic() < stop_at
            can_ask = room > 0 and in_time and max(_finished(study), asked) < target * REPEAT_ALLOWANCE
            upcoming = []
            if can_ask:
                size = min(self.options.jobs, room)
                upcoming = self._prepare(study, problem, ids, pool, size, outcome,
                                         in_flight={p.config for p in current})
                asked += size
            if not current and not upcoming:
                if can_ask:  # every config asked was settled at once (invalid, or measured before)
                    continue
                break
            self._complete(study, problem, ids, pool, worker, current, outcome)
            current = upcoming
        outcome.trials = _distinct(study)
        known = _study_winner(study, problem.is_fp8) if outcome.new_trials == 0 else None
        if problem.is_fp8:  # no re-timing: rebuilt every run, so a new --max-error takes effect
            self._pick_front(study, problem, ids, outcome)
        elif known is not None:  # nothing new since the winner was picked: keep it (and what it was compared with)
            outcome.best, outcome.best_ms, outcome.ties, compared = known
            outcome.best_tflops = problem.tflops(outcome.best_ms)
            outcome.baseline_source = compared.get("baseline_source")
            outcome.baseline_ms, outcome.cudnn_ms = compared.get("baseline_ms"), compared.get("cudnn_ms")
        else:
            self._pick_winner(study, problem, ids, worker, outcome)
        outcome.seconds = time.monotonic() - start
        leases.release_mark(study)
        self.reporter.problem_finished(outcome)
        return outcome

    def _target_trials(self, grid_size: int) -> int:
        return target_trials(self.options, self.gpu.is_interpreter, grid_size)

    def _sampler(self, feasible: Feasible | None = None):
        return make_sampler(self.options.sampler, self.options.seed, feasible)

    def _fits(self, candidate: Candidate, problem: Problem) -> bool:
        """The static shared-memory check (no limits in the interpreter)."""
        return self.gpu.is_interpreter or resources.fits(candidate.config, problem, self.target_capability)

    def _feasible_rows(self, problem: Problem) -> list[tuple[dict[str, Any], Candidate]]:
        """The space's configs on ``problem`` (with the choices that make each) that pass
        its constraints and the static resource check: all a study proposes."""
        rows = self.space.grid_rows(problem)
        if not rows:
            raise FaAutotuneError(f"the search space allows no config for {problem.key}")
        fitting = [(params, config) for params, config in rows if self._fits(config, problem)]
        if not fitting:
            least = min(resources.shared_bytes(c.config, problem, self.target_capability) or 0 for _, c in rows)
            limit = SHARED_MEMORY_LIMIT.get(self.target_capability)
            raise FaAutotuneError(f"no config of the search space fits {problem.key} on {self.gpu.name}: the "
                                  f"smallest needs {least} bytes of shared memory, the limit is {limit}")
        return fitting

    def _enqueue_start(self, study, problem: Problem, grid: list[Candidate], ids: Ids) -> None:
        """Grid: every valid config once. Otherwise warm start: the built-in default, this
        problem's earlier winners, the Gluon structures that won sweeps somewhere (Hopper) and
        the winners of the nearest tuned problems on this GPU, where the space allows them."""
        if self.options.sampler == "grid":
            for config in grid:
                study.enqueue_trial(self._params(config))
            return
        if not self.options.warm_start:
            return
        allowed = set(grid)
        seen = set()
        shipped = [self.baseline(problem, self.gpu)[0]]  # what the tune must beat, measured early
        for config in warm_starts(problem, self.gpu, tuned_problems(self.db, self.gpu), shipped):
            if config in allowed and config not in seen:
                seen.add(config)
                study.enqueue_trial(self._params(config))

    def _params(self, candidate: Candidate) -> dict[str, Any]:
        return {p.name: candidate.listed_value(p.name) for p in self.space.parameters}

    # ------------------------------------------------------------------ trials
    def _prepare(self, study, problem: Problem, ids: Ids, pool: ProcessPoolExecutor, size: int,
                 outcome: ProblemOutcome, in_flight: set[Candidate]) -> list["_Pending"]:
        """Ask ``size`` trials; settle the invalid and already-measured ones at once and
        start compiling the rest. A repeat of a config in the batch waits for the first."""
        pending: list[_Pending] = []
        for _ in range(size):
            trial = study.ask()
            trial.set_user_attr("owner", OWNER)  # whose trial: another run must not fail it
            config = self._propose(trial, problem, ids, study, outcome)
            if config is None:
                continue
            if config in in_flight or any(config == p.config for p in pending):
                pending.append(_Pending(trial, config, None, utcnow()))
                continue
            previous = reusable(self.db, ids, config)
            if previous is not None:
                self._reuse(study, trial, config, previous, outcome)
                continue
            if not self._claims.claim(ids, config):  # another live worker is measuring it: wait for its row
                pending.append(_Pending(trial, config, None, utcnow()))
                continue
            future = pool.submit(compile_for_tuning, config.config, problem, self.target_capability, config.recipe)
            pending.append(_Pending(trial, config, future, utcnow()))
        return pending

    def _complete(self, study, problem: Problem, ids: Ids, pool: ProcessPoolExecutor, worker: DeviceWorker,
                  pending: list["_Pending"], outcome: ProblemOutcome) -> None:
        for item in pending:
            if item.future is None:  # a repeat, here or in another worker: answered by its first copy
                previous = self._claims.await_elsewhere(ids, item.config)
                if previous is not None:
                    self._reuse(study, item.trial, item.config, previous, outcome)
                    continue
                item = _Pending(item.trial, item.config,
                                pool.submit(compile_for_tuning, item.config.config, problem, self.target_capability,
                                            item.config.recipe), utcnow())
            self._measure(study, item.trial, ids, problem, item.config, _compile_result(item.future, item.config),
                          worker, item.started, outcome)

    def _measure(self, study, trial, ids: Ids, problem: Problem, config: Candidate, compiled: CompileResult,
                 worker: DeviceWorker, started: dt.datetime, outcome: ProblemOutcome) -> None:
        if compiled.status != "ok":
            self._finish(study, trial, ids, config, compiled.status, outcome, started,
                         message=compiled.error, compile_seconds=compiled.seconds)
            return
        result = worker.run(Job(config.config, problem, rep_ms=self.options.search_rep_ms, recipe=config.recipe),
                            self.options.trial_timeout)
        self._finish(study, trial, ids, config, result.pop("status"), outcome, started,
                     compile_seconds=compiled.seconds, **_measurement_fields(result, problem))

    def _propose(self, trial, problem: Problem, ids: Ids, study, outcome: ProblemOutcome) -> Candidate | None:
        """The trial's config (FP8: with the recipe it sampled), or None after recording it as
        ``invalid_config``."""
        params = self.space.suggest(lambda name, choices: trial.suggest_categorical(name, list(choices)), problem)
        trial.set_user_attr("config", json.dumps(params, sort_keys=True))
        try:
            config = Candidate.from_mapping(params, problem.is_fp8)
        except ConfigError as exc:  # not even a config: nothing to store but the trial
            self._finish(study, trial, ids, None, "invalid_config", outcome, utcnow(), message=str(exc))
            return None
        broken = self.space.violated(params, problem)
        if broken is not None:
            self._finish(study, trial, ids, config, "invalid_config", outcome, utcnow(),
                         message=f"constraint {broken.text!r} ({broken.where})")
            return None
        if not self._fits(config, problem):
            need = resources.shared_bytes(config.config, problem, self.target_capability)
            self._finish(study, trial, ids, config, "out_of_resources", outcome, utcnow(),
                         message=f"needs at least {need} bytes of shared memory (estimated before compiling), "
                                 f"limit {SHARED_MEMORY_LIMIT.get(self.target_capability)}")
            return None
        return config

    def _reuse(self, study, trial, config: Candidate, previous, outcome: ProblemOutcome) -> None:
        """Settle ``trial`` with a measurement already stored. ``reused`` counts the configs
        so answered that this run did not measure itself, each once: a repeat of a config
        this run measured (the sampler proposing it again) is neither new nor reused."""
        if config not in outcome.measured and config not in outcome.answered:
            outcome.answered.add(config)
            outcome.reused += 1
        if previous is not None and previous.status == "ok":
            with closed_elsewhere(trial):
                trial.set_user_attr("status", "ok")
                trial.set_user_attr("reused", True)
                study.tell(trial, _objectives(study, previous.median_ms, previous.rel_error))
            outcome.statuses["ok"] += 1
            self._note_best(outcome, config, previous.median_ms)
        else:
            status = previous.status
            with closed_elsewhere(trial):
                trial.set_user_attr("status", status)
                trial.set_user_attr("reused", True)
                _tell_failed(study, trial)
            outcome.statuses[status] += 1
        outcome.trials = _distinct(study)
        self.reporter.trial_done(outcome, "reused", config, previous.median_ms)

    def _finish(self, study, trial, ids: Ids, config: Candidate | None, status: str, outcome: ProblemOutcome,
                started: dt.datetime, **fields) -> None:
        """Record the measurement, then tell Optuna; the row is written first so a kill
        between the two loses nothing that was measured."""
        if config is not None:
            record(self.db, ids, config, status, started_at=started, finished_at=utcnow(), study_name=study.study_name,
                   trial_number=trial.number, **fields)
            self._claims.release(ids, config)
            outcome.measured.add(config)
        outcome.new_trials += 1
        outcome.statuses[status] += 1
        with closed_elsewhere(trial):
            trial.set_user_attr("status", status)
            if config is None:
                trial.set_user_attr("message", fields.get("message", "")[:500])
            if status == "ok":
                study.tell(trial, _objectives(study, fields["median_ms"], fields.get("rel_error")))
            else:
                _tell_failed(study, trial)
        if status == "ok":
            self._note_best(outcome, config, fields["median_ms"])
        outcome.trials = _distinct(study)
        self.reporter.trial_done(outcome, status, config, fields.get("median_ms"))

    def _note_best(self, outcome: ProblemOutcome, config: Candidate, ms: float) -> None:
        if outcome.best_ms is None or ms < outcome.best_ms:
            outcome.best, outcome.best_ms, outcome.best_tflops = config, ms, outcome.problem.tflops(ms)

    # ------------------------------------------------------------------ FP8 front
    def _pick_front(self, study, problem: Problem, ids: Ids, outcome: ProblemOutcome) -> None:
        """FP8: store the study's time/error Pareto front (errors within --max-error); its
        fastest member within the format's tolerance (else its most accurate) becomes the
        problem's winner, which the dispatcher uses when the caller names no error budget."""
        front = pareto_front(_study_points(study, self.options.max_error))
        if not front:
            return
        within = [point for point in front if point[2] <= TOLERANCE[problem.dtype]]
        winner, ms, err = within[0] if within else front[-1]
        points = [FrontPoint(problem, c.config, t, problem.tflops(t), e, self.gpu, self.software,
                             self.options.max_error, outcome.study_name, recipe=c.recipe) for c, t, e in front]
        if self.options.record_best:
            save_front(self.db, ids, points, self.options.max_error)
            save_winner(self.db, ids, Winner(problem, winner.config, ms, problem.tflops(ms), err, self.gpu,
                                             self.software, study_name=outcome.study_name, recipe=winner.recipe))
        study.set_user_attr("winner", {"config": winner.canonical_json(), "median_ms": ms, "ties": 1})
        outcome.best, outcome.best_ms, outcome.best_tflops, outcome.ties = winner, ms, problem.tflops(ms), 1
        outcome.front = points

    # ------------------------------------------------------------------ winner
    def _pick_winner(self, study, problem: Problem, ids: Ids, worker: DeviceWorker, outcome: ProblemOutcome) -> None:
        """Re-time this study's top few (and the built-in default and the problem's earlier
        winners, which a new winner must beat) in interleaved rounds, so that clock drift
        hits every candidate alike; the fastest median wins (configs within noise of it are
        counted as ties)."""
        measured = _study_ranking(study)
        candidates = [config for config, _ in measured[: self.options.retime_top]]
        before, outcome.baseline_source = self.baseline(problem, self.gpu)
        incumbents = [Candidate.of(default_for(problem, self.gpu), problem.is_fp8), before] + [
            c for p, c in tuned_problems(self.db, self.gpu) if p == problem]
        for config in incumbents:
            if config not in candidates and any(c == config for c, _ in measured):
                candidates.append(config)
        if not candidates:
            return
        # What the winner is reported against is timed in the same rounds; only a config
        # this study measured may win (the warm start measures the baseline where the space holds it).
        crownable = set(candidates)
        candidates += [before] if before not in candidates else []
        rounds: dict[Candidate, list[dict]] = {c: [] for c in candidates}
        cudnn: list[dict] | None = [] if not self.gpu.is_interpreter and not problem.decode else None
        # The interpreter's timings mean nothing: one round there keeps CPU runs short.
        rounds_wanted = 1 if self.gpu.is_interpreter else RETIME_ROUNDS
        rep = self.options.retime_rep_ms / rounds_wanted
        for round_index in range(rounds_wanted):
            for config in candidates:
                if round_index and not rounds[config]:
                    continue  # failed its first round: out
                result = worker.run(Job(config.config, problem, rep_ms=rep, check=round_index == 0,
                                        recipe=config.recipe), self.options.trial_timeout)
                if result["status"] == "ok":
                    rounds[config].append(result)
                elif round_index == 0:
                    record(self.db, ids, config, result.pop("status"), phase="retime", study_name=outcome.study_name,
                           **_measurement_fields(result, problem))
            if cudnn is not None and (round_index == 0 or cudnn):
                result = worker.run(Job(None, problem, rep_ms=rep, check=round_index == 0, baseline="cudnn"),
                                    self.options.trial_timeout)
                cudnn = cudnn + [result] if result["status"] == "ok" else []
        if cudnn and len(cudnn) == rounds_wanted:
            outcome.cudnn_ms = _combine_rounds(cudnn, problem)["median_ms"]
        timed = []
        for config, results in rounds.items():
            if len(results) == rounds_wanted:
                fields = _combine_rounds(results, problem)
                record(self.db, ids, config, "ok", phase="retime", study_name=outcome.study_name, **fields)
                timed.append((config, fields))
                if config == before:
                    outcome.baseline_ms = fields["median_ms"]
        timed = [item for item in timed if item[0] in crownable]
        if not timed:
            return
        # The fastest median wins. Configs within noise of it (1%, or the winner's own
        # round-to-round spread if larger) are counted as ties, a sign to re-time longer; the
        # spread of a noisy runner-up says nothing about the winner, and handing a tie to a
        # config by name cost 3-8% on an H200 (2026-12-01: round spreads of 2-8% made every
        # candidate a tie).
        winner, fields = min(timed, key=lambda item: (item[1]["median_ms"], item[0].canonical_json()))
        tolerance = max(NOISE_FLOOR, (fields["p80_ms"] - fields["p20_ms"]) / fields["median_ms"])
        tied = [item for item in timed if item[1]["median_ms"] <= fields["median_ms"] * (1 + tolerance)]
        if self.options.record_best:
            save_winner(self.db, ids, Winner(problem, winner.config, fields["median_ms"], fields["tflops"],
                                             fields.get("rel_error"), self.gpu, self.software, len(tied),
                                             study_name=outcome.study_name, recipe=winner.recipe))
        study.set_user_attr("winner", {"config": winner.canonical_json(), "median_ms": fields["median_ms"],
                                       "ties": len(tied), "baseline_source": outcome.baseline_source,
                                       "baseline_ms": outcome.baseline_ms, "cudnn_ms": outcome.cudnn_ms})
        outcome.best, outcome.best_ms, outcome.best_tflops = winner, fields["median_ms"], fields["tflops"]
        outcome.ties = len(tied)


def pareto_front(points: list[tuple[Candidate, float, float]]) -> list[tuple[Candidate, float, float]]:
    """The (candidate, ms, error) points no other point beats on both time and error, fastest
    first (equal points keep the first in canonical-JSON order)."""
    front: list[tuple[Candidate, float, float]] = []
    for config, ms, err in sorted(points, key=lambda p: (p[1], p[2], p[0].canonical_json())):
        if not front or err < front[-1][2]:
            front.append((config, ms, err))
    return front


def _study_points(study, max_error: float | None) -> list[tuple[Candidate, float, float]]:
    """(candidate, fastest ms, its error) of a multi-objective (FP8) study's passing configs."""
    points: dict[Candidate, tuple[float, float]] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        config = Candidate.from_stored(trial.user_attrs.get("config", "null"), fp8=True)
        ms, err = trial.values
        if config is None or not (math.isfinite(ms) and math.isfinite(err)):
            continue
        if (max_error is None or err <= max_error) and (config not in points or ms < points[config][0]):
            points[config] = (ms, err)
    return [(config, ms, err) for config, (ms, err) in points.items()]


def _study_ranking(study) -> list[tuple[Candidate, float]]:
    """(config, fastest search-phase ms) of the configs this (single-objective, so not FP8)
    study measured (or answered from the database), fastest first. Only the study's own
    configs: a baseline study must not crown a faster config that another study measured on
    the same problem."""
    best: dict[Candidate, float] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        config = Candidate.from_stored(trial.user_attrs.get("config", "null"), fp8=False)
        ms = trial.values[0] if trial.values else None
        if config is not None and ms is not None and math.isfinite(ms):
            best[config] = min(ms, best.get(config, math.inf))
    return sorted(best.items(), key=lambda item: (item[1], item[0].canonical_json()))


def _study_winner(study, fp8: bool) -> tuple[Candidate, float, int, dict] | None:
    """The winner this study picked last time, if its config is still valid, with what it
    was compared with (baseline_source, baseline_ms, cudnn_ms; absent in older studies)."""
    winner = study.user_attrs.get("winner")
    config = Candidate.from_stored(winner["config"], fp8) if isinstance(winner, dict) else None
    if config is None:
        return None
    compared = {k: winner.get(k) for k in ("baseline_source", "baseline_ms", "cudnn_ms")}
    return config, winner["median_ms"], winner["ties"], compared


def _combine_rounds(results: list[dict], problem: Problem) -> dict:
    """One row for a re-timed config: the median of its round medians, the extreme rounds
    as its spread, the correctness figures of its checked first round."""
    medians = sorted(r["median_ms"] for r in results)
    median = statistics.median(medians)
    return {"median_ms": median, "p20_ms": medians[0], "p80_ms": medians[-1], "tflops": problem.tflops(median),
            "max_abs_error": results[0].get("max_abs_error"), "rel_error": results[0].get("rel_error"),
            "message": f"{len(results)} interleaved rounds"}


def _measurement_fields(result: dict, problem: Problem) -> dict:
    fields = {k: result.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "max_abs_error", "rel_error")}
    fields["message"] = result.get("message", "")
    if fields["median_ms"]:
        fields["tflops"] = problem.tflops(fields["median_ms"])
    return fields


@dataclass(frozen=True)
class _Pending:
    """A trial whose config is compiling (``future``), or a repeat waiting for its twin."""

    trial: Any
    config: Candidate
    future: Future | None
    started: dt.datetime


def _compile_result(future: Future, config: Candidate) -> CompileResult:
    try:
        return future.result()
    except Exception as exc:  # a worker died compiling: the config's fault until shown otherwise
        return CompileResult(config.config, "compile_error", 0.0, (), f"compiler process failed: {exc}")


def _finished(study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _abandon(pool: ProcessPoolExecutor) -> None:
    """Cancel what the pool has queued and stop its workers now (they ignore SIGINT, and a
    compile may hang), so the pool's exit does not wait for them."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # CPython's pool keeps them here
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()


def _distinct(study) -> int:
    """Distinct configs the study has settled (repeats of one config count once)."""
    return _distinct_of(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _distinct_of(finished) -> int:
    return len({t.user_attrs.get("config", t.number) for t in finished})


def settled(storage, names: list[str]) -> dict[str, int]:
    """Distinct configs each named study has settled, whichever run settled them (0 for a
    study not created yet): the count a run stops at, read by `tune --gpus`'s display."""
    out = {}
    for name in names:
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            out[name] = 0
            continue
        out[name] = _distinct_of(storage.get_all_trials(study_id, deepcopy=False,
                                                        states=(TrialState.COMPLETE, TrialState.PRUNED)))
    return out


def _objectives(study, ms: float, rel_error: float | None) -> float | list[float]:
    """What Optuna is told for a passing trial: its time, and for FP8 studies its error."""
    if len(study.directions) == 1:
        return ms
    return [ms, rel_error if rel_error is not None else math.inf]


def _tell_failed(study, trial) -> None:
    """A failed trial: pruned after a terrible report (TPE learns to avoid its region);
    multi-objective studies take no reports, so there it is failed."""
    if len(study.directions) == 1:
        trial.report(FAILED_VALUE, 0)
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)

"""The tuner in-process on Triton's interpreter: which configs a study may crown, and that a
re-tune measures the incumbent winner before replacing it."""
from __future__ import annotations

import pytest

from fa_autotune.spec.candidate import Candidate
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.recipe import Fp8Recipe
from fa_autotune.tune.search import SilentReporter, TuneOptions, Tuner, pareto_front
from fa_autotune.spec.space import load_space
from fa_autotune.store import connect, queries
from fa_autotune.store.records import identities, record
from fa_autotune.spec.target import detect_gpu, detect_software

PROBLEM = Problem(1, 2, 2, 40, 40, 16, "float16", causal=False)


@pytest.fixture
def tuner(tmp_path, kernel_cache):
    url = f"sqlite:///{tmp_path / 'tune.sqlite'}"

    def make(space: str, **options) -> Tuner:
        return Tuner(connect(url), load_space(space), detect_gpu(), detect_software(),
                     TuneOptions(jobs=2, seed=3, **options))

    return make


def test_baseline_study_ranks_only_its_own_configs(tuner):
    """A fast measurement another study made must not become the tutorial baseline's
    winner, and the baseline must not replace the dispatcher's choice for the problem."""
    main = tuner("fwd", trials=3)
    (tuned,) = main.tune([PROBLEM])
    outsider = Candidate(KernelConfig(loop_order="kv_outer", BLOCK_M=16, BLOCK_N=16, q_tiles=2, num_stages=2))
    ids = identities(main.db, PROBLEM, main.gpu, main.software)
    record(main.db, ids, outsider, "ok", phase="search", median_ms=1e-6, tflops=1e6, study_name="other")
    best_before = queries.best(main.db)

    baseline = tuner("tutorial", sampler="grid", study="tutorial", warm_start=False, record_best=False)
    (outcome,) = baseline.tune([PROBLEM])
    grid = load_space("tutorial").for_arch("interpreter").grid(PROBLEM)
    assert outcome.best in grid
    retimed = [r for r in queries.trials(main.db) if r.phase == "retime"]
    assert retimed and all(Candidate.from_stored(r.config, fp8=False) != outsider for r in retimed)
    assert queries.best(main.db) == best_before and best_before[0].candidate == tuned.best

    (again,) = tuner("tutorial", sampler="grid", study="tutorial", warm_start=False, record_best=False).tune([PROBLEM])
    assert again.best == outcome.best and again.new_trials == 0


def test_retune_measures_the_incumbent(tuner):
    """A new study on a tuned problem starts from the default and the earlier winner, and
    re-times the earlier winner beside its own best before deciding."""
    (first,) = tuner("fwd", trials=3, study="first").tune([PROBLEM])
    second = tuner("fwd", trials=3, study="second")
    (outcome,) = second.tune([PROBLEM])
    import optuna

    study = optuna.load_study(study_name=outcome.study_name, storage=second.db.optuna_storage())
    starts = [Candidate.from_stored(t.user_attrs["config"], fp8=False) for t in study.trials[:2]]
    assert first.best in starts
    retimed = {r.study_name for r in queries.trials(second.db)
               if r.phase == "retime" and Candidate.from_stored(r.config, fp8=False) == first.best}
    assert outcome.study_name in retimed


def test_pareto_front_drops_dominated_points():
    a, b, c, d = (Candidate(KernelConfig(BLOCK_M=m), Fp8Recipe()) for m in (16, 32, 64, 128))
    front = pareto_front([(a, 1.0, 0.30), (b, 2.0, 0.10), (c, 2.5, 0.20), (d, 3.0, 0.05)])
    assert front == [(a, 1.0, 0.30), (b, 2.0, 0.10), (d, 3.0, 0.05)]


def test_fp8_tune_stores_a_front_the_dispatcher_reads(tmp_path, kernel_cache, monkeypatch):
    """`tune --dtype fp8 --max-error E` as a user runs it: time and error both minimized,
    the front within E stored and shown by `query pareto`; attention_fp8 then runs the
    fastest front config within the caller's budget."""
    import json
    import os
    import subprocess
    import sys

    import torch

    from fa_autotune.runtime import api, dispatch

    url = f"sqlite:///{tmp_path / 'fp8.sqlite'}"
    env = dict(os.environ, FA_AUTOTUNE_CACHE=str(kernel_cache))
    env.pop("TRITON_INTERPRET", None)
    base = [sys.executable, "-m", "fa_autotune"]
    tune = base + ["tune", "--batch", "1", "--heads", "2", "--seqlen", "64", "--head-dim", "32", "--dtype", "fp8",
                   "--jobs", "1", "--seed", "2", "--db", url, "--quiet"]
    # A budget nothing meets first: its measurements must stay usable for a looser budget.
    subprocess.run(tune + ["--trials", "4", "--max-error", "0.001", "--study", "tight"], check=True, env=env,
                   capture_output=True)
    subprocess.run(tune + ["--trials", "8", "--max-error", "0.3"], check=True, env=env, capture_output=True)
    front = json.loads(subprocess.run(base + ["query", "pareto", "--db", url, "--format", "json"], check=True,
                                      env=env, capture_output=True, text=True).stdout)
    assert front and all(r["problem"].endswith("float8_e4m3fn_full") and r["rel_error"] <= 0.3 for r in front)
    # the recipe in its columns and among the config's parameters, the name spelling it
    for r in front:
        candidate = Candidate.from_mapping(r["config"], fp8=True)
        assert (r["fp8_scaling"], r["fp8_hadamard"], r["fp8_sink_tile"]) == (
            candidate.recipe.scaling, candidate.recipe.hadamard, candidate.recipe.sink_tile)
        assert r["config_name"] == candidate.name and r["config"] == candidate.to_dict()
    times, errors = [r["median_ms"] for r in front], [r["rel_error"] for r in front]
    assert times == sorted(times) and errors == sorted(errors, reverse=True) and len(set(errors)) == len(errors)

    monkeypatch.setenv("FA_AUTOTUNE_DB", url)
    dispatch.DISPATCHER.reset()
    problem = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn", causal=False)
    for budget in (None, errors[-1], (errors[0] + errors[-1]) / 2):
        choice = dispatch.DISPATCHER.choose_fp8(problem, "cpu", 0, budget)
        fits = [r for r in front if r["rel_error"] <= (0.1 if budget is None else budget)]  # None: e4m3's tolerance
        expected = fits[0] if fits else front[-1]  # else the most accurate, the problem's recorded winner
        assert choice.candidate == Candidate.from_mapping(expected["config"], fp8=True)
    with pytest.warns(RuntimeWarning, match="within max_error"):
        choice = dispatch.DISPATCHER.choose_fp8(problem, "cpu", 0, errors[-1] / 2)
    assert choice.candidate == Candidate.from_mapping(front[-1]["config"], fp8=True)
    q, k, v = (torch.randn(1, 2, 64, 32, dtype=torch.float16) for _ in range(3))
    out = api.attention_fp8(q, k, v, max_error=errors[-1])
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


def test_only_trials_of_runs_that_are_gone_are_failed(tmp_path):
    """Two tunes of one problem share its study: a run fails only the RUNNING trials whose
    owner process is gone (or, from another host, that outlived the grace period), never a
    live run's trial in flight."""
    import datetime as dt
    import socket
    import subprocess
    import sys

    import optuna
    from optuna.trial import TrialState

    from fa_autotune.tune import leases

    storage = connect(f"sqlite:///{tmp_path / 'db.sqlite'}").optuna_storage()
    study = optuna.create_study(study_name="s", storage=storage)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    owners = {"live": f"{host}:{sleeper.pid}", "dead": f"{host}:{dead.pid}", "mine": leases.OWNER,
              "remote-recent": "elsewhere:1", "unmarked-new": None}
    trials = {}
    for name, owner in owners.items():
        trial = study.ask()
        if owner is not None:
            trial.set_user_attr("owner", owner)
        trials[name] = trial._trial_id
    # A trial without an owner mark: just asked by a live run (the mark follows ask()), or,
    # once older than the grace period, left by a run killed in between (or an old version).
    study.add_trial(optuna.trial.FrozenTrial(
        number=0, state=TrialState.RUNNING, value=None, datetime_start=dt.datetime.now() - dt.timedelta(hours=2),
        datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={},
        intermediate_values={}, trial_id=0))
    trials["unmarked-old"] = study.trials[-1]._trial_id
    try:
        leases.fail_stale_trials(study, grace_s=3600)
        state = {name: storage.get_trial(tid).state for name, tid in trials.items()}
    finally:
        sleeper.kill()
    assert state["live"] == state["mine"] == state["remote-recent"] == state["unmarked-new"] == TrialState.RUNNING
    assert state["dead"] == state["unmarked-old"] == TrialState.FAIL
    now = dt.datetime.now()  # another host's trial: gone once older than the grace period
    assert leases.owner_gone("elsewhere:run:2", now - dt.timedelta(hours=7), now, grace_s=3600)
    assert not leases.owner_gone("elsewhere:run:2", now - dt.timedelta(hours=2), now, grace_s=3600)


def test_progress_lines_when_not_on_a_terminal():
    """In a log or CI the live bar is invisible until the end: a progress line per finished
    problem (the summary is the command's, printed once at the end)."""
    import io

    from rich.console import Console

    from fa_autotune.tune.progress import RichReporter
    from fa_autotune.tune.search import ProblemOutcome

    buffer = io.StringIO()
    reporter = RichReporter(Console(file=buffer, force_terminal=False))
    problem = Problem(1, 2, 2, 64, 64, 32, "float16")
    reporter.start([problem], 4, interpreter=True)
    outcome = ProblemOutcome(problem, "s", trials=4, new_trials=4, best=Candidate(KernelConfig()), best_ms=1.0,
                             best_tflops=0.01)
    reporter.problem_started(0, ProblemOutcome(problem, "s"), 4)
    reporter.problem_finished(outcome)
    reporter.finish([outcome])
    (line,) = [x for x in buffer.getvalue().splitlines() if x.startswith("progress:")]
    assert line.startswith(f"progress: 1/1 problems, 4/4 configs: {problem.key} searched (4 configs")
    assert "tuned problem" not in buffer.getvalue()


def test_a_trial_closed_by_another_run_does_not_end_this_one(tmp_path):
    """If another tune judged this run gone and failed its trial, settling it warns and the
    run goes on (the measurement is already stored)."""
    import optuna
    from optuna.trial import TrialState

    from fa_autotune.tune import leases

    storage = connect(f"sqlite:///{tmp_path / 'db.sqlite'}").optuna_storage()
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask()
    storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    with pytest.warns(RuntimeWarning, match="closed by another tune"):
        with leases.closed_elsewhere(trial):
            trial.set_user_attr("status", "ok")
            study.tell(trial, 1.0)
    with pytest.raises(ZeroDivisionError):  # anything else still propagates
        with leases.closed_elsewhere(trial):
            1 / 0


def test_runs_sharing_a_database_spread_over_the_problems(tuner):
    """A run starts with problems no other live run is tuning (a study marked by a live
    process comes last, one marked by a dead one counts as free), and worker k of n starts
    at the k-th n-th of the list; every problem is still visited."""
    import socket
    import subprocess
    import sys

    import optuna

    from fa_autotune.tune.search import study_name

    problems = [Problem(1, 2, 2, 40 + 8 * i, 40 + 8 * i, 16, "float16") for i in range(4)]
    first = tuner("fwd", trials=1)
    remaining = list(enumerate(problems))
    assert first._next_problem(remaining, 4) == 0
    assert tuner("fwd", trials=1, worker=(1, 2))._next_problem(remaining, 4) == 2
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    try:
        for problem, pid in ((problems[0], sleeper.pid), (problems[1], dead.pid), (problems[2], sleeper.pid)):
            study = optuna.create_study(study_name=study_name(None, first.gpu, first.space, problem),
                                        storage=first.db.optuna_storage())
            study.set_user_attr("worker", {"owner": f"{host}:run:{pid}", "since": "2026-12-01T00:00:00"})
        assert first._next_problem(remaining, 4) == 1  # 0 is live elsewhere, 1's run is dead
        assert tuner("fwd", trials=1, worker=(1, 2))._next_problem(remaining, 4) == 3
        assert first._next_problem([remaining[0], remaining[2]], 4) == 0  # all held: the list's order
        order = []

        class Recorder(SilentReporter):
            def problem_started(self, index, outcome, target):
                order.append(index)

        run = tuner("fwd", trials=1)
        run.reporter = Recorder()
        outcomes = run.tune(problems[:2])
        assert order == [1, 0]  # 0 is held by a live run: visited last
        assert [o.problem for o in outcomes] == problems[:2]  # reported in the list's order
        marks = {s.study_name: s.user_attrs.get("worker") for s in run.db.optuna_storage().get_all_studies()}
        name = lambda p: study_name(None, run.gpu, run.space, p)  # noqa: E731
        assert marks[name(problems[1])] is None  # its own mark cleared at the end
        assert marks[name(problems[0])]["owner"] == f"{host}:run:{sleeper.pid}"  # another run's left alone
    finally:
        sleeper.kill()


def _kernel_starts(problem: Problem, gpu, tuned: list[tuple[Problem, KernelConfig]]) -> list[KernelConfig]:
    """The kernel configs of :func:`warm_starts` for winners ``tuned`` of problems that are not
    FP8 (candidates without a recipe)."""
    from fa_autotune.tune.search import warm_starts

    starts = warm_starts(problem, gpu, [(p, Candidate(c)) for p, c in tuned])
    assert all(c.recipe is None for c in starts)
    return [c.config for c in starts]


def test_warm_start_keeps_an_fp8_winners_recipe():
    """An FP8 problem's earlier winner comes back with its recipe; built-in configs with the
    default one."""
    from fa_autotune.spec.defaults import defaults_for
    from fa_autotune.spec.target import GpuInfo
    from fa_autotune.tune.search import warm_starts

    hopper = GpuInfo("NVIDIA H200", "9.0", 132, 1, "1")
    fp8 = Problem(1, 16, 16, 4096, 4096, 128, "float8_e4m3fn")
    winner = Candidate(KernelConfig(BLOCK_N=128), Fp8Recipe("per_head", False))
    starts = warm_starts(fp8, hopper, [(fp8, winner)])
    defaults = defaults_for(fp8, hopper)
    assert starts[:len(defaults) + 1] == [Candidate(c, Fp8Recipe()) for c in defaults] + [winner]


def test_warm_start_tries_a_causal_persistent_winner_in_other_l2_sections():
    """On Hopper a re-tune of a causal problem measures the default, the incumbent, the
    incumbent with the turns flipped, with lazy rescaling, in sections of 4, 8 and 16 heads
    (persistent Gluon grids only), then the Gluon structures; a non-causal problem gets no
    section variants."""
    from fa_autotune.spec.defaults import GLUON_DEFAULT, defaults_for
    from fa_autotune.spec.target import GpuInfo

    hopper = GpuInfo("NVIDIA H200", "9.0", 132, 1, "1")
    causal = Problem(16, 16, 16, 1024, 1024, 128, "bfloat16", causal=True)
    incumbent = GLUON_DEFAULT.with_(persistent=1, section=8)
    starts = _kernel_starts(causal, hopper, [(causal, incumbent)])
    defaults = defaults_for(causal, hopper)
    assert starts[:len(defaults) + 5] == defaults + [incumbent, incumbent.with_(pingpong=True),
                                                    incumbent.with_(rescale_threshold=8),
                                                    incumbent.with_(section=4), incumbent.with_(section=16)]
    full = Problem(16, 16, 16, 1024, 1024, 128, "bfloat16")
    assert not any(c.section for c in _kernel_starts(full, hopper, [(full, incumbent.with_(section=0))]))
    triton = KernelConfig(BLOCK_M=64, BLOCK_N=64)
    assert not any(c.section for c in _kernel_starts(causal, hopper, [(causal, triton)]))


def test_warm_start_tries_a_d64_causal_steps_in_turn_winner_with_half_steps():
    """A D <= 64 causal Gluon winner without the overlap is measured with half diagonal steps
    right after itself; an overlapped one, one at D=128 or one with three consumers is not."""
    from fa_autotune.spec.defaults import GLUON_DEFAULT, defaults_for
    from fa_autotune.spec.target import GpuInfo

    hopper = GpuInfo("NVIDIA H200", "9.0", 132, 1, "1")
    causal = Problem(16, 32, 32, 1024, 1024, 64, "bfloat16", causal=True)
    incumbent = GLUON_DEFAULT.with_(overlap=False, one_loop=True, section=16)
    starts = _kernel_starts(causal, hopper, [(causal, incumbent)])
    defaults = defaults_for(causal, hopper)
    assert starts[len(defaults):len(defaults) + 2] == [incumbent, incumbent.with_(half_step=True)]
    overlapped = GLUON_DEFAULT.with_(section=16)
    assert starts.count(incumbent.with_(half_step=True)) == 1
    assert not any(c.half_step and c.section == 16 for c in _kernel_starts(causal, hopper, [(causal, overlapped)]))
    d128 = Problem(16, 16, 16, 1024, 1024, 128, "bfloat16", causal=True)
    assert not any(c.half_step for c in _kernel_starts(d128, hopper, [(d128, incumbent)]))
    three = incumbent.with_(consumers=3, consumer_regs=160)  # the space searches half steps with two consumers
    assert not any(c.half_step for c in _kernel_starts(causal, hopper, [(causal, three)]) if c.consumers == 3)


def test_warm_start_tries_a_two_consumer_gluon_winner_with_the_turns_flipped():
    """A two-consumer Gluon incumbent (and its half-step form) is measured with ping-pong
    flipped, before the section variants; three consumers, Triton winners and backward
    problems are not."""
    from fa_autotune.spec.defaults import GLUON_BACKWARD, GLUON_DEFAULT
    from fa_autotune.spec.target import GpuInfo

    hopper = GpuInfo("NVIDIA H200", "9.0", 132, 1, "1")
    causal = Problem(16, 32, 32, 1024, 1024, 64, "bfloat16", causal=True)
    incumbent = GLUON_DEFAULT.with_(overlap=False, one_loop=True, persistent=1, section=16)
    starts = _kernel_starts(causal, hopper, [(causal, incumbent)])
    flipped = [incumbent.with_(pingpong=True), incumbent.with_(half_step=True, pingpong=True)]
    assert all(c in starts for c in flipped)
    assert starts.index(flipped[1]) < starts.index(incumbent.with_(section=4))
    turning = GLUON_DEFAULT.with_(pingpong=True, persistent=1, section=8)
    assert turning.with_(pingpong=False) in _kernel_starts(causal, hopper, [(causal, turning)])
    three = incumbent.with_(consumers=3, consumer_regs=160)  # turns go round three consumers too
    assert three.with_(pingpong=True) in _kernel_starts(causal, hopper, [(causal, three)])
    triton = KernelConfig(BLOCK_M=64, BLOCK_N=64)
    assert not any(c.pingpong for c in _kernel_starts(causal, hopper, [(causal, triton)]) if c.language == "triton")
    backward = Problem(4, 16, 16, 1024, 1024, 128, "bfloat16", causal=True, kind="bwd")
    # forward knobs: the backward kernel has none
    assert not any(c.pingpong or c.rescale_threshold
                   for c in _kernel_starts(backward, hopper, [(backward, GLUON_BACKWARD)]))
    lazy = incumbent.with_(rescale_threshold=8)  # lazy rescaling flipped both ways
    assert lazy.with_(rescale_threshold=0) in _kernel_starts(causal, hopper, [(causal, lazy)])


def test_a_runs_claims_wait_for_a_live_holder_and_take_over_from_a_dead_one(tmp_path):
    """leases.Claims, as the tuner uses it: a config a live process on this host claimed is
    not this run's to measure; once that process is gone, or after it released the claim,
    it is; this run's own claim holds against the others."""
    import socket
    import subprocess
    import sys

    from fa_autotune.spec.target import GpuInfo, SoftwareInfo
    from fa_autotune.store.records import claim, release
    from fa_autotune.tune import leases

    db = connect(f"sqlite:///{tmp_path / 'db.sqlite'}")
    ids = identities(db, PROBLEM, GpuInfo("NVIDIA Test GPU", "9.0", 132, 143000, "580"),
                     SoftwareInfo("3.6.0", "2.11.0", "13.0", "0.1.0", "abc"))
    config, other = Candidate(KernelConfig(BLOCK_M=16)), Candidate(KernelConfig(BLOCK_M=32))
    claims = leases.Claims(db, trial_timeout=1.0)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()
    try:
        live = f"{host}:run:{sleeper.pid}"
        assert claim(db, ids, config, live, lambda *_: False) == live
        assert not claims.claim(ids, config)  # held by a live run
        release(db, ids, config, live)
        assert claims.claim(ids, config)  # released: this run's now
        assert claims.claim(ids, config) and claim(db, ids, config, live, lambda *_: False) == leases.OWNER
        assert claim(db, ids, other, live, lambda *_: False) == live
    finally:
        sleeper.kill()
        sleeper.wait()
    assert claims.claim(ids, other)  # its holder is gone: taken over
    claims.release(ids, other)
    assert claim(db, ids, other, live, lambda *_: False) == live

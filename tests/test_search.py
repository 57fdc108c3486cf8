"""The tuner in-process on Triton's interpreter: which configs a study may crown, and that a
re-tune measures the incumbent winner before replacing it."""
from __future__ import annotations

import pytest

from fa_autotune.config import KernelConfig
from fa_autotune.problem import Problem
from fa_autotune.search import TuneOptions, Tuner
from fa_autotune.space import load_space
from fa_autotune.store import connect, queries
from fa_autotune.store.records import identities, record
from fa_autotune.target import detect_gpu, detect_software

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
    outsider = KernelConfig(loop_order="kv_outer", BLOCK_M=16, BLOCK_N=16, q_tiles=2, num_stages=2)
    ids = identities(main.db, PROBLEM, main.gpu, main.software)
    record(main.db, ids, outsider, "ok", phase="search", median_ms=1e-6, tflops=1e6, study_name="other")
    best_before = queries.best(main.db)

    baseline = tuner("tutorial", sampler="grid", study="tutorial", warm_start=False, record_best=False)
    (outcome,) = baseline.tune([PROBLEM])
    grid = load_space("tutorial").for_arch("interpreter").grid(PROBLEM)
    assert outcome.best in grid
    retimed = [r for r in queries.trials(main.db) if r.phase == "retime"]
    assert retimed and all(KernelConfig.from_stored(r.config) != outsider for r in retimed)
    assert queries.best(main.db) == best_before and KernelConfig.from_stored(best_before[0].config) == tuned.best

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
    starts = [KernelConfig.from_stored(t.user_attrs["config"]) for t in study.trials[:2]]
    assert first.best in starts
    retimed = {r.study_name for r in queries.trials(second.db)
               if r.phase == "retime" and KernelConfig.from_stored(r.config) == first.best}
    assert outcome.study_name in retimed

"""Samplers that only propose configs which can run: every trial a study spends is a
measurement, not a constraint violation or a kernel that overflows shared memory.

The space's grid on a problem, less what the static resource model says cannot fit
(:func:`fa_autotune.kernels.resources.fits`), is the set of feasible configs. Optuna's
sampler (TPE or random) still chooses; :class:`FeasibleSampler` redraws a proposal that
leads nowhere feasible and, failing that, picks among the values that do. Optuna's own
``constraints_func`` only learns from violations after they cost a trial; categorical
distributions cannot change their choices per trial, so the filtering happens here.
"""
from __future__ import annotations

import random
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

SAMPLERS = ("tpe", "grid", "random")
REDRAWS = 8  # proposals asked of the wrapped sampler before choosing among feasible values


def make_sampler(name: str, seed: int | None, feasible: "Feasible | None" = None) -> BaseSampler:
    """TPE (multivariate, grouped for the conditional parameters, constant liar so batches
    can be asked ahead), or random; "grid" enqueues every feasible config and samples
    randomly only as a fallback. With ``feasible``, proposals stay inside it."""
    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            base: BaseSampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                                           n_startup_trials=8, constant_liar=True)
    else:
        base = optuna.samplers.RandomSampler(seed=seed)
    return base if feasible is None else FeasibleSampler(base, feasible, seed)


class Feasible:
    """The feasible configs of one problem, as the parameter values a study chooses for each
    (inactive parameters absent): which choices, given those made so far, still lead to one."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self.rows = [dict(row) for row in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def narrow(self, chosen: Mapping[str, Any], rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The feasible configs (of ``rows``, default all) that agree with every choice in
        ``chosen``. A value chosen for a parameter that a config does not ask for (TPE draws
        whole groups) does not rule that config out."""
        rows = self.rows if rows is None else rows
        return [row for row in rows if all(row.get(name, value) == value for name, value in chosen.items())]

    def consistent(self, chosen: Mapping[str, Any]) -> bool:
        """Whether some feasible config agrees with every choice in ``chosen``."""
        return any(all(row.get(name, value) == value for name, value in chosen.items()) for row in self.rows)


class FeasibleSampler(BaseSampler):
    """Wraps a sampler so that what it proposes stays inside :class:`Feasible`.

    Multivariate proposals (TPE's groups) are redrawn up to :data:`REDRAWS` times until they
    agree with a feasible config the study has not taken yet, else dropped for per-parameter
    sampling; each parameter is redrawn likewise and then, if need be, chosen uniformly among
    the values still open given the trial's other choices. The wrapped sampler's model is
    untouched: it still sees every measured trial as it was measured.
    """

    def __init__(self, base: BaseSampler, feasible: Feasible, seed: int | None = None) -> None:
        self._base = base
        self._feasible = feasible
        self._rng = random.Random(seed)
        self._relative: dict[int, dict[str, Any]] = {}  # trial id -> the relative params handed out
        self._narrowed: dict[int, tuple[dict[str, Any], list]] = {}  # trial id -> (choices applied, rows left)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._base.infer_relative_search_space(study, trial)

    def _open_rows(self, study: Study, trial: FrozenTrial) -> list[dict[str, Any]]:
        """The feasible configs no finished or running trial of the study has taken (all of
        them again once every one has): a proposal the study already measured buys nothing."""
        taken = {frozenset(t.params.items()) for t in study.get_trials(deepcopy=False)
                 if t.number != trial.number and t.state != TrialState.FAIL}
        rows = [row for row in self._feasible.rows if frozenset(row.items()) not in taken]
        return rows or self._feasible.rows

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        rows = self._open_rows(study, trial)
        params: dict[str, Any] = {}
        for _ in range(REDRAWS):
            drawn = self._base.sample_relative(study, trial, search_space)
            if self._feasible.narrow(drawn, rows):
                params = drawn
                break
        self._relative[trial._trial_id] = params
        self._narrowed[trial._trial_id] = ({}, rows)
        return params

    def sample_independent(self, study: Study, trial: FrozenTrial, name: str, distribution: BaseDistribution) -> Any:
        chosen = dict(self._relative.get(trial._trial_id, {}), **trial.params)
        applied, rows = self._narrowed.get(trial._trial_id, ({}, None))
        if rows is None:
            rows = self._open_rows(study, trial)
        rows = self._feasible.narrow({k: v for k, v in chosen.items() if k not in applied}, rows)
        self._narrowed[trial._trial_id] = (chosen, rows)
        allowed = list(dict.fromkeys(row[name] for row in rows if name in row))
        if not allowed:  # no feasible completion (cannot happen when every choice came through here)
            return self._base.sample_independent(study, trial, name, distribution)
        for _ in range(REDRAWS):
            value = self._base.sample_independent(study, trial, name, distribution)
            if value in allowed:
                return value
        return self._rng.choice(allowed)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self._relative.pop(trial._trial_id, None)
        self._narrowed.pop(trial._trial_id, None)
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()
        self._rng = random.Random()

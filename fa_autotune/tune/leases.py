"""Runs that share one database: who is measuring what, and what a killed run left behind.

Several tunes (the workers of ``tune --gpus``, or hosts on one PostgreSQL database) may work
on the same problems at once. They coordinate only through the database: a run owns the
trials it asks (an ``owner`` user attribute), claims a config before compiling it (a claim
row, so no config is measured twice), marks the study of the problem it is tuning (a
``worker`` study attribute, so the others start elsewhere), and, on resuming, fails the
RUNNING trials of runs that are gone. The search itself (:mod:`.search`) asks this module
and never looks at another run's marks.
"""
from __future__ import annotations

import datetime as dt
import os
import socket
import time
import uuid
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import optuna
from optuna.trial import TrialState

from ..spec.candidate import Candidate
from ..store import Database
from ..store.records import Ids, claim, release, reusable

if TYPE_CHECKING:
    from ..store.models import MeasurementModel

# This run: "host:run-id:pid". The pid tells a dead run on this host; the run id tells two
# runs apart on hosts whose pids repeat.
OWNER = f"{socket.gethostname()}:{uuid.uuid4().hex[:12]}:{os.getpid()}"
# Trials of a run on another host (whose process this one cannot see) count as abandoned only
# after this long: wall clocks and time zones differ between machines.
REMOTE_GRACE_S = 6 * 3600


def utcnow() -> dt.datetime:
    """Naive UTC, as the database stores trial and claim times."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def grace_s(trial_timeout: float) -> float:
    """How long another host's trial, claim or problem mark counts as live: past any trial's
    timeout, twice, with room for compiling."""
    return 2 * trial_timeout + 600


@contextmanager
def closed_elsewhere(trial) -> Iterator[None]:
    """Settling a trial that another run has meanwhile closed (it judged this run gone) must
    not end this run: the measurement is already in the database."""
    try:
        yield
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError) as exc:
        if "finished" not in str(exc).lower() and "cannot tell" not in str(exc).lower():
            raise
        warnings.warn(f"trial {trial.number} was closed by another tune; its measurement is stored", RuntimeWarning)


def fail_stale_trials(study, grace_s: float) -> None:
    """Trials left RUNNING by a killed tune are lost in flight: close them as failed. Only
    those whose run is gone: its process on this host no longer exists, or, run elsewhere,
    it started more than ``grace_s`` ago; a live run's trials (another tune of the same
    problem, here or on another machine) are left to it."""
    now = dt.datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("owner")
        if owner is None:
            # Between ask() and the owner's mark another run sees a RUNNING trial without
            # one: a live run's, unless it has stayed so past the grace.
            started = trial.datetime_start
            if started is not None and (now - started).total_seconds() <= grace_s:
                continue
        elif not owner_gone(owner, trial.datetime_start, now, grace_s):
            continue
        try:
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except Exception:  # its owner finished it in the meantime
            pass


def mark(study, grace_s: float) -> None:
    """Mark the study as this run's (``worker``), unless another live run holds it."""
    if not held_elsewhere(study.user_attrs.get("worker"), dt.datetime.now(), grace_s):
        study.set_user_attr("worker", {"owner": OWNER, "since": dt.datetime.now().isoformat()})


def release_mark(study) -> None:
    """Clear the study's ``worker`` mark if this run set it."""
    mark = study.user_attrs.get("worker")
    if isinstance(mark, dict) and mark.get("owner") == OWNER:
        study.set_user_attr("worker", None)


def held_elsewhere(mark: Any, now: dt.datetime, grace_s: float) -> bool:
    """Whether a study's ``worker`` mark ({"owner", "since"}) names another run still alive."""
    if not isinstance(mark, dict) or not isinstance(mark.get("owner"), str) or mark["owner"] == OWNER:
        return False
    try:
        since = dt.datetime.fromisoformat(mark.get("since", ""))
    except (TypeError, ValueError):
        since = None
    if since is not None and since.tzinfo is not None:  # not written by this code: unknown age
        since = None
    return not owner_gone(mark["owner"], since, now, grace_s)


def owner_gone(owner: str, started: dt.datetime | None, now: dt.datetime, grace_s: float) -> bool:
    """Whether the run that owns a RUNNING trial ("host:run-id:pid") is gone: on this host, its
    process no longer exists; elsewhere, the trial is older than ``grace_s`` (at least
    REMOTE_GRACE_S)."""
    if owner == OWNER:
        return False
    host, _, pid = owner.rpartition(":")
    host = host.split(":")[0]
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False
    return started is None or (now - started).total_seconds() > max(grace_s, REMOTE_GRACE_S)


def next_problem(storage, names: list[str], indices: list[int], total: int, worker: tuple[int, int],
                 grace_s: float) -> int:
    """Which of the remaining problems (their study ``names`` and list ``indices``, in the
    order remaining) to tune next, as a position in that order. Runs sharing the database
    spread out: a problem another live run is tuning comes after those nobody is on (its
    study is shared, so joining it later only helps finish it); worker k of n (``worker``)
    starts at the k-th n-th of the list of ``total``. Only an order: every problem is
    visited."""
    try:
        marks = {s.study_name: s.user_attrs.get("worker") for s in storage.get_all_studies()}
    except Exception:  # a busy database must not stop the run: keep the list's order
        marks = {}
    now = dt.datetime.now()
    start = worker[0] * total // worker[1]

    def rank(position: int) -> tuple[bool, int]:
        return (held_elsewhere(marks.get(names[position]), now, grace_s), (indices[position] - start) % total)

    return min(range(len(names)), key=rank)


class Claims:
    """This run's claims on configs of one database: a config another live run is measuring
    is waited for (its row answers it), not measured twice."""

    def __init__(self, db: Database, trial_timeout: float) -> None:
        self.db, self.trial_timeout = db, trial_timeout

    def claim(self, ids: Ids, config: Candidate) -> bool:
        """Claim measuring ``config`` in the database; False while another live run holds it."""
        grace = grace_s(self.trial_timeout)

        def gone(holder: str, claimed_at: dt.datetime | None) -> bool:
            return owner_gone(holder, claimed_at, utcnow().replace(tzinfo=None), grace)

        return claim(self.db, ids, config, OWNER, gone) == OWNER

    def release(self, ids: Ids, config: Candidate) -> None:
        """Give up this run's claim once its measurement is stored."""
        release(self.db, ids, config, OWNER)

    def await_elsewhere(self, ids: Ids, config: Candidate) -> MeasurementModel | None:
        """The stored measurement of ``config``, waiting while another live run measures it
        (up to twice the trial timeout); None when it is this run's to measure (claimed)."""
        deadline = time.monotonic() + 2 * self.trial_timeout + 60
        while True:
            previous = reusable(self.db, ids, config)
            if previous is not None or self.claim(ids, config) or time.monotonic() > deadline:
                return previous
            time.sleep(0.5)

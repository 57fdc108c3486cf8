"""Identities and measurements: a GPU, a software stack, a problem and a config (a
:class:`~fa_autotune.spec.candidate.Candidate`: the kernel config with an FP8 problem's
recipe) each get one row; every measurement points at them. Every write is one short transaction (winners
and fronts: :mod:`.tuned`)."""
from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from ..spec.candidate import Candidate
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.target import GpuInfo, SoftwareInfo
from .db import Database
from .models import (REUSABLE_STATUSES, STATUSES, ClaimModel, ConfigModel, GpuModel, MeasurementModel, ProblemModel,
                     SoftwareModel, _now)


@dataclass(frozen=True)
class Ids:
    """Row ids of the identities a tune writes against."""

    problem: int
    gpu: int
    software: int


def get_or_create(session: Session, model, unique: dict, **extra):
    """The row with these unique values, inserted if missing. Another process may insert it
    between our look and our insert (two tunes sharing a database): on SQLite and
    PostgreSQL the insert is ``ON CONFLICT DO NOTHING`` and the row is read again, so the
    race is absorbed instead of failing with a unique-constraint error."""
    row = session.scalar(select(model).filter_by(**unique))
    if row is not None:
        return row
    insert = _CONFLICT_INSERTS.get(session.get_bind().dialect.name)
    if insert is None:  # other databases: the plain insert
        row = model(**unique, **extra)
        session.add(row)
        session.flush()
        return row
    session.execute(insert(model).values(**unique, **extra).on_conflict_do_nothing(index_elements=list(unique)))
    return session.scalars(select(model).filter_by(**unique).execution_options(populate_existing=True)).one()


_CONFLICT_INSERTS = {"sqlite": sqlite_insert, "postgresql": postgresql_insert}


def gpu_row(session: Session, gpu: GpuInfo) -> GpuModel:
    return get_or_create(session, GpuModel, gpu.to_dict())


def software_row(session: Session, sw: SoftwareInfo) -> SoftwareModel:
    return get_or_create(session, SoftwareModel, sw.to_dict())


def problem_row(session: Session, problem: Problem) -> ProblemModel:
    return get_or_create(session, ProblemModel, {"key": problem.key}, **asdict(problem))


def config_row(session: Session, candidate: Candidate | KernelConfig) -> ConfigModel:
    """The row of a candidate (a config and, for FP8, its recipe; a bare KernelConfig has the
    identity of the candidate without a recipe, or with the default one): one per identity."""
    return get_or_create(session, ConfigModel, {"hash": candidate.key}, name=candidate.name,
                         json=candidate.canonical_json())


def identities(db: Database, problem: Problem, gpu: GpuInfo, sw: SoftwareInfo) -> Ids:
    with db.session() as s:
        return Ids(problem_row(s, problem).id, gpu_row(s, gpu).id, software_row(s, sw).id)


def record(db: Database, ids: Ids, candidate: Candidate | KernelConfig, status: str, *,
           started_at: dt.datetime | None = None, **fields) -> int:
    """Store one measurement; returns its id."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    with db.session() as s:
        row = MeasurementModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software,
                               config_id=config_row(s, candidate).id, status=status, **fields)
        if started_at is not None:
            row.started_at = started_at
        s.add(row)
        s.flush()
        return row.id


def reusable(db: Database, ids: Ids, candidate: Candidate | KernelConfig) -> MeasurementModel | None:
    """The latest measurement of ``candidate`` on this problem, GPU and software that answers
    for the candidate itself (see REUSABLE_STATUSES), or None."""
    with db.session() as s:
        return s.scalar(
            select(MeasurementModel).join(ConfigModel)
            .where(MeasurementModel.problem_id == ids.problem, MeasurementModel.gpu_id == ids.gpu,
                   MeasurementModel.software_id == ids.software, ConfigModel.hash == candidate.key,
                   MeasurementModel.status.in_(REUSABLE_STATUSES))
            .order_by(MeasurementModel.id.desc()).limit(1)
        )


def claim(db: Database, ids: Ids, candidate: Candidate | KernelConfig, owner: str, gone) -> str:
    """Claim measuring ``candidate`` for ``owner``; returns who holds the claim now: ``owner``, or
    another run still alive. A claim whose holder is gone (``gone(holder, claimed_at)``) is
    taken over, atomically against a third run doing the same."""
    with db.session() as s:
        config_id = config_row(s, candidate).id
        unique = {"problem_id": ids.problem, "gpu_id": ids.gpu, "software_id": ids.software, "config_id": config_id}
        row = get_or_create(s, ClaimModel, unique, owner=owner, claimed_at=_now())
        holder = row.owner
        if holder != owner and gone(holder, row.claimed_at):
            taken = s.execute(update(ClaimModel).where(ClaimModel.id == row.id, ClaimModel.owner == holder)
                              .values(owner=owner, claimed_at=_now()))
            holder = owner if taken.rowcount == 1 else s.scalar(select(ClaimModel.owner).where(ClaimModel.id == row.id))
        return holder


def release(db: Database, ids: Ids, candidate: Candidate | KernelConfig, owner: str) -> None:
    """Drop ``owner``'s claim on ``candidate`` (its measurement is stored, whatever its status)."""
    with db.session() as s:
        config_id = s.scalar(select(ConfigModel.id).where(ConfigModel.hash == candidate.key))
        if config_id is not None:
            s.execute(delete(ClaimModel).where(ClaimModel.problem_id == ids.problem, ClaimModel.gpu_id == ids.gpu,
                                               ClaimModel.software_id == ids.software,
                                               ClaimModel.config_id == config_id, ClaimModel.owner == owner))

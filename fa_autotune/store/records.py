"""Writing and reading rows: identities (GPU, software, problem, config) get one row each;
measurements and winners point at them. Every write is one short transaction."""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..config import KernelConfig
from ..problem import Problem
from ..target import GpuInfo, SoftwareInfo
from .db import Database
from .models import (
    REUSABLE_STATUSES, STATUSES, BestModel, ConfigModel, GpuModel, MeasurementModel, ParetoModel, ProblemModel,
    SoftwareModel,
)


@dataclass(frozen=True)
class Ids:
    """Row ids of the identities a tune writes against."""

    problem: int
    gpu: int
    software: int


def _get_or_create(session: Session, model, unique: dict, **extra):
    row = session.scalar(select(model).filter_by(**unique))
    if row is None:
        row = model(**unique, **extra)
        session.add(row)
        session.flush()
    return row


def gpu_row(session: Session, gpu: GpuInfo) -> GpuModel:
    return _get_or_create(session, GpuModel, gpu.to_dict())


def software_row(session: Session, sw: SoftwareInfo) -> SoftwareModel:
    return _get_or_create(session, SoftwareModel, sw.to_dict())


def problem_row(session: Session, problem: Problem) -> ProblemModel:
    return _get_or_create(session, ProblemModel, {"key": problem.key}, **{
        k: v for k, v in problem.to_dict().items()})


def config_row(session: Session, config: KernelConfig) -> ConfigModel:
    return _get_or_create(session, ConfigModel, {"hash": config.key}, name=config.name, json=config.canonical_json())


def identities(db: Database, problem: Problem, gpu: GpuInfo, sw: SoftwareInfo) -> Ids:
    with db.session() as s:
        return Ids(problem_row(s, problem).id, gpu_row(s, gpu).id, software_row(s, sw).id)


def record(db: Database, ids: Ids, config: KernelConfig, status: str, *, started_at: dt.datetime | None = None,
           **fields) -> int:
    """Store one measurement; returns its id."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    with db.session() as s:
        row = MeasurementModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software,
                               config_id=config_row(s, config).id, status=status, **fields)
        if started_at is not None:
            row.started_at = started_at
        s.add(row)
        s.flush()
        return row.id


def reusable(db: Database, ids: Ids, config: KernelConfig) -> MeasurementModel | None:
    """The latest measurement of ``config`` on this problem, GPU and software that answers
    for the config itself (see REUSABLE_STATUSES), or None."""
    with db.session() as s:
        return s.scalar(
            select(MeasurementModel).join(ConfigModel)
            .where(MeasurementModel.problem_id == ids.problem, MeasurementModel.gpu_id == ids.gpu,
                   MeasurementModel.software_id == ids.software, ConfigModel.hash == config.key,
                   MeasurementModel.status.in_(REUSABLE_STATUSES))
            .order_by(MeasurementModel.id.desc()).limit(1)
        )


def set_best(db: Database, ids: Ids, config: KernelConfig, median_ms: float, tflops: float,
             rel_error: float | None, ties: int, study_name: str | None, source: str = "tune") -> None:
    with db.session() as s:
        config_id = config_row(s, config).id
        row = s.scalar(select(BestModel).filter_by(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software))
        if row is None:
            row = BestModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software, config_id=config_id)
            s.add(row)
        row.config_id = config_id
        row.median_ms, row.tflops, row.rel_error, row.ties = median_ms, tflops, rel_error, ties
        row.study_name, row.source = study_name, source
        row.decided_at = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def set_front(db: Database, ids: Ids, front: list[tuple[KernelConfig, float, float, float]],
              max_error: float | None, study_name: str | None) -> None:
    """Replace the problem's stored Pareto front with ``front`` ((config, ms, TFLOPS, error) rows)."""
    with db.session() as s:
        s.execute(delete(ParetoModel).where(ParetoModel.problem_id == ids.problem, ParetoModel.gpu_id == ids.gpu,
                                            ParetoModel.software_id == ids.software))
        for config, ms, flops, err in front:
            s.add(ParetoModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software,
                              config_id=config_row(s, config).id, median_ms=ms, tflops=flops, rel_error=err,
                              max_error=max_error, study_name=study_name))

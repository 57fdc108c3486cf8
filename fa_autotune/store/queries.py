"""Read-side of the results database: plain dataclasses, filterable the same way everywhere."""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from sqlalchemy import Select, select

from ..config import KernelConfig
from ..problem import Problem
from .db import Database
from .models import BestModel, ConfigModel, GpuModel, MeasurementModel, ProblemModel, SoftwareModel


@dataclass(frozen=True)
class Filters:
    """Filters shared by every query; None means any."""

    gpu: str | None = None  # substring of the GPU name, case-insensitive
    dtype: str | None = None
    head_dim: int | None = None
    causal: bool | None = None
    status: str | None = None
    problem: str | None = None  # exact problem key

    def apply(self, stmt: Select, with_status: bool = True) -> Select:
        if self.gpu:
            stmt = stmt.where(GpuModel.name.ilike(f"%{self.gpu}%"))
        if self.dtype:
            from ..problem import canonical_dtype

            stmt = stmt.where(ProblemModel.dtype == canonical_dtype(self.dtype))
        if self.head_dim is not None:
            stmt = stmt.where(ProblemModel.head_dim == self.head_dim)
        if self.causal is not None:
            stmt = stmt.where(ProblemModel.causal == self.causal)
        if self.problem:
            stmt = stmt.where(ProblemModel.key == self.problem)
        if with_status and self.status:
            stmt = stmt.where(MeasurementModel.status == self.status)
        return stmt


@dataclass(frozen=True)
class BestRow:
    gpu: str
    capability: str
    problem: str
    dtype: str
    head_dim: int
    causal: bool
    config_name: str
    config: dict
    median_ms: float
    tflops: float
    rel_error: float | None
    ties: int
    triton: str
    torch: str
    template_hash: str
    source: str
    decided_at: str


@dataclass(frozen=True)
class TrialRow:
    id: int
    gpu: str
    problem: str
    config_name: str
    config: dict
    status: str
    phase: str
    median_ms: float | None
    tflops: float | None
    rel_error: float | None
    compile_seconds: float | None
    study_name: str | None
    trial_number: int | None
    message: str
    finished_at: str


def _stamp(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def problem_of(row: ProblemModel) -> Problem:
    return Problem(row.batch, row.heads_q, row.heads_kv, row.seqlen_q, row.seqlen_k, row.head_dim, row.dtype,
                   row.causal, row.causal_align)


def best(db: Database, filters: Filters = Filters()) -> list[BestRow]:
    """The winner of every problem (per GPU and software stack), sorted by GPU and problem."""
    stmt = (select(BestModel, ProblemModel, ConfigModel, GpuModel, SoftwareModel)
            .join(ProblemModel, BestModel.problem_id == ProblemModel.id)
            .join(ConfigModel, BestModel.config_id == ConfigModel.id)
            .join(GpuModel, BestModel.gpu_id == GpuModel.id)
            .join(SoftwareModel, BestModel.software_id == SoftwareModel.id))
    stmt = filters.apply(stmt, with_status=False)
    with db.session() as s:
        rows = s.execute(stmt).all()
    out = [BestRow(g.name, g.capability, p.key, p.dtype, p.head_dim, p.causal, c.name, json.loads(c.json),
                   b.median_ms, b.tflops, b.rel_error, b.ties, sw.triton, sw.torch, sw.template_hash, b.source,
                   _stamp(b.decided_at))
           for b, p, c, g, sw in rows]
    return sorted(out, key=lambda r: (r.gpu, r.problem, r.triton, r.template_hash))


def trials(db: Database, filters: Filters = Filters(), limit: int | None = None) -> list[TrialRow]:
    """Every measurement, oldest first."""
    stmt = (select(MeasurementModel, ProblemModel, ConfigModel, GpuModel)
            .join(ProblemModel, MeasurementModel.problem_id == ProblemModel.id)
            .join(ConfigModel, MeasurementModel.config_id == ConfigModel.id)
            .join(GpuModel, MeasurementModel.gpu_id == GpuModel.id)
            .order_by(MeasurementModel.id))
    stmt = filters.apply(stmt)
    if limit:
        stmt = stmt.limit(limit)
    with db.session() as s:
        rows = s.execute(stmt).all()
    return [TrialRow(m.id, g.name, p.key, c.name, json.loads(c.json), m.status, m.phase, m.median_ms, m.tflops,
                     m.rel_error, m.compile_seconds, m.study_name, m.trial_number, m.message.splitlines()[0]
                     if m.message else "", _stamp(m.finished_at))
            for m, p, c, g in rows]


def tuned_problems(db: Database, gpu_id: int, software_id: int | None = None) -> list[tuple[Problem, KernelConfig]]:
    """(problem, winning config) of every problem decided on this GPU (and software)."""
    stmt = (select(ProblemModel, ConfigModel)
            .join(BestModel, BestModel.problem_id == ProblemModel.id)
            .join(ConfigModel, BestModel.config_id == ConfigModel.id)
            .where(BestModel.gpu_id == gpu_id))
    if software_id is not None:
        stmt = stmt.where(BestModel.software_id == software_id)
    with db.session() as s:
        rows = s.execute(stmt).all()
    pairs = [(problem_of(p), KernelConfig.from_stored(c.json)) for p, c in rows]
    return [(p, c) for p, c in pairs if c is not None]


def as_dicts(rows: list) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def columns(row_type) -> list[str]:
    return [f.name for f in fields(row_type)]

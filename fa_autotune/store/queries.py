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
from .models import BestModel, ConfigModel, GpuModel, MeasurementModel, ParetoModel, ProblemModel, SoftwareModel


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


def _decided(db: Database, model, filters: Filters) -> list:
    """Rows of a per-problem decision table (winners, Pareto fronts) with their problem,
    config, GPU and software."""
    stmt = (select(model, ProblemModel, ConfigModel, GpuModel, SoftwareModel)
            .join(ProblemModel, model.problem_id == ProblemModel.id)
            .join(ConfigModel, model.config_id == ConfigModel.id)
            .join(GpuModel, model.gpu_id == GpuModel.id)
            .join(SoftwareModel, model.software_id == SoftwareModel.id))
    with db.session() as s:
        return s.execute(filters.apply(stmt, with_status=False)).all()


def best(db: Database, filters: Filters = Filters()) -> list[BestRow]:
    """The winner of every problem (per GPU and software stack), sorted by GPU and problem."""
    rows = _decided(db, BestModel, filters)
    out = [BestRow(g.name, g.capability, p.key, p.dtype, p.head_dim, p.causal, c.name, _config_dict(c.json),
                   b.median_ms, b.tflops, b.rel_error, b.ties, sw.triton, sw.torch, sw.template_hash, b.source,
                   _stamp(b.decided_at))
           for b, p, c, g, sw in rows]
    return sorted(out, key=lambda r: (r.gpu, r.problem, r.triton, r.template_hash))


@dataclass(frozen=True)
class ParetoRow:
    gpu: str
    problem: str
    config_name: str
    config: dict[str, Any]
    fp8_scaling: str
    fp8_hadamard: bool
    median_ms: float
    tflops: float
    rel_error: float
    max_error: float | None
    triton: str
    decided_at: str


def pareto(db: Database, filters: Filters = Filters()) -> list[ParetoRow]:
    """The stored time/error Pareto fronts (FP8 tuning), per GPU and problem, fastest first."""
    out = []
    for f, p, c, g, sw in _decided(db, ParetoModel, filters):
        config = _config_dict(c.json)
        out.append(ParetoRow(g.name, p.key, c.name, config, config.get("fp8_scaling", ""),
                             bool(config.get("fp8_hadamard")), f.median_ms, f.tflops, f.rel_error, f.max_error,
                             sw.triton, _stamp(f.decided_at)))
    return sorted(out, key=lambda r: (r.gpu, r.problem, r.triton, r.median_ms))


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
    return [TrialRow(m.id, g.name, p.key, c.name, _config_dict(c.json), m.status, m.phase, m.median_ms, m.tflops,
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


def _config_dict(text: str) -> dict[str, Any]:
    """Every template parameter of a stored config (knobs added later at their defaults);
    the stored JSON as is where this version no longer accepts the config."""
    config = KernelConfig.from_stored(text)
    return config.to_dict() if config is not None else json.loads(text)


def as_dicts(rows: list) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def columns(row_type) -> list[str]:
    return [f.name for f in fields(row_type)]


@dataclass(frozen=True)
class FailureRow:
    status: str
    count: int
    problems: int
    example_problem: str
    example_config: str
    example_message: str


def failures(db: Database, filters: Filters = Filters()) -> list[FailureRow]:
    """Failed trials grouped by status, with a count and the latest example of each."""
    rows = [r for r in trials(db, filters) if r.status != "ok"]
    out = []
    for status in sorted({r.status for r in rows}):
        group = [r for r in rows if r.status == status]
        last = group[-1]
        out.append(FailureRow(status, len(group), len({r.problem for r in group}), last.problem, last.config_name,
                              last.message))
    return sorted(out, key=lambda r: (-r.count, r.status))


@dataclass(frozen=True)
class CompareRow:
    problem: str
    a_config: str
    a_ms: float
    a_tflops: float
    b_config: str
    b_ms: float
    b_tflops: float
    speedup_b_over_a: float  # a_ms / b_ms: above 1 means side b is faster


COMPARE_KEYS = ("gpu", "triton", "torch", "template_hash", "fa_autotune")


def _side(rows: list[BestRow], selector: tuple[str, str]) -> dict[str, BestRow]:
    key, value = selector
    if key not in COMPARE_KEYS:
        raise ValueError(f"compare by one of {COMPARE_KEYS}, not {key!r}")
    picked: dict[str, BestRow] = {}
    for r in rows:
        field = getattr(r, key)
        if (value.lower() in field.lower()) if key == "gpu" else field == value:
            picked[r.problem] = r  # rows are sorted, so the last (newest software) wins
    return picked


def compare(db: Database, a: tuple[str, str], b: tuple[str, str], filters: Filters = Filters()) -> list[CompareRow]:
    """The same problems' winners on two GPUs or two software versions (``("gpu", "H100")``,
    ``("triton", "3.6.0")``...): only problems both sides have."""
    rows = best(db, filters)
    side_a, side_b = _side(rows, a), _side(rows, b)
    return [CompareRow(p, side_a[p].config_name, side_a[p].median_ms, side_a[p].tflops, side_b[p].config_name,
                       side_b[p].median_ms, side_b[p].tflops, side_a[p].median_ms / side_b[p].median_ms)
            for p in sorted(set(side_a) & set(side_b))]


@dataclass(frozen=True)
class CoverageRow:
    problem: str
    gpu: str
    tuned: bool
    config: str | None
    nearest_problem: str | None
    distance: float | None  # how far the nearest tuned problem is (fa_autotune.problem.distance)


def coverage(db: Database, problems: list[Problem], filters: Filters = Filters()) -> list[CoverageRow]:
    """For each problem (of a preset) and GPU in the database: tuned, or how far the nearest is."""
    import math

    from ..problem import distance

    rows = best(db, filters)
    gpus = sorted({r.gpu for r in rows})
    tuned: dict[str, list[tuple[Problem, str]]] = {g: [] for g in gpus}
    with db.session() as s:
        problem_rows = {p.key: problem_of(p) for p in s.scalars(select(ProblemModel))}
    for r in rows:
        tuned[r.gpu].append((problem_rows[r.problem], r.config_name))
    out = []
    for gpu in gpus:
        for problem in problems:
            exact = [c for p, c in tuned[gpu] if p == problem]
            if exact:
                out.append(CoverageRow(problem.key, gpu, True, exact[0], problem.key, 0.0))
                continue
            near = sorted(((distance(problem, p), p.key, c) for p, c in tuned[gpu]), key=lambda t: (t[0], t[1]))
            if near and math.isfinite(near[0][0]):
                out.append(CoverageRow(problem.key, gpu, False, near[0][2], near[0][1], near[0][0]))
            else:
                out.append(CoverageRow(problem.key, gpu, False, None, None, None))
    return out


@dataclass(frozen=True)
class ProgressRow:
    study_name: str
    problem: str
    trial: int  # 1-based order of measurement within the study
    median_ms: float | None
    best_so_far_ms: float | None


def search_progress(db: Database, filters: Filters = Filters()) -> list[ProgressRow]:
    """Best-so-far against trial number for every study (for the report's convergence plot)."""
    rows = [r for r in trials(db, filters) if r.phase == "search" and r.study_name]
    out, best_by_study, count = [], {}, {}
    for r in rows:
        count[r.study_name] = count.get(r.study_name, 0) + 1
        ms = r.median_ms if r.status == "ok" else None
        if ms is not None:
            best_by_study[r.study_name] = min(ms, best_by_study.get(r.study_name, ms))
        out.append(ProgressRow(r.study_name, r.problem, count[r.study_name], ms, best_by_study.get(r.study_name)))
    return out

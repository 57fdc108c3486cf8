"""Read-side of the results database for analysis (``fa-autotune query``, ``results``):
measurements, failures, comparisons, coverage and convergence as plain dataclasses;
winners and fronts are the :mod:`fa_autotune.spec.tuned` records :mod:`.tuned` reads."""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from sqlalchemy import select

from ..spec.candidate import Candidate
from ..spec.problem import Problem, nearest
from ..spec.tuned import FRONT_COLUMNS, WINNER_COLUMNS, FrontPoint, Winner
from .db import Database
from .filters import Filters
from .models import ConfigModel, GpuModel, MeasurementModel, ProblemModel, SoftwareModel
from .tuned import front_points, winners


def best(db: Database, filters: Filters = Filters()) -> list[Winner]:
    """The winner of every problem (per GPU and software stack), sorted by GPU and problem."""
    return sorted(winners(db, filters), key=lambda w: (w.gpu.name, w.problem.key, w.software.triton,
                                                       w.software.template_hash))


def pareto(db: Database, filters: Filters = Filters()) -> list[FrontPoint]:
    """The stored time/error Pareto fronts (FP8 tuning), per GPU and problem, fastest first."""
    return sorted(front_points(db, filters), key=lambda p: (p.gpu.name, p.problem.key, p.software.triton,
                                                            p.median_ms))


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


def trials(db: Database, filters: Filters = Filters(), limit: int | None = None) -> list[TrialRow]:
    """Every measurement, oldest first."""
    stmt = (select(MeasurementModel, ProblemModel, ConfigModel, GpuModel)
            .join(ProblemModel, MeasurementModel.problem_id == ProblemModel.id)
            .join(ConfigModel, MeasurementModel.config_id == ConfigModel.id)
            .join(GpuModel, MeasurementModel.gpu_id == GpuModel.id)
            .join(SoftwareModel, MeasurementModel.software_id == SoftwareModel.id)
            .order_by(MeasurementModel.id))
    stmt = filters.apply(stmt)
    if limit:
        stmt = stmt.limit(limit)
    with db.session() as s:
        rows = s.execute(stmt).all()
    return [TrialRow(m.id, g.name, p.key, c.name, _config_dict(c.json, p.to_problem().is_fp8), m.status, m.phase,
                     m.median_ms, m.tflops, m.rel_error, m.compile_seconds, m.study_name, m.trial_number,
                     m.message.splitlines()[0] if m.message else "", _stamp(m.finished_at))
            for m, p, c, g in rows]


def _config_dict(text: str, fp8: bool) -> dict[str, Any]:
    """Every template parameter of a stored config (knobs added later at their defaults) and,
    for an FP8 problem, its recipe's; the stored JSON as is where this version no longer
    accepts the config."""
    candidate = Candidate.from_stored(text, fp8)
    return candidate.to_dict() if candidate is not None else json.loads(text)


def as_dicts(rows: list) -> list[dict[str, Any]]:
    """Flat dicts of result rows: a record's ``as_row()`` view, a row dataclass's fields."""
    return [r.as_row() if hasattr(r, "as_row") else asdict(r) for r in rows]


def columns(row_type) -> list[str]:
    """Column names of a row type, in display order."""
    if row_type is Winner:
        return list(WINNER_COLUMNS)
    if row_type is FrontPoint:
        return list(FRONT_COLUMNS)
    return [f.name for f in fields(row_type)]


def _stamp(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


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


def _side(rows: list[Winner], selector: tuple[str, str]) -> dict[str, Winner]:
    key, value = selector
    if key not in COMPARE_KEYS:
        raise ValueError(f"compare by one of {COMPARE_KEYS}, not {key!r}")
    picked: dict[str, Winner] = {}
    for w in rows:
        if (value.lower() in w.gpu.name.lower()) if key == "gpu" else getattr(w.software, key) == value:
            picked[w.problem.key] = w  # rows are sorted, so the last (newest software) wins
    return picked


def compare(db: Database, a: tuple[str, str], b: tuple[str, str], filters: Filters = Filters()) -> list[CompareRow]:
    """The same problems' winners on two GPUs or two software versions (``("gpu", "H100")``,
    ``("triton", "3.6.0")``...): only problems both sides have."""
    rows = best(db, filters)
    side_a, side_b = _side(rows, a), _side(rows, b)
    return [CompareRow(p, side_a[p].candidate.name, side_a[p].median_ms, side_a[p].tflops, side_b[p].candidate.name,
                       side_b[p].median_ms, side_b[p].tflops, side_a[p].median_ms / side_b[p].median_ms)
            for p in sorted(set(side_a) & set(side_b))]


@dataclass(frozen=True)
class CoverageRow:
    problem: str
    gpu: str
    tuned: bool
    config: str | None
    nearest_problem: str | None
    distance: float | None  # how far the nearest tuned problem is (fa_autotune.spec.problem.distance)


def coverage(db: Database, problems: list[Problem], filters: Filters = Filters()) -> list[CoverageRow]:
    """For each problem (of a preset) and GPU in the database: tuned, or how far the nearest is."""
    rows = best(db, filters)
    out = []
    for gpu in sorted({w.gpu.name for w in rows}):
        tuned: dict[Problem, Winner] = {w.problem: w for w in rows if w.gpu.name == gpu}
        for problem in problems:
            found = nearest(problem, tuned)
            if found is None:
                out.append(CoverageRow(problem.key, gpu, False, None, None, None))
            else:
                match, distance = found
                out.append(CoverageRow(problem.key, gpu, match == problem, tuned[match].candidate.name, match.key,
                                       distance))
    return out


@dataclass(frozen=True)
class LiveRow:
    study: str
    configs: int  # distinct configs measured in the search (failures included)
    failed: int  # of those, configs with no passing measurement
    best_ms: float | None


def live(db: Database, studies: list[str]) -> list[LiveRow]:
    """What the searches of ``studies`` have measured so far, whoever measured them (the
    failures `tune --gpus` shows while its workers share the database)."""
    stmt = (select(MeasurementModel.study_name, MeasurementModel.config_id, MeasurementModel.status,
                   MeasurementModel.median_ms)
            .where(MeasurementModel.study_name.in_(studies), MeasurementModel.phase == "search"))
    with db.session() as s:
        rows = s.execute(stmt).all()
    seen: dict[str, set] = {}
    passed: dict[str, set] = {}
    best: dict[str, float] = {}
    for name, config_id, status, ms in rows:
        seen.setdefault(name, set()).add(config_id)
        if status == "ok" and ms is not None:
            passed.setdefault(name, set()).add(config_id)
            best[name] = min(ms, best.get(name, ms))
    return [LiveRow(n, len(seen.get(n, ())), len(seen.get(n, set()) - passed.get(n, set())), best.get(n))
            for n in studies]


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

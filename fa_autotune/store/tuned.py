"""All SQL for tuned results: winners and FP8 Pareto fronts, written by the tuner and by
``fa-autotune import``, read back as :mod:`fa_autotune.spec.tuned` records by the
dispatcher, ``export`` and ``query``.

Rows are read oldest decision first; a row whose config this version of fa_autotune no
longer accepts is left out (it could be neither dispatched nor exported).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Callable, Iterable, Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..spec.candidate import Candidate
from ..spec.problem import Problem
from ..spec.target import GpuInfo, SoftwareInfo
from ..spec.tuned import FrontPoint, Tuned, Winner
from .db import Database, safe_url
from .filters import Filters
from .models import BestModel, ConfigModel, GpuModel, ParetoModel, ProblemModel, SoftwareModel
from .records import Ids, config_row, get_or_create, gpu_row, problem_row, software_row


# ------------------------------------------------------------------ writing
def save_winner(db: Database, ids: Ids, winner: Winner) -> None:
    """Make ``winner`` the problem's winner on this GPU and software (replacing any)."""
    with db.session() as s:
        _put_winner(s, ids, winner)


def save_front(db: Database, ids: Ids, points: Sequence[FrontPoint], max_error: float | None) -> None:
    """Replace the problem's stored Pareto front on this GPU and software with ``points``."""
    with db.session() as s:
        _put_front(s, ids, points, max_error)


def import_tuned(db: Database, sets: Iterable[Tuned], progress: Callable[[int, int], None] | None = None) -> int:
    """Store the winners (and fronts) of ``sets`` in one transaction, as decided now by an
    import; returns the number of winners. ``progress(done, total)`` hears every 1000."""
    sets = list(sets)
    total, count = sum(len(t.winners) for t in sets), 0
    with db.session() as s:
        software: dict[SoftwareInfo, int] = {}
        configs: dict[Candidate, int] = {}
        for tuned in sets:
            gpu_id = gpu_row(s, tuned.gpu).id
            fronts: dict[tuple, list[FrontPoint]] = {}
            for point in tuned.fronts:
                fronts.setdefault((point.problem, point.software), []).append(point)
            for winner in tuned.winners:
                if winner.software not in software:
                    software[winner.software] = software_row(s, winner.software).id
                ids = Ids(problem_row(s, winner.problem).id, gpu_id, software[winner.software])
                _put_winner(s, ids, replace(winner, source="import", ties=1, study_name=None), configs)
                front = fronts.get((winner.problem, winner.software))
                if front:
                    _put_front(s, ids, front, None)
                count += 1
                if progress is not None and count % 1000 == 0:
                    progress(count, total)
    return count


def _put_winner(s: Session, ids: Ids, winner: Winner, configs: dict[Candidate, int] | None = None) -> None:
    candidate = winner.candidate
    if configs is None or candidate not in configs:
        config_id = config_row(s, candidate).id
        if configs is not None:
            configs[candidate] = config_id
    config_id = configs[candidate] if configs is not None else config_id
    # Two runs deciding the same problem at once: the row is created once (the race absorbed),
    # the later decision wins.
    row = get_or_create(s, BestModel, {"problem_id": ids.problem, "gpu_id": ids.gpu, "software_id": ids.software},
                        config_id=config_id, median_ms=winner.median_ms, tflops=winner.tflops)
    row.config_id = config_id
    row.median_ms, row.tflops, row.rel_error, row.ties = winner.median_ms, winner.tflops, winner.rel_error, winner.ties
    row.study_name, row.source = winner.study_name, winner.source
    row.decided_at = _utcnow()


def _put_front(s: Session, ids: Ids, points: Sequence[FrontPoint], max_error: float | None) -> None:
    s.execute(delete(ParetoModel).where(ParetoModel.problem_id == ids.problem, ParetoModel.gpu_id == ids.gpu,
                                        ParetoModel.software_id == ids.software))
    for point in points:
        s.add(ParetoModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software,
                          config_id=config_row(s, point.candidate).id, median_ms=point.median_ms, tflops=point.tflops,
                          rel_error=point.rel_error, max_error=max_error, study_name=point.study_name))


# ------------------------------------------------------------------ reading
def winners(db: Database, filters: Filters = Filters()) -> list[Winner]:
    """Every stored winner (one per problem, GPU and software stack), oldest decision first."""
    out = []
    for b, p, c, g, sw in _decided(db, BestModel, filters):
        problem = p.to_problem()
        candidate = c.to_candidate(problem.is_fp8)
        if candidate is not None:
            out.append(Winner(problem, candidate.config, b.median_ms, b.tflops, b.rel_error, g.to_gpu(),
                              sw.to_software(), b.ties, b.source, b.study_name, _stamp(b.decided_at), candidate.recipe))
    return out


def front_points(db: Database, filters: Filters = Filters()) -> list[FrontPoint]:
    """Every stored Pareto-front point, oldest decision first."""
    out = []
    for f, p, c, g, sw in _decided(db, ParetoModel, filters):
        problem = p.to_problem()
        candidate = c.to_candidate(problem.is_fp8)
        if candidate is not None:
            out.append(FrontPoint(problem, candidate.config, f.median_ms, f.tflops, f.rel_error, g.to_gpu(),
                                  sw.to_software(), f.max_error, f.study_name, _stamp(f.decided_at), candidate.recipe))
    return out


def tuned_for(db: Database, gpu: GpuInfo, prefer_triton: str | None = None) -> Tuned:
    """What the database knows for this GPU model: its latest decision per problem (those
    measured with ``prefer_triton`` first)."""
    only = Filters(gpu_model=gpu)
    return Tuned.latest(gpu, winners(db, only), front_points(db, only), safe_url(db.url), prefer_triton)


def tuned_by_gpu(db: Database, gpu: str | None = None) -> list[Tuned]:
    """The latest decision per problem of every GPU model whose name contains ``gpu``."""
    rows, fronts = winners(db, Filters(gpu=gpu)), front_points(db, Filters(gpu=gpu))
    models: dict[tuple[str, str], GpuInfo] = {}
    for w in rows:
        models.setdefault((w.gpu.slug, w.gpu.capability), w.gpu)
    return [Tuned.latest(model, [w for w in rows if w.gpu.same_model(model)],
                         [p for p in fronts if p.gpu.same_model(model)], safe_url(db.url))
            for model in models.values()]


def tuned_problems(db: Database, gpu: GpuInfo) -> list[tuple[Problem, Candidate]]:
    """(problem, winning candidate) of every decision on this GPU model, any software."""
    return [(w.problem, w.candidate) for w in winners(db, Filters(gpu_model=gpu))]


def _decided(db: Database, model, filters: Filters) -> list:
    """Rows of a per-problem decision table (winners, fronts) with their problem, config,
    GPU and software, oldest first."""
    stmt = (select(model, ProblemModel, ConfigModel, GpuModel, SoftwareModel)
            .join(ProblemModel, model.problem_id == ProblemModel.id)
            .join(ConfigModel, model.config_id == ConfigModel.id)
            .join(GpuModel, model.gpu_id == GpuModel.id)
            .join(SoftwareModel, model.software_id == SoftwareModel.id)
            .order_by(model.decided_at, model.id))
    with db.session() as s:
        return s.execute(filters.apply(stmt, with_status=False)).all()


def _stamp(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)

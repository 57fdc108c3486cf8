"""Exported config files: one JSON file per GPU and kernel family, e.g.
``nvidia-h200.attn_fwd.json`` (see tuning_db/README.md).

Files are written deterministically (sorted keys and entries, no timestamps) so they diff
cleanly under version control, and validated completely on load: a corrupt, truncated,
foreign or newer-schema file raises :class:`ConfigFileError` and nothing is imported.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from .config import KernelConfig
from .errors import ConfigError, ConfigFileError, InputError
from .problem import Problem
from .target import GpuInfo, SoftwareInfo

SCHEMA = "fa_autotune.tuned_configs"
SCHEMA_VERSION = 1
FAMILY = "attn_fwd"


@dataclass(frozen=True)
class FrontPoint:
    """One config of an FP8 problem's time/error Pareto front."""

    config: KernelConfig
    median_ms: float
    tflops: float
    rel_error: float


@dataclass(frozen=True)
class Entry:
    problem: Problem
    config: KernelConfig
    median_ms: float
    tflops: float
    rel_error: float | None
    software: SoftwareInfo
    pareto: tuple[FrontPoint, ...] = ()  # FP8 entries: the stored front, fastest first


@dataclass(frozen=True)
class ConfigFile:
    path: str
    family: str
    gpu: GpuInfo
    entries: dict[str, Entry]  # problem key -> entry


def file_name(gpu: GpuInfo, family: str = FAMILY) -> str:
    return f"{gpu.slug}.{family}.json"


# ------------------------------------------------------------------ writing
def export(db, out_dir: str | Path, gpu_filter: str | None = None) -> list[Path]:
    """Write one file per GPU found among the database's winners; returns the paths."""
    from .store.models import BestModel, ConfigModel, GpuModel, ProblemModel, SoftwareModel
    from .store.queries import problem_of

    stmt = (select(BestModel, ProblemModel, ConfigModel, GpuModel, SoftwareModel)
            .join(ProblemModel, BestModel.problem_id == ProblemModel.id)
            .join(ConfigModel, BestModel.config_id == ConfigModel.id)
            .join(GpuModel, BestModel.gpu_id == GpuModel.id)
            .join(SoftwareModel, BestModel.software_id == SoftwareModel.id)
            .order_by(BestModel.decided_at, BestModel.id))
    if gpu_filter:
        stmt = stmt.where(GpuModel.name.ilike(f"%{gpu_filter}%"))
    by_gpu: dict[tuple, dict[str, Any]] = {}
    with db.session() as s:
        for best, prob, cfg, gpu, sw in s.execute(stmt).all():
            config = KernelConfig.from_stored(cfg.json)
            if config is None:
                continue
            info = GpuInfo(gpu.name, gpu.capability, gpu.sm_count, gpu.memory_mb, gpu.driver)
            files = by_gpu.setdefault((info.slug, info.capability), {"gpu": info, "entries": {}})
            # Later decisions (newer software, re-tunes) replace earlier ones.
            files["entries"][prob.key] = {
                "problem": problem_of(prob).to_dict(), "config": json.loads(config.canonical_json()),
                "median_ms": best.median_ms, "tflops": best.tflops, "rel_error": best.rel_error,
                "software": SoftwareInfo(sw.triton, sw.torch, sw.cuda, sw.fa_autotune, sw.template_hash).to_dict(),
            }
            front = _front_rows(s, best)
            if front:
                files["entries"][prob.key]["pareto"] = front
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for data in by_gpu.values():
        path = out / file_name(data["gpu"])
        payload = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "family": FAMILY,
                   "gpu": data["gpu"].to_dict(), "entries": data["entries"]}
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        paths.append(path)
    return sorted(paths)


def _front_rows(session, best) -> list[dict[str, Any]]:
    """The stored Pareto front of a winner's problem, GPU and software, fastest first."""
    from .store.models import ConfigModel, ParetoModel

    rows = session.execute(select(ParetoModel, ConfigModel).join(ConfigModel, ParetoModel.config_id == ConfigModel.id)
                           .where(ParetoModel.problem_id == best.problem_id, ParetoModel.gpu_id == best.gpu_id,
                                  ParetoModel.software_id == best.software_id)).all()
    points = [(KernelConfig.from_stored(c.json), p) for p, c in rows]
    return [{"config": json.loads(config.canonical_json()), "median_ms": p.median_ms, "tflops": p.tflops,
             "rel_error": p.rel_error}
            for config, p in sorted((x for x in points if x[0] is not None),
                                    key=lambda x: (x[1].median_ms, x[0].canonical_json()))]


# ------------------------------------------------------------------ reading
def load(path: str | Path) -> ConfigFile:
    """Read and validate a config file completely."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise ConfigFileError(f"{path}: not valid JSON{hint}: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigFileError(f"{path}: not an fa_autotune config file (schema {_get(data, 'schema')!r}, "
                              f"expected {SCHEMA!r})")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConfigFileError(f"{path}: schema_version must be an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ConfigFileError(f"{path}: schema version {version} is newer than this fa_autotune reads "
                              f"({SCHEMA_VERSION}); upgrade fa_autotune")
    family = data.get("family")
    if family != FAMILY:
        raise ConfigFileError(f"{path}: kernel family {family!r} is not one this fa_autotune serves ({FAMILY!r})")
    gpu = _gpu(path, data.get("gpu"))
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise ConfigFileError(f"{path}: 'entries' must be an object of problem key -> entry")
    return ConfigFile(str(path), family, gpu, {key: _entry(path, key, value) for key, value in sorted(entries.items())})


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else None


def _gpu(path: Path, raw: Any) -> GpuInfo:
    fields = {"name": str, "capability": str, "sm_count": int, "memory_mb": int, "driver": str}
    if not isinstance(raw, dict) or set(raw) != set(fields):
        raise ConfigFileError(f"{path}: 'gpu' must have exactly {sorted(fields)}")
    for name, kind in fields.items():
        if not isinstance(raw[name], kind) or isinstance(raw[name], bool):
            raise ConfigFileError(f"{path}: gpu.{name} must be {kind.__name__}, got {raw[name]!r}")
    return GpuInfo(**raw)


def _entry(path: Path, key: str, raw: Any) -> Entry:
    where = f"{path}: entries[{key!r}]"
    if not isinstance(raw, dict):
        raise ConfigFileError(f"{where} must be an object")
    missing = {"problem", "config", "median_ms", "tflops", "rel_error", "software"} - set(raw)
    if missing:
        raise ConfigFileError(f"{where} lacks {sorted(missing)}")
    try:
        if not isinstance(raw["problem"], dict):
            raise InputError("problem must be an object")
        problem = Problem(**raw["problem"])
        config = KernelConfig.from_mapping(raw["config"])
    except (InputError, ConfigError, TypeError) as exc:
        raise ConfigFileError(f"{where}: {exc}") from None
    if problem.key != key:
        raise ConfigFileError(f"{where}: key does not match its problem ({problem.key})")
    for name in ("median_ms", "tflops"):
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigFileError(f"{where}: {name} must be a positive number, got {value!r}")
    rel = raw["rel_error"]
    if rel is not None and (isinstance(rel, bool) or not isinstance(rel, (int, float)) or not math.isfinite(rel)):
        raise ConfigFileError(f"{where}: rel_error must be a number or null, got {rel!r}")
    sw = raw["software"]
    names = ("triton", "torch", "cuda", "fa_autotune", "template_hash")
    if not isinstance(sw, dict) or set(sw) != set(names) or not all(isinstance(sw[n], str) for n in names):
        raise ConfigFileError(f"{where}: software must have string fields {list(names)}")
    return Entry(problem, config, float(raw["median_ms"]), float(raw["tflops"]), rel, SoftwareInfo(**sw),
                 _front(where, raw.get("pareto", [])))


def _front(where: str, raw: Any) -> tuple[FrontPoint, ...]:
    if not isinstance(raw, list):
        raise ConfigFileError(f"{where}: pareto must be a list of points")
    points = []
    for i, point in enumerate(raw):
        here = f"{where}.pareto[{i}]"
        if not isinstance(point, dict) or set(point) != {"config", "median_ms", "tflops", "rel_error"}:
            raise ConfigFileError(f"{here} must have exactly config, median_ms, tflops, rel_error")
        try:
            config = KernelConfig.from_mapping(point["config"])
        except (ConfigError, TypeError) as exc:
            raise ConfigFileError(f"{here}: {exc}") from None
        for name in ("median_ms", "tflops", "rel_error"):
            value = point[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigFileError(f"{here}: {name} must be a non-negative number, got {value!r}")
        points.append(FrontPoint(config, float(point["median_ms"]), float(point["tflops"]), float(point["rel_error"])))
    return tuple(points)


# ------------------------------------------------------------------ importing
def import_files(db, paths: list[str | Path]) -> int:
    """Validate every file first, then load all entries in one transaction; returns the count."""
    from .store.models import BestModel
    from .store.records import config_row, gpu_row, problem_row, software_row

    files = [load(p) for p in paths]
    count = 0
    with db.session() as s:
        for f in files:
            gpu_id = gpu_row(s, f.gpu).id
            for entry in f.entries.values():
                problem_id = problem_row(s, entry.problem).id
                software_id = software_row(s, entry.software).id
                config_id = config_row(s, entry.config).id
                row = s.scalar(select(BestModel).filter_by(problem_id=problem_id, gpu_id=gpu_id,
                                                           software_id=software_id))
                if row is None:
                    row = BestModel(problem_id=problem_id, gpu_id=gpu_id, software_id=software_id, config_id=config_id)
                    s.add(row)
                row.config_id = config_id
                row.median_ms, row.tflops, row.rel_error = entry.median_ms, entry.tflops, entry.rel_error
                row.ties, row.study_name, row.source = 1, None, "import"
                if entry.pareto:
                    _import_front(s, entry.pareto, problem_id, gpu_id, software_id)
                count += 1
    return count


def _import_front(session, front: tuple[FrontPoint, ...], problem_id: int, gpu_id: int, software_id: int) -> None:
    from sqlalchemy import delete

    from .store.models import ParetoModel
    from .store.records import config_row

    session.execute(delete(ParetoModel).where(ParetoModel.problem_id == problem_id, ParetoModel.gpu_id == gpu_id,
                                              ParetoModel.software_id == software_id))
    for point in front:
        session.add(ParetoModel(problem_id=problem_id, gpu_id=gpu_id, software_id=software_id,
                                config_id=config_row(session, point.config).id, median_ms=point.median_ms,
                                tflops=point.tflops, rel_error=point.rel_error, study_name=None))

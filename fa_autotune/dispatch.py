"""Which config runs a problem: the lookup chain behind ``attention(config=None)``.

First hit wins: in-process cache -> local results database (the exact problem, then the
nearest tuned problem on this GPU and Triton version, by :func:`fa_autotune.problem.distance`)
-> exported files (each directory of ``FA_AUTOTUNE_CONFIG_DIR``, then the files shipped in
``tuning_db/``; exact, then nearest) -> the built-in default. Sources are read once per
process, on the first call that needs them; after the first call for a problem the answer
is a dict lookup. It never tunes. ``FA_AUTOTUNE_DISABLE_TUNED=1`` forces the defaults.
"""
from __future__ import annotations

import math
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from .config import KernelConfig
from .defaults import default_for
from .errors import FaAutotuneError
from .problem import Problem, distance
from .reference import TOLERANCE
from .target import GpuInfo, detect_gpu, interpreter_gpu

@dataclass(frozen=True)
class Choice:
    """A config and where it came from."""

    config: KernelConfig
    source: str
    matched: Problem | None  # the tuned problem whose config this is (None for the default)
    distance: float
    origin: str  # database URL, file path, or "built-in"


@dataclass(frozen=True)
class _Table:
    """Tuned (problem -> config) pairs of one source for one GPU."""

    source: str
    origin: str
    entries: tuple[tuple[Problem, KernelConfig], ...]

    def lookup(self, problem: Problem) -> Choice | None:
        best: tuple[float, str, Problem, KernelConfig] | None = None
        for tuned, config in self.entries:
            d = 0.0 if tuned == problem else distance(problem, tuned)
            if math.isfinite(d) and (best is None or (d, tuned.key) < (best[0], best[1])):
                best = (d, tuned.key, tuned, config)
        if best is None:
            return None
        return Choice(best[3], self.source, best[2], best[0], self.origin)


class Dispatcher:
    """Thread-safe; one per process (``DISPATCHER``)."""

    def __init__(self) -> None:
        self._choices: dict[tuple[Problem, str, int], Choice] = {}
        self._tables: dict[tuple[str, int], list[_Table]] = {}
        self._fronts: dict[tuple[str, int], list[_FrontPoint]] = {}
        self._lock = threading.RLock()
        self._warned: set[str] = set()

    def choose(self, problem: Problem, device_type: str, device_index: int) -> Choice:
        key = (problem, device_type, device_index)
        choice = self._choices.get(key)
        if choice is None:
            with self._lock:
                choice = self._choices.get(key)
                if choice is None:
                    choice = self._resolve(problem, device_type, device_index)
                    self._choices[key] = choice
        return choice

    def choose_fp8(self, problem: Problem, device_type: str, device_index: int, max_error: float | None = None,
                   recipe: tuple[str | None, bool | None] | None = None) -> Choice:
        """FP8: the fastest config on the stored time/error Pareto front of this problem (else
        of the nearest tuned one) whose error is within ``max_error`` (default: the format's
        tolerance) and whose recipe (fp8_scaling, fp8_hadamard; None parts match any) is
        ``recipe``. A budget no front config meets gets the most accurate one, with a
        warning; without a front, what :meth:`choose` gives, with that recipe."""
        key = (problem, device_type, device_index, max_error, recipe)
        choice = self._choices.get(key)
        if choice is None:
            with self._lock:
                choice = self._resolve_fp8(problem, device_type, device_index, max_error, recipe)
                self._choices[key] = choice
        return choice

    def _resolve_fp8(self, problem, device_type, device_index, max_error, recipe) -> Choice:
        gpu = gpu_of(device_type, device_index)
        budget = TOLERANCE[problem.dtype] if max_error is None else max_error
        if os.environ.get("FA_AUTOTUNE_DISABLE_TUNED", "") in ("", "0"):
            key = (device_type, device_index)
            if key not in self._fronts:
                self._fronts[key] = self._load_fronts(gpu)
            front = _nearest_front([p for p in self._fronts[key] if _recipe_matches(p.config, recipe)], problem)
            fits = [p for p in front if p.rel_error <= budget]
            if fits:
                best = min(fits, key=lambda p: (p.median_ms, p.rel_error))
                return Choice(best.config, "pareto", best.problem, distance(problem, best.problem), best.origin)
            if front and max_error is not None:
                best = min(front, key=lambda p: (p.rel_error, p.median_ms))
                self._warn_once(f"no tuned FP8 config of {problem.key} is within max_error={max_error} "
                                f"(the most accurate measured {best.rel_error:.3g}); running that one")
                return Choice(best.config, "pareto", best.problem, distance(problem, best.problem), best.origin)
        if max_error is not None:
            self._warn_once(f"no FP8 Pareto front tuned for {problem.key} on {gpu.name}: its error under "
                            f"max_error={max_error} is unknown (`fa-autotune tune --dtype fp8 --max-error` measures it)")
        base = self.choose(problem, device_type, device_index)
        if recipe is None:
            return base
        changes = {k: v for k, v in zip(("fp8_scaling", "fp8_hadamard"), recipe) if v is not None}
        return Choice(base.config.with_(**changes), base.source, base.matched, base.distance, base.origin)

    def _load_fronts(self, gpu: GpuInfo) -> list[_FrontPoint]:
        """FP8 fronts along the same chain as winners: the database, then exported files,
        then shipped ones; a problem's front comes from the first source that has it."""
        points = _database_fronts(gpu, self._warn_once)
        for directory in [*_config_dirs(), _shipped_dir()]:
            known = {p.problem.key for p in points}
            points += [p for p in _file_fronts(directory, gpu, self._warn_once) if p.problem.key not in known]
        return points

    def reset(self) -> None:
        """Forget everything read so far (after a tune or an import in this process)."""
        with self._lock:
            self._choices.clear()
            self._tables.clear()
            self._fronts.clear()
            self._warned.clear()

    def _resolve(self, problem: Problem, device_type: str, device_index: int) -> Choice:
        gpu = gpu_of(device_type, device_index)
        if os.environ.get("FA_AUTOTUNE_DISABLE_TUNED", "") not in ("", "0"):
            return _default(problem, gpu)
        tables = self._tables_for(gpu, device_type, device_index)
        for table in tables:
            exact = [(p, c) for p, c in table.entries if p == problem]
            if exact:
                return Choice(exact[0][1], table.source, problem, 0.0, table.origin)
            nearest = table.lookup(problem)
            if nearest is not None:
                return nearest
        if not tables and not gpu.is_interpreter and gpu.name not in self._warned:
            self._warned.add(gpu.name)
            warnings.warn(f"fa_autotune: no tuned configs for {gpu.name} (sm_{gpu.capability}); using built-in "
                          "defaults. Run `fa-autotune tune` on this GPU to tune it.", RuntimeWarning, stacklevel=4)
        return _default(problem, gpu)

    def _tables_for(self, gpu: GpuInfo, device_type: str, device_index: int) -> list[_Table]:
        key = (device_type, device_index)
        if key not in self._tables:
            tables = [t for t in (_database_table(gpu, self._warn_once),) if t is not None]
            for directory in _config_dirs():
                tables += _file_tables(directory, gpu, "exported", self._warn_once)
            tables += _file_tables(_shipped_dir(), gpu, "shipped", self._warn_once)
            self._tables[key] = [t for t in tables if t.entries]
        return self._tables[key]

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"fa_autotune: {message}", RuntimeWarning, stacklevel=6)


def gpu_of(device_type: str, device_index: int) -> GpuInfo:
    """What a tensor's device runs on: its GPU, or the interpreter for CPU tensors."""
    return detect_gpu(device_index) if device_type == "cuda" else interpreter_gpu()


def _default(problem: Problem, gpu: GpuInfo) -> Choice:
    return Choice(default_for(problem, gpu), "default", None, math.inf, "built-in")


def _config_dirs() -> list[Path]:
    raw = os.environ.get("FA_AUTOTUNE_CONFIG_DIR", "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def _shipped_dir() -> Path:
    from .resources import data_dir

    return data_dir("tuning_db")


def _same_gpu(a: GpuInfo, b: GpuInfo) -> bool:
    return a.slug == b.slug and a.capability == b.capability


def _load_file(directory: Path, gpu: GpuInfo, warn):
    """This GPU's exported file in ``directory``, or None (absent, or bad: warned)."""
    from . import export

    path = directory / export.file_name(gpu)
    if not path.is_file():
        return None
    try:
        loaded = export.load(path)
    except FaAutotuneError as exc:  # a bad file must not break attention(): skip it, loudly
        warn(f"ignoring {exc}")
        return None
    if not _same_gpu(loaded.gpu, gpu):
        warn(f"ignoring {path}: it was tuned on {loaded.gpu.name} (sm_{loaded.gpu.capability})")
        return None
    return loaded


def _file_tables(directory: Path, gpu: GpuInfo, source: str, warn) -> list[_Table]:
    loaded = _load_file(directory, gpu, warn)
    if loaded is None:
        return []
    entries = tuple((e.problem, e.config) for e in loaded.entries.values())
    return [_Table(source, loaded.path, entries)]


def _file_fronts(directory: Path, gpu: GpuInfo, warn) -> list["_FrontPoint"]:
    loaded = _load_file(directory, gpu, warn)
    if loaded is None:
        return []
    return [_FrontPoint(e.problem, p.config, p.median_ms, p.rel_error, loaded.path)
            for e in loaded.entries.values() for p in e.pareto]


def _query_database(gpu: GpuInfo, warn, what: str, model) -> tuple[list, str]:
    """(rows of ``model`` joined with problem, config and Triton version for this GPU, the
    database URL); no rows when there is no database or it cannot be read (warned)."""
    from .store.db import default_url

    url = default_url()
    if url.startswith("sqlite:///") and not os.path.exists(url.removeprefix("sqlite:///")):
        return [], url  # never create a database just to look into it
    try:
        from sqlalchemy import select

        from .store import connect
        from .store.models import ConfigModel, GpuModel, ProblemModel, SoftwareModel

        db = connect(url)
        stmt = (select(model, ProblemModel, ConfigModel, SoftwareModel.triton)
                .join(ProblemModel, model.problem_id == ProblemModel.id)
                .join(ConfigModel, model.config_id == ConfigModel.id)
                .join(GpuModel, model.gpu_id == GpuModel.id)
                .join(SoftwareModel, model.software_id == SoftwareModel.id)
                .where(GpuModel.name == gpu.name, GpuModel.capability == gpu.capability)
                .order_by(model.decided_at))
        with db.session() as s:
            rows = s.execute(stmt).all()
        db.dispose()
    except Exception as exc:  # an unreachable database must not break attention()
        warn(f"cannot read {what} from {url}: {exc}")
        return [], url
    return rows, url


def _this_triton_last(rows: list) -> list:
    """Rows of other Triton versions first, so that this version's rows override them."""
    import triton

    return sorted(rows, key=lambda row: row[3] == triton.__version__)


def _database_table(gpu: GpuInfo, warn) -> _Table | None:
    """Winners on this GPU from the local database; prefers rows of this Triton version."""
    from .store.models import BestModel
    from .store.queries import problem_of

    rows, url = _query_database(gpu, warn, "tuned configs", BestModel)
    if not rows:
        return None
    chosen: dict[str, tuple[Problem, KernelConfig]] = {}
    for _, prob, cfg, _ in _this_triton_last(rows):
        config = KernelConfig.from_stored(cfg.json)
        if config is not None:
            chosen[prob.key] = (problem_of(prob), config)
    return _Table("database", url, tuple(chosen.values()))


@dataclass(frozen=True)
class _FrontPoint:
    problem: Problem
    config: KernelConfig
    median_ms: float
    rel_error: float
    origin: str  # database URL or file path


def _database_fronts(gpu: GpuInfo, warn) -> list[_FrontPoint]:
    """The stored FP8 Pareto fronts on this GPU: per problem, the newest front (one software
    stack's; this Triton version's over others)."""
    from .store.models import ParetoModel
    from .store.queries import problem_of

    rows, url = _query_database(gpu, warn, "Pareto fronts", ParetoModel)
    ordered = _this_triton_last(rows)
    newest = {prob.key: point.software_id for point, prob, _, _ in ordered}
    points = []
    for point, prob, cfg, _ in ordered:
        config = KernelConfig.from_stored(cfg.json)
        if config is not None and point.software_id == newest[prob.key]:
            points.append(_FrontPoint(problem_of(prob), config, point.median_ms, point.rel_error, url))
    return points


def _nearest_front(points: list[_FrontPoint], problem: Problem) -> list[_FrontPoint]:
    """The points of the tuned problem nearest to ``problem`` (itself first)."""
    ranked = sorted({(distance(problem, p.problem), p.problem.key) for p in points})
    if not ranked or not math.isfinite(ranked[0][0]):
        return []
    return [p for p in points if p.problem.key == ranked[0][1]]


def _recipe_matches(config: KernelConfig, recipe: tuple | None) -> bool:
    return recipe is None or all(want is None or have == want for have, want in
                                 zip((config.fp8_scaling, config.fp8_hadamard), recipe))


DISPATCHER = Dispatcher()

"""Which config runs a problem: the lookup chain behind ``attention(config=None)``.

First hit wins: in-process cache -> local results database -> exported files (each
directory of ``FA_AUTOTUNE_CONFIG_DIR``) -> the files shipped in ``tuning_db/`` -> for a
kernel family this GPU has no shipped file of, the shipped file of the nearest GPU of the
same compute capability (source "shipped (nearest GPU: NAME)") -> the built-in default.
Each source is a :class:`~fa_autotune.spec.tuned.Tuned` (its exact problem, then the
nearest tuned one); the database is read through :mod:`fa_autotune.store`, files
through :mod:`.files`. Sources are read once per process and device, on the first call that
needs them; after the first call for a problem the answer is a dict lookup. It never tunes.
``FA_AUTOTUNE_DISABLE_TUNED=1`` forces the defaults.
"""
from __future__ import annotations

import atexit
import dataclasses
import math
import os
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import triton

from ..errors import FaAutotuneError
from ..paths import data_dir, default_db_url
from ..spec.candidate import Candidate
from ..spec.config import KernelConfig
from ..spec.defaults import default_for
from ..spec.problem import TOLERANCE, Problem, distance, nearest
from ..spec.recipe import Fp8Recipe, default_recipe
from ..spec.target import GpuInfo, detect_gpu, interpreter_gpu
from ..spec.tuned import FrontPoint, Tuned
from . import files
from .record import ENV as RECORD_ENV
from .record import Recorder, RecordError, load_record


NEAREST_GPU_SOURCE = "shipped (nearest GPU: "  # a Choice's source when another GPU's shipped file answered


@dataclass(frozen=True)
class Choice:
    """A config (with, for an FP8 problem, the recipe to quantize its inputs with) and where
    it came from."""

    config: KernelConfig
    source: str  # database, exported, shipped, "shipped (nearest GPU: NAME)", pareto (an FP8 front) or default
    matched: Problem | None  # the tuned problem whose config this is (None for the default)
    distance: float
    origin: str  # database URL, file path, or "built-in"
    recipe: Fp8Recipe | None = None  # FP8 problems: the tuned (or default) quantization recipe

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.config, self.recipe)


@dataclass(frozen=True)
class _Source:
    kind: str  # database, exported, shipped or "shipped (nearest GPU: NAME)"
    tuned: Tuned


class Dispatcher:
    """Thread-safe; one per process (``DISPATCHER``)."""

    def __init__(self) -> None:
        self._choices: dict[tuple, Choice] = {}
        self._sources: dict[tuple[str, int], list[_Source]] = {}
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        self._on_reset: list[Callable[[], None]] = []
        # Counts the problems served while a recording is on (fa_autotune.record,
        # FA_AUTOTUNE_RECORD); None otherwise, the one check the hot paths pay.
        self.recorder: Recorder | None = None

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
                   scaling: str | None = None, hadamard: bool | None = None, sink_tile: bool | None = None) -> Choice:
        """FP8: the fastest config on the stored time/error Pareto front of this problem (else
        of the nearest tuned one) whose error is within ``max_error`` (default: the format's
        tolerance) and whose recipe has the ``scaling``, ``hadamard`` and ``sink_tile`` given
        (None matches any). A budget no front config meets gets the most accurate one, with a warning;
        without a front, what :meth:`choose` gives, its recipe with those parts."""
        key = (problem, device_type, device_index, max_error, scaling, hadamard, sink_tile)
        choice = self._choices.get(key)
        if choice is None:
            with self._lock:
                choice = self._resolve_fp8(problem, device_type, device_index, max_error, (scaling, hadamard, sink_tile))
                self._choices[key] = choice
        return choice

    def reset(self) -> None:
        """Forget everything read so far (after a tune or an import in this process), and
        the launch plans kept on earlier choices (:meth:`on_reset`)."""
        with self._lock:
            self._choices.clear()
            self._sources.clear()
            self._warned.clear()
        for forget in self._on_reset:
            forget()

    def on_reset(self, forget: Callable[[], None]) -> None:
        """Call ``forget`` on every :meth:`reset`: the plan caches built on this dispatcher's
        choices (attention's, the KV cache's) register here."""
        self._on_reset.append(forget)

    # ------------------------------------------------------------------ resolving
    def _resolve(self, problem: Problem, device_type: str, device_index: int) -> Choice:
        gpu = gpu_of(device_type, device_index)
        if _tuned_disabled():
            return _default(problem, gpu)
        sources = self._sources_for(gpu, device_type, device_index)
        for source in sources:
            found = source.tuned.winner_for(problem)
            if found is not None:
                winner, d = found
                return Choice(winner.config, source.kind, winner.problem, d, source.tuned.origin,
                              _recipe_of(winner.recipe, problem))
        if not any(s.tuned.winners for s in sources) and not gpu.is_interpreter and gpu.name not in self._warned:
            self._warned.add(gpu.name)
            warnings.warn(f"fa_autotune: no tuned configs for {gpu.name} (sm_{gpu.capability}); using built-in "
                          "defaults. Run `fa-autotune tune` on this GPU to tune it.", RuntimeWarning, stacklevel=4)
        return _default(problem, gpu)

    def _resolve_fp8(self, problem, device_type, device_index, max_error, parts: tuple) -> Choice:
        """``parts``: the recipe's (scaling, hadamard, sink_tile) a caller fixed (None: any)."""
        gpu = gpu_of(device_type, device_index)
        budget = TOLERANCE[problem.dtype] if max_error is None else max_error
        if not _tuned_disabled():
            front = self._front_for(problem, parts, self._sources_for(gpu, device_type, device_index))
            fits = [(p, origin) for p, origin in front if p.rel_error <= budget]
            if fits:
                best, origin = min(fits, key=lambda item: (item[0].median_ms, item[0].rel_error))
                return Choice(best.config, "pareto", best.problem, distance(problem, best.problem), origin, best.recipe)
            if front and max_error is not None:
                best, origin = min(front, key=lambda item: (item[0].rel_error, item[0].median_ms))
                self._warn_once(f"no tuned FP8 config of {problem.key} is within max_error={max_error} "
                                f"(the most accurate measured {best.rel_error:.3g}); running that one")
                return Choice(best.config, "pareto", best.problem, distance(problem, best.problem), origin, best.recipe)
        if max_error is not None:
            self._warn_once(f"no FP8 Pareto front tuned for {problem.key} on {gpu.name}: its error under "
                            f"max_error={max_error} is unknown (`fa-autotune tune --dtype fp8 --max-error` measures it)")
        base = self.choose(problem, device_type, device_index)
        return dataclasses.replace(base, recipe=base.recipe.with_(*parts))

    @staticmethod
    def _front_for(problem: Problem, parts: tuple, sources: list[_Source]) -> list[tuple[FrontPoint, str]]:
        """The front (points with their origin) of the tuned problem nearest to ``problem``
        among points whose recipe has the ``parts`` (scaling, hadamard, sink_tile; None
        matches any); a problem's front comes from the first source that has one, as winners do."""
        points: list[tuple[FrontPoint, str]] = []
        for source in sources:
            known = {p.problem for p, _ in points}
            points += [(p, source.tuned.origin) for p in source.tuned.fronts if p.problem not in known]
        points = [(p, origin) for p, origin in points if p.recipe.matches(*parts)]
        found = nearest(problem, {p.problem for p, _ in points})
        return [(p, origin) for p, origin in points if found is not None and p.problem == found[0]]

    # ------------------------------------------------------------------ sources
    def _sources_for(self, gpu: GpuInfo, device_type: str, device_index: int) -> list[_Source]:
        key = (device_type, device_index)
        if key not in self._sources:
            sources = []
            database = _database(gpu, self._warn_once)
            if database is not None:
                sources.append(_Source("database", database))
            for directory in _config_dirs():
                sources += _file_source(directory, gpu, "exported", self._warn_once)
            sources += _file_source(_shipped_dir(), gpu, "shipped", self._warn_once)
            borrowed = _nearest_shipped(_shipped_dir(), gpu, self._warn_once)
            if borrowed and not any(s.tuned.winners for s in sources):
                names = sorted({s.tuned.gpu.name for s in borrowed})
                self._warn_once(f"no tuned configs for {gpu.name} (sm_{gpu.capability}); using those shipped for "
                                f"{' and '.join(names)}, the nearest GPU of its compute capability. Run "
                                "`fa-autotune tune` on this GPU to tune it.")
            self._sources[key] = sources + borrowed
        return self._sources[key]

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"fa_autotune: {message}", RuntimeWarning, stacklevel=6)


def shipped_baseline(problem: Problem, gpu: GpuInfo) -> tuple[Candidate, str]:
    """What a fresh install runs for ``problem`` on ``gpu`` (no database, no exported files):
    the shipped file's winner for it or its nearest tuned problem (this GPU's file, else the
    nearest GPU's), else the built-in default; with where it comes from. `tune` reports its
    winners against it."""
    if not _tuned_disabled():
        def quiet(message: str) -> None:  # a bad shipped file is the dispatcher's to report
            pass

        directory = _shipped_dir()
        for source in _file_source(directory, gpu, "shipped", quiet) + _nearest_shipped(directory, gpu, quiet):
            found = source.tuned.winner_for(problem)
            if found is not None:
                winner = found[0]
                return Candidate(winner.config, _recipe_of(winner.recipe, problem)), source.kind
    return Candidate.of(default_for(problem, gpu), problem.is_fp8), "default"


def gpu_of(device_type: str, device_index: int) -> GpuInfo:
    """What a tensor's device runs on: its GPU, or the interpreter for CPU tensors."""
    return detect_gpu(device_index) if device_type == "cuda" else interpreter_gpu()


def _tuned_disabled() -> bool:
    return os.environ.get("FA_AUTOTUNE_DISABLE_TUNED", "") not in ("", "0")


def _default(problem: Problem, gpu: GpuInfo) -> Choice:
    return Choice(default_for(problem, gpu), "default", None, math.inf, "built-in", _recipe_of(None, problem))


def _recipe_of(recipe: Fp8Recipe | None, problem: Problem) -> Fp8Recipe | None:
    """The recipe a choice for ``problem`` carries: a tuned one (the default where the tuned
    problem was not FP8) on an FP8 problem, none on the others."""
    return recipe if recipe is not None and problem.is_fp8 else default_recipe(problem.is_fp8)


def _config_dirs() -> list[Path]:
    raw = os.environ.get("FA_AUTOTUNE_CONFIG_DIR", "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def _shipped_dir() -> Path:
    return data_dir("tuning_db")


def _file_source(directory: Path, gpu: GpuInfo, kind: str, warn) -> list[_Source]:
    """This GPU's files in ``directory`` (one per kernel family), those that are usable (a
    bad or foreign file is skipped with a warning: it must not break attention())."""
    return [source for family in files.FAMILIES for source in _family_source(directory, gpu, family, kind, warn)]


def _family_source(directory: Path, gpu: GpuInfo, family: str, kind: str, warn) -> list[_Source]:
    path = next((directory / name for name in files.file_names(gpu, family) if (directory / name).is_file()), None)
    if path is None:
        return []
    try:
        tuned = files.load(path)
    except FaAutotuneError as exc:
        warn(f"ignoring {exc}")
        return []
    except Exception as exc:  # anything else a file can provoke must not break attention() either
        warn(f"ignoring {path}: {type(exc).__name__}: {exc}")
        return []
    if not tuned.gpu.same_model(gpu):
        warn(f"ignoring {path}: it was tuned on {tuned.gpu.name} (sm_{tuned.gpu.capability})")
        return []
    return [_Source(kind, tuned)]


def _nearest_shipped(directory: Path, gpu: GpuInfo, warn) -> list[_Source]:
    """For each kernel family this GPU has no file of in ``directory``: the file there of the
    nearest other GPU model of the same compute capability (:func:`gpu_distance`), so a GPU
    nobody tuned yet starts from configs measured on a close relative rather than from the
    defaults. Its own database and exported files still come first."""
    if gpu.is_interpreter:  # the interpreter has no relatives: its timings mean nothing elsewhere
        return []
    sources = []
    for family in files.FAMILIES:
        if any((directory / name).is_file() for name in files.file_names(gpu, family)):
            continue  # its own file (used, or refused with a warning) is the one to read
        candidates = []
        for path in sorted(directory.glob(f"*.{family}.json")):
            try:
                tuned = files.load(path)
            except Exception as exc:  # a bad file must not break attention()
                warn(f"ignoring {path}: {type(exc).__name__}: {exc}")
                continue
            if tuned.gpu.capability == gpu.capability and not tuned.gpu.same_model(gpu) and tuned.winners:
                candidates.append((gpu_distance(gpu, tuned.gpu), tuned.gpu.name, str(path), tuned))
        if candidates:
            tuned = min(candidates, key=lambda c: c[:3])[3]
            sources.append(_Source(f"{NEAREST_GPU_SOURCE}{tuned.gpu.name})", tuned))
    return sources


def gpu_distance(a: GpuInfo, b: GpuInfo) -> float:
    """How unlike two GPU models of one compute capability are, from what a tuned file
    records of its GPU: ``|log2 SM ratio| + 0.5 * |log2 memory ratio|`` (SM count decides how a
    grid fills the GPU; memory size stands in for bandwidth, which the files do not record)."""
    def log_ratio(x: int, y: int) -> float:
        return abs(math.log2(max(x, 1) / max(y, 1)))

    return log_ratio(a.sm_count, b.sm_count) + 0.5 * log_ratio(a.memory_mb, b.memory_mb)


def _database(gpu: GpuInfo, warn) -> Tuned | None:
    """What the local database knows for this GPU (this Triton version's decisions over
    others'), or None when there is no database or it cannot be read (warned)."""
    url = default_db_url()
    if url.startswith("sqlite:///") and not os.path.exists(url.removeprefix("sqlite:///")):
        return None  # never create a database just to look into it
    from ..store import connect, safe_url, scrub  # SQLAlchemy only when there is a database to read
    from ..store.tuned import tuned_for

    try:
        db = connect(url, readonly=True)  # creates and migrates nothing
        try:
            return tuned_for(db, gpu, prefer_triton=triton.__version__)
        finally:
            db.dispose()
    except Exception as exc:  # an unreachable or foreign database must not break attention()
        warn(scrub(f"cannot read tuned results from {safe_url(url)}: {exc}", url))
        return None


DISPATCHER = Dispatcher()


# ------------------------------------------------------------------ recording
def start_recording(path: str | os.PathLike) -> Recorder:
    """Count the problems :data:`DISPATCHER` serves from now on, for ``path`` (refused while
    another recording is on, or when ``path`` holds something that is not a record file: it
    could never be written)."""
    recorder = Recorder(path, _served)
    if recorder.path.is_dir():
        raise RecordError(f"{recorder.path} is a directory; name a JSON file to record into")
    if recorder.path.exists():
        load_record(recorder.path)  # refused now, not at exit
    with DISPATCHER._lock:
        if DISPATCHER.recorder is not None:
            raise RecordError(f"already recording to {DISPATCHER.recorder.path}; one recording at a time")
        DISPATCHER.recorder = recorder
    return recorder


def stop_recording(recorder: Recorder) -> Path | None:
    """Stop ``recorder`` and merge what it counted into its file (None when it counted nothing)."""
    with DISPATCHER._lock:
        if DISPATCHER.recorder is recorder:
            DISPATCHER.recorder = None
    return recorder.write() if recorder.counts() else None


@contextmanager
def record(path: str | os.PathLike) -> Iterator[Recorder]:
    """Count the problems attention(), its backward and attention_with_kvcache run through
    the dispatcher inside the block; on leaving it, merge them into the record file ``path``
    for ``fa-autotune tune --recorded PATH`` (see :mod:`.record`)."""
    recorder = start_recording(path)
    try:
        yield recorder
    finally:
        stop_recording(recorder)


def _served(problem: Problem) -> tuple[str, str, str | None]:
    """How the dispatcher answers ``problem`` (served, source, matched key): the choice it
    made for it in this process (any device), else resolved now for the first GPU (or the
    interpreter). "exact": a tuned entry of its own on this GPU; "nearest": a neighbouring
    problem's, or another GPU's (the nearest GPU's shipped file, even for this very problem);
    "default"."""
    choice = next((c for key, c in list(DISPATCHER._choices.items()) if len(key) == 3 and key[0] == problem), None)
    if choice is None:
        import torch

        choice = DISPATCHER.choose(problem, "cuda" if torch.cuda.is_available() else "cpu", 0)
    if choice.source == "default" or choice.matched is None:
        served = "default"
    else:
        borrowed = choice.source.startswith(NEAREST_GPU_SOURCE)
        served = "exact" if choice.distance == 0 and not borrowed else "nearest"
    return served, choice.source, choice.matched.key if choice.matched is not None else None


def _record_from_environment() -> Recorder | None:
    """``FA_AUTOTUNE_RECORD=PATH``: record for the life of the process, written at exit (a
    bad PATH is an error here, at the dispatcher's first use, not a recording lost at exit)."""
    path = os.environ.get(RECORD_ENV, "")
    if not path:
        return None
    try:
        recorder = start_recording(path)
    except RecordError as exc:
        raise RecordError(f"{RECORD_ENV}: {exc}") from None
    atexit.register(recorder.write_at_exit)
    return recorder


_record_from_environment()

"""Exported tuned-result files: one JSON file per GPU model and kernel family, e.g.
``nvidia-h200.attn_fwd.json`` (see tuning_db/README.md).

Files are written deterministically (sorted keys and entries, no timestamps) so they diff
cleanly under version control, and validated completely on load: a corrupt, truncated,
foreign or newer-schema file raises :class:`ConfigFileError` and nothing is imported. What
a file holds is a :class:`~fa_autotune.spec.tuned.Tuned`, as the database gives it.
Validated by hand, not with pydantic: see :mod:`fa_autotune.spec.config` for why.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ConfigFileError, InputError, quote
from ..spec.candidate import Candidate
from ..spec.problem import Problem
from ..spec.target import INTERPRETER, GpuInfo, SoftwareInfo
from ..spec.tuned import FrontPoint, Tuned, Winner

if TYPE_CHECKING:
    from ..store import Database

SCHEMA = "fa_autotune.tuned_configs"
SCHEMA_VERSION = 1
FAMILY = "attn_fwd"
# Kernel families, one file each: forward attention, KV-cache attention (decode), backward.
FAMILIES = (FAMILY, "attn_decode", "attn_bwd")


def file_name(gpu: GpuInfo, family: str = FAMILY, qualified: bool = False) -> str:
    """``<gpu slug>.<family>.json``; ``qualified`` adds the compute capability
    (``<slug>.sm90.<family>.json``), for GPU models whose names share a slug."""
    if not qualified:
        return f"{gpu.slug}.{family}.json"
    cap = gpu.capability.replace(".", "")
    return f"{gpu.slug}.{'sm' + cap if cap.isdigit() else cap}.{family}.json"


def file_names(gpu: GpuInfo, family: str = FAMILY) -> tuple[str, str]:
    """Where a reader looks for ``gpu``'s file, most specific first."""
    return file_name(gpu, family, qualified=True), file_name(gpu, family)


# ------------------------------------------------------------------ writing
def export(db: "Database", out_dir: str | Path, gpu_filter: str | None = None) -> list[Path]:
    """Write one file per GPU model and kernel family found among the database's winners
    (its latest decision per problem); returns the paths."""
    from ..store.tuned import tuned_by_gpu  # SQLAlchemy only where a database is used

    out = Path(out_dir)
    models = [tuned for tuned in tuned_by_gpu(db, gpu_filter) if tuned.winners]
    slugs = [tuned.gpu.slug for tuned in models]
    out.mkdir(parents=True, exist_ok=True)
    # Two models sharing a slug (same name, other capability) get capability-qualified names
    # rather than overwriting one file.
    return sorted(write(tuned, out, qualified=slugs.count(tuned.gpu.slug) > 1, family=family)
                  for tuned in models for family in FAMILIES
                  if any(w.problem.family == family for w in tuned.winners))


def write(tuned: Tuned, out_dir: Path, qualified: bool = False, family: str = FAMILY) -> Path:
    """The ``family`` file of ``tuned`` in ``out_dir``: every winner of that kernel family,
    FP8 ones with their front."""
    entries = {}
    for winner in tuned.winners:
        if winner.problem.family != family:
            continue
        entry = {"problem": winner.problem.to_dict(), "config": _config_json(winner.candidate),
                 "median_ms": winner.median_ms, "tflops": winner.tflops, "rel_error": winner.rel_error,
                 "software": winner.software.to_dict()}
        front = tuned.front_of(winner.problem)
        if front:
            entry["pareto"] = [{"config": _config_json(p.candidate), "median_ms": p.median_ms, "tflops": p.tflops,
                                "rel_error": p.rel_error} for p in front]
        entries[winner.problem.key] = entry
    payload = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "family": family, "gpu": tuned.gpu.to_dict(),
               "entries": entries}
    path = out_dir / file_name(tuned.gpu, family, qualified=qualified)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


def _config_json(candidate: Candidate) -> dict[str, Any]:
    """The parameters that differ from their defaults (later knobs left out), as stored: an
    FP8 recipe's among them under its parameter names (``fp8_scaling``, ``fp8_hadamard``), as
    files have always written it."""
    return json.loads(candidate.canonical_json())


# ------------------------------------------------------------------ reading
def load(path: str | Path) -> Tuned:
    """Read and validate a config file completely; its origin is the path."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise ConfigFileError(f"{path}: not valid JSON{hint}: {exc.msg} at line {exc.lineno}") from None
    except _DuplicateKey as exc:
        raise ConfigFileError(f"{path}: duplicate key {exc.args[0]!r} (a second copy would silently win)") from None
    except RecursionError:
        raise ConfigFileError(f"{path}: nested too deeply to be a config file") from None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise ConfigFileError(f"{path}: not a config file ({exc})") from None
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
    if family not in FAMILIES:
        raise ConfigFileError(f"{path}: kernel family {family!r} is not one this fa_autotune serves {FAMILIES}")
    gpu = _gpu(path, data.get("gpu"))
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise ConfigFileError(f"{path}: 'entries' must be an object of problem key -> entry")
    winners, fronts = [], []
    for key, value in sorted(entries.items()):
        try:
            winner, front = _entry(path, key, value, gpu)
        except (ValueError, TypeError, OverflowError) as exc:  # a value no check above foresaw
            raise ConfigFileError(f"{path}: entries[{key!r}]: {exc}") from None
        if winner.problem.family != family:
            raise ConfigFileError(f"{path}: entries[{key!r}] is a {winner.problem.family} problem in a {family} file")
        winners.append(winner)
        fronts.extend(front)
    return Tuned(gpu, tuple(winners), tuple(fronts), str(path))


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else None


def _gpu(path: Path, raw: Any) -> GpuInfo:
    fields = {"name": str, "capability": str, "sm_count": int, "memory_mb": int, "driver": str}
    if not isinstance(raw, dict) or set(raw) != set(fields):
        raise ConfigFileError(f"{path}: 'gpu' must have exactly {sorted(fields)}")
    for name, kind in fields.items():
        if not isinstance(raw[name], kind) or isinstance(raw[name], bool):
            raise ConfigFileError(f"{path}: gpu.{name} must be {kind.__name__}, got {raw[name]!r}")
    if not (0 < len(raw["name"]) <= _MAX_NAME and raw["name"].isprintable()):
        raise ConfigFileError(f"{path}: gpu.name must be 1..{_MAX_NAME} printable characters (no control "
                              f"characters), got {quote(raw['name'], 60)}")
    if raw["capability"] != INTERPRETER and not re.fullmatch(r"\d{1,2}\.\d{1,2}", raw["capability"]):
        raise ConfigFileError(f"{path}: gpu.capability must look like '9.0', got {raw['capability']!r}")
    if not (0 <= raw["sm_count"] <= 100_000 and 0 <= raw["memory_mb"] <= 100_000_000):
        raise ConfigFileError(f"{path}: gpu.sm_count / memory_mb out of range ({raw['sm_count']}, {raw['memory_mb']})")
    if len(raw["driver"]) > _MAX_NAME or not raw["driver"].isprintable():
        raise ConfigFileError(f"{path}: gpu.driver must be at most {_MAX_NAME} printable characters")
    return GpuInfo(**raw)


_MAX_NAME = 128  # a GPU name becomes a file name on export


def _entry(path: Path, key: str, raw: Any, gpu: GpuInfo) -> tuple[Winner, list[FrontPoint]]:
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
        candidate = Candidate.from_mapping(raw["config"], problem.is_fp8)
    except (InputError, ConfigError, TypeError) as exc:
        raise ConfigFileError(f"{where}: {exc}") from None
    if problem.key != key:
        raise ConfigFileError(f"{where}: key does not match its problem ({problem.key})")
    if problem.is_empty:
        raise ConfigFileError(f"{where}: an empty problem (no query rows or keys) has nothing tuned")
    if raw.get("pareto") and not problem.is_fp8:
        raise ConfigFileError(f"{where}: a Pareto front belongs to FP8 problems only, this one is {problem.dtype}")
    for name in ("median_ms", "tflops"):
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigFileError(f"{where}: {name} must be a positive number, got {value!r}")
    rel = raw["rel_error"]
    if rel is not None and (isinstance(rel, bool) or not isinstance(rel, (int, float)) or not math.isfinite(rel)
                            or rel < 0):
        raise ConfigFileError(f"{where}: rel_error must be a non-negative number or null, got {rel!r}")
    sw = raw["software"]
    names = ("triton", "torch", "cuda", "fa_autotune", "template_hash")
    if not isinstance(sw, dict) or set(sw) != set(names) or not all(isinstance(sw[n], str) for n in names):
        raise ConfigFileError(f"{where}: software must have string fields {list(names)}")
    for name in names:  # printed by `query`: an escape sequence would reach the user's terminal
        if len(sw[name]) > _MAX_NAME or not sw[name].isprintable():
            raise ConfigFileError(f"{where}: software.{name} must be at most {_MAX_NAME} printable characters "
                                  f"(no control characters), got {quote(sw[name], 60)}")
    software = SoftwareInfo(**sw)
    winner = Winner(problem, candidate.config, float(raw["median_ms"]), float(raw["tflops"]), rel, gpu, software,
                    source="import", recipe=candidate.recipe)
    return winner, _front(where, raw.get("pareto", []), winner)


def _front(where: str, raw: Any, winner: Winner) -> list[FrontPoint]:
    if not isinstance(raw, list):
        raise ConfigFileError(f"{where}: pareto must be a list of points")
    points = []
    for i, point in enumerate(raw):
        here = f"{where}.pareto[{i}]"
        if not isinstance(point, dict) or set(point) != {"config", "median_ms", "tflops", "rel_error"}:
            raise ConfigFileError(f"{here} must have exactly config, median_ms, tflops, rel_error")
        try:
            candidate = Candidate.from_mapping(point["config"], fp8=True)
        except (ConfigError, TypeError) as exc:
            raise ConfigFileError(f"{here}: {exc}") from None
        for name in ("median_ms", "tflops", "rel_error"):
            value = point[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigFileError(f"{here}: {name} must be a non-negative number, got {value!r}")
        points.append(FrontPoint(winner.problem, candidate.config, float(point["median_ms"]), float(point["tflops"]),
                                 float(point["rel_error"]), winner.gpu, winner.software, recipe=candidate.recipe))
    return points


# ------------------------------------------------------------------ importing
def import_files(db: "Database", paths: list[str | Path], progress=None) -> int:
    """Validate every file first, then load all entries in one transaction; returns the count
    (``progress(done, total)`` hears how far the load is)."""
    from ..store.tuned import import_tuned  # SQLAlchemy only where a database is used

    return import_tuned(db, [load(p) for p in paths], progress)

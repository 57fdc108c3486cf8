"""Recording what a workload runs: which problems the dispatcher serves, how often, and
which of them no tuned entry of their own answers, so ``fa-autotune tune --recorded PATH``
tunes exactly those (most-called and untuned first).

Turned on by ``FA_AUTOTUNE_RECORD=PATH`` (read once, when the dispatcher is imported; the
file is written at interpreter exit) or by ``with fa_autotune.record(PATH):`` (written on
leaving the block); both live in :mod:`.dispatch`, which holds the recorder, this module
the counting and the file. Counted: calls of ``attention`` (forward; the forward of a training
step too), ``attention_backward`` (what ``loss.backward()`` runs) and
``attention_with_kvcache`` that the dispatcher configures (``config=None``);
``attention_varlen`` and ``attention_fp8`` are not recorded. The count is a dict lookup
and an increment under a lock on the hot path (no I/O); off, the hot path pays one
attribute check (``DISPATCHER.recorder is not None``).

The file is small JSON keyed by problem key; an existing file's counts are merged in (under
a lock file, so processes ending at once do not lose each other's counts) and it is
replaced atomically. A file that is not a record file is an error and is never overwritten.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import FaAutotuneError, InputError
from ..spec.problem import Problem

SCHEMA = "fa_autotune.recorded_problems"
SCHEMA_VERSION = 1
ENV = "FA_AUTOTUNE_RECORD"
SERVED = ("exact", "nearest", "default")  # a tuned entry of its own, a neighbour's, none
_MAX_BY_ID = 16384  # identity shortcuts kept (plans are rebuilt past api's cap; counts stay)


class RecordError(FaAutotuneError):
    """A record file that cannot be read, merged or written."""


@dataclass(frozen=True)
class Recorded:
    """One recorded problem: its calls, and how the dispatcher served it when last recorded."""

    problem: Problem
    calls: int
    served: str  # one of SERVED
    source: str  # the Choice's source (database, shipped, default, ...)
    matched: str | None  # the tuned problem whose config it ran

    @property
    def untuned(self) -> bool:
        return self.served != "exact"

    def to_dict(self) -> dict[str, Any]:
        return {"problem": self.problem.to_dict(), "calls": self.calls, "served": self.served, "source": self.source,
                "matched": self.matched}


class Recorder:
    """Per-problem call counts of one recording (thread-safe)."""

    def __init__(self, path: str | os.PathLike, serve: Callable[[Problem], tuple[str, str, str | None]]) -> None:
        self.path = Path(path).expanduser()
        self._serve = serve  # problem -> (served, source, matched key): how the dispatcher answers it
        self._entries: dict[Problem, list] = {}  # problem -> [calls]
        self._by_id: dict[int, tuple[Problem, list]] = {}  # id(plan's problem) -> (it, its entry)
        self._lock = threading.Lock()

    def count(self, problem: Problem) -> None:
        """One call of ``problem``: a long-lived object (a cached plan's) is found by identity,
        so the hot path does not hash a dataclass; others by value."""
        with self._lock:
            found = self._by_id.get(id(problem))
            if found is not None and found[0] is problem:
                found[1][0] += 1
                return
            entry = self._entries.get(problem)
            if entry is None:
                entry = self._entries[problem] = [0]
            if len(self._by_id) >= _MAX_BY_ID:
                self._by_id.clear()
            self._by_id[id(problem)] = (problem, entry)  # holding it keeps its id from being reused
            entry[0] += 1

    def count_by_value(self, problem: Problem) -> None:
        """One call of a problem built afresh per call (KV-cache calls, the general path): by value, so
        short-lived objects leave no identity entries behind."""
        with self._lock:
            entry = self._entries.get(problem)
            if entry is None:
                entry = self._entries[problem] = [0]
            entry[0] += 1

    def counts(self) -> dict[Problem, int]:
        with self._lock:
            return {p: e[0] for p, e in self._entries.items() if e[0]}

    def recorded(self) -> list[Recorded]:
        """This recording's problems with how the dispatcher serves them now."""
        return [Recorded(problem, calls, *self._serve(problem)) for problem, calls in self.counts().items()]

    def write(self) -> Path:
        """Merge this recording into :attr:`path` (atomically) and return it."""
        return write_record(self.path, self.recorded())

    def write_at_exit(self) -> None:
        """atexit: write, and on failure say so on stderr with where the counts went
        instead (an exception in an atexit hook would only print a traceback)."""
        if not self.counts():
            return
        try:
            self.write()
        except Exception as exc:
            fallback = self.path.with_name(f"{self.path.name}.{os.getpid()}.json")
            try:
                _write_atomically(fallback, _payload({r.problem.key: r for r in self.recorded()}))
                where = f"this run's counts are in {fallback}"
            except Exception as second:
                where = f"this run's counts are lost ({type(second).__name__}: {second})"
            print(f"fa_autotune: cannot record to {self.path}: {exc}; {where}", file=sys.stderr)


# ------------------------------------------------------------------ the file
def load_record(path: str | os.PathLike) -> list[Recorded]:
    """A record file's problems, validated completely (a bad file raises RecordError)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{path}: no such record file (record one with FA_AUTOTUNE_RECORD={path} or "
                          "fa_autotune.record(path))") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise RecordError(f"{path}: not valid JSON ({exc}); not a record file, left as it is") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise RecordError(f"{path}: not an fa_autotune record file (schema "
                          f"{data.get('schema') if isinstance(data, dict) else None!r}, expected {SCHEMA!r}); "
                          "left as it is: name another file")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise RecordError(f"{path}: record schema_version {version!r} is not one this fa_autotune reads "
                          f"(1..{SCHEMA_VERSION})")
    problems = data.get("problems")
    if not isinstance(problems, dict):
        raise RecordError(f"{path}: 'problems' must be an object of problem key -> entry")
    out = []
    for key, raw in problems.items():
        where = f"{path}: problems[{key!r}]"
        if not isinstance(raw, dict) or set(raw) != {"problem", "calls", "served", "source", "matched"}:
            raise RecordError(f"{where} must have exactly problem, calls, served, source, matched")
        try:
            if not isinstance(raw["problem"], dict):
                raise InputError("problem must be an object")
            problem = Problem(**raw["problem"])
        except (InputError, TypeError) as exc:
            raise RecordError(f"{where}: {exc}") from None
        if problem.key != key:
            raise RecordError(f"{where}: key does not match its problem ({problem.key})")
        calls = raw["calls"]
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise RecordError(f"{where}: calls must be a positive integer, got {calls!r}")
        if raw["served"] not in SERVED:
            raise RecordError(f"{where}: served must be one of {SERVED}, got {raw['served']!r}")
        if not isinstance(raw["source"], str) or not (raw["matched"] is None or isinstance(raw["matched"], str)):
            raise RecordError(f"{where}: source must be a string and matched a string or null")
        out.append(Recorded(problem, calls, raw["served"], raw["source"], raw["matched"]))
    return out


def write_record(path: str | os.PathLike, recorded: list[Recorded]) -> Path:
    """Merge ``recorded`` into the record file at ``path`` (calls add up; how a problem is
    served is this recording's, the newer answer) and replace it atomically."""
    path = Path(path).expanduser()
    with _file_lock(path):
        merged = {r.problem.key: r for r in load_record(path)} if path.exists() else {}
        for r in recorded:
            old = merged.get(r.problem.key)
            merged[r.problem.key] = r if old is None else Recorded(r.problem, old.calls + r.calls, r.served, r.source,
                                                                    r.matched)
        _write_atomically(path, _payload(merged))
    return path


def _payload(entries: dict[str, Recorded]) -> dict[str, Any]:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "problems": {key: entries[key].to_dict() for key in sorted(entries)}}


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    """Write to a temporary file beside ``path`` and rename it over: a reader (or a crash)
    never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``PATH.lock`` for a read-merge-write (POSIX; elsewhere none)."""
    try:
        import fcntl
    except ImportError:  # Windows: processes ending at the same moment may lose counts
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def priority(recorded: list[Recorded]) -> list[Recorded]:
    """Tuning order: problems without a tuned entry of their own first, then by calls, most
    first (ties: by key, for a stable order)."""
    return sorted(recorded, key=lambda r: (not r.untuned, -r.calls, r.problem.key))



"""Python API over a results database: the same queries as ``fa-autotune query``, returning
plain dataclasses (``to_dataframe`` turns any list of them into a pandas DataFrame).

    from fa_autotune import results
    rows = results.best("sqlite:///tune.sqlite", dtype="bf16", causal=True)
"""
from __future__ import annotations

from typing import Any

from .spec.space import load_space
from .spec.tuned import FrontPoint, Winner
from .store import Database, connect, queries
from .store.filters import Filters
from .store.queries import CompareRow, CoverageRow, FailureRow, ProgressRow, TrialRow

__all__ = ["best", "pareto", "trials", "failures", "compare", "coverage", "search_progress", "to_dataframe",
           "Winner", "FrontPoint", "TrialRow", "FailureRow", "CompareRow", "CoverageRow", "ProgressRow"]


def _db(db: Database | str | None) -> Database:
    return db if isinstance(db, Database) else connect(db, readonly=True)


def best(db: Database | str | None = None, **filters: Any) -> list[Winner]:
    """Every stored winner (problem, config, timing, GPU, software), sorted by GPU and problem."""
    return queries.best(_db(db), Filters(**filters))


def pareto(db: Database | str | None = None, **filters: Any) -> list[FrontPoint]:
    """The stored FP8 time/error Pareto fronts, fastest first per problem."""
    return queries.pareto(_db(db), Filters(**filters))


def trials(db: Database | str | None = None, limit: int | None = None, **filters: Any) -> list[TrialRow]:
    return queries.trials(_db(db), Filters(**filters), limit=limit)


def failures(db: Database | str | None = None, **filters: Any) -> list[FailureRow]:
    return queries.failures(_db(db), Filters(**filters))


def compare(a: tuple[str, str], b: tuple[str, str], db: Database | str | None = None, **filters: Any) -> list[CompareRow]:
    return queries.compare(_db(db), a, b, Filters(**filters))


def coverage(preset: str, db: Database | str | None = None, space: str = "fwd", **filters: Any) -> list[CoverageRow]:
    problems = list(load_space(space).presets[preset].problems)
    return queries.coverage(_db(db), problems, Filters(**filters))


def search_progress(db: Database | str | None = None, **filters: Any) -> list[ProgressRow]:
    return queries.search_progress(_db(db), Filters(**filters))


def to_dataframe(rows: list):
    """A pandas DataFrame of any list of result rows, records flattened as ``query`` prints
    them (needs pandas)."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("to_dataframe needs pandas: pip install pandas") from exc
    return pd.DataFrame(queries.as_dicts(rows))

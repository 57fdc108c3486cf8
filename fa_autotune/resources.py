"""Find the data folders (templates, search spaces, shipped tuning files).

They sit at the top of a source checkout and inside the package (``_data/``) once
installed from a wheel; every caller goes through :func:`data_dir` so neither the
current directory nor the install layout matters.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .errors import FaAutotuneError

_PACKAGE_DIR = Path(__file__).resolve().parent
DATA_FOLDERS = ("templates", "search_spaces", "tuning_db")


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """Return the directory of data folder ``name``, installed copy first."""
    if name not in DATA_FOLDERS:
        raise ValueError(f"unknown data folder {name!r}; expected one of {DATA_FOLDERS}")
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FaAutotuneError(
        f"data folder {name!r} not found next to {_PACKAGE_DIR}; the installation is incomplete"
    )

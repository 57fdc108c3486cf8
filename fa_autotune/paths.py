"""Where fa_autotune finds its data and keeps its per-user state.

Data folders (templates, search spaces, shipped tuning files) sit at the top of a source
checkout and inside the package (``_data/``) once installed from a wheel; every caller goes
through :func:`data_dir`, so neither the current directory nor the install layout matters.
State (kernel cache, default database) lives in the user cache dir.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import platformdirs

from .errors import FaAutotuneError

_PACKAGE_DIR = Path(__file__).resolve().parent
DATA_FOLDERS = ("templates", "search_spaces", "tuning_db")
APP = "fa_autotune"  # the per-user cache dir's name


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


# The launch plans (kernels/): the flags, grids and descriptors they pass (a padded head dim's
# split, 128-key steps over column chunks, L2 sections, varlen tile tables) decide what a
# rendered kernel computes as much as its template does.
LAUNCH_PLANS = ("launch.py", "fwd.py", "bwd.py", "varlen.py", "decode.py", "tiles.py")


def template_sources() -> list[Path]:
    """The files whose bytes template_hash covers: the templates, the Gluon device code they
    import (kernels/gluon_*.py), the launch plans (LAUNCH_PLANS), the FP8 quantizer that makes
    an FP8 trial's inputs (fp8/) and the trial inputs' definition."""
    package = Path(__file__).parent
    return [*sorted(data_dir("templates").glob("*.jinja")), *sorted((package / "kernels").glob("gluon_*.py")),
            *(package / "kernels" / name for name in LAUNCH_PLANS), *sorted((package / "fp8").glob("*.py")),
            package / "tune" / "inputs.py"]


@lru_cache(maxsize=1)
def template_hash() -> str:
    """Hash over every template file, the device code the templates import, the launch
    plans, the FP8 quantizer and the trial inputs' definition: identifies the kernel code a
    measurement ran and the data its error was judged on (a tune reuses only measurements of
    the same hash)."""
    digest = hashlib.sha256()
    for path in template_sources():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """The per-user cache dir of fa_autotune: ``$XDG_CACHE_HOME/fa_autotune`` where that is
    set, on any platform (tests and CI isolate their state so), else the platform's user cache
    dir (platformdirs: ``~/.cache/fa_autotune`` on Linux, as before; ``~/Library/Caches`` on
    macOS, ``%LOCALAPPDATA%`` on Windows), except that a ``~/.cache/fa_autotune`` written by an
    earlier version keeps serving while the platform's folder does not exist yet (its tuned
    results would otherwise silently stop being used)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / APP
    legacy = Path.home() / ".cache" / APP  # where versions before 0.2.0 kept state on every platform
    platform = platformdirs.user_cache_path(APP, appauthor=False)
    return legacy if legacy != platform and legacy.is_dir() and not platform.exists() else platform


def kernel_cache_dir() -> Path:
    """Rendered kernel modules; ``FA_AUTOTUNE_CACHE`` overrides."""
    override = os.environ.get("FA_AUTOTUNE_CACHE")
    return Path(override).expanduser() if override else cache_root() / "kernels"


def default_db_url() -> str:
    """The results database: ``FA_AUTOTUNE_DB``, else a SQLite file in the user cache dir."""
    return os.environ.get("FA_AUTOTUNE_DB") or f"sqlite:///{cache_root() / 'tuning.sqlite'}"


def read_small_text(path: str | os.PathLike, limit: int, error: type[Exception], label: str,
                    too_large: str = "") -> str:
    """A small UTF-8 text file a user named (a config, a search space): unreadable, past
    ``limit`` bytes or not UTF-8 raises ``error`` with a one-line message starting ``label``;
    at most ``limit + 1`` bytes are read, so a huge file costs nothing."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"{label}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise error(f"{label}: larger than {limit // 1024} KiB{too_large}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{label}: not UTF-8 text (byte {exc.start})") from None

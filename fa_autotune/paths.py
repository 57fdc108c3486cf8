"""Where fa_autotune keeps its per-user state (kernel cache, default database)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """User cache dir for fa_autotune (XDG convention; ``~/.cache/fa_autotune``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fa_autotune"


def kernel_cache_dir() -> Path:
    """Rendered kernel modules; ``FA_AUTOTUNE_CACHE`` overrides."""
    override = os.environ.get("FA_AUTOTUNE_CACHE")
    return Path(override).expanduser() if override else cache_root() / "kernels"

"""fa_autotune: generated, tuned Triton FlashAttention kernels.

``from fa_autotune import attention`` is all most users need. Importing the package is
cheap: Triton, Jinja, Optuna and SQLAlchemy load only when first used.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .api import attention
from .config import KernelConfig
from .errors import ConfigError, FaAutotuneError, InputError
from .problem import Problem

__all__ = ["attention", "KernelConfig", "Problem", "FaAutotuneError", "ConfigError", "InputError", "__version__"]

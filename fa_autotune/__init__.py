"""fa_autotune: generated, tuned Triton FlashAttention kernels.

``from fa_autotune import attention`` is all most users need. Importing the package is
cheap: PyTorch, Triton, Jinja, Optuna and SQLAlchemy load only when first used.
"""
from __future__ import annotations

from typing import Any

from .config import KernelConfig
from .errors import ConfigError, FaAutotuneError, InputError
from .problem import Problem

__version__ = "0.1.0"

__all__ = ["attention", "attention_fp8", "explain", "quantize_fp8", "KernelConfig", "Problem", "FaAutotuneError", "ConfigError",
           "InputError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("attention", "attention_fp8", "explain"):
        from . import api

        return getattr(api, name)
    if name == "quantize_fp8":
        from .quantize import quantize_fp8

        return quantize_fp8
    raise AttributeError(f"module 'fa_autotune' has no attribute {name!r}")

"""fa_autotune: generated, tuned Triton FlashAttention kernels.

``from fa_autotune import attention`` is all most users need. Importing the package is
cheap: PyTorch, Triton, Jinja, Optuna and SQLAlchemy load only when first used.

The pipeline, one package per stage: ``spec`` (problem, config, search space, tuned-result
records) -> ``kernels`` (render, launch, ahead-of-time compile; ``fp8`` prepares FP8 inputs)
-> ``tune`` (measure, search) -> ``store`` (the results database) -> ``runtime`` (exported
files, dispatch, the public API); ``cli``, ``bench``, ``report`` and ``results`` on top.
"""
# No ``from __future__ import annotations`` and no bare typing names here: both would be
# module attributes, listed by dir(fa_autotune) beside the API (``annotations``, ``Any``).
import typing as _typing

from ._version import __version__
from .errors import ConfigError, FaAutotuneError, InputError
from .spec.config import KernelConfig
from .spec.problem import Problem
from .spec.recipe import Fp8Recipe

__all__ = ["attention", "attention_fp8", "attention_varlen", "attention_with_kvcache", "explain", "quantize_fp8",
           "record", "KernelConfig", "Fp8Recipe", "Problem", "FaAutotuneError", "ConfigError", "InputError",
           "__version__"]


def __dir__() -> list:
    """The public API (the lazily imported entry points among it), not the imports and
    submodules that happen to be loaded: what tab completion and ``dir()`` should offer."""
    return sorted(__all__)


def __getattr__(name: str) -> _typing.Any:
    if name in ("attention", "attention_fp8", "attention_varlen", "explain"):
        from .runtime import api

        return getattr(api, name)
    if name == "attention_with_kvcache":
        from .runtime.kvcache import attention_with_kvcache

        return attention_with_kvcache
    if name == "record":
        from .runtime.dispatch import record

        return record
    if name == "quantize_fp8":
        from .fp8.quantize import quantize_fp8

        return quantize_fp8
    raise AttributeError(f"module 'fa_autotune' has no attribute {name!r}")

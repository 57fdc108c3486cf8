"""One exception base for everything fa_autotune raises on purpose.

Subclasses also derive from the builtin a caller would expect (``ValueError`` for bad
input or config, ``RuntimeError`` for environment problems), so ``except ValueError``
keeps working for users who never heard of this module.
"""
from __future__ import annotations


class FaAutotuneError(Exception):
    """Base class of every error fa_autotune raises deliberately."""


class InputError(FaAutotuneError, ValueError):
    """Tensors handed to ``attention`` that no kernel can take (dtype, device, shape...)."""


class ConfigError(FaAutotuneError, ValueError):
    """A kernel config that is malformed, or cannot work for the problem at hand.

    ``parameter`` names the offending template parameter so callers and the tuner can
    report it (or record it as an ``invalid_config`` trial).
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


class KernelResourceError(ConfigError):
    """The variant needs more shared memory or registers than the GPU has."""


class KernelCompileError(ConfigError):
    """Triton failed to compile the variant for this problem."""


class TemplateError(FaAutotuneError, RuntimeError):
    """A template failed to render or a rendered module failed to import."""


class SearchSpaceError(FaAutotuneError, ValueError):
    """A malformed search-space file; the message names the file, key and problem."""


class DatabaseError(FaAutotuneError, RuntimeError):
    """The results database cannot be reached or has an unexpected schema."""


class ConfigFileError(FaAutotuneError, ValueError):
    """An exported config file that is corrupt, truncated, foreign or of a newer schema."""

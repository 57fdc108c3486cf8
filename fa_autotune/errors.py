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


MESSAGE_LIMIT = 1000  # characters of an error message the CLI prints; input quoted in one is cut


def quote(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters (an ellipsis marks a cut):
    messages quote user input, which may be megabytes long."""
    text = repr(value) if not isinstance(value, str) or len(value) <= 4 * limit else repr(value[:4 * limit])
    return text if len(text) <= limit else text[:limit - 1] + "…"


def one_line(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` on one line (line breaks shown as " | ") and at most ``limit`` characters."""
    flat = " | ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"

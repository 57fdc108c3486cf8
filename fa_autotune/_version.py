"""The version of fa_autotune (one place: pyproject reads it, results record it)."""
__version__ = "0.2.0"

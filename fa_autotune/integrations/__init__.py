"""Hooks into other libraries (optional dependencies, imported only when used)."""

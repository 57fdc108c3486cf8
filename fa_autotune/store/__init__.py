"""The results database: every trial of every tune, and the winners."""
from .db import Database, connect, default_url, relative_sqlite_path, safe_url, scrub
from .models import STATUSES

__all__ = ["Database", "connect", "default_url", "relative_sqlite_path", "safe_url", "scrub", "STATUSES"]

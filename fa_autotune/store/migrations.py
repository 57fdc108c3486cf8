"""Schema versions and the steps between them.

Version 1 is the first schema. A later change adds ``MIGRATIONS[n]``, a function that
takes a connection at version n-1 to version n without dropping data (ALTER TABLE ...),
and bumps ``models.SCHEMA_VERSION``. Opening a database runs the missing steps in order
inside one transaction; a database newer than the code is refused untouched.

Why not Alembic (weighed in issue 40; Alembic is installed with Optuna):

- The database is shared with Optuna, whose own Alembic environment already owns the
  ``alembic_version`` table in it (``v3.2.0.a`` with the Optuna installed here). Ours would
  need a second version table, and ``fa_schema_version`` would have to stay as well: readers
  (:func:`check_readable`, the dispatcher, installs of earlier versions sharing the file)
  check that integer without importing Alembic, so two records of one version would have to
  agree.
- What needs care here is not the steps (two, a few lines each) but running them safely
  when several workers open one database at once: the PostgreSQL advisory lock below and
  SQLite's retried schema race (store.db). Alembic offers neither; both would stay.
- Measured on this project's dev machine (2 shared cores, SQLite, an up-to-date database,
  median of 20): :func:`upgrade` takes 0.7 ms; ``alembic.command.upgrade`` to head in a
  prototype (three revisions, its own version table) 14.7 ms, plus 0.25-0.6 s to import
  Alembic in writers that do not start Optuna (``fa-autotune import``); and its script
  directory would have to ship inside the wheel and be found at run time.

Revisit if migrations become frequent or need data transformations that Alembic's batch
mode would make safer on SQLite.
"""
from __future__ import annotations

from typing import Callable

from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection, Engine

from ..errors import DatabaseError
from . import models


def _add_pareto_table(conn: Connection) -> None:
    """Version 2: FP8 tuning stores each problem's time/error Pareto front."""
    models.ParetoModel.__table__.create(conn, checkfirst=True)


def _add_kv_cache_columns(conn: Connection) -> None:
    """Version 3: problems have a kind (forward, KV-cache decode, backward) and a page size."""
    columns = {c["name"] for c in inspect(conn).get_columns("fa_problems")}
    if "kind" not in columns:
        conn.execute(text("ALTER TABLE fa_problems ADD COLUMN kind VARCHAR(8) NOT NULL DEFAULT 'fwd'"))
    if "page_size" not in columns:
        conn.execute(text("ALTER TABLE fa_problems ADD COLUMN page_size INTEGER NOT NULL DEFAULT 0"))


MIGRATIONS: dict[int, Callable[[Connection], None]] = {2: _add_pareto_table, 3: _add_kv_cache_columns}


# PostgreSQL advisory lock key ("fa_auto") held while the schema is created or migrated.
_SCHEMA_LOCK = 0x66615F6175746F


def upgrade(engine: Engine) -> int:
    """Bring the database to ``models.SCHEMA_VERSION``; returns the version found.

    On PostgreSQL one process at a time (a transaction-scoped advisory lock): otherwise a
    worker that looked before another committed the new schema would find the tables in
    place a moment later and add a second version row (seen with four workers opening an
    empty database at once). SQLite commits each CREATE TABLE at once, so a process may see
    part of a schema another is still creating: the caller (store.db) retries those."""
    target = models.SCHEMA_VERSION
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
        tables = set(inspect(conn).get_table_names())
        ours = {t for t in tables if t.startswith("fa_")}
        if "fa_schema_version" not in tables:
            if ours:
                raise DatabaseError(f"database has fa_autotune tables {sorted(ours)} but no schema version; "
                                    "it was not written by fa_autotune")
            models.Base.metadata.create_all(conn)
            conn.execute(models.SchemaVersionModel.__table__.insert().values(version=target))
            return 0
        found = conn.execute(
            select(models.SchemaVersionModel.version).order_by(models.SchemaVersionModel.id.desc()).limit(1)
        ).scalar()
        if found is None:
            raise DatabaseError("database schema version table is empty")
        if found > target:
            raise DatabaseError(f"database schema version {found} is newer than this fa_autotune "
                                f"understands ({target}); upgrade fa_autotune")
        for version in range(found + 1, target + 1):
            step = MIGRATIONS.get(version)
            if step is None:
                raise DatabaseError(f"no migration from schema version {version - 1} to {version}")
            step(conn)
            conn.execute(models.SchemaVersionModel.__table__.insert().values(version=version))
        models.Base.metadata.create_all(conn)  # tables added by this version, if any
        return found


def check_readable(engine: Engine) -> int:
    """For readers: the schema version of an fa_autotune database, creating and migrating
    nothing. Raises DatabaseError when the database holds no fa_autotune results or needs a
    migration first (any writing command, e.g. ``fa-autotune import``, performs it)."""
    target = models.SCHEMA_VERSION
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        if "fa_schema_version" not in tables:
            raise DatabaseError("no fa_autotune results in this database")
        found = conn.execute(
            select(models.SchemaVersionModel.version).order_by(models.SchemaVersionModel.id.desc()).limit(1)
        ).scalar()
    if found is None or found > target:
        raise DatabaseError(f"database schema version {found} is not one this fa_autotune reads ({target})")
    if found < target:
        raise DatabaseError(f"database schema version {found} predates this fa_autotune ({target}); a writing "
                            "command (tune, import) upgrades it")
    return found

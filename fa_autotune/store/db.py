"""Connecting to the results database (any SQLAlchemy URL; SQLite by default).

SQLite runs in WAL mode with a busy timeout so ``tune`` can write while ``query`` reads.
The schema is versioned; :mod:`.migrations` upgrades older databases in place and refuses
newer ones, so a database is never silently rewritten by the wrong version.
"""
from __future__ import annotations

import os
import re
import sqlite3
import time
import urllib.parse
from contextlib import contextmanager
from typing import Any, Iterator

from sqlalchemy import create_engine, event, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import DatabaseError, quote
from ..paths import default_db_url
from .migrations import check_readable, upgrade
from .models import SchemaVersionModel

BUSY_TIMEOUT_S = 30


def default_url() -> str:
    """``FA_AUTOTUNE_DB``, else a SQLite file in the user cache dir."""
    return default_db_url()


# Query parameters that carry a secret (libpq's password, sslpassword, passfile; tokens and
# keys of other drivers): masked in every message like the ``user:pw@`` form.
_SECRET_PARAM = re.compile(r"pass|secret|token|key|credential|auth", re.IGNORECASE)
_MASK = "***"


def safe_url(url: str) -> str:
    """The URL with its password masked, for messages: the ``user:pw@`` form and any
    secret-looking query parameter (``?password=...``, ``sslpassword``, ``passfile``...)."""
    try:
        parsed = make_url(url)
        secret = {k: _MASK for k in parsed.query if _SECRET_PARAM.search(k)}
        return parsed.update_query_dict(secret).render_as_string(hide_password=True).replace("%2A%2A%2A", _MASK)
    except Exception:
        return "<unparseable URL>"


def scrub(message: str, url: str) -> str:
    """``message`` (a driver's error text) with the URL's secrets replaced by ``***``: a
    driver may quote its connection string or a password in its own words."""
    try:
        parsed = make_url(url)
    except Exception:
        return message
    message = message.replace(url, safe_url(url))
    secrets = [parsed.password] if parsed.password else []
    for key, value in parsed.query.items():
        if _SECRET_PARAM.search(key):
            secrets += [value] if isinstance(value, str) else list(value)
    # as written in the URL too: a driver may echo its percent-encoded form (p%40ss for p@ss)
    secrets += [urllib.parse.quote(str(s), safe="") for s in secrets if s]
    for secret in sorted({str(s) for s in secrets if s}, key=len, reverse=True):
        message = message.replace(secret, _MASK)
    return message


class Database:
    """An engine, a session factory, and the schema checked and upgraded."""

    def __init__(self, url: str, readonly: bool = False) -> None:
        """``readonly``: for readers (queries, export, the dispatcher): never create a file,
        a directory, a table or a migration, never switch SQLite's journal mode; a database
        without fa_autotune results is a DatabaseError saying so."""
        self.url, self.readonly = url, readonly
        try:
            parsed = make_url(url)
        except Exception as exc:
            # a file path where a URL belongs: say which URL (never for text that may be a
            # mistyped URL with a password in it: a scheme, or user@host)
            if url.strip() and "@" not in url and not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", url):
                raise DatabaseError(f"not a database URL: {quote(url)}; for a SQLite file give "
                                    f"sqlite:///{os.path.abspath(url)}") from None
            raise DatabaseError(scrub(f"not a database URL: {safe_url(url)} ({exc})", url)) from None
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        kwargs = {}
        engine_url: Any = url
        if self.is_sqlite:
            kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_S}
            if readonly:
                engine_url = _readonly_sqlite(parsed)
            else:
                _check_before_writing(parsed.database)
                _prepare_sqlite_path(parsed.database)
        try:
            self.engine: Engine = create_engine(engine_url, future=True, **kwargs)
        except Exception as exc:  # missing driver, bad options
            raise DatabaseError(scrub(f"cannot open database {safe_url(url)}: {exc}", url)) from None
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas(parsed.database, wal=not readonly))
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

        def open_checked() -> None:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            if readonly:
                check_readable(self.engine)
            else:
                upgrade(self.engine)

        try:
            _schema_race_retried(open_checked)
        except DatabaseError:
            self.engine.dispose()
            raise
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise DatabaseError(scrub(f"cannot reach database {safe_url(url)}: {exc.__class__.__name__}: "
                                      f"{str(exc).splitlines()[0]}", url)) from None

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed on success, rolled back on any error; the database's own
        failures (read-only, locked, gone) become one DatabaseError naming it (password
        masked), never a driver traceback."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            session.rollback()
            detail = str(getattr(exc, "orig", None) or exc).strip()  # the driver's own words first
            first = detail.splitlines()[0] if detail else ""
            raise DatabaseError(scrub(f"database {safe_url(self.url)}: {exc.__class__.__name__}: {first}", self.url)) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def scalar(self, statement):
        with self.session() as s:
            return s.scalar(statement)

    def optuna_storage(self):
        """Optuna's RDB storage on the same database."""
        import optuna

        kwargs = {"connect_args": {"timeout": BUSY_TIMEOUT_S}} if self.is_sqlite else {}
        try:
            return _schema_race_retried(
                lambda: optuna.storages.RDBStorage(self.url, engine_kwargs=kwargs, skip_compatibility_check=False))
        except Exception as exc:
            raise DatabaseError(scrub(f"Optuna cannot use {safe_url(self.url)}: {exc}", self.url)) from None

    def dispose(self) -> None:
        self.engine.dispose()


def _schema_race_retried(create, attempts: int = 6):
    """``create()``, again if another process created the same tables first: several tunes
    started at once on a fresh database all try to create the schema (theirs and Optuna's,
    with its version rows), and all but one see "already exists" or a unique-constraint
    error; the retry then finds the schema in place. Also again after a SQLite "database is
    locked" that came at once rather than after the busy timeout: SQLite answers so without
    waiting where waiting could deadlock, and while another connection opens or cleans up a
    WAL file (sqlite.org/wal.html), and says to retry."""
    for attempt in range(attempts):
        started = time.monotonic()
        try:
            return create()
        except Exception as exc:
            message = str(exc).lower()
            raced = any(sign in message for sign in ("already exists", "unique constraint failed", "duplicate key",
                                                     # SQLite commits DDL at once: another process may
                                                     # see the tables before the version row
                                                     "schema version table is empty", "but no schema version"))
            locked_at_once = "database is locked" in message and time.monotonic() - started < BUSY_TIMEOUT_S / 2
            if not (raced or locked_at_once) or attempt == attempts - 1:
                raise
            time.sleep(0.1 * (attempt + 1))


def _prepare_sqlite_path(database: str | None) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    directory = os.path.dirname(os.path.abspath(database))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise DatabaseError(f"cannot create the directory of SQLite database {database}: {exc}") from None


def relative_sqlite_path(url: str) -> str | None:
    """The absolute path a SQLite URL names relative to the current directory
    (``sqlite:///tmp/x.sqlite``, three slashes: ./tmp/x.sqlite), else None: a writer says
    where it creates such a file, since four slashes were most likely meant."""
    try:
        parsed = make_url(url)
    except Exception:
        return None
    database = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if not database or database == ":memory:" or database.startswith("file:") or os.path.isabs(database):
        return None
    return os.path.abspath(database)


def _relative_hint(database: str) -> str:
    if os.path.isabs(database):
        return ""
    return (f" (the URL names {os.path.abspath(database)}, relative to the current directory; an absolute "
            f"path takes four slashes: sqlite:////{database})")


def _check_before_writing(database: str | None) -> None:
    """Refuse, before anything is written, an existing SQLite file a writer must not touch:
    one that is not a SQLite database or is corrupted (``PRAGMA quick_check``: Optuna would
    otherwise create its tables and rewrite the header before the damage showed), and another
    application's database (tables, none of them fa_autotune's), which would get our tables
    and a switch to WAL mode. Opened read-only, so a refusal leaves the file as it was."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = os.path.abspath(database)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:  # a new (or empty) database
        return
    # read-only creates no file beside a rollback-journal database; an idle WAL one opens
    # immutable (as readers do: see _readonly_sqlite)
    uri = f"file:{urllib.parse.quote(path)}?mode=ro{'&immutable=1' if _is_idle_wal(path) else ''}"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open SQLite database {path}: {exc}") from None
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        if tables and not any(name.startswith("fa_") for name in tables):
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise DatabaseError(f"{path} is another application's SQLite database (tables {shown}, none of "
                                "fa_autotune's); left untouched: give --db a new file")
        found = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
        if found != ["ok"]:
            lines = [line for row in found for line in str(row).splitlines() if line and not line.startswith("***")]
            raise DatabaseError(f"SQLite database {path} is corrupted ({'; '.join(lines) or found[0]}); nothing "
                                "was written: restore it from a backup, or give --db a new file")
    except sqlite3.Error as exc:
        damaged = isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)
        what = "is not a SQLite database or is corrupted" if damaged else "cannot be read"
        raise DatabaseError(f"{path} {what} ({exc}); nothing was written") from None
    finally:
        conn.close()


def _readonly_sqlite(parsed) -> Any:
    """A SQLite URL opened read-only (``mode=ro``): a missing file is an error, not a new
    database, and a read-only filesystem still reads."""
    database = parsed.database
    if not database or database == ":memory:":
        raise DatabaseError("an in-memory database holds no fa_autotune results")
    if database.startswith("file:"):
        return parsed
    if not os.path.isfile(database):
        raise DatabaseError(f"no fa_autotune results at {database}: no such file{_relative_hint(database)}")
    path = os.path.abspath(database)
    # A WAL database in a directory nobody may write (a read-only filesystem) opens only as
    # immutable: SQLite could not create its -shm file. One nobody has open (no -wal, no
    # -shm beside it) opens immutable too: a read-only connection would create both files
    # and, unable to checkpoint, leave them behind, owned by the reader (in a shared
    # directory the owner's next write then fails with "attempt to write a readonly
    # database"). Every committed row is in the main file then; a tune starting meanwhile
    # writes to its new -wal, which this short read does not see.
    extra = "" if os.access(os.path.dirname(path), os.W_OK) and not _is_idle_wal(path) else "&immutable=1"
    return parsed.set(database=f"file:{urllib.parse.quote(path)}?mode=ro{extra}", query={"uri": "true"})


def _is_idle_wal(path: str) -> bool:
    """A WAL database nobody has open: no -wal or -shm file beside it."""
    return _is_wal(path) and not any(os.path.exists(path + suffix) for suffix in ("-wal", "-shm"))


def _is_wal(path: str) -> bool:
    """Whether the SQLite file's header says WAL mode (file format versions 2 at bytes 18-19)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return False
    return header.startswith(b"SQLite format 3\x00") and header[18:20] == b"\x02\x02"


def _sqlite_pragmas(database: str | None, wal: bool = True):
    in_memory = not database or database == ":memory:"

    def on_connect(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        if not in_memory and wal:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


def connect(url: str | None = None, readonly: bool = False) -> Database:
    return Database(url or default_url(), readonly)


def schema_version(db: Database) -> int:
    return db.scalar(select(SchemaVersionModel.version).order_by(SchemaVersionModel.id.desc()).limit(1))

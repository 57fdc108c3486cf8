from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import text

from fa_autotune.config import KernelConfig
from fa_autotune.errors import DatabaseError
from fa_autotune.problem import Problem
from fa_autotune.store import connect, migrations, models
from fa_autotune.store.db import schema_version
from fa_autotune.store.queries import Filters, best, pareto, trials
from fa_autotune.store.records import identities, record, reusable, set_best, set_front
from fa_autotune.target import GpuInfo, SoftwareInfo

GPU = GpuInfo("NVIDIA Test GPU", "9.0", 132, 143000, "580")
SW = SoftwareInfo("3.6.0", "2.11.0", "13.0", "0.1.0", "abc")
PROBLEM = Problem(1, 2, 2, 64, 64, 32, "float16")


@pytest.fixture
def db(tmp_path):
    return connect(f"sqlite:///{tmp_path / 'sub' / 'tune.sqlite'}")


def test_sqlite_is_wal_with_schema_version(db, tmp_path):
    with db.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
    assert schema_version(db) == models.SCHEMA_VERSION


def test_record_reuse_and_best(db):
    ids = identities(db, PROBLEM, GPU, SW)
    assert identities(db, PROBLEM, GPU, SW) == ids  # identities are deduplicated
    cfg = KernelConfig(BLOCK_M=64)
    assert reusable(db, ids, cfg) is None
    record(db, ids, cfg, "timeout", message="hung")
    assert reusable(db, ids, cfg) is None  # a timeout may be the machine's fault: retried
    record(db, ids, cfg, "ok", median_ms=1.5, tflops=10.0)
    assert reusable(db, ids, cfg).median_ms == 1.5
    set_best(db, ids, cfg, 1.4, 11.0, 1e-3, 1, "s")
    set_best(db, ids, cfg.with_(BLOCK_N=32), 1.3, 12.0, 1e-3, 2, "s")  # replaces, never duplicates
    rows = best(db)
    assert len(rows) == 1 and rows[0].config["BLOCK_N"] == 32 and rows[0].ties == 2
    assert KernelConfig.from_mapping(best(db)[0].config) == cfg.with_(BLOCK_N=32)
    assert [r.status for r in trials(db, Filters(status="ok"))] == ["ok"]
    with pytest.raises(ValueError):
        record(db, ids, cfg, "exploded")


def test_newer_schema_is_refused_untouched(db):
    with db.engine.begin() as conn:
        conn.execute(models.SchemaVersionModel.__table__.insert().values(version=models.SCHEMA_VERSION + 1))
    with pytest.raises(DatabaseError, match="newer"):
        connect(db.url)


def test_migration_upgrades_in_place_keeping_data(db, monkeypatch):
    ids = identities(db, PROBLEM, GPU, SW)
    record(db, ids, KernelConfig(), "ok", median_ms=2.0)
    db.dispose()

    def add_note(conn):
        conn.execute(text("ALTER TABLE fa_measurements ADD COLUMN note TEXT"))

    monkeypatch.setattr(models, "SCHEMA_VERSION", models.SCHEMA_VERSION + 1)
    monkeypatch.setitem(migrations.MIGRATIONS, models.SCHEMA_VERSION, add_note)
    upgraded = connect(db.url)
    assert schema_version(upgraded) == models.SCHEMA_VERSION
    with upgraded.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*), max(median_ms) FROM fa_measurements")).one() == (1, 2.0)
        conn.execute(text("SELECT note FROM fa_measurements"))


def test_foreign_database_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE fa_measurements (id INTEGER)")
    with pytest.raises(DatabaseError, match="not written by fa_autotune"):
        connect(f"sqlite:///{path}")


@pytest.mark.parametrize("url, message", [
    ("postgresql+nosuchdriver://u:secret@localhost/db", "cannot open database"),
    ("not a url", "not a database URL"),
])
def test_unreachable_or_bad_urls(url, message):
    with pytest.raises(DatabaseError, match=message) as info:
        connect(url)
    assert "secret" not in str(info.value)


def test_sqlite_under_a_file_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DatabaseError):
        connect(f"sqlite:///{blocker / 'db.sqlite'}")


def test_version_1_database_gains_the_pareto_table(db):
    """A database written before FP8 tuning (schema 1, no fa_pareto) upgrades in place."""
    ids = identities(db, PROBLEM, GPU, SW)
    record(db, ids, KernelConfig(), "ok", median_ms=2.0)
    with db.engine.begin() as conn:
        conn.execute(text("DROP TABLE fa_pareto"))
        conn.execute(text("DELETE FROM fa_schema_version"))
        conn.execute(models.SchemaVersionModel.__table__.insert().values(version=1))
    db.dispose()
    upgraded = connect(db.url)
    assert schema_version(upgraded) == 2
    fp8 = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn")
    ids = identities(upgraded, fp8, GPU, SW)
    fast, exact = KernelConfig(fp8_scaling="per_tensor", fp8_hadamard=False), KernelConfig()
    set_front(upgraded, ids, [(fast, 1.0, 10.0, 0.2), (exact, 1.5, 7.0, 0.05)], 0.3, "s")
    set_front(upgraded, ids, [(exact, 1.4, 7.5, 0.05)], 0.3, "s")  # a re-tune replaces the front
    rows = pareto(upgraded)
    assert [(r.config_name, r.median_ms) for r in rows] == [(exact.name, 1.4)]
    with upgraded.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM fa_measurements")).scalar() == 1

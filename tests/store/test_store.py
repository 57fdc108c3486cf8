from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import text

from fa_autotune.spec.candidate import Candidate
from fa_autotune.spec.config import KernelConfig
from fa_autotune.errors import DatabaseError
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.recipe import Fp8Recipe
from fa_autotune.store import connect, migrations, models
from fa_autotune.store.db import schema_version
from fa_autotune.store.queries import Filters, best, pareto, trials
from fa_autotune.store.records import identities, record, reusable
from fa_autotune.store.tuned import save_front, save_winner
from fa_autotune.spec.target import GpuInfo, SoftwareInfo
from fa_autotune.spec.tuned import FrontPoint, Winner

GPU = GpuInfo("NVIDIA Test GPU", "9.0", 132, 143000, "580")
SW = SoftwareInfo("3.6.0", "2.11.0", "13.0", "0.1.0", "abc")
PROBLEM = Problem(1, 2, 2, 64, 64, 32, "float16")


@pytest.fixture
def db(any_db_url):
    """A fresh results database, SQLite and PostgreSQL (where a server is given)."""
    database = connect(any_db_url)
    yield database
    database.dispose()


def test_sqlite_is_wal_with_schema_version(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'sub' / 'tune.sqlite'}")
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
    save_winner(db, ids, Winner(PROBLEM, cfg, 1.4, 11.0, 1e-3, GPU, SW, study_name="s"))
    save_winner(db, ids, Winner(PROBLEM, cfg.with_(BLOCK_N=32), 1.3, 12.0, 1e-3, GPU, SW, ties=2, study_name="s"))
    rows = best(db)  # replaced, never duplicated
    assert len(rows) == 1 and rows[0].config.BLOCK_N == 32 and rows[0].ties == 2
    assert best(db)[0].config == cfg.with_(BLOCK_N=32)
    assert (rows[0].problem, rows[0].gpu, rows[0].software, rows[0].study_name) == (PROBLEM, GPU, SW, "s")
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
    assert schema_version(upgraded) == models.SCHEMA_VERSION
    fp8 = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn")
    ids = identities(upgraded, fp8, GPU, SW)
    fast = Fp8Recipe("per_tensor", False)
    save_front(upgraded, ids, [FrontPoint(fp8, KernelConfig(), 1.0, 10.0, 0.2, GPU, SW, recipe=fast),
                               FrontPoint(fp8, KernelConfig(), 1.5, 7.0, 0.05, GPU, SW)], 0.3)
    save_front(upgraded, ids, [FrontPoint(fp8, KernelConfig(), 1.4, 7.5, 0.05, GPU, SW)], 0.3)  # a re-tune replaces it
    rows = pareto(upgraded)
    assert [(r.candidate, r.median_ms, r.max_error) for r in rows] == [(Candidate(KernelConfig(), Fp8Recipe()), 1.4,
                                                                          0.3)]
    with upgraded.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM fa_measurements")).scalar() == 1


def test_version_2_database_gains_the_kv_cache_columns_keeping_every_row(db):
    """A database as schema 2 left it (before KV-cache and backward problems: no kind or
    page size), built here by the current code: a reader refuses it untouched, a writer
    upgrades it in place, every problem a forward one, no row lost."""
    ids = identities(db, PROBLEM, GPU, SW)
    record(db, ids, KernelConfig(), "ok", median_ms=2.0)
    record(db, ids, KernelConfig(BLOCK_M=32), "timeout", message="hung")
    save_winner(db, ids, Winner(PROBLEM, KernelConfig(), 2.0, 1.0, 1e-3, GPU, SW, study_name="s"))
    tables = ("fa_problems", "fa_configs", "fa_measurements", "fa_best")
    with db.engine.begin() as conn:
        before = {t: conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar() for t in tables}
        conn.execute(text("ALTER TABLE fa_problems DROP COLUMN kind"))
        conn.execute(text("ALTER TABLE fa_problems DROP COLUMN page_size"))
        conn.execute(text("DELETE FROM fa_schema_version"))
        conn.execute(models.SchemaVersionModel.__table__.insert().values(version=2))
    db.dispose()
    with pytest.raises(DatabaseError, match="predates"):
        connect(db.url, readonly=True)
    with connect(db.url).engine.connect() as conn:  # the writer's upgrade
        assert {t: conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar() for t in tables} == before
        assert conn.execute(text("SELECT kind, page_size FROM fa_problems")).all() == [("fwd", 0)]
    upgraded = connect(db.url, readonly=True)
    assert schema_version(upgraded) == models.SCHEMA_VERSION
    assert [r.problem for r in best(upgraded)] == [PROBLEM]


def test_a_row_inserted_by_another_run_meanwhile_is_absorbed(db):
    """Two tunes sharing a database: another run inserts the same problem (or config, GPU,
    software, winner) between our look and our insert. The insert yields to it instead of
    failing on the unique constraint."""
    from fa_autotune.store.records import config_row, problem_row

    problem, config = Problem(1, 2, 2, 64, 64, 32, "float16"), KernelConfig(BLOCK_M=16, BLOCK_N=16)
    with db.session() as other:  # the other run, committed
        problem_row(other, problem)
        config_row(other, config)
    with db.session() as s:
        real, looks = s.scalar, []

        def looked_before_the_other_insert(statement, *args, **kwargs):
            looks.append(statement)
            return None if len(looks) <= 2 else real(statement, *args, **kwargs)

        s.scalar = looked_before_the_other_insert
        assert problem_row(s, problem).key == problem.key
        assert config_row(s, config).hash == config.key
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM fa_problems")).scalar() == 1
        assert conn.execute(text("SELECT COUNT(*) FROM fa_configs")).scalar() == 1


def test_concurrent_writers_share_identities(tmp_path, any_db_url):
    """Four processes registering the same 40 problems and configs at once: no errors, one
    row each (SQLite and PostgreSQL)."""
    import subprocess
    import sys

    url = any_db_url
    connect(url).dispose()  # the schema, once
    script = tmp_path / "writer.py"
    script.write_text(f"""
import time
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.store import connect
from fa_autotune.store.records import config_row, problem_row
db = connect({url!r})
time.sleep(max(0.0, {__import__('time').time() + 3.0} - time.time()))  # start together
for i in range(40):
    with db.session() as s:
        problem_row(s, Problem(1, 2, 2, 64 + i, 64, 32, "float16"))
        config_row(s, KernelConfig(BLOCK_M=16, BLOCK_N=16, num_stages=1 + i % 4, num_warps=2 ** (1 + i % 3)))
""")
    procs = [subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(errors)
    with connect(url).engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM fa_problems")).scalar() == 40
        assert conn.execute(text("SELECT COUNT(*) FROM fa_configs")).scalar() == 12


def test_version_2_database_gains_kv_cache_problems(db):
    """A database written before KV-cache tuning (schema 2: no decode/page_size columns)
    upgrades in place; its problems read back as forward problems, decode ones store beside."""
    ids = identities(db, PROBLEM, GPU, SW)
    record(db, ids, KernelConfig(), "ok", median_ms=2.0)
    with db.engine.begin() as conn:
        conn.execute(text("ALTER TABLE fa_problems DROP COLUMN kind"))
        conn.execute(text("ALTER TABLE fa_problems DROP COLUMN page_size"))
        conn.execute(text("DELETE FROM fa_schema_version"))
        conn.execute(models.SchemaVersionModel.__table__.insert().values(version=2))
    db.dispose()
    upgraded = connect(db.url)
    assert schema_version(upgraded) == models.SCHEMA_VERSION == 3
    decode = Problem(4, 32, 8, 1, 4096, 128, "bfloat16", kind="decode", page_size=16)
    config = KernelConfig(loop_order="decode", BLOCK_M=16, num_splits=4)
    record(upgraded, identities(upgraded, decode, GPU, SW), config, "ok", median_ms=0.1)
    with upgraded.session() as s:
        problems = {row.key: row.to_problem() for row in s.query(models.ProblemModel)}
    assert problems == {PROBLEM.key: PROBLEM, decode.key: decode}


def test_an_immediate_sqlite_lock_is_retried_a_waited_out_one_is_not(monkeypatch):
    """Opening and creating the schema is retried after a "database is locked" that SQLite
    gave at once (deadlock avoidance, another connection cleaning up its WAL file: SQLite says
    to retry), not after one that waited out the busy timeout (a lock really held)."""
    from fa_autotune.store import db as dbmod

    calls = []

    def locked_twice():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "opened"

    assert dbmod._schema_race_retried(locked_twice) == "opened" and len(calls) == 3
    clock = iter(range(0, 10**6, dbmod.BUSY_TIMEOUT_S))  # each attempt takes the whole busy timeout
    monkeypatch.setattr(dbmod.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(dbmod.time, "sleep", lambda s: None)
    calls.clear()
    with pytest.raises(RuntimeError, match="database is locked"):
        dbmod._schema_race_retried(locked_twice)
    assert len(calls) == 1


def test_concurrent_first_opens_create_the_schema_once(tmp_path, any_db_url):
    """Four processes opening one empty database at the same moment: the schema is created
    once, every process ends at the current version (issue 17: workers start together)."""
    import subprocess
    import sys

    script = tmp_path / "opener.py"
    script.write_text(f"""
import time
from fa_autotune.store import connect
from fa_autotune.store.db import schema_version
time.sleep(max(0.0, {__import__('time').time() + 3.0} - time.time()))
db = connect({any_db_url!r})
db.optuna_storage()
print(schema_version(db))
""")
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(err for _, err in results)
    assert {out.strip() for out, _ in results} == {str(models.SCHEMA_VERSION)}
    with connect(any_db_url).engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM fa_schema_version")).scalar() == 1


def test_claims_keep_workers_from_measuring_one_config_twice(db):
    """A config claimed by a live worker stays its; a released or abandoned claim passes on."""
    from fa_autotune.store.records import claim, release

    ids = identities(db, PROBLEM, GPU, SW)
    cfg = KernelConfig(BLOCK_M=32)
    alive, dead = (lambda holder, at: False), (lambda holder, at: True)
    assert claim(db, ids, cfg, "host:a:1", alive) == "host:a:1"
    assert claim(db, ids, cfg, "host:b:2", alive) == "host:a:1"  # a is measuring it
    assert claim(db, ids, cfg.with_(BLOCK_M=64), "host:b:2", alive) == "host:b:2"  # another config is free
    release(db, ids, cfg, "host:b:2")  # not b's to release
    assert claim(db, ids, cfg, "host:b:2", alive) == "host:a:1"
    release(db, ids, cfg, "host:a:1")
    assert claim(db, ids, cfg, "host:b:2", alive) == "host:b:2"
    assert claim(db, ids, cfg, "host:c:3", dead) == "host:c:3"  # b died holding it: taken over
    assert claim(db, ids, cfg, "host:b:2", alive) == "host:c:3"


def test_live_counts_what_every_worker_measured(db):
    """`tune --gpus` shows the failures of its studies, whoever measured them: distinct
    configs per study (a config measured twice counts once; failures counted as such;
    re-timing is not search; other studies are not this run's)."""
    from fa_autotune.store.queries import live

    ids = identities(db, PROBLEM, GPU, SW)
    a, b, c = KernelConfig(BLOCK_M=64), KernelConfig(BLOCK_M=32), KernelConfig(BLOCK_N=32)
    record(db, ids, a, "ok", median_ms=2.0, study_name="s1")
    record(db, ids, a, "ok", median_ms=1.5, study_name="s1")
    record(db, ids, b, "wrong_result", study_name="s1")
    record(db, ids, c, "ok", median_ms=1.0, phase="retime", study_name="s1")
    record(db, ids, c, "ok", median_ms=0.5, study_name="an earlier space's study")
    (row, empty) = live(db, ["s1", "s2"])
    assert (row.study, row.configs, row.failed, row.best_ms) == ("s1", 2, 1, 1.5)
    assert (empty.configs, empty.failed, empty.best_ms) == (0, 0, None)


def test_rows_written_while_the_recipe_was_a_template_parameter_read_with_it(db):
    """A database an earlier fa_autotune wrote keeps working: its fa_configs rows hold the FP8
    recipe among the template parameters (as the JSON, hash and name below, copied from a
    database that version wrote). Winners, fronts and trials read back with the recipe, and a
    measurement of the same candidate today lands on that row (same hash): nothing migrates,
    a re-tune answers the trial from it."""
    fp8 = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn")
    legacy_json = ('{"BLOCK_M":16,"BLOCK_N":32,"access":"pointer","causal_mode":"split","fp8_pv":"inplace",'
                   '"fp8_scaling":"per_tensor","loop_order":"q_outer","num_splits":1,"num_stages":2,"num_warps":4,'
                   '"q_tiles":1,"tile_order":"head","warp_specialize":false}')
    name = "attn_fwd_qouter_m16n32_w4s2_ptr_cband_headmajor_fp8tensor_pvin"
    ids = identities(db, fp8, GPU, SW)
    with db.session() as s:
        row = models.ConfigModel(hash="9f643519ffe888dc", name=name, json=legacy_json)
        s.add(row)
        s.flush()
        s.add(models.MeasurementModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software,
                                      config_id=row.id, status="ok", median_ms=1.0, rel_error=0.05))
        s.add(models.BestModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software, config_id=row.id,
                               median_ms=1.0, tflops=1.0, rel_error=0.05))
        s.add(models.ParetoModel(problem_id=ids.problem, gpu_id=ids.gpu, software_id=ids.software, config_id=row.id,
                                 median_ms=1.0, tflops=1.0, rel_error=0.05))
    candidate = Candidate(KernelConfig(BLOCK_M=16, BLOCK_N=32, num_stages=2, tile_order="head", fp8_pv="inplace"),
                          Fp8Recipe("per_tensor", True))
    assert (candidate.key, candidate.name, candidate.canonical_json()) == ("9f643519ffe888dc", name, legacy_json)
    (winner,) = best(db)
    (point,) = pareto(db)
    assert winner.candidate == point.candidate == candidate
    assert point.as_row()["fp8_scaling"] == "per_tensor" and winner.as_row()["config_name"] == name
    (trial,) = trials(db)
    assert trial.config == candidate.to_dict() and trial.config_name == name
    assert reusable(db, ids, candidate).median_ms == 1.0
    record(db, ids, candidate, "ok", median_ms=0.9)
    save_winner(db, ids, Winner(fp8, candidate.config, 0.9, 1.1, 0.05, GPU, SW, recipe=candidate.recipe))
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM fa_configs")).scalar() == 1
    assert best(db)[0].median_ms == 0.9
    # the same kernel with the default recipe is another candidate, the kernel's own row
    record(db, ids, Candidate(candidate.config, Fp8Recipe()), "ok", median_ms=2.0)
    with db.engine.connect() as conn:
        keys = {k for (k,) in conn.execute(text("SELECT hash FROM fa_configs"))}
    assert keys == {"9f643519ffe888dc", candidate.config.key}

"""The command line as a user runs it: separate processes, a temporary SQLite database."""
from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

TINY = ["--batch", "1", "--heads", "2", "--seqlen", "40", "--head-dim", "16"]


def cli(*args, env=None, timeout=600, check=True):
    result = subprocess.run([sys.executable, "-m", "fa_autotune", *args], capture_output=True, text=True,
                            env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def env(tmp_path, kernel_cache):
    e = dict(os.environ, FA_AUTOTUNE_CACHE=str(kernel_cache))
    e.pop("TRITON_INTERPRET", None)  # the CLI must find its own way to the interpreter
    return e


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'tune.sqlite'}"


def measurements(db_url):
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
        return conn.execute("SELECT c.hash, m.status, m.phase FROM fa_measurements m "
                            "JOIN fa_configs c ON c.id = m.config_id").fetchall()


def test_tune_then_query(env, db_url):
    out = cli("tune", *TINY, "--trials", "4", "--jobs", "2", "--seed", "3", "--db", db_url, "--quiet", env=env)
    assert "interpreter" in out.stdout and "not a GPU" in out.stdout
    rows = measurements(db_url)
    search = [r for r in rows if r[2] == "search"]
    assert len({r[0] for r in search}) == 4
    assert {r[1] for r in rows} <= {"ok", "invalid_config", "compile_error", "out_of_resources", "wrong_result"}

    best = json.loads(cli("query", "best", "--db", db_url, "--format", "json", env=env).stdout)
    assert len(best) == 1
    assert best[0]["problem"] == "b1_hq2_hkv2_nq40_nk40_d16_float16_full" and best[0]["median_ms"] > 0
    assert best[0]["gpu"].startswith("Triton interpreter") and best[0]["config"]["loop_order"]

    table = list(csv.DictReader(io.StringIO(cli("query", "trials", "--db", db_url, "--format", "csv", env=env).stdout)))
    assert len(table) == len(rows) and all(r["status"] for r in table)
    assert json.loads(table[0]["config"])["BLOCK_M"] in (16, 32)
    ok_only = json.loads(cli("query", "trials", "--db", db_url, "--format", "json", "--status", "ok", env=env).stdout)
    assert ok_only and all(r["status"] == "ok" for r in ok_only)
    assert json.loads(cli("query", "best", "--db", db_url, "--format", "json", "--dtype", "bf16", env=env).stdout) == []
    assert "best" in cli("query", "best", "--db", db_url, env=env).stdout  # the table has a title

    # The same command again with more trials continues the study; nothing is timed twice.
    cli("tune", *TINY, "--trials", "6", "--jobs", "2", "--seed", "3", "--db", db_url, "--quiet", env=env)
    search = [r for r in measurements(db_url) if r[2] == "search"]
    assert len({r[0] for r in search}) == 6
    assert len(search) == 6, "a config was measured twice"


def test_kill_minus_nine_then_resume(env, db_url):
    args = ["tune", *TINY, "--causal", "--trials", "10", "--jobs", "2", "--seed", "5", "--db", db_url, "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "fa_autotune", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.5)
        try:
            if len(measurements(db_url)) >= 3:
                break
        except sqlite3.Error:
            continue
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner, its compile pool and its device worker
    proc.wait()
    before = measurements(db_url)
    assert 3 <= len(before) < 10
    cli(*args, env=env)
    after = [r for r in measurements(db_url) if r[2] == "search"]
    assert before == measurements(db_url)[: len(before)]  # nothing measured was lost or rewritten
    assert len({r[0] for r in after}) == 10
    assert len(after) <= 10 + 2, "more than the trials in flight were measured again"


def test_bad_space_and_bad_db_are_one_line_errors(env, tmp_path, db_url):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nparameters:\n  BLOCK_M: [48]\n")
    result = cli("tune", *TINY, "--space", str(bad), "--db", db_url, env=env, check=False)
    assert result.returncode == 2 and "bad.yaml:3 (parameters.BLOCK_M)" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("query", "best", "--db", "postgresql+nosuchdriver://x/y", env=env, check=False)
    assert result.returncode == 2 and "cannot open database" in result.stderr
    result = cli("tune", "--preset", "nope", "--db", db_url, env=env, check=False)
    assert result.returncode == 2 and "unknown preset 'nope'" in result.stderr


def test_time_budget_and_report(env, db_url, tmp_path):
    start = time.monotonic()
    cli("tune", *TINY, "--trials", "50", "--time-budget", "3", "--jobs", "2", "--db", db_url, "--quiet", env=env)
    assert time.monotonic() - start < 120
    assert 1 <= len({r[0] for r in measurements(db_url) if r[2] == "search"}) < 50
    out = cli("report", "--db", db_url, "--out", str(tmp_path / "plots"), env=env)
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["search_convergence.png", "tflops_per_problem.png"] and "png" in out.stdout
    assert all((tmp_path / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_render_and_compile_commands(env, tmp_path):
    out = cli("render", "--config", '{"loop_order": "split_kv", "num_splits": 4}', "--out", str(tmp_path), env=env)
    path = out.stdout.strip()
    assert path.endswith(".py") and "attn_fwd_splitkv" in path and os.path.exists(path)
    bad = cli("render", "--config", '{"BLOCK_M": 65}', env=env, check=False)
    assert bad.returncode == 2 and "BLOCK_M" in bad.stderr


def test_compile_command_reports_a_gluon_kernel_for_hopper(env):
    """No GPU here: `compile` builds the Gluon FlashAttention-3 variant for sm_90 and reports
    what proves its structure (register hand-over, TMA, wgmma)."""
    config = ('{"language": "gluon", "access": "tensor_desc", "num_warps": 4, "BLOCK_M": 64, "BLOCK_N": 128, '
              '"num_stages": 2, "persistent": 1}')
    out = cli("compile", "--config", config, "--batch", "2", "--heads", "16", "--kv-heads", "4", "--seqlen", "4096",
              "--head-dim", "128", "--dtype", "bf16", "--causal", env=env)
    report = json.loads(out.stdout)
    assert report["status"] == "ok" and report["variant"] == "attn_fwd_gluon_m64x2n128_s2_r240_cband_ov_pers1"
    (kernel,) = report["kernels"]
    assert "inc 240" in kernel["setmaxnreg"] and kernel["uses_wgmma"]
    assert dict(kernel["instructions"])["cp.async.bulk.tensor"] > 0


@pytest.mark.parametrize("flags, message", [
    (["--batch", "1", "--heads", "2", "--seqlen", "0", "--head-dim", "16"], "empty problem"),
    ([*TINY, "--dtype", "bf16"], "bfloat16 cannot be tuned in Triton's interpreter"),
])
def test_tune_refuses_what_it_cannot_measure(env, db_url, flags, message):
    """An empty problem, or bf16 where the interpreter computes it wrong: a one-line refusal
    before any trial, and nothing stored."""
    result = cli("tune", *flags, "--trials", "1", "--db", db_url, env=env, check=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(db_url.removeprefix("sqlite:///")) or measurements(db_url) == []


def test_reading_commands_never_write(env, tmp_path):
    """`query`, `export` and `report` on another application's SQLite file or on a path
    that does not exist: a one-line refusal, and the file (or its absence) untouched: no
    fa_ tables, no WAL switch, no directories."""
    other = tmp_path / "otherapp.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    before = other.read_bytes()
    missing = tmp_path / "nowhere" / "deeper" / "db.sqlite"
    for url in (f"sqlite:///{other}", f"sqlite:///{missing}"):
        for args in (["query", "best"], ["export", "--out", str(tmp_path / "exported")],
                     ["report", "--out", str(tmp_path / "report")]):
            result = cli(*args, "--db", url, env=env, check=False)
            assert result.returncode == 2 and "no fa_autotune results" in result.stderr, (args, result.stderr)
            assert "Traceback" not in result.stderr
    assert other.read_bytes() == before and not (tmp_path / "otherapp.sqlite-wal").exists()
    with sqlite3.connect(other) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["notes"]
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "exported").exists()

"""The command line as a user runs it: separate processes, a temporary SQLite database."""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from helpers import measurements

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


@pytest.fixture
def shared_url(any_db_url):
    """Results database URL of each backend (SQLite, PostgreSQL where a server is given)."""
    return any_db_url


def here(capsys, *args) -> subprocess.CompletedProcess:
    """`fa-autotune ARGS` run in this process, as `main` runs it for the console script: its
    exit code and output. For reading commands and refusals, which return in a moment: a
    fresh interpreter for each (importing torch) would only slow the suite. An exception
    that escapes `main` fails the test, as a traceback in a subprocess would."""
    from fa_autotune import cli as cli_module

    capsys.readouterr()
    try:
        code = cli_module.main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = 0 if exc.code is None else exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["fa-autotune", *args], code, out, err)


def test_tune_then_query(env, shared_url, capsys):
    db_url = shared_url
    out = cli("tune", *TINY, "--trials", "4", "--jobs", "1", "--seed", "3", "--db", db_url, "--quiet", env=env)
    assert "interpreter" in out.stdout and "not a GPU" in out.stdout
    # Not a terminal: one plain line per problem (no folded table); TFLOPS mean nothing here.
    line = next(x for x in out.stdout.splitlines() if x.startswith("tuned problem:"))
    assert "TFLOPS: -;" in line and "configs: 4;" in line and "new: 4;" in line
    rows = measurements(db_url)
    search = [r for r in rows if r[2] == "search"]
    assert len({r[0] for r in search}) == 4
    assert {r[1] for r in rows} <= {"ok", "invalid_config", "compile_error", "out_of_resources", "wrong_result"}

    best = json.loads(here(capsys, "query", "best", "--db", db_url, "--format", "json").stdout)
    assert len(best) == 1
    assert best[0]["problem"] == "b1_hq2_hkv2_nq40_nk40_d16_float16_full" and best[0]["median_ms"] > 0
    assert best[0]["gpu"].startswith("Triton interpreter") and best[0]["config"]["loop_order"]

    table = list(csv.DictReader(io.StringIO(here(capsys, "query", "trials", "--db", db_url, "--format", "csv").stdout)))
    assert len(table) == len(rows) and all(r["status"] for r in table)
    assert json.loads(table[0]["config"])["BLOCK_M"] in (16, 32)
    ok_only = json.loads(here(capsys, "query", "trials", "--db", db_url, "--format", "json", "--status", "ok").stdout)
    assert ok_only and all(r["status"] == "ok" for r in ok_only)
    assert json.loads(here(capsys, "query", "best", "--db", db_url, "--format", "json", "--dtype", "bf16").stdout) == []
    assert "best" in here(capsys, "query", "best", "--db", db_url).stdout  # the table has a title
    # Interpreter timings are not speeds: '-' in every table, as in the tune summary above,
    # with a note; JSON and CSV keep the stored number.
    assert "TFLOPS are shown as '-'" in out.stdout
    for what in ("best", "trials"):
        stored = json.loads(here(capsys, "query", what, "--db", db_url, "--format", "json").stdout)
        shown = here(capsys, "query", what, "--db", db_url).stdout
        assert "TFLOPS are shown as '-' for timings from Triton's interpreter" in shown
        assert not [r for r in stored if r["tflops"] and f"{r['tflops']:.4g}" in shown], shown
    assert best[0]["tflops"] > 0
    assert len(json.loads(here(capsys, "query", "trials", "--db", db_url, "--format", "json", "--limit", "2").stdout)) == 2
    best_status = here(capsys, "query", "best", "--db", db_url, "--status", "ok")
    assert best_status.returncode == 2 and "--status filters measurements" in best_status.stderr

    # The same command again with more trials continues the study; nothing is timed twice.
    cli("tune", *TINY, "--trials", "6", "--jobs", "1", "--seed", "3", "--db", db_url, "--quiet", env=env)
    search = [r for r in measurements(db_url) if r[2] == "search"]
    assert len({r[0] for r in search}) == 6
    assert len(search) == 6, "a config was measured twice"


def _wait_for_measurements(db_url: str, count: int, timeout: float = 300) -> None:
    """Until a running tune (another process) has stored ``count`` measurements."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.5)
        try:
            if len(measurements(db_url)) >= count:
                return
        except Exception:  # no schema yet, or the file is being created: look again
            continue


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [child for child, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_kill_minus_nine_then_resume(env, db_url):
    """SQLite (PostgreSQL: the kill -9 of one of two workers below, restarted after)."""
    args = ["tune", *TINY, "--causal", "--trials", "10", "--jobs", "1", "--seed", "5", "--db", db_url, "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "fa_autotune", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for_measurements(db_url, 3)
    children = _descendants(proc.pid)
    assert children, "the tuner runs a compile pool and a device worker"
    os.kill(proc.pid, signal.SIGKILL)  # the tuner alone: its children must not outlive it
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.2)
    assert not [pid for pid in children if _alive(pid)], "compile or device workers outlived a killed tune"
    before = measurements(db_url)
    assert 3 <= len(before) < 10
    cli(*args, env=env)
    after = [r for r in measurements(db_url) if r[2] == "search"]
    assert before == measurements(db_url)[: len(before)]  # nothing measured was lost or rewritten
    # Ten distinct configs settled by the study; a kill landing between a measurement's row and
    # Optuna's tell leaves that one measured config outside the resumed study (kept, not lost).
    assert 10 <= len({r[0] for r in after}) <= 11
    assert len(after) <= 10 + 2, "more than the trials in flight were measured again"


def test_bad_space_and_bad_db_are_one_line_errors(tmp_path, db_url, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nparameters:\n  BLOCK_M: [48]\n")
    result = here(capsys, "tune", *TINY, "--space", str(bad), "--db", db_url)
    assert result.returncode == 2 and "bad.yaml:3 (parameters.BLOCK_M)" in result.stderr
    assert "Traceback" not in result.stderr
    result = here(capsys, "query", "best", "--db", "postgresql+nosuchdriver://x/y")
    assert result.returncode == 2 and "cannot open database" in result.stderr
    result = here(capsys, "tune", "--preset", "nope", "--db", db_url)
    assert result.returncode == 2 and "unknown preset 'nope'" in result.stderr


def test_time_budget_and_report(env, db_url, tmp_path):
    start = time.monotonic()
    cli("tune", *TINY, "--trials", "50", "--time-budget", "3", "--jobs", "1", "--db", db_url, "--quiet", env=env)
    assert time.monotonic() - start < 120
    assert 1 <= len({r[0] for r in measurements(db_url) if r[2] == "search"}) < 50
    out = cli("report", "--db", db_url, "--out", str(tmp_path / "plots"), env=env)
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["search_convergence.png", "tflops_per_problem.png"] and "png" in out.stdout
    assert all((tmp_path / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_render_and_compile_commands(env, tmp_path, capsys):
    out = cli("render", "--config", '{"loop_order": "split_kv", "num_splits": 4}', "--out", str(tmp_path), env=env)
    path = out.stdout.strip()
    assert path.endswith(".py") and "attn_fwd_splitkv" in path and os.path.exists(path)
    bad = here(capsys, "render", "--config", '{"BLOCK_M": 65}')
    assert bad.returncode == 2 and "BLOCK_M" in bad.stderr
    # the FP8 recipe is no template parameter: refused where no FP8 problem could take it
    for command in ("render", "compile"):
        bad = here(capsys, command, "--config", '{"fp8_scaling": "per_head"}')
        assert bad.returncode == 2
        assert "fp8_scaling: the FP8 quantization recipe is not a kernel parameter" in bad.stderr


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
def test_tune_refuses_what_it_cannot_measure(db_url, flags, message, capsys):
    """An empty problem, or bf16 where the interpreter computes it wrong: a one-line refusal
    before any trial, and nothing stored."""
    result = here(capsys, "tune", *flags, "--trials", "1", "--db", db_url)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(db_url.removeprefix("sqlite:///")) or measurements(db_url) == []


def test_reading_commands_never_write(tmp_path, capsys):
    """`query`, `export` and `report` on another application's SQLite file or on a path
    that does not exist: a one-line refusal, and the file (or its absence) untouched: no
    fa_ tables, no WAL switch, no directories."""
    other = tmp_path / "otherapp.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    before = other.read_bytes()
    missing = tmp_path / "nowhere#x" / "deeper?y" / "db.sqlite"  # URI-special characters stay a path
    for url in (f"sqlite:///{other}", f"sqlite:///{missing}"):
        for args in (["query", "best"], ["export", "--out", str(tmp_path / "exported")],
                     ["report", "--out", str(tmp_path / "report")]):
            result = here(capsys, *args, "--db", url)
            assert result.returncode == 2 and "no fa_autotune results" in result.stderr, (args, result.stderr)
            assert "Traceback" not in result.stderr
    assert other.read_bytes() == before and not (tmp_path / "otherapp.sqlite-wal").exists()
    with sqlite3.connect(other) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["notes"]
    assert not (tmp_path / "nowhere#x").exists() and not (tmp_path / "nowhere").exists()
    assert not (tmp_path / "exported").exists()


@pytest.mark.parametrize("args, message", [
    (["tune", *TINY, "--jobs", "-1"], "--jobs: expected a positive integer"),
    (["tune", *TINY, "--trials", "0"], "--trials: expected a positive integer"),
    (["query", "trials", "--limit", "0"], "--limit: expected a positive integer"),
])
def test_bad_numbers_are_usage_errors(db_url, args, message, capsys):
    result = here(capsys, *args, "--db", db_url)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_import_into_a_read_only_database_is_one_line(env, tmp_path, db_url):
    """Writing where the database cannot be written: the database's error in one line."""
    shipped = os.path.join(os.path.dirname(__file__), "..", "tuning_db", "nvidia-h200.attn_fwd.json")
    cli("import", shipped, "--db", db_url, env=env)  # creates the schema
    path = db_url.removeprefix("sqlite:///")
    ro_url = f"sqlite:///file:{path}?mode=ro&uri=true"
    result = cli("import", shipped, "--db", ro_url, env=env, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "readonly" in result.stderr.lower() or "read-only" in result.stderr.lower(), result.stderr


def test_ctrl_c_stops_a_tune_cleanly(env, db_url):
    """SIGINT: the workers ignore it, the tuner stops, keeps what it measured and says how
    to resume; no worker traceback."""
    args = ["tune", *TINY, "--trials", "10", "--jobs", "2", "--seed", "7", "--db", db_url, "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "fa_autotune", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_measurements(db_url, 2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert len(measurements(db_url)) >= 2


def test_large_problems_in_the_interpreter_are_warned_about(capsys):
    from fa_autotune.cli import _check_tunable
    from fa_autotune.spec.problem import Problem
    from fa_autotune.spec.target import interpreter_gpu

    _check_tunable([Problem(1, 2, 2, 64, 64, 32, "float16")], interpreter_gpu())
    assert capsys.readouterr().err == ""
    _check_tunable([Problem(4, 32, 8, 8192, 8192, 128, "float16", causal=True)], interpreter_gpu())
    assert "large for Triton's interpreter" in capsys.readouterr().err


def test_import_shows_progress(env, tmp_path, db_url):
    """A long import says how far it is (every 1000 configs)."""
    from fa_autotune.runtime import files
    from fa_autotune.spec.config import KernelConfig
    from fa_autotune.spec.problem import Problem
    from fa_autotune.spec.target import SoftwareInfo, interpreter_gpu

    sw = SoftwareInfo("3.6.0", "2.13.0", "none", "0.1.0", "x")
    entries = {}
    for i in range(2100):
        p = Problem(1, 2, 2, 64 + i, 64 + i, 16, "float16")
        entries[p.key] = {"problem": p.to_dict(), "config": KernelConfig(BLOCK_M=16, BLOCK_N=16).to_dict(),
                          "median_ms": 1.0, "tflops": 1.0, "rel_error": 1e-4, "software": sw.to_dict()}
    path = tmp_path / files.file_name(interpreter_gpu())
    path.write_text(json.dumps({"schema": files.SCHEMA, "schema_version": 1, "family": "attn_fwd",
                                "gpu": interpreter_gpu().to_dict(), "entries": entries}))
    result = cli("import", str(path), "--db", db_url, env=env)
    assert "importing: 1000/2100" in result.stderr and "importing: 2000/2100" in result.stderr
    assert "imported 2100 tuned configs" in result.stdout


def test_two_tunes_of_one_problem_share_a_database(env, pg_url):
    """Two runs of the same tune at once (two hosts: PostgreSQL; two workers on SQLite are
    test_gpus_runs_one_worker_per_gpu_on_one_database): neither fails the other's trials in
    flight nor crashes on rows the other wrote; both finish and every measurement is kept."""
    db_url = pg_url
    from fa_autotune.store import connect

    connect(db_url).optuna_storage()  # an existing results database (creating one at once is issue 17's)
    args = ["tune", *TINY, "--causal", "--trials", "6", "--jobs", "1", "--db", db_url, "--quiet"]
    procs = [subprocess.Popen([sys.executable, "-m", "fa_autotune", *args, "--seed", str(seed)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [p.communicate(timeout=600) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err
    search = [r for r in measurements(db_url) if r[2] == "search"]
    assert len({r[0] for r in search}) >= 6
    hashes = [r[0] for r in search]
    assert len(hashes) == len(set(hashes)), "a config was measured by both workers (claims failed)"


def run_with_files(script: str, env: dict, files_dir) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter process that reads tuned files from ``files_dir`` only."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(env, FA_AUTOTUNE_CONFIG_DIR=str(files_dir), TRITON_INTERPRET="1",
                                   FA_AUTOTUNE_DB=f"sqlite:///{files_dir}/none.sqlite"))


def test_decode_tune_export_and_serve(env, db_url, tmp_path):
    """`tune --space decode` on a KV-cache problem (paged), export to the attn_decode file,
    and attention_with_kvcache picks the tuned config from it in a fresh process."""
    out = cli("tune", "--space", "decode", "--batch", "2", "--heads", "4", "--kv-heads", "2", "--seqlen", "1",
              "--seqlen-k", "48", "--head-dim", "32", "--page-size", "16", "--trials", "3", "--jobs", "1",
              "--db", db_url, "--quiet", env=env)
    line = next(x for x in out.stdout.splitlines() if x.startswith("tuned problem:"))
    assert "b2_hq4_hkv2_nq1_nk48_d32_float16_full_paged16" in line and "configs: 3;" in line
    assert "attn_decode_" in line
    cli("export", "--db", db_url, "--out", str(tmp_path / "files"), env=env)
    (path,) = (tmp_path / "files").iterdir()
    assert path.name.endswith(".attn_decode.json")
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    assert data["family"] == "attn_decode" and entry["problem"]["page_size"] == 16
    script = ("import torch, fa_autotune\n"
              "from fa_autotune.runtime.dispatch import DISPATCHER\n"
              "p = fa_autotune.Problem(2, 4, 2, 1, 48, 32, 'float16', kind='decode', page_size=16)\n"
              "print(DISPATCHER.choose(p, 'cpu', 0).source)\n")
    served = run_with_files(script, env, tmp_path / "files")
    assert served.stdout.strip() == "exported", served.stderr


def test_page_size_needs_the_decode_space(db_url, capsys):
    result = here(capsys, "tune", *TINY, "--page-size", "16", "--db", db_url)
    assert result.returncode != 0 and "--space decode" in result.stderr


def test_backward_tune_export_and_train(env, db_url, tmp_path):
    """`tune --space bwd` on one backward problem (checked against float32 autograd), export
    to the attn_bwd file, and loss.backward() in a fresh process runs the tuned kernels
    (explain shows them)."""
    out = cli("tune", "--space", "bwd", "--preset", "smoke", "--match", "full", "--trials", "2", "--jobs", "1",
              "--db", db_url, "--quiet", env=env)
    line = next(x for x in out.stdout.splitlines() if x.startswith("tuned problem:"))
    assert "b1_hq2_hkv2_nq64_nk64_d32_float16_full_bwd" in line and "attn_bwd_" in line
    cli("export", "--db", db_url, "--out", str(tmp_path / "files"), env=env)
    (path,) = (tmp_path / "files").iterdir()
    assert path.name.endswith(".attn_bwd.json")
    script = ("import torch, fa_autotune\n"
              "q, k, v = (torch.randn(1, 2, 64, 32, dtype=torch.float16, requires_grad=True) for _ in range(3))\n"
              "info = fa_autotune.explain(q, k, v)['backward']\n"
              "fa_autotune.attention(q, k, v).float().sum().backward()\n"
              "print(info['source'], info['kernel'], bool(torch.isfinite(q.grad).all() and k.grad.abs().sum() > 0))\n")
    served = run_with_files(script, env, tmp_path / "files")
    source, kernel, finite = served.stdout.split()
    assert source == "exported" and kernel.startswith("attn_bwd_") and finite == "True", served.stderr


def test_two_tunes_at_once_one_killed_the_other_finishes(env, pg_url):
    """Two workers tuning one preset against one database (PostgreSQL, as two hosts would;
    SQLite: test_kill_minus_nine_then_resume), one of them killed with -9 mid-run:
    the other finishes every problem, the killed one's measurements stay, and a restart of the
    killed worker completes; configs are claimed in the database, so only the killed worker's
    in-flight config may be measured a second time."""
    args = ["tune", "--preset", "smoke", "--trials", "4", "--jobs", "1", "--db", pg_url, "--quiet"]
    from fa_autotune.store import connect

    connect(pg_url).optuna_storage()
    victim = subprocess.Popen([sys.executable, "-m", "fa_autotune", *args, "--seed", "1"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    survivor = subprocess.Popen([sys.executable, "-m", "fa_autotune", *args, "--seed", "2"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_measurements(pg_url, 2)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    out, err = survivor.communicate(timeout=600)
    assert survivor.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert sum(line.startswith("tuned problem:") for line in out.splitlines()) == 2
    before = measurements(pg_url)
    cli(*args, "--seed", "1", env=env)
    after = measurements(pg_url)
    assert after[:len(before)] == before  # nothing lost or rewritten
    pairs = [(r[3], r[0]) for r in after if r[2] == "search"]  # two problems: a config once per problem
    assert len(set(pairs)) >= 4 and len(pairs) - len(set(pairs)) <= 1


@pytest.mark.parametrize("spec, message", [("all", "shows none"), ("0,0", "each GPU once"), ("x", "GPU ids")])
def test_gpus_refuses_what_it_cannot_run(db_url, spec, message, capsys):
    result = here(capsys, "tune", "--gpus", spec, "--db", db_url)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.parametrize("command", ["render", "compile", "tune", "query", "bench", "export", "import", "report"])
def test_every_command_has_a_description_defaults_and_examples_in_its_help(command, capsys):
    """`fa-autotune COMMAND --help`: what the command does, an example a user can copy, and
    the defaults of its options."""
    result = here(capsys, command, "--help")
    assert result.returncode == 0 and result.stderr == ""
    usage, description = result.stdout.split("\n\n")[:2]
    assert usage.startswith(f"usage: fa-autotune {command}") and description.strip()
    examples = result.stdout.split("examples:\n", 1)[1].splitlines()
    assert examples and all(line.startswith(f"  fa-autotune {command}") for line in examples)
    from fa_autotune.cli import _causal_spelling, build_parser

    for line in examples:  # each one a valid command line
        build_parser().parse_args(_causal_spelling(shlex.split(line, comments=True)[1:]))
    assert "(default: " in result.stdout
    listing = here(capsys, "--help").stdout
    assert re.search(rf"^    {command} +\S", listing, re.M), f"{command} has no line in fa-autotune --help"


def test_tune_help_shows_numeric_defaults(capsys):
    text = " ".join(here(capsys, "tune", "--help").stdout.split())
    assert "head dimension D (default: 128; with --model: the config's)" in text and "(default: 180.0)" in text


def test_causal_is_a_flag_in_every_command(tmp_path, db_url, capsys):
    """`--causal` / `--no-causal` as in `tune`: in query and report they filter (neither: both
    kinds); the older `--causal true|false` still means the same."""
    shipped = os.path.join(os.path.dirname(__file__), "..", "tuning_db", "nvidia-h200.attn_fwd.json")
    assert here(capsys, "import", shipped, "--db", db_url).returncode == 0

    def causal_column(*flags):
        result = here(capsys, "query", "best", "--db", db_url, "--format", "json", *flags)
        assert result.returncode == 0, result.stderr
        return {row["problem"]["causal"] if isinstance(row["problem"], dict) else "causal" in row["problem"]
                for row in json.loads(result.stdout)}

    assert causal_column() == {True, False}
    assert causal_column("--causal") == {True} == causal_column("--causal", "true") == causal_column("--causal=yes")
    assert causal_column("--no-causal") == {False} == causal_column("--causal", "false")
    assert here(capsys, "query", "--no-causal", "best", "--db", db_url, "--format", "csv").returncode == 0
    bad = here(capsys, "query", "best", "--db", db_url, "--causal=maybe")
    assert bad.returncode == 2 and "--causal" in bad.stderr and "Traceback" not in bad.stderr
    # tune: not given is None (a plain tune fills in no mask, --model the model's own), and
    # `--causal true` a causal problem, not an error
    from fa_autotune.cli import build_parser, _causal_spelling

    parse = lambda *a: build_parser().parse_args(_causal_spelling(["tune", *TINY, *a]))  # noqa: E731
    assert parse("--no-causal").causal is False and parse().causal is None
    assert parse("--causal").causal is True and parse("--causal", "true").causal is True
    plain = here(capsys, "tune", *TINY, "--dry-run")
    assert plain.returncode == 0 and plain.stdout.split() and all(k.endswith("_full") for k in plain.stdout.split())


TWO_CONFIGS = """\
version: 1
kernel: attn_fwd
parameters:
  loop_order: [q_outer]
  BLOCK_M: [16]
  BLOCK_N: [16, 32]
  num_warps: [4]
  num_stages: [2]
  access: [pointer]
  causal_mode: [split]
  warp_specialize: [false]
  num_splits: [1]
  q_tiles: [1]
constraints: []
presets:
  smoke:
    description: one tiny problem
    problems:
      - {batch: 1, heads: 2, seqlen: 40, head_dim: 16, dtype: float16, causal: false}
"""


def test_reused_counts_only_earlier_measurements_and_a_log_gets_one_summary(env, db_url, tmp_path):
    """A fresh database, a space of two configs asked two at a time: the sampler proposes
    each config once (no trial spent on a repeat) and none is `reused`; off a terminal the
    progress is a line per problem and the summary comes once. A second study on the same
    database measures nothing: both configs reused."""
    space = tmp_path / "two.yaml"
    space.write_text(TWO_CONFIGS)
    args = ["tune", "--space", str(space), "--sampler", "random", "--trials", "2", "--jobs", "2", "--db", db_url]
    first = cli(*args, "--seed", "3", env=env)
    log = first.stdout + first.stderr
    summaries = [line for line in log.splitlines() if line.startswith("tuned problem:")]
    assert len(summaries) == 1, log
    assert "configs: 2; new: 2; reused: 0;" in summaries[0]
    assert "progress: 1/1 problems, 2/2 configs: b1_hq2_hkv2_nq40_nk40_d16_float16_full searched" in first.stderr
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:  # two trials, no repeat
        assert conn.execute("SELECT count(*) FROM trials").fetchone()[0] == 2
    conn.close()
    second = cli(*args, "--seed", "3", "--study", "another", "--quiet", env=env)
    (summary,) = [line for line in second.stdout.splitlines() if line.startswith("tuned problem:")]
    assert "configs: 2; new: 0; reused: 2;" in summary

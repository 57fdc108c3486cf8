"""Bad input, faults and secrets, as a user meets them on the command line (issue 43): each
case is a one-line message and an exit code, never a traceback, and nothing written that
the refusal says is not written."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_cli import cli, env, here  # noqa: F401 (env: the fixture)

SECRET = "s3cretPW"
# Nothing listens on port 1: the connection is refused at once, and the error quotes the URL.
PG_SECRET_URL = f"postgresql+psycopg://fa_user@127.0.0.1:1/fa?password={SECRET}&sslpassword={SECRET}x"
SHIPPED = os.path.join(os.path.dirname(__file__), "..", "tuning_db", "nvidia-h200.attn_fwd.json")


def one_line_error(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The refusal's message: exit ``code``, one line on stderr, no traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage:"), result.stderr
    return lines[-1]


# ------------------------------------------------------------------ secrets
@pytest.mark.parametrize("args", [["query", "best"], ["import", SHIPPED], ["tune", "--batch", "1", "--heads", "2",
                                                                              "--seqlen", "40", "--head-dim", "16"]])
def test_a_password_given_as_a_query_parameter_is_masked(args, capsys):
    message = one_line_error(here(capsys, *args, "--db", PG_SECRET_URL))
    assert SECRET not in message and "password=***" in message and "sslpassword=***" in message, message
    assert "127.0.0.1:1/fa" in message  # the rest of the URL still says which database


def test_attention_warns_about_an_unreachable_database_without_its_password(tmp_path):
    script = ("import warnings, torch, fa_autotune\n"
              "q = torch.randn(1, 2, 16, 16, dtype=torch.float16)\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    warnings.simplefilter('always')\n"
              "    fa_autotune.attention(q, q, q)\n"
              "print('\\n'.join(str(w.message) for w in caught if w.category is RuntimeWarning))\n")
    env = dict(os.environ, FA_AUTOTUNE_DB=PG_SECRET_URL, TRITON_INTERPRET="1", FA_AUTOTUNE_CACHE=str(tmp_path),
               FA_AUTOTUNE_CONFIG_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cannot read tuned results from postgresql+psycopg://fa_user@127.0.0.1:1/fa?" in result.stdout
    assert SECRET not in result.stdout + result.stderr and "password=***" in result.stdout


def test_safe_url_masks_every_secret_form():
    from fa_autotune.store import safe_url, scrub

    url = "postgresql+psycopg://u:pw1234@h/db?passfile=/home/u/.pgpass&sslmode=require&password=abcd1234"
    shown = safe_url(url)
    assert "pw1234" not in shown and "abcd1234" not in shown and ".pgpass" not in shown
    assert "sslmode=require" in shown and "u:***@h/db" in shown
    assert scrub(f"driver said: bad password abcd1234 for {url}", url) == f"driver said: bad password *** for {shown}"
    encoded = "postgresql+psycopg://u:p%40ss@h/db"  # the password p@ss, as written in the URL
    assert scrub("password p@ss wrong, dsn had p%40ss", encoded) == "password *** wrong, dsn had ***"


# ------------------------------------------------------------------ files beside the database
def test_reading_a_wal_database_leaves_no_files_beside_it(tmp_path, env, capsys):
    """`query`/`export` on a WAL database nobody has open create no -wal/-shm files (a
    reader's would stay behind, and in a shared directory block the owner's next write);
    while a writer has it open, a reader still sees the writer's committed rows."""
    import json
    import sqlite3

    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    cli("import", SHIPPED, "--db", url, env=env)  # the owner, in its own process
    before = sorted(os.listdir(tmp_path))
    assert before == ["shared.sqlite"]
    with sqlite3.connect(tmp_path / "shared.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    best = here(capsys, "query", "best", "--db", url, "--format", "json")
    assert best.returncode == 0 and len(json.loads(best.stdout)) > 0
    assert here(capsys, "export", "--db", url, "--out", str(tmp_path / "out")).returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["out", "shared.sqlite"]
    # a writer holding the database open (its -wal has rows not yet in the main file)
    writer = sqlite3.connect(tmp_path / "shared.sqlite")
    try:
        writer.execute("SELECT count(*) FROM sqlite_master").fetchone()  # holds the -wal open
        decode = os.path.join(os.path.dirname(SHIPPED), "nvidia-h200.attn_decode.json")
        cli("import", decode, "--db", url, env=env)
        assert os.path.exists(tmp_path / "shared.sqlite-wal")
        rows = json.loads(here(capsys, "query", "best", "--db", url, "--format", "json").stdout)
        assert len(rows) > len(json.loads(best.stdout))
    finally:
        writer.close()
    cli("import", SHIPPED, "--db", url, env=env)  # the owner still writes


def _exported(tmp_path, name: str = "file.json", **changes) -> str:
    """The shipped H200 file with ``changes`` made to its GPU and every entry's software."""
    import json

    data = json.loads(open(SHIPPED).read())
    data["gpu"].update(changes.get("gpu", {}))
    for entry in data["entries"].values():
        entry["software"].update(changes.get("software", {}))
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_a_refused_import_creates_no_database(tmp_path, capsys):
    bad = _exported(tmp_path, software={"triton": "3.6.0\x1b[2J"})  # a clear-screen escape
    url = f"sqlite:///{tmp_path / 'new' / 'db.sqlite'}"
    message = one_line_error(here(capsys, "import", SHIPPED, bad, "--db", url))
    assert "software.triton" in message and "control characters" in message
    assert "\x1b" not in message
    assert not (tmp_path / "new").exists()


def test_import_refuses_another_applications_sqlite_file(tmp_path, capsys):
    import sqlite3

    other = tmp_path / "otherapp.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.close()
    before = other.read_bytes()
    for args in (["import", SHIPPED], ["tune", "--batch", "1", "--heads", "2", "--seqlen", "40", "--head-dim", "16"]):
        message = one_line_error(here(capsys, *args, "--db", f"sqlite:///{other}"))
        assert "another application's SQLite database" in message and "notes" in message, message
    assert other.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["otherapp.sqlite"]


def test_tune_refuses_a_corrupted_database_before_writing(tmp_path, env, capsys):
    """A database with a damaged page: refused with the damage named, the file byte for byte
    as it was (no Optuna tables, no header rewrite)."""
    import sqlite3

    path = tmp_path / "results.sqlite"
    cli("import", SHIPPED, "--db", f"sqlite:///{path}", env=env)
    with sqlite3.connect(path) as conn:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'fa_configs'").fetchone()
    conn.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * page_size
    data[start:start + page_size] = b"\xa5" * page_size  # the table's root page overwritten
    path.write_bytes(bytes(data))
    for args in (["tune", "--batch", "1", "--heads", "2", "--seqlen", "40", "--head-dim", "16", "--trials", "1"],
                 ["import", SHIPPED]):
        message = one_line_error(here(capsys, *args, "--db", f"sqlite:///{path}"))
        assert "corrupted" in message and "nothing was written" in message, message
    assert path.read_bytes() == bytes(data) and sorted(os.listdir(tmp_path)) == ["results.sqlite"]
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database at all\n" * 200)
    message = one_line_error(here(capsys, "import", SHIPPED, "--db", f"sqlite:///{garbage}"))
    assert "not a SQLite database or is corrupted" in message


def test_database_text_is_shown_not_read_as_markup(tmp_path, capsys):
    """A GPU name with rich markup characters (legal in a file) is printed as it is."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert here(capsys, "import", _exported(tmp_path, gpu={"name": "GPU[/][b]x"}), "--db", url).returncode == 0
    result = here(capsys, "query", "best", "--db", url)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "GPU[/][b]x" in result.stdout, result.stdout


# ------------------------------------------------------------------ tune arguments
@pytest.mark.parametrize("flag, value, message", [
    ("--trial-timeout", "0", "expected a positive, finite number, got '0'"),
    ("--trial-timeout", "-5", "expected a positive, finite number"),
    ("--time-budget", "nan", "expected a positive, finite number, got 'nan'"),
    ("--time-budget", "inf", "expected a positive, finite number, got 'inf'"),
    ("--retime-top", "-1", "expected a positive integer, got -1"),
    ("--retime-top", "0", "expected a positive integer, got 0"),
    ("--seed", "-1", "expected a non-negative integer, got -1"),
    ("--seed", "4294967296", "expected a seed from 0 to 2147483647"),
    ("--max-error", "nan", "expected a positive, finite number"),
])
def test_tune_refuses_numbers_that_would_poison_a_run(tmp_path, flag, value, message, capsys):
    """Refused by the argument parser, before a database is opened: nothing stored."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    line = one_line_error(here(capsys, "tune", "--batch", "1", "--heads", "2", "--seqlen", "40", "--head-dim", "16",
                               "--trials", "1", flag, value, "--db", url))
    assert f"argument {flag}: {message}" in line, line
    assert os.listdir(tmp_path) == []


def test_tune_options_refuse_the_same_numbers_from_python():
    from fa_autotune.errors import FaAutotuneError
    from fa_autotune.tune.search import TuneOptions

    for bad in ({"trial_timeout": 0.0}, {"trial_timeout": float("nan")}, {"time_budget": float("nan")},
                {"retime_top": 0}, {"seed": -1}):
        with pytest.raises(FaAutotuneError):
            TuneOptions(**bad)
    assert TuneOptions(trial_timeout=0.5, retime_top=1, seed=0).trial_timeout == 0.5


# ------------------------------------------------------------------ tracebacks turned into messages
@pytest.fixture
def odd_paths(tmp_path):
    """A missing file, a binary file, a directory and a plain file, by name."""
    (tmp_path / "binary.json").write_bytes(b"\x00\xff\xfe{\x80")
    (tmp_path / "adir").mkdir()
    (tmp_path / "plain.txt").write_text("keep me\n")
    return {"missing": str(tmp_path / "missing.json"), "binary": str(tmp_path / "binary.json"),
            "directory": str(tmp_path / "adir"), "file": str(tmp_path / "plain.txt")}


@pytest.mark.parametrize("command", ["render", "compile"])
@pytest.mark.parametrize("kind, message", [("missing", "cannot read (No such file or directory)"),
                                           ("binary", "not UTF-8 text (byte 1)"),
                                           ("directory", "cannot read (Is a directory)")])
def test_config_file_that_cannot_be_read(odd_paths, command, kind, message, capsys):
    line = one_line_error(here(capsys, command, "--config-file", odd_paths[kind]))
    assert f"--config-file {odd_paths[kind]}: {message}" in line, line


@pytest.mark.parametrize("arch, message", [
    ("nine", "expected a compute capability MAJOR.MINOR like 9.0 or 8.0, got 'nine'"),
    ("9", "got '9'; did you mean 9.0?"),
    ("1.0", "Triton compiles for compute capability 7.0 and newer, got 1.0"),
])
def test_compile_arch_must_be_a_capability(arch, message, capsys):
    line = one_line_error(here(capsys, "compile", "--config", "{}", "--arch", arch))
    assert "argument --arch: " in line and message in line, line


@pytest.mark.parametrize("args", [["render", "--config", "{}"], ["export", "--db", "DB"], ["report", "--db", "DB"]])
def test_out_onto_an_existing_file_is_refused_and_the_file_kept(odd_paths, tmp_path, env, args, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cli("import", SHIPPED, "--db", url, env=env)
    args = [url if a == "DB" else a for a in args]
    for out in (odd_paths["file"], os.path.join(odd_paths["file"], "sub")):
        line = one_line_error(here(capsys, *args, "--out", out))
        assert f"{odd_paths['file']} is a file, not a directory" in line and "never replaced" in line, line
    assert open(odd_paths["file"]).read() == "keep me\n"


def test_a_search_space_that_is_not_utf8(tmp_path, capsys):
    space = tmp_path / "latin1.yaml"
    space.write_bytes("version: 1\n# caf\xe9\n".encode("latin-1"))
    line = one_line_error(here(capsys, "tune", "--space", str(space), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert f"{space}: not UTF-8 text (byte 16)" in line, line
    assert not (tmp_path / "db.sqlite").exists()


def test_a_billion_laughs_search_space_is_refused_at_once(tmp_path, capsys):
    """Ten kilobytes of nested aliases would expand to 10**30 nodes: refused after counting
    the composed graph, in well under a second, with a short message."""
    import time

    lines = ["version: 1", "a0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 30)]
    space = tmp_path / "laughs.yaml"
    space.write_text("\n".join(lines + ["parameters: *a29", "presets: {p: {problems: [*a29]}}"]) + "\n")
    start = time.monotonic()
    line = one_line_error(here(capsys, "tune", "--space", str(space), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert "laughs.yaml:6: expands to more than 100000 YAML nodes" in line and len(line) < 400, line  # at a4
    assert time.monotonic() - start < 10
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("version: 1\nparameters: &p {BLOCK_M: *p}\n")
    line = one_line_error(here(capsys, "tune", "--space", str(recursive), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert "not valid YAML" in line or "recursive" in line, line
    deep = tmp_path / "deep.yaml"
    deep.write_text("version: 1\nparameters: " + "[" * 3000 + "]" * 3000 + "\n")
    line = one_line_error(here(capsys, "tune", "--space", str(deep), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert "deep.yaml: nested too deeply to be a search space" in line, line
    assert not (tmp_path / "db.sqlite").exists()


def test_error_messages_quoting_input_are_bounded(tmp_path, capsys):
    """A huge value quoted back (here a 900 KB kernel name in a search space) is cut with an
    ellipsis: the message stays one short line."""
    space = tmp_path / "long.yaml"
    shipped = open(os.path.join(os.path.dirname(SHIPPED), "..", "search_spaces", "tutorial.yaml")).read()
    assert "\nkernel: attn_fwd\n" in shipped
    space.write_text(shipped.replace("\nkernel: attn_fwd\n", "\nkernel: " + "k" * 900_000 + "\n"))
    line = one_line_error(here(capsys, "tune", "--space", str(space), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert "kernel must be one of" in line and "kkk…" in line and len(line) <= 1100, len(line)


def test_output_into_a_closed_pipe_is_quiet(tmp_path, env):
    """`fa-autotune query best --format json | head` with head gone: no traceback, no
    'Exception ignored' noise; the status a SIGPIPE'd command has."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cli("import", SHIPPED, "--db", url, env=env)
    proc = subprocess.Popen([sys.executable, "-m", "fa_autotune", "query", "best", "--format", "json", "--db", url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


# ------------------------------------------------------------------ issue 40 item 5
def test_a_path_given_as_db_gets_the_url_to_use(tmp_path, capsys):
    path = tmp_path / "x.sqlite"
    line = one_line_error(here(capsys, "query", "best", "--db", str(path)))
    assert f"for a SQLite file give sqlite:///{path}" in line and "sqlite:////" in line, line
    line = one_line_error(here(capsys, "import", SHIPPED, "--db", "relative/x.sqlite"))
    assert f"sqlite:///{os.path.abspath('relative/x.sqlite')}" in line
    assert not path.exists() and not os.path.exists("relative")


def test_a_relative_sqlite_url_says_where_it_writes(tmp_path, env, capsys, monkeypatch):
    """sqlite:///tmp/x (three slashes) is ./tmp/x: a reader says so when nothing is there, a
    writer names the absolute path it creates."""
    monkeypatch.chdir(tmp_path)
    url = "sqlite:///tmp/rel/x.sqlite"
    line = one_line_error(here(capsys, "query", "best", "--db", url))
    assert f"the URL names {tmp_path}/tmp/rel/x.sqlite" in line and "sqlite:////tmp/rel/x.sqlite" in line, line
    result = here(capsys, "import", SHIPPED, "--db", url)
    assert result.returncode == 0 and (tmp_path / "tmp" / "rel" / "x.sqlite").exists()
    assert f"creating the SQLite database {tmp_path}/tmp/rel/x.sqlite" in result.stderr, result.stderr
    assert "four slashes: sqlite:////tmp/rel/x.sqlite" in result.stderr
    again = here(capsys, "import", SHIPPED, "--db", url)  # it exists now: nothing to announce
    assert again.returncode == 0 and "creating" not in again.stderr


def test_query_status_must_be_a_status(tmp_path, env, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cli("import", SHIPPED, "--db", url, env=env)
    line = one_line_error(here(capsys, "query", "trials", "--status", "okk", "--db", url))
    assert "--status 'okk' is not a measurement status; one of ok, invalid_config" in line, line


def test_a_preset_of_another_space_is_pointed_to(tmp_path, env, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cli("import", SHIPPED, "--db", url, env=env)
    line = one_line_error(here(capsys, "query", "coverage", "--preset", "serving", "--db", url))
    assert "no preset 'serving' in --space fwd" in line and "preset 'serving' belongs to --space decode" in line, line
    line = one_line_error(here(capsys, "tune", "--preset", "serving", "--db", url))
    assert "belongs to --space decode" in line, line
    served = here(capsys, "query", "coverage", "--preset", "serving", "--space", "decode", "--db", url)
    assert served.returncode == 0 and "Traceback" not in served.stderr


def test_an_output_directory_that_cannot_be_made_is_one_line(tmp_path, env, capsys):
    """/proc takes no new directories (whoever runs this, root included): the OS's reason,
    naming the path, in one line."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cli("import", SHIPPED, "--db", url, env=env)
    for args in (["export", "--db", url], ["render", "--config", "{}"]):
        line = one_line_error(here(capsys, *args, "--out", "/proc/fa_autotune_no_such_dir"))
        assert "/proc/fa_autotune_no_such_dir: " in line, line

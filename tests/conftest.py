"""Shared fixtures. Without a GPU the kernels run in Triton's interpreter, which must be
chosen before Triton is imported, hence the environment variable set here."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite never sees the user's own tuning state: the README has a newcomer run the tuner
# first, which fills ~/.cache/fa_autotune/tuning.sqlite, and the dispatcher would then answer
# from it. The default database (and kernel cache, unless FA_AUTOTUNE_CACHE names one) live
# in a fresh directory per session; tests that want a database or config files set their own.
_STATE = tempfile.mkdtemp(prefix="fa_autotune_tests_")
atexit.register(shutil.rmtree, _STATE, True)
os.environ["XDG_CACHE_HOME"] = _STATE
for _name in ("FA_AUTOTUNE_DB", "FA_AUTOTUNE_CONFIG_DIR", "FA_AUTOTUNE_DISABLE_TUNED"):
    os.environ.pop(_name, None)

# The modules whose tests run whole tunes or compile many kernels (20-60 s each on 2 cores),
# run first: with pytest-xdist each worker takes the next test when it is free, so the
# long ones spread over the workers and the short ones fill the gaps at the end.
_LONG_FIRST = ("tests/test_cli.py", "tests/test_examples.py", "tests/tune/test_search.py", "tests/kernels/test_aot.py",
               "tests/runtime/test_training.py", "tests/runtime/test_dispatch.py", "tests/test_cli_faults.py",
               "tests/test_docs.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return _LONG_FIRST.index(path) if path in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: the order within a module stays


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_GPU else "cpu"


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A fresh, empty kernel cache directory for this test."""
    path = tmp_path / "kernels"
    monkeypatch.setenv("FA_AUTOTUNE_CACHE", str(path))
    return path


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ------------------------------------------------------------------ PostgreSQL
# The database tests run against SQLite and, where a server is given, PostgreSQL. .ci/run
# starts a throwaway server (.ci/postgres.sh) and sets FA_AUTOTUNE_TEST_PG_URL; without it the
# PostgreSQL cases skip, naming why; FA_AUTOTUNE_REQUIRE_PG=1 (set by CI) turns that skip into
# a failure, so CI never passes without them.
PG_URL_VAR = "FA_AUTOTUNE_TEST_PG_URL"


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    url = os.environ.get(PG_URL_VAR)
    if not url:
        if os.environ.get("FA_AUTOTUNE_REQUIRE_PG") == "1":
            pytest.fail(f"{PG_URL_VAR} is not set but FA_AUTOTUNE_REQUIRE_PG=1: the PostgreSQL server did not start")
        pytest.skip(f"no PostgreSQL server: start one with `eval \"$(.ci/postgres.sh start)\"` (sets {PG_URL_VAR})")
    return url


@pytest.fixture
def pg_url(pg_server_url):
    """A fresh, empty PostgreSQL database for this test, dropped afterwards."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"fa_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(pg_server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request, tmp_path) -> str:
    """A fresh results database URL of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'tune.sqlite'}"
    return request.getfixturevalue("pg_url")

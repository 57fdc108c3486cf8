"""fa_autotune.paths: where per-user state goes, and every environment variable that moves it."""
from __future__ import annotations

import sys

import platformdirs
import pytest

from fa_autotune import paths

OVERRIDES = ("FA_AUTOTUNE_CACHE", "FA_AUTOTUNE_DB", "XDG_CACHE_HOME")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No override set, and a home of the test's own (tests/conftest.py sets XDG_CACHE_HOME)."""
    for name in OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_default_is_the_platforms_user_cache_dir(clean_env):
    expected = platformdirs.user_cache_path("fa_autotune", appauthor=False)
    assert paths.cache_root() == expected
    if sys.platform.startswith("linux"):  # the location before platformdirs, unchanged
        assert paths.cache_root() == clean_env / ".cache" / "fa_autotune"
    assert paths.kernel_cache_dir() == expected / "kernels"
    assert paths.default_db_url() == f"sqlite:///{expected / 'tuning.sqlite'}"


def test_xdg_cache_home_moves_the_cache_on_every_platform(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_root() == tmp_path / "xdg" / "fa_autotune"
    assert paths.kernel_cache_dir() == tmp_path / "xdg" / "fa_autotune" / "kernels"
    assert paths.default_db_url() == f"sqlite:///{tmp_path / 'xdg' / 'fa_autotune' / 'tuning.sqlite'}"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # set but empty: as if unset
    assert paths.cache_root() == platformdirs.user_cache_path("fa_autotune", appauthor=False)


def test_fa_autotune_variables_override_the_cache_dir(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FA_AUTOTUNE_CACHE", "~/kernels-here")
    monkeypatch.setenv("FA_AUTOTUNE_DB", "postgresql://host/db")
    assert paths.kernel_cache_dir() == clean_env / "kernels-here"  # ~ expanded
    assert paths.default_db_url() == "postgresql://host/db"
    assert paths.cache_root() == tmp_path / "xdg" / "fa_autotune"  # the rest stays put



def test_an_earlier_versions_cache_keeps_serving_where_the_platform_puts_it_elsewhere(clean_env, monkeypatch,
                                                                                        tmp_path):
    """On macOS and Windows platformdirs' folder is not ~/.cache/fa_autotune: while that folder
    does not exist yet, the ~/.cache/fa_autotune an earlier version wrote (its database of
    tuned results) keeps being used; once it exists, or with no legacy folder, the platform's."""
    platform = tmp_path / "Library" / "Caches" / "fa_autotune"
    monkeypatch.setattr(paths.platformdirs, "user_cache_path", lambda app, appauthor=False: platform)
    legacy = clean_env / ".cache" / "fa_autotune"
    assert paths.cache_root() == platform  # nothing written before
    legacy.mkdir(parents=True)
    assert paths.cache_root() == legacy
    platform.mkdir(parents=True)
    assert paths.cache_root() == platform

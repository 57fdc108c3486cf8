"""Shared fixtures. Without a GPU the kernels run in Triton's interpreter, which must be
chosen before Triton is imported, hence the environment variable set here."""
from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


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

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from fa_autotune.benchmark import Bench, Cell, Row, geomeans, markdown
from fa_autotune.errors import FaAutotuneError


def row(problem, dtype, **ms):
    return Row(problem, dtype, {p: Cell(p, "ok", v, 1.0 / v, 1e-3, p) for p, v in ms.items()})


def test_geomeans_and_ratios_against_cudnn():
    rows = [row("a", "float16", cudnn=1.0, tuned=0.5), row("b", "float16", cudnn=1.0, tuned=2.0)]
    g = geomeans(rows, ("tuned", "cudnn"))["float16"]
    assert math.isclose(g["tuned_vs_cudnn"], 1.0) and math.isclose(g["tuned_min_vs_cudnn"], 0.5)
    assert math.isclose(g["cudnn_tflops"], 1.0)
    rows[1].cells["tuned"] = Cell("tuned", "wrong_result", rel_error=0.5)
    assert geomeans(rows, ("tuned", "cudnn"))["float16"]["tuned_vs_cudnn"] is None  # incomplete: no geomean


def test_markdown_marks_failed_providers():
    rows = [row("p", "bfloat16", cudnn=2.0, tuned=1.0)]
    rows[0].cells["flex"] = Cell("flex", "unavailable", detail="no compiler")
    summary = {"environment": {"gpu": "G", "date": "d", "torch": "t", "triton": "x", "cuda": "c", "cudnn": 1,
                               "fa_autotune": "f", "template_hash": "h"}, "preset": "quick",
               "bf16_matmul_tflops": 1.0, "geomeans": geomeans(rows, ("tuned", "cudnn")),
               "rows": [{"problem": "p", "dtype": "bfloat16", "cells": {k: c.__dict__ for k, c in rows[0].cells.items()}}]}
    text = markdown(summary, ("tuned", "cudnn", "flex"))
    assert "| p | 1 (2.00x) | 0 (1.00x) | unavailable |" in text


def test_unknown_provider_is_an_error():
    with pytest.raises(FaAutotuneError, match="unknown provider"):
        Bench(("tuned", "fastest"), None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_bench_refuses_without_a_gpu():
    result = subprocess.run([sys.executable, "-m", "fa_autotune", "bench", "--preset", "quick"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr

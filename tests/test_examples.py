"""examples/ run as a user runs them: `python examples/NAME.py` in a process of its own, from
another directory, in Triton's interpreter where there is no GPU. Each must exit 0 and print its
result line; the scripts check their own numbers against PyTorch and exit non-zero when off."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NUMBER = r"[0-9.]+(?:e[-+][0-9]+)?"
WHERE = r"\((?:cpu, float16|cuda, bfloat16)"
EXPECTED = {  # script: the result line it prints when its check passes
    "dense.py": rf"dense: max abs error {NUMBER} vs SDPA {WHERE}\)",
    "varlen.py": rf"varlen: max abs error {NUMBER} vs SDPA per sequence, 4 sequences {WHERE}\)",
    "paged_kv_cache.py": rf"paged_kv_cache: max abs error {NUMBER} vs SDPA over the dense history, 3 decode steps, "
                         rf"page size 16 {WHERE}\)",
    "fp8.py": rf"fp8: relative error {NUMBER} vs attention\(\), recipe e4m3 per_block \+ Hadamard {WHERE} inputs\)",
    "fp8_kv_cache.py": rf"fp8_kv_cache: max abs error {NUMBER} vs SDPA over the dequantized cache, 3 decode steps "
                       rf"{WHERE} q\)",
    "training_step.py": rf"training_step: loss {NUMBER} -> {NUMBER} in 8 steps; gradients within {NUMBER} of "
                        rf"SDPA's \(relative\) {WHERE}\)",
    "transformers_model.py": rf"transformers_model: max abs logit difference {NUMBER} vs sdpa {WHERE}, "
                             r"transformers \S+\)",
    "tune_export_ship.py": r"tune_export_ship: explain\(\) reports source 'exported' for "
                           r"b1_hq2_hkv2_nq64_nk64_d32_float16_causal-top_left \((?:cpu|cuda)\)",
}
SLOW = {"tune_export_ship.py"}  # 20-35 s on 2 cores (a tune, an export and three more processes)


def run_example(name: str, tmp_path: Path, interpret: bool = True) -> subprocess.CompletedProcess:
    """`python examples/NAME`, from an empty directory, with this checkout's fa_autotune first
    on the path (an installed copy elsewhere must not answer) and TMPDIR a fresh directory."""
    if name == "transformers_model.py" and importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed (pip install -e '.[test]')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TMPDIR=str(tmp_path / "tmp"))
    env.pop("TRITON_INTERPRET", None)
    if interpret and not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    (tmp_path / "cwd").mkdir()
    (tmp_path / "tmp").mkdir()
    return subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=tmp_path / "cwd", env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [])
                                  for name in EXPECTED])
def test_example_runs_and_checks_out(name, tmp_path):
    result = run_example(name, tmp_path)
    output = f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, output
    assert any(re.fullmatch(EXPECTED[name], line) for line in result.stdout.splitlines()), output
    left = [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")]  # torch's cache
    assert not left, f"temporaries left behind: {left}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the examples run without the interpreter")
@pytest.mark.parametrize("name", list(EXPECTED))
def test_without_a_gpu_or_the_interpreter_the_example_says_so(name, tmp_path):
    result = run_example(name, tmp_path, interpret=False)
    assert result.returncode != 0
    assert "TRITON_INTERPRET=1 python" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr  # said up front, not deep inside a kernel launch


def test_every_example_is_tested_and_listed_in_its_readme():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))  # _device.py: shared
    assert scripts == sorted(EXPECTED)
    readme = (EXAMPLES / "README.md").read_text()
    for name in scripts:
        assert f"`{name}`" in readme, name

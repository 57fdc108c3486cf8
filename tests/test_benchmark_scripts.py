"""Benchmark scripts that a GPU session runs, exercised on tiny shapes in Triton's interpreter
so that their code paths (and the checks they make before timing) are known to work."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_small(script: str, out: Path, *extra: str) -> None:
    """``benchmarks/<script> --small`` with one round of 1 ms into ``out``, in the interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--small", "--rounds", "1",
                             "--rep-ms", "1", "--out", str(out), *extra], capture_output=True, text=True, env=env, timeout=300,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]


def test_fp8_cache_and_sinks_runs_small_in_the_interpreter(tmp_path):
    run_small("fp8_cache_and_sinks.py", tmp_path)
    data = json.loads((tmp_path / "fp8_cache_and_sinks.json").read_text())
    assert data["device"] == "cpu" and len(data["cache"]) == 4 and len(data["sinks"]) == 2
    for row in data["cache"]:  # both caches checked against float32 over what they hold
        assert row["rel_error"]["bf16"] < 1e-2 and row["rel_error"]["fp8"] < 1e-2
    for row in data["sinks"]:  # the sink tile is what keeps sinks accurate
        assert row["rel_error"]["plain"] > 0.1 and row["rel_error"]["sink_tile"] < 0.06
        # quantizing here: the default recipe is accurate on sinks and on outlier channels
        assert row["rel_error"]["quantize_here"] < 0.06 and row["rel_error"]["quantize_here_plain"] > 0.1
        assert row["rel_error_outliers"]["quantize_here"] < 0.06
    assert "| 4 x 64 | 16 |" in (tmp_path / "fp8_cache_and_sinks.md").read_text()


def test_bwd_sweep_runs_small_in_the_interpreter(tmp_path):
    run_small("bwd_sweep.py", tmp_path)
    (row,) = json.loads((tmp_path / "bwd_sweep.json").read_text())["rows"]
    assert row["skipped"] == {} and 0 < row["rel_error"]["triton 16x16"] < 1e-2  # checked, then timed
    assert "| b1_hq4_hkv2_nq64_nk64_d32_float16_causal-top_left_bwd | " in (tmp_path / "bwd_sweep.md").read_text()


def test_training_step_runs_small_in_the_interpreter(tmp_path):
    """A tiny Llama-style attention layer: fa_autotune's step checked against the float32
    layer (output and every gradient within twice PyTorch's math attention's error), then
    timed; cuDNN and FA4 are reported unavailable on a CPU, not errors."""
    run_small("training_step.py", tmp_path)
    (row,) = json.loads((tmp_path / "training_step.json").read_text())["rows"]
    ours = row["cells"]["fa_autotune"]
    assert ours["status"] == "ok" and ours["tokens_per_s"] > 0
    assert all(0 < ours["rel_error"][n] <= row["bound"][n] for n in ("output", "d_input", "d_wq", "d_wk", "d_wv", "d_wo"))
    if not __import__("torch").cuda.is_available():
        assert row["cells"]["cudnn"]["status"] == row["cells"]["fa4"]["status"] == "unavailable"
    assert "| 2 x 48 | " in (tmp_path / "training_step.md").read_text()


def test_fp8_end_to_end_runs_small_in_the_interpreter(tmp_path):
    run_small("fp8_end_to_end.py", tmp_path, "--configs", "dispatched")
    record = json.loads((tmp_path / "fp8-end-to-end.json").read_text())
    assert record["command"][1].endswith("fp8_end_to_end.py") and record["triton"]
    (row,) = record["rows"]
    assert row["device"] == "cpu" and row["quantize"]["v_order"] in ("wgmma", "natural")
    assert set(row["ms"]) == {"prequantized", "quantize_included", "quantize_only", "attention_16bit"}
    assert all(0 < e < 0.1 for e in row["rel_error"].values())  # checked against float32 before timing


def test_split_key_steps_compile_for_hopper():
    """benchmarks/split_key_steps.py's prototype (K/V steps of 64 + 32 keys at D=192, beside
    one 64-key part) compiles for sm_90 without a GPU (`--aot`, out of the interpreter): every
    variant fits Hopper's shared memory with nothing spilled, and a
    two-part step issues its second part's products beside the first's; shapes the prototype
    cannot run are refused."""
    import importlib.util

    import pytest

    from fa_autotune.kernels.aot import SHARED_MEMORY_LIMIT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "split_key_steps.py"), "--aot", "--head-dim", "192"],
                            capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {(r["head_dim"], r["variant"]): r for r in map(json.loads, result.stdout.splitlines())}
    assert len(rows) == 4
    for row in rows.values():
        assert row["stack_bytes"] == 0 and row["shared_bytes"] <= SHARED_MEMORY_LIMIT[(9, 0)], row
        assert "setmaxnreg.inc.sync.aligned.u32 \t240;" in row["setmaxnreg"]
    assert rows[(192, "64+32 keys")]["wgmma"] > rows[(192, "64 keys")]["wgmma"] > 0
    # a step waits for its scores with its PV products still running: 2 groups (one per O
    # chunk) behind one key part's scores, 4 behind two parts'; 0 at the prologue and the tail
    assert rows[(192, "64 keys")]["wait_groups"] == [0, 2] and rows[(192, "64+32 keys")]["wait_groups"] == [0, 4]
    spec = importlib.util.spec_from_file_location("split_key_steps", ROOT / "benchmarks" / "split_key_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(ValueError, match="head dims 192 and 256"):
        module.check_shape(128, 4096)
    with pytest.raises(ValueError, match="multiple of 128"):
        module.check_shape(192, 4000)

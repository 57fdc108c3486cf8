"""A GPU without tuned files of its own borrows the shipped ones of its nearest relative
(same compute capability, closest SM count and memory), until its own results exist."""
from __future__ import annotations

import json
import warnings

import pytest

from fa_autotune.runtime import api, dispatch, files
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.target import GpuInfo, SoftwareInfo

SW = SoftwareInfo("3.6.0", "2.13.0", "12.8", "0.2.0", "x")
H200 = GpuInfo("NVIDIA H200", "9.0", 132, 143155, "580")
H20 = GpuInfo("NVIDIA H20", "9.0", 78, 97871, "580")
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", "8.0", 108, 81920, "580")  # closest in size, another capability
H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 132, 81559, "580")  # the GPU the tests run "on"
P128 = Problem(1, 16, 16, 1024, 1024, 128, "bfloat16", causal=True)
P64 = Problem(1, 16, 16, 1024, 1024, 64, "bfloat16", causal=True)
CFG = {H200.name: KernelConfig(BLOCK_M=128, BLOCK_N=64, num_stages=3), H20.name: KernelConfig(BLOCK_M=64, BLOCK_N=64),
       A100.name: KernelConfig(BLOCK_M=64, BLOCK_N=32), H100.name: KernelConfig(BLOCK_M=128, BLOCK_N=128)}


def write(directory, gpu: GpuInfo, problems, family: str = "attn_fwd"):
    payload = {"schema": files.SCHEMA, "schema_version": 1, "family": family, "gpu": gpu.to_dict(),
               "entries": {p.key: {"problem": p.to_dict(), "config": CFG[gpu.name].to_dict(), "median_ms": 1.0,
                                   "tflops": 1.0, "rel_error": 1e-3, "software": SW.to_dict()} for p in problems}}
    path = directory / files.file_name(gpu, family)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return path


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A shipped dir with H200, H20 and A100 files; this process "runs on" an H100."""
    monkeypatch.setenv("FA_AUTOTUNE_DB", f"sqlite:///{tmp_path / 'absent.sqlite'}")
    monkeypatch.delenv("FA_AUTOTUNE_CONFIG_DIR", raising=False)
    monkeypatch.delenv("FA_AUTOTUNE_DISABLE_TUNED", raising=False)
    directory = tmp_path / "shipped"
    directory.mkdir()
    for gpu in (H200, H20, A100):
        write(directory, gpu, [P128, P64])
    monkeypatch.setattr(dispatch, "_shipped_dir", lambda: directory)
    monkeypatch.setattr(dispatch, "detect_gpu", lambda index: H100)
    dispatch.DISPATCHER.reset()
    yield directory
    dispatch.DISPATCHER.reset()


def test_nearest_gpu_of_the_same_capability_serves_and_says_so(shipped):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = dispatch.DISPATCHER.choose(P128, "cuda", 0)
        dispatch.DISPATCHER.choose(P64, "cuda", 0)
    # H200 (same SMs, memory 1.8x) beats H20 (0.6x the SMs); the A100 is sm_80: never borrowed
    assert choice.source == "shipped (nearest GPU: NVIDIA H200)"
    assert choice.config == CFG[H200.name] and choice.distance == 0.0
    assert choice.origin.endswith("nvidia-h200.attn_fwd.json")
    assert api._choice_info(P128, choice)["source"] == "shipped (nearest GPU: NVIDIA H200)"  # what explain() shows
    notes = [str(w.message) for w in caught]
    assert len([n for n in notes if "using those shipped for NVIDIA H200" in n]) == 1, notes
    assert not any("using built-in defaults" in n for n in notes)


def test_gpu_distance_prefers_sm_count_then_memory():
    assert dispatch.gpu_distance(H100, H200) < dispatch.gpu_distance(H100, H20)
    assert dispatch.gpu_distance(H100, H100) == 0.0
    h200_nvl = GpuInfo("NVIDIA H200 NVL", "9.0", 132, 143771, "580")
    assert dispatch.gpu_distance(H200, h200_nvl) < dispatch.gpu_distance(H200, H100)


def test_own_results_replace_the_borrowed_ones_problem_by_problem(shipped, tmp_path, monkeypatch):
    """What `fa-autotune tune` + export on the H100 gives (own files, own database): those
    problems come from there; a problem nothing of its own can lend to stays borrowed."""
    own = tmp_path / "own"
    own.mkdir()
    write(own, H100, [P128])
    monkeypatch.setenv("FA_AUTOTUNE_CONFIG_DIR", str(own))
    dispatch.DISPATCHER.reset()
    mine = dispatch.DISPATCHER.choose(P128, "cuda", 0)
    other = dispatch.DISPATCHER.choose(P64, "cuda", 0)  # head dim 64: D=128 entries cannot lend to it
    assert (mine.source, mine.config) == ("exported", CFG[H100.name])
    assert (other.source, other.config) == ("shipped (nearest GPU: NVIDIA H200)", CFG[H200.name])


def test_own_shipped_file_wins_and_families_borrow_separately(shipped):
    """A family the GPU ships a file of is read from it; another family still borrows."""
    write(shipped, H100, [P128])
    write(shipped, H200, [P128.with_kind("decode")], family="attn_decode")
    dispatch.DISPATCHER.reset()
    assert dispatch.DISPATCHER.choose(P128, "cuda", 0).source == "shipped"
    assert dispatch.DISPATCHER.choose(P128.with_kind("decode"), "cuda", 0).source == \
        "shipped (nearest GPU: NVIDIA H200)"


def test_no_relative_of_the_capability_means_defaults(shipped, monkeypatch):
    blackwell = GpuInfo("NVIDIA B200", "10.0", 148, 183359, "580")
    monkeypatch.setattr(dispatch, "detect_gpu", lambda index: blackwell)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choice = dispatch.DISPATCHER.choose(P128, "cuda", 0)
    assert choice.source == "default"
    assert any("no tuned configs for NVIDIA B200" in str(w.message) for w in caught)


def test_the_interpreter_never_borrows(shipped):
    assert dispatch.DISPATCHER.choose(P128.with_dtype("float16"), "cpu", 0).source == "default"


def test_a_borrowed_entry_is_recorded_as_not_tuned_here(shipped):
    """Recording on a GPU that borrows the nearest GPU's file marks even an exact-shape entry
    as borrowed ("nearest", untuned), so `tune --recorded` tunes it first."""
    dispatch.DISPATCHER.choose(P128, "cuda", 0)
    served, source, matched = dispatch._served(P128)
    assert (served, source, matched) == ("nearest", "shipped (nearest GPU: NVIDIA H200)", P128.key)

"""The dispatcher's lookup chain, exported files, and torch.compile, on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import fa_autotune
from fa_autotune.runtime import api, dispatch, files
from fa_autotune.spec.candidate import Candidate
from fa_autotune.spec.config import KernelConfig
from fa_autotune.errors import ConfigError, ConfigFileError, InputError
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.recipe import Fp8Recipe
from fa_autotune.spec.target import GpuInfo, SoftwareInfo, interpreter_gpu
from fa_autotune.spec.tuned import FrontPoint, Winner
from helpers import assert_close_to_reference, make_qkv

SW = SoftwareInfo("3.6.0", "2.13.0", "none", "0.1.0", "x")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No database, no config dirs, an empty shipped dir, fresh caches."""
    monkeypatch.setenv("FA_AUTOTUNE_DB", f"sqlite:///{tmp_path / 'absent.sqlite'}")
    monkeypatch.delenv("FA_AUTOTUNE_CONFIG_DIR", raising=False)
    monkeypatch.delenv("FA_AUTOTUNE_DISABLE_TUNED", raising=False)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(dispatch, "_shipped_dir", lambda: shipped)
    dispatch.DISPATCHER.reset()
    api._PLANS.clear()
    yield shipped
    dispatch.DISPATCHER.reset()
    api._PLANS.clear()


def write_file(directory, entries, gpu=None):
    """A config file for the interpreter 'GPU' with (problem, config) entries."""
    gpu = gpu or interpreter_gpu()
    payload = {"schema": files.SCHEMA, "schema_version": 1, "family": "attn_fwd", "gpu": gpu.to_dict(),
               "entries": {p.key: {"problem": p.to_dict(), "config": c.to_dict(), "median_ms": 1.0, "tflops": 1.0,
                                   "rel_error": 1e-4, "software": SW.to_dict()} for p, c in entries}}
    path = directory / files.file_name(gpu)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return path


CFG_A = KernelConfig(BLOCK_M=16, BLOCK_N=32, num_stages=2)
CFG_B = KernelConfig(loop_order="kv_outer", BLOCK_M=16, BLOCK_N=16, q_tiles=2)


def test_default_when_nothing_is_tuned():
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    info = fa_autotune.explain(q, k, v)
    assert info["source"] == "default" and info["matched_problem"] is None


def test_exported_dir_then_shipped_then_default(tmp_path, monkeypatch, isolated):
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    problem = Problem(1, 2, 2, 24, 24, 16, "float16")
    write_file(isolated, [(problem, CFG_B)])
    assert fa_autotune.explain(q, k, v)["source"] == "shipped"
    user = tmp_path / "user"
    user.mkdir()
    write_file(user, [(problem, CFG_A)])
    monkeypatch.setenv("FA_AUTOTUNE_CONFIG_DIR", str(user))
    dispatch.DISPATCHER.reset()
    info = fa_autotune.explain(q, k, v)
    assert info["source"] == "exported" and info["config"] == CFG_A.to_dict() and info["distance"] == 0
    out = fa_autotune.attention(q, k, v)
    assert_close_to_reference(out, q, k, v)
    monkeypatch.setenv("FA_AUTOTUNE_DISABLE_TUNED", "1")
    dispatch.DISPATCHER.reset()
    assert fa_autotune.explain(q, k, v)["source"] == "default"


def test_nearest_tuned_problem(isolated):
    short, long = Problem(1, 2, 2, 64, 64, 16, "float16"), Problem(1, 2, 2, 1024, 1024, 16, "float16")
    write_file(isolated, [(short, CFG_A), (long, CFG_B)])
    q, k, v = make_qkv(1, 2, 2, 100, 100, 16)
    info = fa_autotune.explain(q, k, v)
    assert info["matched_problem"] == short.key and 0 < info["distance"] < 2
    q, k, v = make_qkv(1, 2, 2, 700, 700, 16)
    assert fa_autotune.explain(q, k, v)["matched_problem"] == long.key
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32)  # another head dim is never borrowed
    assert fa_autotune.explain(q, k, v)["source"] == "default"
    q, k, v = make_qkv(1, 2, 2, 64, 64, 16)
    assert fa_autotune.explain(q, k, v, causal=True)["source"] == "default"  # nor is the other masking


def test_gqa_problems_borrow_across_groups_after_their_own(isolated):
    """A forward GQA problem with no entry of its own group borrows the nearest entry of
    another group (the kernels read K/V head h // group whatever it is); at the same lengths
    one of its own group wins, also at another batch size; it runs correctly on the borrowed
    config. Backward and KV-cache problems borrow only within their group."""
    from fa_autotune.spec.problem import distance

    mha, gqa = Problem(1, 4, 4, 64, 64, 16, "float16"), Problem(2, 4, 2, 64, 64, 16, "float16")
    write_file(isolated, [(mha, CFG_A)])
    q, k, v = make_qkv(1, 4, 1, 64, 64, 16)  # group 4: only the MHA entry to borrow from
    info = fa_autotune.explain(q, k, v)
    assert info["matched_problem"] == mha.key and 1 <= info["distance"] < 2
    assert_close_to_reference(fa_autotune.attention(q, k, v), q, k, v)
    write_file(isolated, [(mha, CFG_A), (gqa, CFG_B)])
    dispatch.DISPATCHER.reset()
    q, k, v = make_qkv(1, 4, 2, 64, 64, 16)  # group 2: its own group's entry, at twice the batch, wins
    assert fa_autotune.explain(q, k, v)["matched_problem"] == gqa.key
    for kind in ("bwd", "decode"):
        a, b = Problem(1, 4, 1, 1, 64, 16, "float16", kind=kind), Problem(1, 4, 4, 1, 64, 16, "float16", kind=kind)
        assert distance(a, b) == float("inf")
    assert distance(Problem(1, 4, 1, 64, 64, 16, "float16"), mha) == 0.5 * 2 + 0.25


@pytest.mark.parametrize("mangle, message", [
    (lambda t: t[: len(t) // 2], "not valid JSON"),
    (lambda t: "{not json", "not valid JSON"),
    (lambda t: t.replace("fa_autotune.tuned_configs", "somebody.else"), "not an fa_autotune config file"),
    (lambda t: t.replace('"schema_version": 1', '"schema_version": 7'), "newer than this fa_autotune"),
    (lambda t: t.replace('"BLOCK_M": 16', '"BLOCK_M": 17'), "BLOCK_M"),
    (lambda t: t.replace('"median_ms": 1.0', '"median_ms": -1'), "median_ms must be a positive number"),
    (lambda t: t.replace('"family": "attn_fwd"', '"family": "attn_sparse"'), "kernel family"),
    (lambda t: t.replace('"family": "attn_fwd"', '"family": "attn_bwd"'), "attn_fwd problem in a attn_bwd file"),
    # reliability review (issue 14): every bad value a refusal, never a traceback
    (lambda t: t.encode().replace(b'"float16"', b'"float16\xff"'), "not UTF-8"),
    (lambda t: "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (lambda t: t.replace('"median_ms": 1.0', '"median_ms": 1.0, "median_ms": 0.001'), "duplicate key"),
    (lambda t: t.replace('"rel_error": 0.0001', '"rel_error": -1'), "rel_error must be a non-negative"),
    (lambda t: t.replace('"batch": 1,', '"batch": 1000000000000000000000000000000,'), "batch must be an integer"),
    (lambda t: t.replace('"batch": 1,', '"batch": 1e30,'), "batch must be an integer"),
    (lambda t: json.dumps(dict(json.loads(t), gpu=dict(json.loads(t)["gpu"], sm_count=-5))), "sm_count"),
    (lambda t: json.dumps(dict(json.loads(t), gpu=dict(json.loads(t)["gpu"], capability="abc"))), "gpu.capability"),
    (lambda t: json.dumps(dict(json.loads(t), gpu=dict(json.loads(t)["gpu"], name="x" * 400))), "gpu.name"),
    (lambda t: t.replace('"batch": 1,', '"batch": 1' + "0" * 5000 + ","), "not a config file"),
    (lambda t: t.replace('"causal": false', '"causal": "false"'), "causal must be true or false"),
])
def test_bad_files_are_refused_and_change_nothing(tmp_path, isolated, mangle, message):
    problem = Problem(1, 2, 2, 24, 24, 16, "float16")
    path = write_file(tmp_path, [(problem, CFG_A)])
    mangled = mangle(path.read_text())
    path.write_bytes(mangled if isinstance(mangled, bytes) else mangled.encode())
    with pytest.raises(ConfigFileError, match=message):
        files.load(path)
    db = tmp_path / "db.sqlite"
    result = subprocess.run([sys.executable, "-m", "fa_autotune", "import", str(path), "--db", f"sqlite:///{db}"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message.split()[0] in result.stderr and "Traceback" not in result.stderr
    from fa_autotune.store import connect
    from fa_autotune.store.queries import best
    assert best(connect(f"sqlite:///{db}")) == []
    # The dispatcher skips it with one warning instead of failing attention().
    (isolated / path.name).write_bytes(path.read_bytes())
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    with pytest.warns(RuntimeWarning, match="ignoring"):
        assert fa_autotune.explain(q, k, v)["source"] == "default"
    assert_close_to_reference(fa_autotune.attention(q, k, v), q, k, v)


@pytest.mark.parametrize("problem, pareto, message", [
    (Problem(1, 2, 2, 0, 24, 16, "float16"), False, "empty problem"),
    (Problem(1, 2, 2, 24, 24, 16, "float16"), True, "Pareto front belongs to FP8 problems"),
])
def test_entries_that_mean_nothing_are_refused(tmp_path, problem, pareto, message):
    path = write_file(tmp_path, [(problem, CFG_A)])
    if pareto:
        data = json.loads(path.read_text())
        entry = data["entries"][problem.key]
        entry["pareto"] = [{"config": CFG_A.to_dict(), "median_ms": 1.0, "tflops": 1.0, "rel_error": 0.01}]
        path.write_text(json.dumps(data))
    with pytest.raises(ConfigFileError, match=message):
        files.load(path)


def test_foreign_gpu_file_is_ignored(isolated):
    other = GpuInfo("Triton interpreter (x86_64)" if "arm" in interpreter_gpu().name else interpreter_gpu().name,
                    "8.0", 1, 1, "x")
    write_file(isolated, [(Problem(1, 2, 2, 24, 24, 16, "float16"), CFG_A)], gpu=other)
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    with pytest.warns(RuntimeWarning, match="tuned on"):
        assert fa_autotune.explain(q, k, v)["source"] == "default"


def test_unknown_gpu_warns_once(monkeypatch):
    monkeypatch.setattr(dispatch, "detect_gpu", lambda index: GpuInfo("NVIDIA Imaginary", "9.0", 100, 1, "1"))
    problem = Problem(1, 2, 2, 24, 24, 16, "float16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = dispatch.DISPATCHER.choose(problem, "cuda", 0)
        dispatch.DISPATCHER.choose(Problem(1, 2, 2, 48, 48, 16, "float16"), "cuda", 0)
    from fa_autotune.spec.defaults import default_config
    assert first.source == "default" and first.config == default_config(problem, (9, 0), 100)  # Hopper defaults
    assert len([w for w in caught if "no tuned configs for NVIDIA Imaginary" in str(w.message)]) == 1


def test_hot_path_does_no_io_and_resolves_once(isolated, monkeypatch):
    problem = Problem(1, 2, 2, 24, 24, 16, "float16")
    write_file(isolated, [(problem, CFG_A)])
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    first = fa_autotune.attention(q, k, v)
    calls = []
    monkeypatch.setattr(dispatch.Dispatcher, "_resolve", lambda *a: calls.append(a))
    monkeypatch.setattr(files, "load", lambda *a: pytest.fail("file I/O on the hot path"))
    monkeypatch.setattr(api, "_make_plan", lambda *a: pytest.fail("re-planned on the hot path"))
    second = fa_autotune.attention(q, k, v)
    torch.testing.assert_close(first, second)
    assert calls == []


def test_concurrent_first_calls_resolve_once(isolated, monkeypatch):
    write_file(isolated, [(Problem(1, 2, 2, 24, 24, 16, "float16"), CFG_A)])
    original = dispatch.Dispatcher._resolve
    count = []

    def counting(self, *args):
        count.append(1)
        return original(self, *args)

    monkeypatch.setattr(dispatch.Dispatcher, "_resolve", counting)
    problem = Problem(1, 2, 2, 24, 24, 16, "float16")
    results = []
    threads = [threading.Thread(target=lambda: results.append(dispatch.DISPATCHER.choose(problem, "cpu", 0)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(count) == 1 and len({r.config for r in results}) == 1


def test_tune_export_import_explain_end_to_end(tmp_path, monkeypatch, kernel_cache):
    env = dict(os.environ, FA_AUTOTUNE_CACHE=str(kernel_cache))
    env.pop("TRITON_INTERPRET", None)
    tuned = f"sqlite:///{tmp_path / 'tuned.sqlite'}"
    base = [sys.executable, "-m", "fa_autotune"]
    subprocess.run(base + ["tune", "--batch", "1", "--heads", "2", "--seqlen", "24", "--head-dim", "16",
                           "--trials", "3", "--jobs", "1", "--seed", "1", "--db", tuned, "--quiet"],
                   check=True, env=env, capture_output=True)
    out_dir = tmp_path / "exported"
    subprocess.run(base + ["export", "--db", tuned, "--out", str(out_dir)], check=True, env=env, capture_output=True)
    (path,) = out_dir.iterdir()
    first_bytes = path.read_bytes()
    subprocess.run(base + ["export", "--db", tuned, "--out", str(out_dir)], check=True, env=env, capture_output=True)
    assert path.read_bytes() == first_bytes  # deterministic
    fresh = tmp_path / "fresh.sqlite"
    subprocess.run(base + ["import", str(path), "--db", f"sqlite:///{fresh}"], check=True, env=env, capture_output=True)
    entry = next(iter(json.loads(first_bytes)["entries"].values()))

    monkeypatch.setenv("FA_AUTOTUNE_DB", f"sqlite:///{fresh}")
    dispatch.DISPATCHER.reset()
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    info = fa_autotune.explain(q, k, v)
    assert info["source"] == "database" and KernelConfig.from_mapping(info["config"]) == KernelConfig.from_mapping(entry["config"])
    assert_close_to_reference(fa_autotune.attention(q, k, v), q, k, v)

    # The same file through FA_AUTOTUNE_CONFIG_DIR with no database at all.
    monkeypatch.setenv("FA_AUTOTUNE_DB", f"sqlite:///{tmp_path / 'none.sqlite'}")
    monkeypatch.setenv("FA_AUTOTUNE_CONFIG_DIR", str(out_dir))
    dispatch.DISPATCHER.reset()
    api._PLANS.clear()
    info = fa_autotune.explain(q, k, v)
    assert info["source"] == "exported" and KernelConfig.from_mapping(info["config"]) == KernelConfig.from_mapping(entry["config"])
    assert_close_to_reference(fa_autotune.attention(q, k, v), q, k, v)
    assert not (tmp_path / "none.sqlite").exists()  # looking never creates a database


def test_torch_compile_fullgraph():
    class Block(torch.nn.Module):
        def forward(self, x, k, v):
            return fa_autotune.attention(x * 2.0, k, v, causal=True).sum(-1) + 1

    q, k, v = make_qkv(1, 2, 2, 20, 20, 16)
    torch._dynamo.reset()
    compiled = torch.compile(Block(), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), Block()(q, k, v))
    out, lse = torch.compile(lambda a, b, c: fa_autotune.attention(a, b, c, return_lse=True), fullgraph=True,
                             backend="aot_eager")(q, k, v)
    assert lse.shape == (1, 2, 20) and torch.isfinite(lse).all()


def test_results_api_returns_dataclasses(tmp_path):
    from fa_autotune import results
    from fa_autotune.store import connect
    from fa_autotune.store.records import identities, record
    from fa_autotune.store.tuned import save_winner

    db = connect(f"sqlite:///{tmp_path / 'r.sqlite'}")
    gpu = GpuInfo("NVIDIA H200", "9.0", 132, 1, "1")
    problem = Problem(1, 2, 2, 64, 64, 64, "float16")
    ids = identities(db, problem, gpu, SW)
    record(db, ids, CFG_A, "ok", median_ms=1.0, tflops=2.0, study_name="s")
    record(db, ids, CFG_B, "compile_error", message="boom", study_name="s")
    save_winner(db, ids, Winner(problem, CFG_A, 1.0, 2.0, 1e-3, gpu, SW, study_name="s"))
    assert results.best(db)[0].config == CFG_A
    assert [f.status for f in results.failures(db)] == ["compile_error"]
    cover = results.coverage("smoke", db)
    assert {c.problem for c in cover} == {"b1_hq2_hkv2_nq64_nk64_d32_float16_full",
                                          "b1_hq2_hkv2_nq64_nk64_d32_float16_causal-top_left"}
    assert all(c.distance is None for c in cover)  # head dim 32 vs tuned 64: no neighbour
    assert results.compare(("gpu", "H200"), ("gpu", "H200"), db)[0].speedup_b_over_a == 1.0
    progress = results.search_progress(db)
    assert [p.best_so_far_ms for p in progress] == [1.0, 1.0]
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pandas"):
            results.to_dataframe(results.best(db))
    else:
        assert list(results.to_dataframe(results.best(db))["median_ms"]) == [1.0]


@pytest.mark.parametrize("persistent", [0, 1])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_borrowed_config_that_cannot_run_degrades(isolated, persistent, layout):
    """A warp-specialized winner of N=64 borrowed for a ragged, causal N=63 problem: it runs
    unspecialized, and without the persistent grid that was chosen for the producer warps;
    on tensors TMA cannot read (head dim not contiguous) over block pointers as well."""
    ws = KernelConfig(access="tensor_desc", warp_specialize=True, num_stages=2, BLOCK_M=16, BLOCK_N=16,
                      persistent=persistent)
    write_file(isolated, [(Problem(1, 2, 2, 64, 64, 16, "float16", causal=True), ws)])
    q, k, v = make_qkv(1, 2, 2, 63, 63, 16)
    if layout == "strided":
        q, k, v = (t.transpose(2, 3).contiguous().transpose(2, 3) for t in (q, k, v))
    info = fa_autotune.explain(q, k, v, causal=True)
    assert info["source"] == "shipped"
    access = "tensor_desc" if layout == "contiguous" else "block_ptr"
    assert info["config"] == ws.with_(warp_specialize=False, persistent=0, access=access).to_dict()
    assert_close_to_reference(fa_autotune.attention(q, k, v, causal=True), q, k, v, causal=True)


def test_fp8_dispatch_reads_only_the_newest_front(tmp_path, monkeypatch):
    """A re-tune on a newer software stack replaces the front the dispatcher uses; points
    of the older front (here a faster, less accurate one) no longer count."""
    from fa_autotune.store import connect
    from fa_autotune.store.records import identities
    from fa_autotune.store.tuned import save_front

    url = f"sqlite:///{tmp_path / 'fronts.sqlite'}"
    monkeypatch.setenv("FA_AUTOTUNE_DB", url)
    db = connect(url)
    problem = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn")
    kernel = KernelConfig(BLOCK_M=32, BLOCK_N=32)
    old_fast, new = Candidate(kernel, Fp8Recipe("per_tensor", False)), Candidate(kernel, Fp8Recipe())
    for sw, front in ((SoftwareInfo("3.6.0", "2.13", "", "0.1.0", "old"), [(old_fast, 1.0, 9.0, 0.08)]),
                      (SoftwareInfo("3.6.0", "2.13", "", "0.1.0", "new"), [(new, 1.5, 6.0, 0.04)])):
        points = [FrontPoint(problem, c.config, ms, t, e, interpreter_gpu(), sw, recipe=c.recipe)
                  for c, ms, t, e in front]
        save_front(db, identities(db, problem, interpreter_gpu(), sw), points, None)
    db.dispose()
    dispatch.DISPATCHER.reset()
    assert dispatch.DISPATCHER.choose_fp8(problem, "cpu", 0, max_error=0.1).candidate == new
    # A recipe no front point has falls back to the general chain, with that recipe.
    choice = dispatch.DISPATCHER.choose_fp8(problem, "cpu", 0, scaling="per_head")
    assert choice.source != "pareto" and choice.recipe == Fp8Recipe("per_head", True)
    dispatch.DISPATCHER.reset()


def test_fp8_fronts_travel_in_exported_files(tmp_path, monkeypatch):
    """export writes an FP8 problem's front beside its winner, import restores it, and the
    dispatcher reads it from FA_AUTOTUNE_CONFIG_DIR with no database at all."""
    from fa_autotune.store import connect
    from fa_autotune.store.queries import pareto
    from fa_autotune.store.records import identities
    from fa_autotune.store.tuned import save_front, save_winner

    db = connect(f"sqlite:///{tmp_path / 'tuned.sqlite'}")
    problem = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn")
    kernel = KernelConfig(BLOCK_M=32, BLOCK_N=32)
    fast, accurate = Candidate(kernel, Fp8Recipe("per_tensor", False)), Candidate(kernel, Fp8Recipe())
    ids = identities(db, problem, interpreter_gpu(), SW)
    gpu = interpreter_gpu()
    save_front(db, ids, [FrontPoint(problem, kernel, 1.0, 9.0, 0.12, gpu, SW, recipe=fast.recipe),
                         FrontPoint(problem, kernel, 1.5, 6.0, 0.04, gpu, SW)], 0.3)
    save_winner(db, ids, Winner(problem, kernel, 1.5, 6.0, 0.04, gpu, SW, study_name="s"))
    out = tmp_path / "exported"
    (path,) = files.export(db, out)
    entry = json.loads(path.read_text())["entries"][problem.key]
    assert [p["rel_error"] for p in entry["pareto"]] == [0.12, 0.04]
    # the recipe among the config's parameters, as files wrote it before it was a record of its own
    assert [p["config"].get("fp8_scaling") for p in entry["pareto"]] == ["per_tensor", None]
    assert entry["pareto"][0]["config"]["fp8_hadamard"] is False and "fp8_scaling" not in entry["config"]

    fresh = connect(f"sqlite:///{tmp_path / 'fresh.sqlite'}")
    assert files.import_files(fresh, [path]) == 1
    assert [p.candidate for p in pareto(fresh)] == [fast, accurate]

    monkeypatch.setenv("FA_AUTOTUNE_CONFIG_DIR", str(out))
    dispatch.DISPATCHER.reset()
    choice = dispatch.DISPATCHER.choose_fp8(problem, "cpu", 0, max_error=0.2)
    assert (choice.candidate, choice.source, choice.origin) == (fast, "pareto", str(path))
    assert dispatch.DISPATCHER.choose_fp8(problem, "cpu", 0, max_error=0.05).candidate == accurate
    # No budget named: e4m3's tolerance (0.1) rules out the faster point's 0.12.
    assert dispatch.DISPATCHER.choose_fp8(problem, "cpu", 0).candidate == accurate


def test_winners_tuned_under_other_templates_keep_serving(tmp_path, monkeypatch):
    """The template hash identifies the code a measurement ran, not the problem: a database
    tuned before a template change still answers the dispatcher (and a re-tune measures
    again under the new hash)."""
    import triton

    from fa_autotune.paths import template_hash
    from fa_autotune.store import connect
    from fa_autotune.store.records import identities
    from fa_autotune.store.tuned import save_winner

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    monkeypatch.setenv("FA_AUTOTUNE_DB", url)
    db = connect(url)
    problem = Problem(1, 2, 2, 24, 24, 16, "float16")
    old = SoftwareInfo(triton.__version__, "2.13.0", "none", "0.1.0", "9b45809a6d39c298")
    assert old.template_hash != template_hash()
    save_winner(db, identities(db, problem, interpreter_gpu(), old),
                Winner(problem, CFG_B, 1.0, 1.0, 1e-4, interpreter_gpu(), old))
    db.dispose()
    dispatch.DISPATCHER.reset()
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    info = fa_autotune.explain(q, k, v)
    assert info["source"] == "database" and info["config"] == CFG_B.to_dict()
    assert_close_to_reference(fa_autotune.attention(q, k, v), q, k, v)


def test_the_shipped_h200_file_loads_and_serves(monkeypatch):
    """Every entry of the shipped file validates, and an H200 is answered from it."""
    from fa_autotune.paths import data_dir

    monkeypatch.setattr(dispatch, "_shipped_dir", lambda: data_dir("tuning_db"))
    tuned = files.load(data_dir("tuning_db") / "nvidia-h200.attn_fwd.json")
    assert tuned.gpu.name == "NVIDIA H200" and len(tuned.winners) >= 24
    assert any(p.problem.is_fp8 for p in tuned.fronts)
    monkeypatch.setattr(dispatch, "detect_gpu", lambda index: tuned.gpu)
    problem = tuned.winners[0].problem
    choice = dispatch.DISPATCHER.choose(problem, "cuda", 0)
    assert (choice.source, choice.config, choice.distance) == ("shipped", tuned.winners[0].config, 0.0)


def test_export_rewrites_the_shipped_file_byte_for_byte(tmp_path):
    """Loading a file and writing the records back gives the same bytes: one record type,
    no field lost on the way."""
    from fa_autotune.paths import data_dir

    shipped = data_dir("tuning_db") / "nvidia-h200.attn_fwd.json"
    assert files.write(files.load(shipped), tmp_path).read_bytes() == shipped.read_bytes()


def test_database_secrets_never_printed(monkeypatch):
    """An unreachable database is skipped with a warning that masks its password."""
    monkeypatch.setenv("FA_AUTOTUNE_DB", "postgresql://user:s3cret-pw@127.0.0.1:1/db")
    dispatch.DISPATCHER.reset()
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fa_autotune.explain(q, k, v)["source"] == "default"
    messages = " ".join(str(w.message) for w in caught)
    assert "cannot read tuned results" in messages and "s3cret-pw" not in messages and "***" in messages


def test_export_keeps_gpu_models_that_share_a_slug_apart(tmp_path, isolated):
    """Two GPU models with one name (other compute capability) export to two files, named
    with the capability, instead of one overwriting the other; the dispatcher finds its own."""
    from fa_autotune.store import connect

    here = interpreter_gpu()
    twin = GpuInfo(here.name, "8.0", 1, 1, "x")
    problem = Problem(1, 2, 2, 24, 24, 16, "float16")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    paths = [write_file(a, [(problem, CFG_A)]), write_file(b, [(problem, CFG_B)], gpu=twin)]
    db = connect(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert files.import_files(db, paths) == 2
    exported = files.export(db, tmp_path / "out")
    assert len(exported) == 2 and len({p.name for p in exported}) == 2
    by_capability = {files.load(p).gpu.capability: files.load(p) for p in exported}
    assert by_capability["8.0"].winners[0].config == CFG_B
    assert by_capability[here.capability].winners[0].config == CFG_A
    for path in exported:
        (isolated / path.name).write_bytes(path.read_bytes())
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    info = fa_autotune.explain(q, k, v)
    assert info["source"] == "shipped" and info["config"] == CFG_A.to_dict()


@pytest.mark.parametrize("content", [b"not a database at all" * 100, None])
def test_foreign_or_corrupt_database_is_skipped_and_untouched(tmp_path, monkeypatch, content):
    """FA_AUTOTUNE_DB naming a corrupt file or another application's SQLite database:
    attention() runs on the defaults with one warning, and the file is not changed (no
    fa_ tables, no WAL switch)."""
    import sqlite3

    path = tmp_path / "other.sqlite"
    if content is None:
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY)")
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    monkeypatch.setenv("FA_AUTOTUNE_DB", f"sqlite:///{path}")
    dispatch.DISPATCHER.reset()
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16)
    with pytest.warns(RuntimeWarning, match="cannot read tuned results"):
        out = fa_autotune.attention(q, k, v)
    assert_close_to_reference(out, q, k, v)
    assert path.read_bytes() == before and not (tmp_path / "other.sqlite-wal").exists()


DECODE_P = Problem(2, 4, 2, 1, 64, 32, "float16", kind="decode", page_size=16)
DECODE_CFG = KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=16, num_stages=1, num_splits=3)


def test_decode_winners_go_to_their_own_file_and_serve_nearby_shapes(tmp_path, isolated):
    """One Tuned with forward and KV-cache winners writes two files; the decode file serves
    attention_with_kvcache's shapes nearest its buckets, never forward problems."""
    gpu = interpreter_gpu()
    forward = Problem(1, 2, 2, 24, 24, 16, "float16")
    from fa_autotune.spec.tuned import Tuned

    tuned = Tuned.latest(gpu, [Winner(forward, CFG_A, 1.0, 1.0, 1e-4, gpu, SW),
                               Winner(DECODE_P, DECODE_CFG, 1.0, 1.0, 1e-4, gpu, SW)])
    paths = [files.write(tuned, isolated, family=f) for f in ("attn_fwd", "attn_decode")]
    assert [p.name.split(".")[-2] for p in paths] == ["attn_fwd", "attn_decode"]
    fwd, dec = (files.load(p) for p in paths)
    assert [w.problem for w in fwd.winners] == [forward] and [w.problem for w in dec.winners] == [DECODE_P]
    longer = Problem(3, 4, 2, 1, 200, 32, "float16", kind="decode", page_size=128)
    choice = dispatch.DISPATCHER.choose(longer, "cpu", 0)
    assert (choice.source, choice.config, choice.matched) == ("shipped", DECODE_CFG, DECODE_P)
    contiguous = Problem(3, 4, 2, 1, 200, 32, "float16", kind="decode")
    assert dispatch.DISPATCHER.choose(contiguous, "cpu", 0).source == "default"  # paged buckets do not serve it
    assert dispatch.DISPATCHER.choose(Problem(1, 4, 2, 1, 64, 32, "float16"), "cpu", 0).config != DECODE_CFG
    # attention_with_kvcache runs the tuned config on the longer shape
    k_cache = torch.randn(8, 128, 2, 32, dtype=torch.float16)
    q = torch.randn(3, 1, 4, 32, dtype=torch.float16)
    table = torch.arange(6, dtype=torch.int32).reshape(3, 2)
    out = fa_autotune.attention_with_kvcache(q, k_cache, k_cache, cache_seqlens=torch.tensor(
        [200, 3, 130], dtype=torch.int32), block_table=table)
    for b, n in enumerate((200, 3, 130)):
        kv = k_cache[table[b].long()].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0)
        assert_close_to_reference(out[b:b + 1].transpose(1, 2), q[b:b + 1].transpose(1, 2), kv, kv)


def test_a_decode_entry_in_a_forward_file_is_refused(tmp_path):
    path = write_file(tmp_path, [(DECODE_P, DECODE_CFG)])
    with pytest.raises(ConfigFileError, match="attn_decode problem in a attn_fwd file"):
        files.load(path)


def test_the_shipped_h200_decode_file_loads_and_serves(monkeypatch):
    from fa_autotune.paths import data_dir

    monkeypatch.setattr(dispatch, "_shipped_dir", lambda: data_dir("tuning_db"))
    tuned = files.load(data_dir("tuning_db") / "nvidia-h200.attn_decode.json")
    assert tuned.gpu.name == "NVIDIA H200" and len(tuned.winners) == 18
    assert all(w.problem.decode and w.config.loop_order == "decode" for w in tuned.winners)
    monkeypatch.setattr(dispatch, "detect_gpu", lambda index: tuned.gpu)
    near = Problem(2, 32, 8, 1, 100000, 128, "bfloat16", kind="decode", page_size=32)
    choice = dispatch.DISPATCHER.choose(near, "cuda", 0)
    assert choice.source == "shipped" and choice.matched.page_size in (16, 128) and choice.config.loop_order == "decode"


def test_a_tuned_fp8_recipe_travels_from_the_store_to_the_quantizer(tmp_path, monkeypatch):
    """store -> export -> a dispatcher reading only the exported file -> attention_fp8 in the
    interpreter: the chosen front point's kernel runs on inputs quantized with that point's
    recipe, a caller's hadamard= / scaling= pick among the recipes (a recipe no point has: the
    tuned kernel with that recipe), and the output is accurate."""
    from fa_autotune.store import connect
    from fa_autotune.store.records import identities
    from fa_autotune.store.tuned import save_front, save_winner

    problem = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn")
    fast = Candidate(KernelConfig(BLOCK_M=32, BLOCK_N=32, num_stages=2), Fp8Recipe("per_head", False))
    accurate = Candidate(KernelConfig(BLOCK_M=16, BLOCK_N=32), Fp8Recipe())
    db = connect(f"sqlite:///{tmp_path / 'tuned.sqlite'}")
    gpu = interpreter_gpu()
    ids = identities(db, problem, gpu, SW)
    save_front(db, ids, [FrontPoint(problem, c.config, ms, 1.0, err, gpu, SW, recipe=c.recipe)
                         for c, ms, err in ((fast, 1.0, 0.03), (accurate, 2.0, 0.01))], 0.3)
    save_winner(db, ids, Winner(problem, fast.config, 1.0, 1.0, 0.03, gpu, SW, recipe=fast.recipe))
    (path,) = files.export(db, tmp_path / "exported")
    db.dispose()
    monkeypatch.setenv("FA_AUTOTUNE_CONFIG_DIR", str(path.parent))
    dispatch.DISPATCHER.reset()

    quantized, ran = [], []
    quantize, prepare = api.quantize_fp8, api.prepare
    monkeypatch.setattr(api, "quantize_fp8", lambda *a, **kw: quantized.append((kw["scaling"], kw["hadamard"]))
                        or quantize(*a, **kw))
    monkeypatch.setattr(api, "prepare", lambda config, *a: ran.append(config) or prepare(config, *a))
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32)
    out = fa_autotune.attention_fp8(q, k, v)
    assert (quantized[-1], ran[-1]) == (("per_head", False), fast.config)
    _assert_fp8_close(out, q, k, v)
    fa_autotune.attention_fp8(q, k, v, hadamard=True)  # only the accurate point rotates
    assert (quantized[-1], ran[-1]) == (("per_block", True), accurate.config)
    with pytest.warns(RuntimeWarning, match="within max_error"):  # none within: the most accurate
        fa_autotune.attention_fp8(q, k, v, max_error=0.001)
    assert (quantized[-1], ran[-1]) == (("per_block", True), accurate.config)
    fa_autotune.attention_fp8(q, k, v, scaling="per_tensor")  # no such point: the winner, requantized
    assert (quantized[-1], ran[-1]) == (("per_tensor", False), fast.config)
    x = fa_autotune.quantize_fp8(q, k, v, scaling="per_head", hadamard=False)
    fa_autotune.attention_fp8(x)  # inputs quantized already: the fastest point of their recipe
    assert ran[-1] == fast.config


def test_a_recipe_given_with_a_config_is_honoured_or_refused(monkeypatch):
    """attention_fp8 takes a config mapping with a recipe among its parameters (as stored
    configs and `query pareto` list them) and quantizes with it; for inputs quantized
    already the recipe must be theirs. Where no recipe can apply (attention(), render), a
    recipe other than the default is a ConfigError saying it is given separately."""
    quantized = []
    quantize = api.quantize_fp8
    monkeypatch.setattr(api, "quantize_fp8", lambda *a, **kw: quantized.append((kw["scaling"], kw["hadamard"]))
                        or quantize(*a, **kw))
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32)
    small = {"BLOCK_M": 32, "BLOCK_N": 32}
    out = fa_autotune.attention_fp8(q, k, v, config=dict(small, fp8_scaling="per_tensor"))
    assert quantized[-1] == ("per_tensor", True)
    _assert_fp8_close(out, q, k, v)
    fa_autotune.attention_fp8(q, k, v, config=small)  # no recipe named: the default one
    assert quantized[-1] == ("per_block", True)
    fa_autotune.attention_fp8(q, k, v, config=dict(small, fp8_scaling="per_tensor"), scaling="per_head")
    assert quantized[-1] == ("per_head", True)  # the call's own arguments win
    pareto_row = Candidate(KernelConfig(**small), Fp8Recipe("per_head", False)).to_dict()
    fa_autotune.attention_fp8(q, k, v, config=pareto_row)
    assert quantized[-1] == ("per_head", False)

    x = fa_autotune.quantize_fp8(q, k, v, scaling="per_head", block_q=32, block_k=32)
    fa_autotune.attention_fp8(x, config=dict(small, fp8_scaling="per_head", fp8_hadamard=True))
    with pytest.raises(ConfigError, match="fp8_scaling: config names the recipe .*per_tensor.* quantized with") as info:
        fa_autotune.attention_fp8(x, config=dict(small, fp8_scaling="per_tensor"))
    assert info.value.parameter == "fp8_scaling"
    with pytest.raises(ConfigError, match="fp8_hadamard"):
        fa_autotune.attention_fp8(x, config=dict(small, fp8_hadamard=False))
    with pytest.raises(InputError, match="quantized with scaling='per_head', not scaling='per_tensor'"):
        fa_autotune.attention_fp8(x, config=small, scaling="per_tensor")  # would be ignored: refused
    with pytest.raises(InputError, match="hadamard=True, not hadamard=False"):
        fa_autotune.attention_fp8(x, config=small, hadamard=False)
    fa_autotune.attention_fp8(x, config=small, scaling="per_head", hadamard=True)  # the inputs' own recipe

    q16, k16, v16 = make_qkv(1, 2, 2, 24, 24, 16)
    with pytest.raises(ConfigError, match="fp8_scaling: the FP8 quantization recipe is not a kernel parameter"):
        fa_autotune.attention(q16, k16, v16, config={"BLOCK_M": 16, "BLOCK_N": 16, "fp8_scaling": "per_tensor"})
    legacy = dict(KernelConfig(BLOCK_M=16, BLOCK_N=16).to_dict(), fp8_scaling="per_block", fp8_hadamard=True)
    assert_close_to_reference(fa_autotune.attention(q16, k16, v16, config=legacy), q16, k16, v16)


def _assert_fp8_close(out, q, k, v):
    from fa_autotune.tune.reference import TOLERANCE, compare, reference_attention

    report = compare(out.float(), reference_attention(q.float(), k.float(), v.float())[0])
    assert report.finite and report.rel <= TOLERANCE["float8_e4m3fn"], report

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from fa_autotune.bench import Bench, Cell, Row, geomeans, markdown
from fa_autotune.errors import FaAutotuneError
from fa_autotune.tune.reference import compare, reference_attention


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


def test_with_forward_names_backward_rows_and_counts_the_forward():
    from fa_autotune.spec.problem import Problem

    bwd = Problem(2, 4, 4, 128, 128, 64, "float16", causal=True, kind="bwd")
    fwd = bwd.with_kind("fwd")
    step = Bench(("tuned",), None, with_forward=True)
    assert step.row_key(bwd) == bwd.key + "_with_fwd" and step.row_key(fwd) == fwd.key
    assert math.isclose(step.row_flops(bwd), 3.5 * fwd.flops) and math.isclose(step.row_flops(fwd), fwd.flops)
    plain = Bench(("tuned",), None)
    assert plain.row_key(bwd) == bwd.key and math.isclose(plain.row_flops(bwd), 2.5 * fwd.flops)


def test_with_forward_runs_a_fresh_forward_each_timed_call(monkeypatch):
    """The timed call of a --with-forward row runs the forward again each time (a training
    step); a plain backward row runs it once, beforehand."""
    from fa_autotune.bench import api
    from fa_autotune.spec.problem import Problem

    forwards = []

    def attention(q, k, v, causal, causal_align="top_left"):
        forwards.append(1)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    monkeypatch.setattr(api, "attention", attention)
    monkeypatch.setattr(api, "explain", lambda *a, **kw: {"backward": {"kernel": "k", "source": "test"}})
    problem = Problem(1, 2, 2, 8, 8, 16, "float32", kind="bwd")
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    dout = torch.randn_like(q)
    for with_forward, per_call in ((True, 1), (False, 0)):
        forwards.clear()
        call, _, _ = Bench(("tuned",), None, with_forward=with_forward).backward_callable_for(
            "tuned", problem, q, k, v, dout)
        assert len(forwards) == 1  # the forward the row's check and plain timing use
        grads = [call() for _ in range(3)]
        assert len(forwards) == 1 + 3 * per_call
        assert all(torch.allclose(a, b) for a, b in zip(grads[0], grads[-1]))


def test_with_forward_needs_the_backward_space(capsys):
    """Refused before any GPU is looked for (run in this process: a refusal needs no fresh
    interpreter)."""
    from fa_autotune import cli

    for args, message in ((["--preset", "quick", "--with-forward"], "--space bwd"),
                          (["--merge", "a", "--with-forward"], "--merge only reads")):
        assert cli.main(["bench", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and "--with-forward" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_bench_refuses_without_a_gpu(capsys):
    from fa_autotune import cli

    assert cli.main(["bench", "--preset", "quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


ENV = {"gpu": "G", "capability": "9.0", "driver": "1", "date": "2026-11-30 01:00 UTC", "torch": "t", "triton": "x",
       "cuda": "c", "cudnn": 1, "fa_autotune": "f", "template_hash": "h"}


def _bench_dir(tmp_path, name, rows, env=ENV, ceiling=700.0):
    from fa_autotune.bench import write

    return write(rows, ("tuned", "cudnn"), ceiling, tmp_path / name, "llm-prefill", dict(env)) and tmp_path / name


def test_merge_runs_from_two_gpus_into_one_table(tmp_path):
    a = _bench_dir(tmp_path, "a", [row("p1", "float16", cudnn=1.0, tuned=0.5)])
    b = _bench_dir(tmp_path, "b", [row("p2", "float16", cudnn=1.0, tuned=2.0)], dict(ENV, date="2026-11-30 02:00 UTC"),
                   ceiling=800.0)
    result = subprocess.run([sys.executable, "-m", "fa_autotune", "bench", "--merge", str(a), str(b / "bench.json"),
                             "--out", str(tmp_path / "m")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    from fa_autotune.bench import read

    merged = read(tmp_path / "m")
    assert [r.problem for r in merged["rows"]] == ["p1", "p2"] and merged["runs"] == 2
    assert math.isclose(merged["geomeans"]["float16"]["tuned_vs_cudnn"], 1.0)
    assert merged["bf16_matmul_tflops"] == 750.0 and merged["environment"]["date"].startswith("2026-11-30 02")
    assert "Merged from 2 runs" in (tmp_path / "m" / "bench.md").read_text()


def test_merge_refuses_other_software_and_repeated_problems(tmp_path):
    from fa_autotune.bench import merge

    a = _bench_dir(tmp_path, "a", [row("p1", "float16", cudnn=1.0, tuned=0.5)])
    b = _bench_dir(tmp_path, "b", [row("p2", "float16", cudnn=1.0, tuned=0.5)], dict(ENV, triton="y"))
    c = _bench_dir(tmp_path, "c", [row("p1", "float16", cudnn=1.0, tuned=0.7)])
    with pytest.raises(FaAutotuneError, match="triton differ"):
        merge([a, b], tmp_path / "m")
    with pytest.raises(FaAutotuneError, match="p1 appears in more than one"):
        merge([a, c], tmp_path / "m")
    (tmp_path / "bad.json").write_text('{"rows": []}')
    with pytest.raises(FaAutotuneError, match="is not a bench result"):
        merge([tmp_path / "bad.json"], tmp_path / "m")


def test_resume_refuses_another_machine_or_provider_set(tmp_path):
    from fa_autotune.bench import resume

    assert resume(tmp_path / "none", ("tuned", "cudnn")) == (None, [])
    a = _bench_dir(tmp_path, "a", [row("p1", "float16", cudnn=1.0, tuned=0.5)])
    with pytest.raises(FaAutotuneError, match="providers"):
        resume(a, ("tuned",))
    with pytest.raises(FaAutotuneError, match="another gpu"):  # this machine has no GPU "G"
        resume(a, ("tuned", "cudnn"))


def test_merge_takes_no_measuring_flags(tmp_path, capsys):
    from fa_autotune import cli

    a = _bench_dir(tmp_path, "a", [row("p1", "float16", cudnn=1.0, tuned=0.5)])
    assert cli.main(["bench", "--merge", str(a), "--resume", "--out", str(tmp_path / "m")]) == 2
    assert "--merge only reads earlier outputs" in capsys.readouterr().err


def test_markdown_shows_kv_cache_rows_in_microseconds_and_bandwidth():
    cells = {"tuned": Cell("tuned", "ok", 0.137, 15.7, 1e-3, "attn_decode_m16n64_w4s4_cband_x16", 3.92),
             "cudnn": Cell("cudnn", "ok", 0.137, 15.7, 1e-3, "SDPA cudnn, dense K/V", 3.93),
             "tutorial": Cell("tutorial", "unavailable", detail="Unavailable: forward kernels")}
    key = "b1_hq32_hkv8_nq1_nk131072_d128_bfloat16_full_paged16"
    rows = [Row(key, "bfloat16", cells)]
    summary = {"environment": {"gpu": "G", "date": "d", "torch": "t", "triton": "x", "cuda": "c", "cudnn": 1,
                               "fa_autotune": "f", "template_hash": "h"}, "preset": "serving",
               "bf16_matmul_tflops": 1.0, "geomeans": geomeans(rows, ("tuned", "cudnn")),
               "rows": [{"problem": key, "dtype": "bfloat16", "cells": {k: c.__dict__ for k, c in cells.items()}}]}
    text = markdown(summary, ("tuned", "cudnn", "tutorial"))
    assert f"| {key} | 137 us, 3.92 TB/s (1.00x) | 137 us, 3.93 TB/s (1.00x) | unavailable |" in text
    assert "tuned: attn_decode_m16n64_w4s4_cband_x16" in text and "tutorial:" not in text.split("Configs used")[1]


def test_rounds_take_turns_and_the_ratio_is_the_median_of_the_rounds(monkeypatch):
    """--rounds 3: every checked provider timed once per round, in turn; a drift that slows
    both alike in one round leaves the ratio alone, a wrong provider is never timed."""
    import fa_autotune.bench as bench
    from fa_autotune.tune.measure import Timing
    from fa_autotune.spec.problem import Problem

    calls = []
    # (provider, round) -> ms: round 1 runs everything 30% slower (the board's power limit).
    times = {("tuned", 0): 1.0, ("cudnn", 0): 1.1, ("tuned", 1): 1.3, ("cudnn", 1): 1.43,
             ("tuned", 2): 1.0, ("cudnn", 2): 0.9}

    def fake_time(fn, rep_ms):
        name = fn()
        calls.append(name)
        ms = times[(name, calls.count(name) - 1)]
        return Timing(ms, ms, ms)

    class Report:
        rel = 1e-3

        def __init__(self, ok):
            self.ok = ok

        def passes(self, dtype):
            return self.ok

    monkeypatch.setattr(bench, "time_callable", fake_time)
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    problem = Problem(1, 2, 2, 64, 64, 32, "float16")
    b = Bench(("tuned", "cudnn", "flash"), None, rounds=3)
    r = b._row(problem, lambda p: ((lambda p=p: p), None, p), lambda out: Report(out != "flash"))
    # flash failed its check: checked once, never timed; the others' order rotates round by round
    assert calls == ["tuned", "cudnn", "cudnn", "tuned", "tuned", "cudnn"]
    assert r.cells["flash"].status == "wrong_result" and list(r.cells) == ["tuned", "cudnn", "flash"]
    assert r.cells["tuned"].round_ms == [1.0, 1.3, 1.0] and r.cells["tuned"].ms == 1.0
    assert math.isclose(r.ratio("tuned"), 1.1)  # median of 1.1, 1.1, 0.9; medians' ratio would say 1.1 too
    with pytest.raises(FaAutotuneError, match="rounds"):
        Bench(("tuned",), None, rounds=0)


def test_a_provider_failing_in_a_later_round_says_so(monkeypatch):
    """Checked, timed once, then failing: unavailable, with the round and its check's error
    kept; one round times each provider right after its check."""
    import fa_autotune.bench as bench
    from fa_autotune.tune.measure import Timing
    from fa_autotune.spec.problem import Problem

    calls = []

    def fake_time(fn, rep_ms):
        name = fn()
        calls.append(name)
        if name == "cudnn" and calls.count("cudnn") == 2:
            raise RuntimeError("out of memory")
        return Timing(1.0, 1.0, 1.0)

    class Report:
        rel = 2e-3

        def passes(self, dtype):
            return True

    monkeypatch.setattr(bench, "time_callable", fake_time)
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    problem = Problem(1, 2, 2, 64, 64, 32, "float16")
    r = Bench(("tuned", "cudnn"), None, rounds=3)._row(problem, lambda p: ((lambda p=p: p), None, p),
                                                      lambda out: Report())
    cell = r.cells["cudnn"]
    assert cell.status == "unavailable" and cell.rel_error == 2e-3
    assert "passed its check, failed in timing round 2: RuntimeError: out of memory" in cell.detail
    assert r.cells["tuned"].status == "ok" and r.cells["tuned"].round_ms == [1.0, 1.0, 1.0]
    calls.clear()
    one = Bench(("tuned", "cudnn"), None)._row(problem, lambda p: ((lambda p=p: p), None, p), lambda out: Report())
    assert calls == ["tuned", "cudnn"] and one.cells["cudnn"].round_ms is None and one.cells["cudnn"].ms == 1.0


def test_ratio_of_rounds_differs_from_ratio_of_medians():
    """The rounds' ratio pairs each round's timings; the medians' ratio would mix rounds."""
    from fa_autotune.bench import cell_ratio

    tuned = {"ms": 1.2, "round_ms": [1.0, 1.2, 1.5]}
    cudnn = {"ms": 1.2, "round_ms": [1.05, 1.26, 1.2]}
    assert math.isclose(cell_ratio(tuned, cudnn), 1.05)  # ratios 1.05, 1.05, 0.8
    assert math.isclose(cell_ratio(dict(tuned, round_ms=None), cudnn), 1.0)
    assert cell_ratio({"ms": None}, cudnn) is None


def test_markdown_and_resume_know_the_rounds(tmp_path):
    from fa_autotune.bench import resume, write

    rows = [Row("p", "float16", {"tuned": Cell("tuned", "ok", 1.0, 1.0, 1e-3, "t", None, [1.0, 1.1, 0.9]),
                                 "cudnn": Cell("cudnn", "ok", 1.0, 1.0, 1e-3, "c", None, [1.1, 1.1, 1.0])})]
    summary = write(rows, ("tuned", "cudnn"), 700.0, tmp_path / "r", "quick", dict(ENV), rounds=3)
    text = (tmp_path / "r" / "bench.md").read_text()
    assert summary["rounds"] == 3 and "took turns over 3 rounds" in text
    assert "| p | 1 (1.10x) | 1 (1.00x) |" in text  # median of 1.1, 1.0, 1.11
    with pytest.raises(FaAutotuneError, match="--rounds 3, not 1"):
        resume(tmp_path / "r", ("tuned", "cudnn"), 1)


def test_fa4_without_flash_attn_is_unavailable_and_says_how_to_get_it(monkeypatch):
    from fa_autotune.bench import Unavailable
    from fa_autotune.spec.problem import Problem

    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # an import of it raises ImportError
    problem = Problem(1, 2, 2, 8, 8, 16, "float32")
    q = k = v = torch.zeros(1, 2, 8, 16)
    with pytest.raises(Unavailable, match=r"fa-autotune\[fa4\]"):
        Bench(("fa4",), None).callable_for("fa4", problem, q, k, v)


@pytest.fixture
def fake_fa4(monkeypatch):
    """A stand-in for flash_attn.cute.flash_attn_func that insists on FA4's calling convention
    ((B, N, H, D) contiguous tensors, GQA by head count, causal bottom-right) and returns
    (out, lse) as FA4 does, computed with differentiable torch ops."""
    import types

    calls = []

    def flash_attn_func(q, k, v, causal=False):
        calls.append(causal)
        assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        group = qt.shape[1] // kt.shape[1]
        kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
        s = qt @ kt.transpose(-1, -2) * qt.shape[-1] ** -0.5
        if causal:
            nq, nk = s.shape[-2:]
            s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq).logical_not(), float("-inf"))
        return (s.softmax(-1) @ vt).transpose(1, 2), s.logsumexp(-1)

    module = types.ModuleType("flash_attn.cute")
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", module)
    return calls


def test_fa4_runs_on_bnhd_copies_and_answers_in_bhnd(fake_fa4):
    """The bench hands FA4 (B, N, H, D) copies made before timing and checks its output, and
    its gradients, as (B, H, N, D) like every other provider's."""
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.reference import compare, compare_all, reference_attention, reference_gradients

    problem = Problem(2, 4, 2, 24, 24, 16, "float32", causal=True)
    q, k, v = (torch.randn(2, h, 24, 16) for h in (4, 2, 2))
    fn, context, detail = Bench(("fa4",), None).callable_for("fa4", problem, q, k, v)
    assert context is None and "flash_attn_func" in detail
    ref, _ = reference_attention(q, k, v, causal=True)
    out = fn()
    assert out.shape == q.shape and compare(out, ref).passes("float32")
    dout = torch.randn_like(q)
    grad_fn, _, _ = Bench(("fa4",), None).backward_callable_for("fa4", problem.with_kind("bwd"), q, k, v, dout)
    grads = grad_fn()
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert compare_all(grads, reference_gradients(q, k, v, dout, causal=True)).passes("float32")
    assert fake_fa4 == [True, True]


def test_fa4_refuses_a_top_left_diagonal_it_cannot_draw(fake_fa4):
    from fa_autotune.bench import Unavailable
    from fa_autotune.spec.problem import Problem

    problem = Problem(1, 2, 2, 8, 24, 16, "float32", causal=True)  # top-left, seqlen_q != seqlen_k
    q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16)
    with pytest.raises(Unavailable, match="bottom-right"):
        Bench(("fa4",), None).callable_for("fa4", problem, q, k, v)


def test_ratios_against_fa4_beside_cudnn():
    rows = [row("a", "float16", cudnn=1.0, tuned=0.5, fa4=0.4), row("b", "bfloat16", cudnn=1.0, tuned=1.0, fa4=1.25)]
    g = geomeans(rows, ("tuned", "cudnn", "fa4"))
    assert math.isclose(g["float16"]["tuned_vs_fa4"], 0.8) and math.isclose(g["bfloat16"]["tuned_vs_fa4"], 1.25)
    assert math.isclose(g["all"]["tuned_vs_fa4"], 1.0) and math.isclose(g["all"]["tuned_min_vs_fa4"], 0.8)
    summary = {"environment": {"gpu": "G", "date": "d", "torch": "t", "triton": "x", "cuda": "c", "cudnn": 1,
                               "fa_autotune": "f", "template_hash": "h"}, "preset": "anchors",
               "bf16_matmul_tflops": 1.0, "geomeans": g, "rows": []}
    text = markdown(summary, ("tuned", "cudnn", "fa4"))
    assert "| all | tuned | 1 | 1.414x | 1.000x | 141% | 1.000x | 0.800x |" in text
    assert "cudnn_vs_fa4" not in geomeans(rows, ("tuned", "cudnn"))["float16"]


def test_config_call_runs_a_named_config_and_refuses_one_that_cannot_run():
    """The public callable the benchmark scripts time a config with (benchmarks/gluon_sweep.py)."""
    from fa_autotune import ConfigError, KernelConfig
    from fa_autotune.bench import _prepared, config_call
    from fa_autotune.spec.problem import problem_from_tensors
    from fa_autotune.tune.reference import compare, reference_attention

    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (torch.randn(1, 2, 64, 16, device=device, dtype=torch.float16) for _ in range(3))
    problem = problem_from_tensors(q, k, v, causal=True)
    fn = config_call(KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1), problem, q, k, v)
    first, second = fn(), fn()
    assert first.data_ptr() != second.data_ptr()  # a fresh output each call
    assert compare(first, reference_attention(q, k, v, causal=True)[0]).passes(problem.dtype)
    with pytest.raises(ConfigError):
        config_call(KernelConfig(BLOCK_M=48), problem, q, k, v)
    assert _prepared is config_call


def test_fp8_rows_run_attention_fp8_prequantized_and_quantizing():
    """FP8 rows: ``tuned``/``default`` time attention_fp8 on inputs quantized beforehand with
    the config's recipe, ``tuned_quantize`` quantizing itself; all within FP8's tolerance of
    float32 (interpreter, fp16 sources); the other providers take the 16-bit problem, and
    ``tuned_quantize`` has no cell on a 16-bit row."""
    from fa_autotune.bench import FP8_ONLY, PROVIDERS, NotApplicable, Unavailable, default_providers
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.reference import TOLERANCE

    problem = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn", causal=True)
    q, k, v = (torch.randn(1, 2, 64, 32, dtype=torch.float16) for _ in range(3))
    ref, _ = reference_attention(q.float(), k.float(), v.float(), causal=True)
    bench = Bench(("tuned", "default", "tuned_quantize", "tutorial"), None)
    for provider in ("tuned", "default", "tuned_quantize"):
        fn, context, detail = bench.callable_for(provider, problem, q, k, v)
        out = fn()
        assert out.dtype == torch.float16 and context is None and ("prequantized" in detail) == (provider != "tuned_quantize")
        assert compare(out.float(), ref).rel <= TOLERANCE["float8_e4m3fn"], provider
    with pytest.raises(Unavailable, match="no FP8 kernels"):
        bench.callable_for("tutorial", problem, q, k, v)
    with pytest.raises(NotApplicable):
        bench.callable_for("tuned_quantize", problem.with_dtype("float16"), q, k, v)
    sixteen = Problem(1, 2, 2, 64, 64, 32, "float16")
    assert default_providers([sixteen]) == tuple(p for p in PROVIDERS if p not in FP8_ONLY)
    assert default_providers([sixteen, problem]) == PROVIDERS

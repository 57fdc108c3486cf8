"""``fa-autotune bench``: every attention provider, side by side, on the same inputs.

KV-cache problems (``--space decode``) run ``attention_with_kvcache`` for ``tuned`` and
``default`` and report microseconds and TB/s of K/V read beside the ratios. Backward problems
(``--space bwd``) time dQ, dK and dV together through autograd (each provider's own
backward, its forward run once beforehand), checked against float32 autograd; TFLOPS count
2.5x the forward's FLOPs. With ``with_forward`` (``--with-forward``) each backward row times
the forward and the backward together, as a training step runs them (key suffix
``_with_fwd``; TFLOPS count 3.5x the forward's FLOPs).

Providers: ``tuned`` (the dispatcher), ``default`` (the built-in config), ``tutorial``
(our template tuned only over the Triton fused-attention tutorial's config list,
search_spaces/tutorial.yaml), SDPA's ``flash``, ``cudnn`` and ``efficient`` backends, and
``flex`` (FlexAttention under torch.compile), and ``fa4`` (FlashAttention-4, pip
``flash-attn-4``: the ``[fa4]`` extra; on Hopper its SM90 kernels are FlashAttention-3's design),
called on (B, N, H, D) copies of the inputs made before timing. Each provider's output is
checked against a float32 reference before it is timed; a wrong or unavailable provider (FA4
not installed, say) is reported, not timed. Ratios are against cuDNN, and against FA4 where it
ran; geomeans per dtype; the matmul ceiling is measured in the same run.

FP8 problems (dtype ``float8_e4m3fn``/``float8_e5m2``, e.g. the ``fp8`` preset) run on bf16
inputs with outlier channels (what the tuner judges FP8 on): ``tuned`` and ``default`` are
``attention_fp8`` on inputs quantized beforehand with the config's recipe (per block, Hadamard,
...), ``tuned_quantize`` is ``attention_fp8`` quantizing the bf16 inputs itself (the price
of quantization: its ratio to ``tuned``), and the other providers run the same problem in
bf16, so each FP8 row sets FP8 beside the 16-bit kernels of the same shape.
"""
from __future__ import annotations

import contextlib
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from .errors import FaAutotuneError
from .kernels.checks import check_config
from .kernels.fwd import prepare
from .runtime import api
from .spec.candidate import Candidate
from .spec.config import KernelConfig
from .runtime.dispatch import DISPATCHER
from .runtime.kvcache import attention_with_kvcache
from .spec.defaults import decode_default, default_for
from .spec.problem import Problem
from .spec.space import load_space
from .spec.target import detect_gpu, detect_software, environment
from .store import connect
from .fp8.quantize import fmt_of, quantize_fp8, tile_blocks, v_order_for
from .tune.inputs import TrialInputs, fp8_source_inputs, random_inputs
from .tune.measure import sdpa_call, time_callable
from .tune.reference import compare, compare_all, reference_attention, reference_gradients
from .tune.search import TuneOptions, Tuner

PROVIDERS = ("tuned", "default", "tutorial", "cudnn", "flash", "efficient", "flex", "fa4", "tuned_quantize")
FP8_ONLY = ("tuned_quantize",)  # providers only FP8 rows have
BASELINE = "cudnn"
LEADER = "fa4"  # the strongest other kernels: ratios against it too, where it ran


@dataclass
class Cell:
    provider: str
    status: str  # ok, wrong_result, unavailable
    ms: float | None = None
    tflops: float | None = None
    rel_error: float | None = None
    detail: str = ""
    tbps: float | None = None  # KV-cache problems: K/V bytes read per second, in TB/s
    # --rounds > 1: each round's median (ms), the providers of a row taking turns round by
    # round; ``ms`` is their median.
    round_ms: list[float] | None = None


@dataclass
class Row:
    problem: str
    dtype: str
    cells: dict[str, Cell] = field(default_factory=dict)

    def ratio(self, provider: str, base: str = BASELINE) -> float | None:
        a, b = self.cells.get(provider), self.cells.get(base)
        return cell_ratio(asdict(a), asdict(b)) if a and b else None


def cell_ratio(cell: dict, base: dict) -> float | None:
    """How many times faster than ``base`` (cells as dicts, as bench.json holds them): the
    median of the rounds' ratios where both were timed in the same rounds (a clock or power
    drift between rounds then cancels), else the ratio of the medians."""
    if not cell.get("ms") or not base.get("ms"):
        return None
    mine, theirs = cell.get("round_ms") or [], base.get("round_ms") or []
    if len(mine) > 1 and len(mine) == len(theirs):
        return statistics.median(b / a for a, b in zip(mine, theirs))
    return base["ms"] / cell["ms"]


class Unavailable(Exception):
    """A provider that cannot run this problem here (missing backend, unsupported shape)."""


class NotApplicable(Unavailable):
    """A provider that has no meaning for this kind of row (no cell is written)."""


def default_providers(problems: list[Problem]) -> tuple[str, ...]:
    """Every provider, those of FP8 rows only where there are FP8 problems."""
    fp8 = any(p.is_fp8 for p in problems)
    return tuple(p for p in PROVIDERS if fp8 or p not in FP8_ONLY)


def config_call(config: KernelConfig, problem: Problem, q, k, v) -> Callable[[], torch.Tensor]:
    """A callable that runs ``config`` on these tensors, as the bench times a config: checked
    against ``problem`` and the tensors first (``ConfigError`` naming the field if it cannot run
    them), compiled and planned once, then each call allocates a fresh output and launches the
    kernel (no dispatch, no per-call checks) and returns it.

    ``q``, ``k``, ``v``: (B, H, N, D) tensors as :func:`fa_autotune.attention` takes them;
    ``problem``: their :class:`~fa_autotune.Problem`
    (``fa_autotune.spec.problem.problem_from_tensors(q, k, v, causal)``).
    For benchmarks that time named configs beside ``attention()``, e.g.
    ``fn = config_call(KernelConfig.from_mapping({...}), problem, q, k, v); fn()``."""
    check_config(config, problem, q, k, v)
    out = torch.empty_like(q)
    plan = prepare(config, q, k, v, out, None, problem.head_dim ** -0.5, problem.causal_offset, problem.causal)

    def call():
        o = torch.empty_like(q)
        plan(q, k, v, o, None)
        return o

    return call


_prepared = config_call  # the earlier private name, for callers outside this repository


def _flex(problem: Problem, q, k, v):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh compile per problem: past Dynamo's recompile limit (8 shapes) torch.compile
    # silently falls back to eager flex_attention, which materialises the score matrix.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    mask = None
    if problem.causal:
        offset = problem.causal_offset
        mask = create_block_mask(lambda b, h, qi, kv: kv <= qi + offset, None, None, problem.seqlen_q,
                                 problem.seqlen_k, device=q.device)
    gqa = problem.heads_q != problem.heads_kv
    return lambda: compiled(q, k, v, block_mask=mask, enable_gqa=gqa)


def _fa4_func():
    """FlashAttention-4's ``flash_attn_func``, or :class:`Unavailable` saying how to get it."""
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError as exc:
        raise Unavailable(f"flash-attn-4 is not importable ({exc}); pip install 'fa-autotune[fa4]'") from None
    return flash_attn_func


def _fa4_layout(problem: Problem, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """FA4's (B, N, H, D) contiguous copies of (B, H, N, D) tensors (made outside the timed
    call); its causal diagonal is flash-attn's, bottom-right."""
    if problem.causal and problem.causal_align != "bottom_right" and problem.seqlen_q != problem.seqlen_k:
        raise Unavailable("FlashAttention-4 aligns the causal diagonal bottom-right")
    return [t.transpose(1, 2).contiguous() for t in tensors]


def _fa4_call(problem: Problem, q, k, v) -> Callable[[], torch.Tensor]:
    """A call of FA4 on (B, N, H, D) tensors returning its output as a (B, H, N, D) view."""
    func = _fa4_func()

    def call():
        out = func(q, k, v, causal=problem.causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    return call


class Bench:
    def __init__(self, providers: tuple[str, ...], db_url: str | None, tutorial_trials: int | None = None,
                 rep_ms: float = 200.0, with_forward: bool = False, rounds: int = 1) -> None:
        unknown = set(providers) - set(PROVIDERS)
        if unknown:
            raise FaAutotuneError(f"unknown provider(s) {sorted(unknown)}; choose from {', '.join(PROVIDERS)}")
        if rounds < 1:
            raise FaAutotuneError(f"rounds must be at least 1, got {rounds}")
        self.providers, self.db_url, self.rep_ms, self.rounds = providers, db_url, rep_ms, rounds
        self.tutorial_trials = tutorial_trials
        self.with_forward = with_forward

    def row_key(self, problem: Problem) -> str:
        """The row's name: the problem's key, marked when a backward row includes its forward."""
        return f"{problem.key}_with_fwd" if self.with_forward and problem.backward else problem.key

    def row_flops(self, problem: Problem) -> float:
        """FLOPs one timed call does: a backward with its forward adds the forward's (3.5x)."""
        return problem.flops + problem.with_kind("fwd").flops if self.with_forward and problem.backward \
            else problem.flops

    def callable_for(self, provider: str, problem: Problem, q, k, v):
        """(fn, context factory or None, detail)."""
        if problem.is_fp8:
            return self.fp8_callable_for(provider, problem, q, k, v)
        if provider in FP8_ONLY:
            raise NotApplicable(f"{provider} runs FP8 rows only")
        if provider == "tuned":
            info = api.explain(q, k, v, problem.causal)
            return (lambda: api.attention(q, k, v, problem.causal)), None, f"{info['kernel']} ({info['source']})"
        if provider == "default":
            cfg = default_for(problem, detect_gpu(q.device.index or 0))
            return config_call(cfg, problem, q, k, v), None, cfg.name
        if provider == "tutorial":
            cfg = self._tutorial_config(problem)
            return config_call(cfg, problem, q, k, v), None, cfg.name
        if provider == "flex":
            return _flex(problem, q, k, v), None, "torch.compile(flex_attention)"
        if provider == LEADER:
            return _fa4_call(problem, *_fa4_layout(problem, q, k, v)), None, "flash_attn.cute.flash_attn_func"
        fn, context = sdpa_call(provider, problem, q, k, v)
        return fn, context, f"SDPA {provider}"

    def fp8_callable_for(self, provider: str, problem: Problem, q, k, v):
        """FP8 rows, on 16-bit ``q, k, v``: ours through ``attention_fp8`` (quantized beforehand
        with the config's recipe, or by ``attention_fp8`` itself for ``tuned_quantize``); every
        other provider on the 16-bit inputs (same shape)."""
        fmt = fmt_of(problem.dtype)
        if provider == "tuned_quantize":
            chosen = DISPATCHER.choose_fp8(problem, q.device.type, q.device.index or 0).candidate
            return (lambda: api.attention_fp8(q, k, v, causal=problem.causal, fmt=fmt)), None, \
                f"{chosen.name}, quantizing {q.dtype} inputs ({_recipe_text(chosen.recipe)})"
        if provider in ("tuned", "default"):
            chosen = DISPATCHER.choose_fp8(problem, q.device.type, q.device.index or 0).candidate \
                if provider == "tuned" else Candidate.of(default_for(problem, detect_gpu(q.device.index or 0)), True)
            block_q, block_k = tile_blocks(chosen.config.BLOCK_M, chosen.config.BLOCK_N)
            recipe = chosen.recipe
            x = quantize_fp8(q, k, v, scaling=recipe.scaling, hadamard=recipe.hadamard, fmt=fmt,
                             block_q=block_q, block_k=block_k, sink_tile=recipe.sink_tile,
                             v_order=v_order_for(chosen.config.warp_specialize, k.shape[2]))
            config = None if provider == "tuned" else chosen.config
            return (lambda: api.attention_fp8(x, causal=problem.causal, config=config, out_dtype=q.dtype)), None, \
                f"{chosen.name}, prequantized ({_recipe_text(recipe)})"
        if provider == "tutorial":
            raise Unavailable("the tutorial's configs have no FP8 kernels")
        fn, context, detail = self.callable_for(provider, problem.with_dtype(str(q.dtype).removeprefix("torch.")),
                                                q, k, v)
        return fn, context, f"{detail} on the {str(q.dtype).removeprefix('torch.')} inputs"

    def _tutorial_config(self, problem: Problem) -> KernelConfig:
        """Best of the tutorial's config list for this problem, tuned exhaustively (answered
        from the database when it was tuned before)."""
        options = TuneOptions(sampler="grid", trials=self.tutorial_trials, study="tutorial", retime_top=3,
                              warm_start=False, record_best=False)
        (outcome,) = Tuner(connect(self.db_url), load_space("tutorial"), detect_gpu(), detect_software(),
                           options).tune([problem])
        if outcome.best is None:
            raise Unavailable("no tutorial config passed on this problem")
        return outcome.best.config

    def decode_callable_for(self, provider: str, problem: Problem, x: TrialInputs):
        """KV-cache problems: (fn giving (B, H, Nq, D), context factory or None, detail). Ours
        read the cache as laid out (contiguous or paged); SDPA and Flex read dense K/V."""
        if provider in ("tuned", "default"):
            config = None if provider == "tuned" else decode_default(problem, torch.cuda.get_device_capability(),
                                                                      torch.cuda.get_device_properties(0).multi_processor_count)
            chosen = config or DISPATCHER.choose(problem, "cuda", x.q.device.index or 0).config

            def call():
                return attention_with_kvcache(x.q, x.k, x.v, cache_seqlens=x.lengths, block_table=x.block_table,
                                              causal=problem.causal, config=config, check_lengths=False).transpose(1, 2)
            return call, None, chosen.name
        if provider == "tutorial":
            raise Unavailable("the tutorial's configs are forward kernels, not KV-cache ones")
        if provider == LEADER:
            raise Unavailable("fa4's KV-cache path is not wired into the bench")
        q, k, v = x.reference
        if provider == "flex":
            return _flex(problem, q, k, v), None, "torch.compile(flex_attention), dense K/V"
        if problem.causal and problem.seqlen_q > 1:
            raise Unavailable("SDPA's is_causal aligns top-left; KV-cache attention aligns bottom-right")
        fn, context = sdpa_call(provider, replace(problem, causal=False), q, k, v)
        return fn, context, f"SDPA {provider}, dense K/V"

    def backward_callable_for(self, provider: str, problem: Problem, q, k, v, dout):
        """Backward problems: (fn giving (dq, dk, dv), context factory or None, detail). Every
        provider's forward runs once with a graph; the timed call is the backward alone, or
        with ``with_forward`` a fresh forward and its backward."""
        fwd = replace(problem, kind="fwd")
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        context, layout = None, "bhnd"
        if provider == "tuned":
            info = api.explain(q, k, v, fwd.causal, causal_align=fwd.causal_align)["backward"]
            run, detail = (lambda: api.attention(*leaves, fwd.causal, causal_align=fwd.causal_align)), \
                f"{info['kernel']} ({info['source']})"
        elif provider == "flex":
            flex = _flex(fwd, *leaves)
            run, detail = flex, "torch.compile(flex_attention)"
        elif provider == LEADER:  # on (B, N, H, D) leaves and dO; gradients handed back as (B, H, N, D) views
            leaves = [t.requires_grad_(True) for t in _fa4_layout(fwd, q, k, v)]
            dout = dout.transpose(1, 2).contiguous()
            fa4 = _fa4_call(fwd, *leaves)
            run, detail, layout = (lambda: fa4().transpose(1, 2)), "flash_attn.cute.flash_attn_func", "bnhd"
        elif provider in ("cudnn", "flash", "efficient"):
            if fwd.causal and fwd.causal_align == "bottom_right" and fwd.seqlen_q != fwd.seqlen_k:
                raise Unavailable("SDPA's is_causal aligns top-left")
            run, context = sdpa_call(provider, fwd, *leaves)
            detail = f"SDPA {provider}"
        else:
            raise Unavailable(f"{provider} has no backward here")
        with (context() if context else contextlib.nullcontext()):
            out = run()

        def bhnd(grads):
            return tuple(g.transpose(1, 2) for g in grads) if layout == "bnhd" else grads

        def call():
            return bhnd(torch.autograd.grad(out, leaves, dout, retain_graph=True))

        def step():
            return bhnd(torch.autograd.grad(run(), leaves, dout))
        return (step if self.with_forward else call), context, detail

    def run_problem(self, problem: Problem) -> Row:
        """Every provider on one set of inputs: checked against float32, then timed."""
        if problem.backward:
            q, k, v = random_inputs(problem, "cuda")
            dout = torch.randn_like(q)
            refs = reference_gradients(q, k, v, dout, causal=problem.causal, causal_align=problem.causal_align)
            return self._row(problem, lambda p: self.backward_callable_for(p, problem, q, k, v, dout),
                             lambda grads: compare_all(grads, refs))
        if problem.decode:
            x = TrialInputs.kv_cache(problem, "cuda")
            q, k, v = x.reference
        elif problem.is_fp8:  # LLM-like activations with outlier channels, in bf16
            q, k, v = (t.to(torch.bfloat16) for t in fp8_source_inputs(problem, "cuda"))
        else:
            q, k, v = random_inputs(problem, "cuda")
        ref, _ = reference_attention(q.float(), k.float(), v.float(), causal=problem.causal,
                                     causal_align=problem.causal_align)
        if problem.decode:
            return self._row(problem, lambda p: self.decode_callable_for(p, problem, x), lambda out: compare(out, ref))
        return self._row(problem, lambda p: self.callable_for(p, problem, q, k, v), lambda out: compare(out, ref))

    def _row(self, problem: Problem, make: Callable, judge: Callable) -> Row:
        """Each provider checked, then timed. With rounds > 1 the checked providers take turns,
        one timing each per round, the order rotated every round, so drifting clocks (long
        problems run into the board's power limit) weigh on all of them alike; with one round
        each provider is timed right after its check and let go (one provider's inputs and
        autograd state in memory at a time)."""
        row = Row(self.row_key(problem), problem.dtype)
        timed: dict[str, tuple[Callable, Callable | None, float, str]] = {}
        rounds: dict[str, list[float]] = {}

        def time_one(provider: str, fn: Callable, context: Callable | None, rel: float, detail: str, k: int) -> bool:
            try:
                with (context() if context else contextlib.nullcontext()):
                    rounds.setdefault(provider, []).append(time_callable(fn, rep_ms=self.rep_ms).median_ms)
                return True
            except Exception as exc:  # checked, then failed while timed: say so, keep the check's error
                row.cells[provider] = Cell(provider, "unavailable", rel_error=rel, detail=(
                    f"{detail}: passed its check, failed in timing round {k + 1}: {type(exc).__name__}: {exc}")[:300])
                return False
            finally:
                torch.cuda.synchronize()

        for provider in self.providers:
            try:
                fn, context, detail = make(provider)
                with (context() if context else contextlib.nullcontext()):
                    report = judge(fn())
                if not report.passes(problem.dtype):
                    row.cells[provider] = Cell(provider, "wrong_result", rel_error=report.rel, detail=detail)
                elif self.rounds > 1:
                    timed[provider] = (fn, context, report.rel, detail)
                elif time_one(provider, fn, context, report.rel, detail, 0):
                    self._ok(row, problem, provider, rounds[provider], report.rel, detail)
            except NotApplicable:
                pass
            except Exception as exc:  # a provider that cannot run is a result, not a crash
                row.cells[provider] = Cell(provider, "unavailable", detail=f"{type(exc).__name__}: {exc}"[:300])
            torch.cuda.synchronize()
        order = list(timed)
        for k in range(self.rounds if timed else 0):
            for provider in order[k % len(order):] + order[:k % len(order)]:
                if provider in timed and not time_one(provider, *timed[provider], k):
                    del timed[provider]
        for provider, (_, _, rel, detail) in timed.items():
            self._ok(row, problem, provider, rounds[provider], rel, detail)
        row.cells = {p: row.cells[p] for p in self.providers if p in row.cells}
        return row

    def _ok(self, row: Row, problem: Problem, provider: str, times: list[float], rel: float, detail: str) -> None:
        ms = statistics.median(times)
        tbps = problem.kv_bytes / (ms * 1e-3) / 1e12 if problem.decode else None
        tflops = self.row_flops(problem) / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
        row.cells[provider] = Cell(provider, "ok", ms, tflops, rel, detail, tbps, times if self.rounds > 1 else None)


def matmul_ceiling(dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float:
    """TFLOPS of one n^3 matmul on random data: the ceiling every ratio is read against."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = time_callable(lambda: a @ b, rep_ms=300).median_ms
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def geomeans(rows: list[Row], providers: tuple[str, ...]) -> dict[str, dict[str, float | None]]:
    """Per dtype (and over all rows, key "all") and provider: geomean TFLOPS, geomean and worst
    ratio against cuDNN, and against FA4 where it is a provider (None where a row lacks one)."""
    out: dict[str, dict[str, float | None]] = {}
    bases = (BASELINE, LEADER) if LEADER in providers else (BASELINE,)
    groups = {dtype: [r for r in rows if r.dtype == dtype] for dtype in sorted({r.dtype for r in rows})}
    if len(groups) > 1:
        groups["all"] = list(rows)
    for dtype, subset in groups.items():
        for p in providers:
            values = [r.cells[p].tflops for r in subset if p in r.cells and r.cells[p].tflops]
            out.setdefault(dtype, {})[f"{p}_tflops"] = _geo(values) if len(values) == len(subset) else None
            for base in bases:
                name = "cudnn" if base == BASELINE else base
                ratios = [r.ratio(p, base) for r in subset if r.ratio(p, base)]
                out[dtype][f"{p}_vs_{name}"] = _geo(ratios) if len(ratios) == len(subset) else None
                out[dtype][f"{p}_min_vs_{name}"] = min(ratios) if len(ratios) == len(subset) else None
    return out


def _geo(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def write(rows: list[Row], providers: tuple[str, ...], ceiling: float, out_dir: Path, preset: str,
          env: dict | None = None, runs: int = 1, rounds: int = 1) -> dict:
    env = env or environment()
    summary = {"environment": env, "preset": preset, "bf16_matmul_tflops": ceiling, "baseline": BASELINE,
               "providers": list(providers), "runs": runs, "rounds": rounds,
               "geomeans": geomeans(rows, providers),
               "rows": [{"problem": r.problem, "dtype": r.dtype, "cells": {k: asdict(c) for k, c in r.cells.items()}}
                        for r in rows]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out_dir / "bench.md").write_text(markdown(summary, providers))
    plot(rows, providers, out_dir / "bench.png")
    return summary


def read(path: Path) -> dict:
    """A bench.json written by ``write``, its rows as ``Row`` objects (for resuming and merging)."""
    file = path / "bench.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
        data["rows"] = [Row(r["problem"], r["dtype"], {k: Cell(**c) for k, c in r["cells"].items()})
                        for r in data["rows"]]
        float(data["bf16_matmul_tflops"])
        data["environment"]["gpu"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FaAutotuneError(f"{file} is not a bench result: {type(exc).__name__}: {exc}") from exc
    return data


# What must agree for results of several runs to share one table.
_SAME_STACK = ("gpu", "capability", "driver", "torch", "triton", "cuda", "cudnn", "template_hash")


def merge(paths: list[Path], out_dir: Path) -> dict:
    """One table from bench runs on the same GPU model and software (e.g. one run per GPU of a
    host, each over part of a preset). Every ratio still compares providers timed side by
    side on the same inputs in one run; only the problems come from different runs."""
    parts = [read(p) for p in paths]
    first = parts[0]["environment"]
    for path, part in zip(paths[1:], parts[1:]):
        differs = [k for k in _SAME_STACK if part["environment"].get(k) != first.get(k)]
        if differs:
            raise FaAutotuneError(f"cannot merge {path}: its {', '.join(differs)} differ from {paths[0]}'s")
    providers = tuple(dict.fromkeys(p for part in parts for p in part.get("providers") or
                                    [c for r in part["rows"] for c in r.cells]))
    rows: dict[str, Row] = {}
    for part in parts:
        for r in part["rows"]:
            if r.problem in rows:
                raise FaAutotuneError(f"problem {r.problem} appears in more than one of the merged runs")
            rows[r.problem] = r
    ceiling = statistics.median(part["bf16_matmul_tflops"] for part in parts)
    preset = " + ".join(dict.fromkeys(part["preset"] for part in parts))
    env = dict(first, date=max(part["environment"]["date"] for part in parts))
    rounds = {part.get("rounds", 1) for part in parts}
    return write(list(rows.values()), providers, ceiling, out_dir, preset, env,
                 sum(part.get("runs", 1) for part in parts), rounds.pop() if len(rounds) == 1 else 0)


def resume(out_dir: Path, providers: tuple[str, ...], rounds: int = 1) -> tuple[float | None, list[Row]]:
    """(matmul ceiling, rows) already measured in ``out_dir`` by a run this one may continue:
    same providers, GPU and software; (None, []) when there is nothing to continue."""
    if not (out_dir / "bench.json").exists():
        return None, []
    previous = read(out_dir)
    if previous.get("providers") is None:
        raise FaAutotuneError(f"--resume: {out_dir}/bench.json has no provider list (an older format); "
                              "measure into a new --out")
    if tuple(previous["providers"]) != providers:
        raise FaAutotuneError(f"--resume: {out_dir} was measured with providers {previous['providers']}, "
                              f"not {list(providers)}")
    if previous.get("rounds", 1) != rounds:
        raise FaAutotuneError(f"--resume: {out_dir} was measured with --rounds {previous.get('rounds', 1)}, "
                              f"not {rounds}")
    here = environment()
    differs = [k for k in _SAME_STACK if previous["environment"].get(k) != here.get(k)]
    if differs:
        raise FaAutotuneError(f"--resume: {out_dir} was measured with another {', '.join(differs)}; "
                              "measure into a new --out (or merge the two with --merge)")
    return previous["bf16_matmul_tflops"], previous["rows"]


def markdown(summary: dict, providers: tuple[str, ...]) -> str:
    env = summary["environment"]
    lines = [f"# fa-autotune bench: {summary['preset']} on {env.get('gpu')} ({env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
             f"fa_autotune {env['fa_autotune']} (templates {env['template_hash']}). bf16 matmul ceiling measured "
             f"in this run: {summary['bf16_matmul_tflops']:.0f} TFLOPS.", "",
             *([f"Merged from {summary['runs']} runs on GPUs of this model and software; each row is one run, "
                "its providers timed side by side on the same inputs (ceiling: median of the runs').", ""]
               if summary.get("runs", 1) > 1 else []),
             "TFLOPS (ratio to cuDNN); KV-cache problems (`_kvcache`, `_paged<P>`) in microseconds and TB/s "
             "of K/V read, fa_autotune reading the cache as laid out, SDPA and Flex dense (B, H, N, D) K/V. "
             "Every output checked against a float32 reference before timing." + _rounds_note(summary.get("rounds", 1)),
             "",
             "| problem | " + " | ".join(providers) + " |", "|---" * (len(providers) + 1) + "|"]
    for r in summary["rows"]:
        cells = []
        base = r["cells"].get(BASELINE, {})
        for p in providers:
            c = r["cells"].get(p)
            if not c or c["status"] != "ok":
                cells.append(c["status"] if c else "-")
                continue
            r_ = cell_ratio(c, base) if base else None
            ratio = f" ({r_:.2f}x)" if r_ else ""
            if c.get("tbps"):  # KV-cache problems: time and K/V bandwidth
                cells.append(f"{c['ms'] * 1e3:.0f} us, {c['tbps']:.2f} TB/s{ratio}")
            else:
                cells.append(f"{c['tflops']:.0f}{ratio}")
        lines.append(f"| {r['problem']} | " + " | ".join(cells) + " |")
    leader = LEADER in providers
    lines += ["", "Geomeans per dtype (TFLOPS; ratio to cuDNN; worst problem's ratio; % of the bf16 matmul ceiling"
              + ("; the same against FA4" if leader else "") + "):", ""]
    lines += ["| dtype | provider | TFLOPS | vs cuDNN | worst vs cuDNN | % of matmul |"
              + (" vs FA4 | worst vs FA4 |" if leader else ""), "|---|---|---|---|---|---|" + ("---|---|" if leader else "")]
    for dtype, g in summary["geomeans"].items():
        for p in providers:
            t, ratio, worst = g.get(f"{p}_tflops"), g.get(f"{p}_vs_cudnn"), g.get(f"{p}_min_vs_cudnn")
            if t is None or ratio is None:
                continue
            line = f"| {dtype} | {p} | {t:.0f} | {ratio:.3f}x | {worst:.3f}x | {100 * t / summary['bf16_matmul_tflops']:.0f}% |"
            if leader:
                vs, low = g.get(f"{p}_vs_{LEADER}"), g.get(f"{p}_min_vs_{LEADER}")
                line += f" {vs:.3f}x | {low:.3f}x |" if vs is not None else " - | - |"
            lines.append(line)
    lines += ["", "Configs used:", ""]
    for r in summary["rows"]:
        details = "; ".join(f"{p}: {c['detail']}" for p, c in r["cells"].items()
                            if p in ("tuned", "default", "tutorial") and c["status"] == "ok")
        lines.append(f"- {r['problem']}: {details}")
    return "\n".join(lines) + "\n"


def _rounds_note(rounds: int) -> str:
    if rounds == 1:
        return ""
    if rounds == 0:
        return " Runs merged here timed different numbers of rounds (see bench.json)."
    return (f" Each problem's providers took turns over {rounds} rounds, one timing each per round: the time shown "
            "is the median of its rounds, the ratio the median of the rounds' ratios.")


def plot(rows: list[Row], providers: tuple[str, ...], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(rows)), 5))
    width = 0.8 / len(providers)
    for i, p in enumerate(providers):
        values = [r.cells[p].tflops if p in r.cells and r.cells[p].tflops else 0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=p)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], [r.problem for r in rows], rotation=75, fontsize=6)
    ax.set_ylabel("TFLOPS")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _recipe_text(recipe) -> str:
    """An FP8 recipe as a bench cell's detail names it."""
    return f"{recipe.scaling}, hadamard {recipe.hadamard}, sink tile {recipe.sink_tile}"

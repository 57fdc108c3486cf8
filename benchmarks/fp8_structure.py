"""Two kernel-structure experiments behind the FP8 defaults, on one GPU (H200):

    python3 benchmarks/fp8_structure.py persistent OUT.json   # persistent grid x where to warp-specialize
    python3 benchmarks/fp8_structure.py causal-ws OUT.json    # causal kernels warp-specialized anyway

persistent: 128x256 FP8 tiles (4 warps, 2 stages, TMA) on a persistent grid, with the tile loop,
the K/V loop, both or neither warp-specialized (the rendered module's loops edited, so that
`outer` and `both`, which the template does not emit, can be timed beside it), against the
one-program-per-tile warp-specialized kernel and fp16 `attention`.
causal-ws: lifts the check that refuses warp specialization on causal problems and reports
what Triton 3.6 then does (errors over three runs, or the failure).
Both print one line per kernel and write the rows as JSON; `benchmarks/results/2026-11-30-h200-fp8-structure/results.md`
holds their output.
"""
from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import fa_autotune
from fa_autotune.kernels import checks, launcher
from fa_autotune.tune.inputs import fp8_source_inputs, random_inputs
from fa_autotune.tune.measure import time_callable
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.reference import compare, reference_attention

TILE_256 = dict(BLOCK_M=128, BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc")
WS_128 = dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, access="tensor_desc", warp_specialize=True)
_REAL_LOAD = launcher.load_module
_OVERRIDE: dict[str, object] = {}


def _edited_module(config: KernelConfig, where: str):
    """The rendered module of a persistent config with its tile loop and/or K/V loop specialized."""
    src = Path(_REAL_LOAD(config).__file__).read_text()
    if where in ("outer", "both"):
        src = src.replace("for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):",
                          "for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), warp_specialize=True):")
    if where in ("inner", "both"):
        src = re.sub(r"(MASKED=False, DOT_PRECISION=DOT_PRECISION,\s*)WARP_SPECIALIZE=False", r"\1WARP_SPECIALIZE=True",
                     src)
    path = Path(tempfile.mkdtemp()) / f"{config.name}_{where}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _errors(fn, ref, runs: int = 1) -> list[float]:
    out = []
    for _ in range(runs):
        report = compare(fn().float(), ref)
        torch.cuda.synchronize()
        out.append(round(report.rel, 5) if report.finite else float("nan"))
    return out


def _time(calls: dict, rep_ms: float) -> dict[str, float]:
    samples = {k: [] for k in calls}
    for _ in range(3):
        for key, fn in calls.items():
            samples[key].append(time_callable(fn, rep_ms=rep_ms).median_ms)
    return {k: statistics.median(v) for k, v in samples.items()}


def persistent() -> list[dict]:
    launcher.load_module = lambda cfg: _OVERRIDE.get(cfg.name) or _REAL_LOAD(cfg)
    rows = []
    for n in (4096, 16384):
        problem = Problem(16384 // n, 16, 16, n, n, 128, "float8_e4m3fn")
        source = fp8_source_inputs(problem, "cuda", seed=1)
        ref, _ = reference_attention(*source)
        q16, k16, v16 = random_inputs(problem.with_dtype("float16"), "cuda", seed=0)
        judged = fa_autotune.quantize_fp8(*source, block_q=128, block_k=256)
        timed = fa_autotune.quantize_fp8(q16, k16, v16, block_q=128, block_k=256)
        kernels = {"ws (base)": (KernelConfig(**TILE_256, warp_specialize=True), None)}
        for programs in (1, 2):
            config = KernelConfig(**TILE_256, persistent=programs)
            for where in ("plain", "outer", "inner", "both"):
                kernels[f"pers{programs} {where}"] = (config, None if where == "plain" else _edited_module(config, where))
        calls, errors = {"fp16 tuned": lambda: fa_autotune.attention(q16, k16, v16)}, {}
        for name, (config, module) in kernels.items():
            def run(config=config, module=module, inputs=timed):
                _OVERRIDE[config.name] = module
                return fa_autotune.attention_fp8(inputs, config=config)
            errors[name] = _errors(lambda: run(inputs=judged), ref)[0]
            calls[name] = run
        ms = _time(calls, 100)
        for name, value in ms.items():
            rows.append(dict(n=n, kernel=name, ms=value, tflops=problem.tflops(value),
                             vs_fp16=ms["fp16 tuned"] / value, rel_error=errors.get(name)))
            print(f"N={n:6d} {name:18s} {value:7.3f} ms {rows[-1]['tflops']:6.0f} TFLOPS "
                  f"{rows[-1]['vs_fp16']:5.2f}x err={errors.get(name)}", flush=True)
    return rows


def causal_ws() -> list[dict]:
    checks._check_warp_specialize = lambda config, problem, capability: None
    rows = []
    for n, batch in ((4096, 4), (16384, 1), (2048, 2)):
        for fp8 in (True, False):
            problem = Problem(batch, 16, 16, n, n, 128, "float8_e4m3fn" if fp8 else "float16", causal=True)
            q, k, v = random_inputs(problem.with_dtype("float16"), "cuda", seed=0)
            ref, _ = reference_attention(q, k, v, causal=True)
            if fp8:
                x = fa_autotune.quantize_fp8(q, k, v, block_q=128, block_k=256)
                kernels = {"ptr m64n128 (best now)": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3, access="pointer"),
                           "ws m128n256": dict(TILE_256, warp_specialize=True),
                           "ws m128n256 pers1": dict(TILE_256, warp_specialize=True, persistent=1),
                           "ws m128n128": WS_128}
                make = lambda c: (lambda: fa_autotune.attention_fp8(x, causal=True, config=c))
            else:
                kernels = {"fp16 tuned": None, "ws m128n128": WS_128, "ws m128n128 pers1": dict(WS_128, persistent=1),
                           "ws m128n64": dict(WS_128, BLOCK_N=64)}
                make = lambda c: (lambda: fa_autotune.attention(q, k, v, True, config=c))
            calls, errors = {}, {}
            for name, config in kernels.items():
                try:
                    errors[name] = _errors(make(config), ref, runs=3)  # a race shows as a changing or NaN error
                    calls[name] = make(config)
                except Exception as exc:  # the outcome being measured
                    print(n, problem.dtype, name, "FAILED", type(exc).__name__, str(exc)[:200], flush=True)
            for name, value in _time(calls, 60).items():
                rows.append(dict(n=n, dtype=problem.dtype, kernel=name, ms=value, tflops=problem.tflops(value),
                                 errors=errors[name]))
                print(f"N={n:6d} {problem.dtype:14s} {name:24s} {value:7.3f} ms {rows[-1]['tflops']:6.0f} TFLOPS "
                      f"errs={errors[name]}", flush=True)
    return rows


def main() -> int:
    experiments = {"persistent": persistent, "causal-ws": causal_ws}
    if len(sys.argv) != 3 or sys.argv[1] not in experiments or not torch.cuda.is_available():
        print(__doc__, file=sys.stderr)
        return 2
    Path(sys.argv[2]).write_text(json.dumps(experiments[sys.argv[1]](), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

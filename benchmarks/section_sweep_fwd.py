"""Causal Gluon forward grids: the heads per L2 section (the template's _order runs each
section's longest tiles first) at 4, 8 and 16 (the config's `section`) against the L2-sized one
(the launcher's rule for static grids), for the config attention() dispatches (static persistent configs also with
dynamic=True), beside cuDNN, 3 interleaved rounds. Each variant's output is checked against
float32 first.

    OUT=DIR python3 benchmarks/section_sweep_fwd.py      # writes DIR/fwd_section.json
"""
import json
import os

import torch
from fa_autotune.kernels.launcher import l2_section, prepare
from fa_autotune.runtime.dispatch import DISPATCHER
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.inputs import random_inputs
from fa_autotune.tune.measure import time_callable
from fa_autotune.tune.reference import compare, reference_attention
from fa_autotune.bench import sdpa_call

res = []
for (b, h, hkv, n, d, dt) in [(16, 32, 32, 1024, 64, "bfloat16"), (4, 32, 32, 4096, 64, "bfloat16"),
                              (1, 32, 32, 16384, 64, "bfloat16"), (16, 16, 16, 1024, 128, "bfloat16"),
                              (4, 16, 16, 4096, 128, "bfloat16"), (1, 16, 16, 16384, 128, "bfloat16"),
                              (2, 32, 8, 8192, 128, "bfloat16"), (4, 28, 4, 3000, 128, "bfloat16")]:
    p = Problem(b, h, hkv, n, n, d, dt, causal=True)
    q, k, v = random_inputs(p, "cuda")
    ref, _ = reference_attention(q, k, v, causal=True)
    cfg = DISPATCHER.choose(p, "cuda", 0).config
    plans = {}
    grids = [("", cfg)] + ([] if cfg.dynamic else [("dyn_", cfg.with_(dynamic=True))])
    rule = l2_section(q.device, b * h, h // hkv, n, d, 2)  # "secNone": the L2-sized rule's section
    variants = [(f"{tag}sec{sec}", grid.with_(section=sec or rule)) for tag, grid in grids for sec in (4, 8, 16, None)]
    for name, variant in variants:
        out = torch.empty_like(q)
        plan = prepare(variant, q, k, v, out, None, d ** -0.5, 0, True)
        plan(q, k, v, out, None)
        torch.cuda.synchronize()
        report = compare(out.float(), ref)
        if not report.passes(dt):
            raise SystemExit(f"{variant.name} is wrong on {p.key}: rel error {report.rel:.3g}")
        plans[name] = (plan, out)
    cud, ctx = sdpa_call("cudnn", p, q, k, v)
    times = {name: [] for name in plans}
    times["cudnn"] = []
    for r in range(3):
        with ctx():
            times["cudnn"].append(time_callable(cud, rep_ms=60).median_ms)
        for name, (plan, out) in plans.items():
            times[name].append(time_callable(lambda: plan(q, k, v, out, None), rep_ms=60).median_ms)
    row = {"problem": p.key, "config": cfg.name, "ms": times,
           "default_section": rule}
    res.append(row)
    best = {k_: round(min(v_), 4) for k_, v_ in times.items()}
    print(p.key, cfg.name, "default", row["default_section"], best,
          {k_: round(best["cudnn"] / v_, 3) for k_, v_ in best.items()}, flush=True)
json.dump(res, open(os.environ["OUT"] + "/fwd_section.json", "w"), indent=1)

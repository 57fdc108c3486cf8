"""The Gluon backward (Hopper default, dQ inside) on a program-per-tile grid against one
program per SM taking tiles from a counter, with the L2 section (KV heads whose tiles run
longest first) at 1, 4 and 16 (the config's `section`) and at the L2-sized one (causal problems;
without a mask only that one), beside cuDNN, 2 interleaved rounds. Gradients
checked against float32 first: at most twice bf16 PyTorch's error.

    OUT=DIR python3 benchmarks/section_sweep_bwd.py                     # the causal set
    OUT=DIR NAME=gqa PROBS='[[2,32,8,8192,128,0]]' python3 benchmarks/section_sweep_bwd.py
"""
import json
import os
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
import fa_autotune
from fa_autotune.kernels.launcher import BackwardPlan, l2_section
from fa_autotune.spec.config import KernelConfig
from fa_autotune.tune.measure import time_callable
from bwd_sweep import inputs, reference, rel, cudnn_ms, GLUON

CAUSAL = [(16, 16, 16, 1024, 128, True), (16, 32, 32, 1024, 64, True), (8, 32, 32, 2048, 64, True),
          (4, 16, 16, 4096, 128, True), (4, 32, 32, 4096, 64, True), (2, 32, 8, 8192, 128, True)]
PROBLEMS = json.loads(os.environ["PROBS"]) if "PROBS" in os.environ else CAUSAL
res = []
for prob in PROBLEMS:
    b, h, hkv, n, d, causal = prob
    t = inputs(prob)
    q, k, v, dout = t
    causal = bool(causal)
    exact = reference(*t, causal, torch.float32)
    bound = [2 * rel(a, w) + 1e-4 for a, w in zip(reference(*t, causal, torch.bfloat16), exact)]
    out, lse = fa_autotune.attention(q, k, v, causal=causal, return_lse=True)
    base = dict(GLUON, consumers=2, dq_atomic=True,
                **(dict(BLOCK_M=64, num_stages=3) if d > 64 else dict(BLOCK_M=128, num_stages=2)))
    rule = l2_section(q.device, b * hkv, 1, n * (h // hkv), d, 2)  # "secNone": the L2-sized rule's section
    variants = [("tile", base)] + [(f"dyn_sec{s}", dict(base, persistent=1, dynamic=True, section=s or rule))
                                   for s in ((1, 4, 16, None) if causal else (None,))]
    plans = []
    for name, kw in variants:
        grads = tuple(torch.empty_like(x) for x in (q, k, v))
        config = KernelConfig(loop_order="backward", **kw)
        plan = BackwardPlan(config, q, k, v, out, dout, *grads, d ** -0.5, 0, causal)
        call = (q, k, v, out, dout, lse, *grads)
        plan(*call)
        torch.cuda.synchronize()
        errors = [rel(a, w) for a, w in zip(grads, exact)]
        if any(e > bd for e, bd in zip(errors, bound)):
            raise SystemExit(f"{config.name} is wrong on {prob}: relative errors {errors}, bounds {bound}")
        plans.append((name, plan, call, max(errors)))
    times = {name: [] for name, *_ in plans}
    times["cudnn"] = []
    for r in range(2):
        times["cudnn"].append(cudnn_ms(*t, causal))
        for name, plan, call, err in plans:
            times[name].append(time_callable(lambda: plan(*call), warmup_ms=10, rep_ms=60).median_ms)
    row = {"problem": prob, "err": {n: e for n, _, _, e in plans}, "ms": times,
           "default_section": rule}
    res.append(row)
    print(prob, "section", row["default_section"], {k_: round(min(v_), 3) for k_, v_ in times.items()},
          "max err", max(row["err"].values()), flush=True)
json.dump(res, open(os.environ["OUT"] + "/" + os.environ.get("NAME", "bwd_section") + ".json", "w"), indent=1)

"""The shared FlashAttention-3-style Gluon example (../shared/examples/gluon_fa3_fwd_h200.py,
copied next to this script or found through EXAMPLES) against the forward attention()
dispatches and cuDNN, D=128 non-causal, 3 interleaved rounds, in TFLOPS; both outputs are
checked against float32 first.

    EXAMPLES=../shared/examples OUT=DIR python3 benchmarks/example_vs_ours.py
"""
import contextlib
import json
import os
import sys

sys.path.insert(0, os.environ.get("EXAMPLES", os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import gluon_fa3_fwd_h200 as gfa  # noqa: E402
import fa_autotune
from fa_autotune.bench import sdpa_call
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.measure import time_callable
from fa_autotune.tune.reference import compare, reference_attention

res = {}
for dtype in (torch.bfloat16, torch.float16):
    for (B, H, N, D) in [(1, 16, 16384, 128), (4, 16, 4096, 128)]:
        torch.manual_seed(0)
        q, k, v = (torch.randn((B, H, N, D), device="cuda", dtype=dtype) for _ in range(3))
        o = torch.empty_like(q)
        ex = gfa.make_fa_fwd(q, k, v, o, bm=64, stages=2, regs=240, overlap=1, pingpong=0)
        ours = lambda: fa_autotune.attention(q, k, v, False)
        prob = Problem(B, H, H, N, N, D, str(dtype).split(".")[1])
        cud, ctx = sdpa_call("cudnn", prob, q, k, v)
        exact, _ = reference_attention(q, k, v)
        ex()
        for name, got in (("example", o), ("ours", ours())):
            report = compare(got.float(), exact)
            if not report.passes(prob.dtype):
                raise SystemExit(f"{name} is wrong on {prob.key}: rel error {report.rel:.3g}")
        err = (o.float() - ours().float()).abs().max().item()
        flops = 4 * B * H * N * N * D
        key = f"{prob.key}"
        res[key] = {"example": [], "ours": [], "cudnn": [], "ex_vs_ours_maxdiff": err,
                    "ours_kernel": fa_autotune.explain(q, k, v, False)["kernel"]}
        for r in range(3):
            for name, fn in (("example", ex), ("ours", ours), ("cudnn", cud)):
                with (ctx() if name == "cudnn" else contextlib.nullcontext()):
                    ms = time_callable(fn, rep_ms=150).median_ms
                res[key][name].append(flops / ms / 1e9)
        print(key, res[key]["ours_kernel"], {n: [round(x) for x in res[key][n]] for n in ("example", "ours", "cudnn")},
              "maxdiff", err, flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/fa3_vs_ours.json", "w"), indent=1)

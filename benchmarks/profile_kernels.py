"""Launch our dispatched kernel and SDPA cuDNN on one LLM-prefill problem inside NVTX ranges,
so that Nsight Compute can profile exactly those launches side by side:

    ncu --clock-control none --nvtx --nvtx-include "tuned/" --nvtx-include "cudnn/" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --csv --page details python3 benchmarks/profile_kernels.py --head-dim 64 --seqlen 1024 --causal

Warm-up calls (compilation, autotuning, cuDNN plan building) run outside the ranges. Both
outputs are checked against a float32 reference first. Shapes follow the preset: hidden 2048
(heads = 2048 / head_dim) and batch x seqlen = 16384.
"""
from __future__ import annotations

import argparse
import contextlib
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()

    import torch

    import fa_autotune
    from fa_autotune.bench import sdpa_call
    from fa_autotune.tune.inputs import random_inputs
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.reference import compare, reference_attention

    heads = 2048 // args.head_dim
    problem = Problem(16384 // args.seqlen, heads, heads, args.seqlen, args.seqlen, args.head_dim, args.dtype,
                      causal=args.causal)
    q, k, v = random_inputs(problem, "cuda")
    ref, _ = reference_attention(q, k, v, causal=problem.causal)
    cudnn, context = sdpa_call("cudnn", problem, q, k, v)
    calls = {"tuned": (lambda: fa_autotune.attention(q, k, v, problem.causal)), "cudnn": cudnn}
    contexts = {"cudnn": context}
    print(problem.key, fa_autotune.explain(q, k, v, problem.causal)["kernel"], file=sys.stderr)
    for name, fn in calls.items():
        with contexts.get(name, contextlib.nullcontext)():
            for _ in range(3):
                out = fn()
            report = compare(out.float(), ref)
            if not report.passes(problem.dtype):
                raise SystemExit(f"{name} is wrong on {problem.key}: rel error {report.rel:.3g}")
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(name)
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Launch backward configs once each inside NVTX ranges named "bwd", so that
Nsight Compute profiles exactly those launches (warm-up and compilation run outside):

    ncu --clock-control none --nvtx --nvtx-include "bwd/" -k regex:dkdv \
        --section WarpStateStats --section SourceCounters -o OUT \
        python3 benchmarks/profile_backward.py --head-dim 128 --seqlen 4096 CONFIG_JSON [CONFIG_JSON ...]
    ncu -i OUT.ncu-rep --page source --csv --print-source sass   # stall samples per instruction

Each config's gradients are checked against float32 autograd first. Shapes follow llm-prefill
(hidden 2048, batch x seqlen = 16384), bf16.
"""
from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="backward configs as JSON objects")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()

    import torch

    sys.path.insert(0, "benchmarks")
    from bwd_sweep import inputs, plan_for, reference, rel

    heads = 2048 // args.head_dim
    problem = (16384 // args.seqlen, heads, heads, args.seqlen, args.head_dim, args.causal)
    tensors = inputs(problem)
    exact = reference(*tensors, args.causal, torch.float32)
    for text in args.configs:
        cfg, plan, call = plan_for(json.loads(text), problem, tensors)
        for _ in range(3):
            plan(*call)
        torch.cuda.synchronize()
        errors = [rel(a, w) for a, w in zip(call[-3:], exact)]
        if max(errors) > 2e-2:
            raise SystemExit(f"{cfg.name} is wrong on {problem}: relative errors {errors}")
        torch.cuda.nvtx.range_push("bwd")
        plan(*call)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(cfg.name, "errors", [f"{e:.2e}" for e in errors], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

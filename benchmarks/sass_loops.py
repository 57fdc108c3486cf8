"""The SASS instruction mix of each loop of a kernel variant, compiled for sm_90 without a GPU:
how many instructions one K/V step costs, and of which kind (what found the masked steps' cost).

Usage: python3 benchmarks/sass_loops.py '{"language": "gluon", "access": "tensor_desc", "BLOCK_M": 64,
           "BLOCK_N": 128, "num_stages": 2, "persistent": 1}' --head-dim 128 --seqlen 1024 --causal [--out FILE]
Prints every loop (a backward branch) that holds a matrix product or an exp2, with its length and
the commonest opcodes, for every kernel of the variant (the backward's preprocess, dK/dV and dQ passes);
--out FILE keeps each kernel's whole SASS beside FILE, named after the kernel. Uses the cuobjdump that Triton ships
(fa_autotune.kernels.aot.sass_loops).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from fa_autotune.kernels.aot import compile_variant, sass_loops
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the config as JSON")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    config = KernelConfig.from_mapping(json.loads(args.config))
    heads = 2048 // args.head_dim
    problem = Problem(max(1, 16384 // args.seqlen), heads, heads, args.seqlen, args.seqlen, args.head_dim, args.dtype,
                      causal=args.causal)
    result = compile_variant(config, problem, sass=True)
    if result.status != "ok":
        raise SystemExit(f"{config.name}: {result.status}: {result.error}")
    for kernel in result.kernels:  # the forward's main kernel; the backward's preprocess, dK/dV (and dQ) passes
        if not kernel.sass:
            raise SystemExit("no SASS: cuobjdump (shipped with Triton) is missing or cannot read the cubin")
        if args.out:
            args.out.with_name(f"{args.out.stem}.{kernel.kernel}{args.out.suffix}").write_text(kernel.sass)
        print(kernel.kernel, problem.key, f"stack {kernel.stack_bytes} B, spill traffic in the step loops: "
              f"{kernel.step_loop_local_memory}")
        for start, end, ops in sass_loops(kernel.sass):
            if ops["HGMMA"] or ops["MUFU"]:
                print(f"  loop {start:#x}-{end:#x}: {sum(ops.values())} instructions;", dict(ops.most_common(16)))


if __name__ == "__main__":
    main()

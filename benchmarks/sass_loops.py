"""The SASS instruction mix of each loop of a kernel variant, compiled for sm_90 without a GPU:
how many instructions one K/V step costs, and of which kind (what found the masked steps' cost).

Usage: python3 benchmarks/sass_loops.py '{"language": "gluon", "access": "tensor_desc", "BLOCK_M": 64,
           "BLOCK_N": 128, "num_stages": 2, "persistent": 1}' --head-dim 128 --seqlen 1024 --causal [--out FILE]
Prints every loop (a backward branch) that holds a matrix product or an exp2, with its length and
the commonest opcodes; --out keeps the whole SASS. Uses the cuobjdump that Triton ships.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

import fa_autotune.kernels.aot as aot
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.problem import Problem


def sass_of(config: KernelConfig, problem: Problem) -> str:
    """The SASS of the variant's first kernel (the forward's main kernel)."""
    cubins: list[bytes] = []
    keep = aot.resource_usage

    def capture(cubin: bytes):
        cubins.append(cubin)
        return keep(cubin)

    aot.resource_usage = capture
    try:
        result = aot.compile_variant(config, problem)
    finally:
        aot.resource_usage = keep
    if result.status != "ok":
        raise SystemExit(f"{config.name}: {result.status}: {result.error}")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubins[0])
        f.flush()
        return subprocess.run([str(aot._CUOBJDUMP), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def loops(sass: str) -> list[tuple[int, int, collections.Counter]]:
    """(start, end, opcode counts) of each backward branch's body that computes attention."""
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", sass, re.M)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA.*0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in index:
            continue
        body = ins[index[int(m.group(1), 16)]:i + 1]
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for _, t in body)
        if ops["HGMMA"] or ops["MUFU"]:
            out.append((body[0][0], a, ops))
    return out


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
    sass = sass_of(config, problem)
    if args.out:
        args.out.write_text(sass)
    print(config.name, problem.key)
    for start, end, ops in loops(sass):
        print(f"loop {start:#x}-{end:#x}: {sum(ops.values())} instructions;", dict(ops.most_common(16)))


if __name__ == "__main__":
    main()

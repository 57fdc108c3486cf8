"""Backward variants side by side on one GPU: each named config's gradients checked against
float32 first (flash-attn's rule: at most twice PyTorch's same-precision error), then
interleaved timing rounds with SDPA's cuDNN backward beside them.

    python3 benchmarks/bwd_sweep.py --out DIR [--set group_split] [--rounds 3] [--rep-ms 100] [--small]

Writes DIR/bwd_sweep.json and DIR/bwd_sweep.md (TFLOPS, ratio to cuDNN and to the set's
first variant per problem). ``--small`` runs tiny shapes with the Triton backward (on a CPU:
Triton's interpreter, which proves the code path, never a speed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from fa_autotune.kernels.bwd import BackwardPlan
from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.defaults import GLUON_BACKWARD
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.target import environment
from fa_autotune.tune.inputs import random_inputs
from fa_autotune.tune.measure import check_and_time_cudnn, time_callable
from fa_autotune.tune.reference import reference_attention

# issue 41's GQA rows (search_spaces/bwd.yaml, preset fa4-anchors): (B, Hq, Hkv, N, D, causal, dtype)
GQA_ROWS = [(1, 28, 4, 3000, 128, True, "bfloat16"), (2, 32, 4, 4096, 128, True, "float16"),
            (2, 32, 8, 8192, 128, True, "bfloat16"), (4, 32, 8, 4096, 128, False, "bfloat16")]
VARIANT_SETS = {
    # the GQA group over several programs adding dK/dV with fp32 atomics (group_split)
    "group_split": {f"split {n}": GLUON_BACKWARD.with_(group_split=n) for n in (1, 2, 4, 8)}
    | {"split 1 pers dyn": GLUON_BACKWARD.with_(persistent=1, dynamic=True),
       "split 4 pers dyn": GLUON_BACKWARD.with_(group_split=4, persistent=1, dynamic=True)},
}
SMALL_VARIANTS = {"triton 16x16": KernelConfig(loop_order="backward", BLOCK_M=16, BLOCK_N=16, num_warps=4,
                                               num_stages=1)}


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm())


def _grads(q, k, v, dout, causal):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = reference_attention(*leaves, causal=causal)
    return torch.autograd.grad(out, leaves, dout.to(out.dtype))


def run_problem(problem: Problem, variants: dict[str, KernelConfig], device: str, rounds: int, rep_ms: float) -> dict:
    q, k, v = random_inputs(problem, device, seed=0)
    dout = torch.randn_like(q)
    causal = problem.causal
    exact = _grads(q.float(), k.float(), v.float(), dout.float(), causal)
    same = _grads(q, k, v, dout, causal)
    bound = [2 * _rel(p, w) + 1e-4 for p, w in zip(same, exact)]
    leaves = [t.detach().clone() for t in (q, k, v)]
    out, lse = reference_attention(*(t.float() for t in leaves), causal=causal)
    out = out.to(q.dtype)
    lse = lse.contiguous()
    calls, errors, skipped = {}, {}, {}
    for name, config in variants.items():
        got = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        try:
            plan = BackwardPlan(config, q, k, v, out, dout, *got, problem.head_dim ** -0.5, 0, causal)
            plan(q, k, v, out, dout, lse, *got)
        except Exception as exc:  # a variant that cannot run this problem is reported, not timed
            skipped[name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        rels = [_rel(a, w) for a, w in zip(got, exact)]
        if not all(torch.isfinite(a).all() for a in got) or any(r > b for r, b in zip(rels, bound)):
            skipped[name] = f"wrong: relative errors {rels} over the bound {bound}"
            continue
        errors[name] = max(rels)
        calls[name] = (lambda plan=plan, got=got: plan(q, k, v, out, dout, lse, *got))
    times: dict[str, list[float]] = {name: [] for name in calls}
    cudnn: list[float] = []
    for r in range(rounds):
        names = list(calls)[r % max(len(calls), 1):] + list(calls)[:r % max(len(calls), 1)]
        for name in names:
            times[name].append(time_callable(calls[name], rep_ms=rep_ms, device=device).median_ms)
        if device == "cuda":
            cudnn.append(check_and_time_cudnn(problem, device, rep_ms, seed=0, check=r == 0)[0].median_ms)
    ms = {name: statistics.median(t) for name, t in times.items()}
    work = 2.5 * 4.0 * problem.batch * problem.heads_q * problem.seqlen_q * problem.seqlen_k * problem.head_dim
    work /= 2 if causal else 1
    row = {"problem": problem.key, "ms": ms, "tflops": {n: work / m / 1e9 for n, m in ms.items()},
           "rel_error": errors, "skipped": skipped}
    if cudnn:
        row["cudnn_ms"] = statistics.median(cudnn)
        row["vs_cudnn"] = {n: row["cudnn_ms"] / m for n, m in ms.items()}
    first = next(iter(variants))
    if first in ms:
        row["vs_first"] = {n: ms[first] / m for n, m in ms.items()}
    print(json.dumps(row), flush=True)
    return row


def _markdown(result: dict) -> str:
    names = list(result["variants"])
    lines = [f"# Backward sweep `{result['set']}` ({result['environment'].get('gpu', 'cpu')})", "",
             f"Command: `{result['command']}`; TFLOPS count the backward as 2.5x the forward's work; "
             "ratios: cuDNN's time over the variant's, and the first variant's over it.", "",
             "| problem | " + " | ".join(names) + " | cuDNN TFLOPS |", "|---" * (len(names) + 2) + "|"]
    for row in result["rows"]:
        cells = []
        for n in names:
            if n in row["tflops"]:
                cells.append(f"{row['tflops'][n]:.0f} ({row.get('vs_cudnn', {}).get(n, float('nan')):.2f}x cuDNN, "
                             f"{row.get('vs_first', {}).get(n, float('nan')):.2f}x)")
            else:
                cells.append("skipped")
        cudnn = row.get("cudnn_ms")
        work = next(iter(row["tflops"].values()), None)
        ref = (work * next(iter(row["ms"].values())) / cudnn) if cudnn and work else None
        lines.append(f"| {row['problem']} | " + " | ".join(cells) + (f" | {ref:.0f} |" if ref else " | - |"))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", default="group_split", choices=sorted(VARIANT_SETS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--small", action="store_true", help="tiny shapes, the Triton backward (CPU: interpreter)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.small:
        rows = [(1, 4, 2, 64, 32, True, "float16")]
        variants = SMALL_VARIANTS
    else:
        rows, variants = GQA_ROWS, VARIANT_SETS[args.set]
    problems = [Problem(b, hq, hkv, n, n, d, dtype, causal=causal, kind="bwd") for b, hq, hkv, n, d, causal, dtype in rows]
    result = {"set": args.set, "command": "python3 benchmarks/bwd_sweep.py " + " ".join(sys.argv[1:]),
              "environment": environment() if device == "cuda" else {}, "variants": {n: c.to_dict() for n, c in variants.items()},
              "rows": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for problem in problems:  # written after every problem: a run cut short keeps what it measured
        result["rows"].append(run_problem(problem, variants, device, args.rounds, args.rep_ms))
        (args.out / "bwd_sweep.json").write_text(json.dumps(result, indent=2, default=str))
        (args.out / "bwd_sweep.md").write_text(_markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()

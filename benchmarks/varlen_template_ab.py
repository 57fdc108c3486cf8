"""In-process A/B of two template folders' varlen kernel (one config, both grids), beside dense
attention() at the mean length (varlen_bench.against_dense), interleaved rounds: between
processes the dense anchor moves by up to 4%, so a template change is judged in one process.
Each output is checked against float32 attention per sequence before it is timed.

Usage (from the repository root; BASE a copy of another commit's templates, e.g.
`git archive HEAD templates | tar -x -C /tmp/base`):
    python3 benchmarks/varlen_template_ab.py BASE/templates [ROUNDS]
"""
import statistics
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch

from fa_autotune.kernels import render
from fa_autotune.kernels.launcher import VarlenPlan
from fa_autotune.spec.config import KernelConfig
from varlen_bench import against_dense, length_mixes, packed_inputs
from varlen_ragged import check_varlen

ORIG = render.data_dir


def plan_for(cfg, tdir, q, k, v, cu, longest, causal):
    """A call of cfg's varlen kernel rendered from the templates in tdir (its module named by
    its source's hash, so both versions live in one process), as VarlenPlan launches it."""
    render.data_dir = lambda name: Path(tdir) if name == "templates" else ORIG(name)
    render._environment.cache_clear()
    mod = render._import(render.render(cfg))
    render._MODULES[cfg.key] = mod
    out = torch.empty_like(q)
    plan = VarlenPlan(cfg, q, k, v, cu, longest, 128 ** -0.5, causal, out, None)

    def call():
        plan(q, k, v, cu, cu, out, None)
        return out
    return call


BASE = dict(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1)
BASE_TEMPLATES = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
cases = [("64 seqs 64-2048", False), ("64 seqs 64-2048", True), ("64 seqs of 1024", False), ("16 seqs 256-4096", False)]
for name, causal in cases:
    lens = length_mixes()[name]
    q, k, v, cu = packed_inputs(lens)
    calls = {}
    for grid, extra in (("dyn", {"dynamic": True}), ("static", {})):
        cfg = KernelConfig.from_mapping({**BASE, **extra})
        for label, tdir in (("base", BASE_TEMPLATES), ("new", "templates")):
            fn = plan_for(cfg, tdir, q, k, v, cu, max(lens), causal)
            check_varlen(fn(), q, k, v, lens, causal)
            calls[f"{grid}-{label}"] = fn
    samples, stats = against_dense(calls, lens, causal, rounds)
    print(f"{name} causal={causal}:", flush=True)
    for n, (ms, tf, ratio) in stats.items():
        print(f"   {n:12s} {ms:.4f} ms {tf:.0f} TF vs dense {ratio:.3f}", flush=True)
    for grid in ("dyn", "static"):
        sp = statistics.median(a / b for a, b in zip(samples[f"{grid}-base"], samples[f"{grid}-new"]))
        print(f"   {grid}: new speed vs base {sp:.3f}", flush=True)
    del q, k, v, cu, calls
    torch.cuda.empty_cache()

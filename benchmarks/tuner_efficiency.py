"""How well `fa-autotune tune` spends its trials, on a GPU.

Three measurements:
- statuses: for the tunes already run into a database, each study's trials by status, and
  the share that ended invalid_config or out_of_resources (the search must spend at most
  10% there);
- census (no GPU): configs drawn from what the sampler may propose on a preset's problems,
  compiled ahead of time for sm_90: the share that would fail to compile or fit;
- sample efficiency: per problem, an exhaustive grid over the space (`--sampler grid`),
  `tune` as a user runs it (TPE, default budget, warm start) and TPE without the warm start,
  each into its own database; then the three winners re-timed side by side in interleaved
  rounds on one set of inputs. The default tune must land within 2% of the grid's best.

    python3 benchmarks/tuner_efficiency.py grid --out DIR          # GPU 0: the grids
    python3 benchmarks/tuner_efficiency.py tune --out DIR          # another GPU at the same time
    python3 benchmarks/tuner_efficiency.py cold --out DIR          # (TPE without the warm start)
    python3 benchmarks/tuner_efficiency.py compare --out DIR       # once both have run
    python3 benchmarks/tuner_efficiency.py statuses --db URL ...   # any tune's databases
    python3 benchmarks/tuner_efficiency.py census --preset quick   # CPU: compile what may be proposed

`compare` writes DIR/sample_efficiency.json and .md. The problems are head dims 192 and
256 (grids of 66 to 116 configs that fit), none of them a shipped problem.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBLEMS = [  # (name, tune flags): not in the shipped H200 file, so the warm start has only neighbours
    ("b2_h16_n8192_d256_causal_bf16", ["--batch", "2", "--heads", "16", "--seqlen", "8192", "--head-dim", "256",
                                       "--causal", "--dtype", "bfloat16"]),
    ("b4_h16_n4096_d192_fp16", ["--batch", "4", "--heads", "16", "--seqlen", "4096", "--head-dim", "192",
                                "--no-causal", "--dtype", "float16"]),
    ("b1_h32_kv8_n8192_d256_bf16", ["--batch", "1", "--heads", "32", "--kv-heads", "8", "--seqlen", "8192",
                                    "--head-dim", "256", "--no-causal", "--dtype", "bfloat16"]),
]
RUNS = {"grid": ["--sampler", "grid"], "tune": [], "cold": ["--no-warm-start"]}  # what each database holds


def _url(out: Path, run: str) -> str:
    return f"sqlite:///{(out / f'{run}.sqlite').resolve()}"


def _tune(out: Path, run: str) -> None:
    for name, flags in PROBLEMS:
        command = [sys.executable, "-m", "fa_autotune", "tune", "--quiet", "--db", _url(out, run), *RUNS[run], *flags]
        print("$", " ".join(command[1:]), flush=True)
        with open(out / f"{run}-{name}.log", "w") as log:
            subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)


def statuses(urls: list[str]) -> list[dict]:
    """Per study: trials by status (Optuna's trials, so a proposal the space refused counts)."""
    import optuna
    from collections import Counter

    from fa_autotune.store import connect

    out = []
    for url in urls:
        storage = connect(url).optuna_storage()
        for summary in optuna.get_all_study_summaries(storage):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            counts = Counter(t.user_attrs.get("status", str(t.state.name).lower()) for t in study.trials)
            total = sum(counts.values())
            wasted = counts.get("invalid_config", 0) + counts.get("out_of_resources", 0)
            out.append({"db": url, "study": summary.study_name, "trials": total, "statuses": dict(counts),
                        "invalid_or_out_of_resources": wasted, "share": wasted / total if total else None})
    return out


def census(preset: str, sample: int, seed: int, jobs: int) -> dict:
    """No GPU needed: per problem of ``preset``, ``sample`` configs drawn uniformly from what the
    sampler may propose (the sm90 space's constraints and the static shared-memory check, as
    `tune` filters them) compiled ahead of time for sm_90, and their statuses. Whatever the
    sampler picks comes from this set, so its failure share bounds what a study can hit."""
    import random
    from collections import Counter

    from fa_autotune.kernels import resources
    from fa_autotune.kernels.aot import HOPPER, compile_many
    from fa_autotune.spec.space import load_space

    space = load_space("fwd")
    arch = space.for_arch("sm90")
    rows = []
    for problem in space.presets[preset].problems:
        feasible = [c.config for c in arch.grid(problem) if resources.fits(c.config, problem, HOPPER)]
        drawn = random.Random(seed).sample(feasible, min(sample, len(feasible)))
        results = compile_many(drawn, problem, HOPPER, jobs=jobs)
        counts = Counter(r.status for r in results)
        rows.append({"problem": problem.key, "feasible": len(feasible), "compiled": len(results),
                     "statuses": dict(counts),
                     "failed": {r.config.name: r.status for r in results if r.status != "ok"}})
        print(f"{problem.key}: {len(feasible)} feasible, {len(results)} compiled: {dict(counts)}", flush=True)
    return {"command": " ".join(sys.argv), "commit": os.environ.get("FA_AUTOTUNE_COMMIT"), "preset": preset,
            "sample": sample, "seed": seed, "rows": rows}


def _winner(url: str, key: str):
    from fa_autotune.store import connect, queries

    found = [w for w in queries.best(connect(url)) if w.problem.key == key]
    return found[0] if found else None


def compare(out: Path, rounds: int, rep_ms: float) -> dict:
    """The winners of the three runs per problem, re-timed in interleaved rounds."""
    import torch

    from fa_autotune.bench import config_call
    from fa_autotune.spec.target import environment
    from fa_autotune.store import connect, queries
    from fa_autotune.tune.inputs import random_inputs
    from fa_autotune.tune.measure import time_callable
    from fa_autotune.tune.reference import compare as rel_error, reference_attention

    keys = sorted({w.problem.key for w in queries.best(connect(_url(out, "grid")))})
    rows = []
    for key in keys:
        winners = {run: _winner(_url(out, run), key) for run in RUNS if (out / f"{run}.sqlite").exists()}
        problem = winners["grid"].problem
        q, k, v = random_inputs(problem, "cuda", seed=0)
        ref, _ = reference_attention(q, k, v, causal=problem.causal, causal_align=problem.causal_align)
        calls = {}
        for run, w in winners.items():
            if w is None:
                continue
            calls[run] = config_call(w.config, problem, q, k, v)
            error = rel_error(calls[run](), ref)
            assert error.passes(problem.dtype), (run, key, error)
        times = {run: [] for run in calls}
        for _ in range(rounds):
            for run, fn in calls.items():
                times[run].append(time_callable(fn, rep_ms=rep_ms).median_ms)
        med = {run: statistics.median(t) for run, t in times.items()}
        trials = {run: len([t for t in queries.trials(connect(_url(out, run))) if t.problem == key
                            and t.phase == "search"]) for run in calls}
        rows.append({"problem": key, "grid_size": trials.get("grid"),
                     "winners": {run: winners[run].config.name for run in calls},
                     "median_ms": med, "rounds_ms": times, "search_measurements": trials,
                     "grid_best_over": {run: med["grid"] / med[run] for run in med}})
        torch.cuda.empty_cache()
    result = {"command": " ".join(sys.argv), "commit": os.environ.get("FA_AUTOTUNE_COMMIT"),  # the device copy has no .git
              "environment": environment(), "rounds": rounds, "rep_ms": rep_ms,
              "rows": rows, "statuses": statuses([_url(out, run) for run in RUNS if (out / f"{run}.sqlite").exists()])}
    (out / "sample_efficiency.json").write_text(json.dumps(result, indent=2, default=str))
    lines = ["| problem | grid configs | grid best | tune (default) | ratio | tune without warm start | ratio |",
             "|---|---|---|---|---|---|---|"]
    def cells(r: dict, run: str) -> str:
        if run not in r["median_ms"]:
            return "- | -"
        return f"{r['median_ms'][run]:.4f} ms | {r['grid_best_over'][run]:.3f}"

    for r in rows:
        lines.append(f"| {r['problem']} | {r['grid_size']} | {r['median_ms']['grid']:.4f} ms | "
                     f"{cells(r, 'tune')} | {cells(r, 'cold')} |")
    (out / "sample_efficiency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("grid", "tune", "cold", "compare", "statuses", "census"))
    parser.add_argument("--out", type=Path, default=Path("tuner-efficiency"))
    parser.add_argument("--db", action="append", default=[], help="statuses: database URLs to read")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--preset", default="quick", help="census: the fwd preset whose problems to compile for")
    parser.add_argument("--sample", type=int, default=40, help="census: configs drawn per problem")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="census: compile processes")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase == "grid":
        _tune(args.out, "grid")
    elif args.phase in ("tune", "cold"):
        _tune(args.out, args.phase)
    elif args.phase == "compare":
        compare(args.out, args.rounds, args.rep_ms)
    elif args.phase == "census":
        result = census(args.preset, args.sample, args.seed, args.jobs)
        (args.out / f"census-{args.preset}.json").write_text(json.dumps(result, indent=2))
    else:
        print(json.dumps(statuses(args.db), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

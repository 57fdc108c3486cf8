"""How many trials does TPE need to come within 2% of the exhaustive grid's best?

Step 1 (GPU): measure every valid config of a problem with the grid sampler:
    fa-autotune tune --sampler grid --study grid --db URL --batch 4 --heads 16 --seqlen 4096 --head-dim 128
Step 2 (anywhere, no GPU): replay samplers against those measurements:
    python3 benchmarks/sample_efficiency.py --db URL --out DIR [--seeds 20]

The replay runs the tuner's own sampler settings (fa_autotune.tune.search.make_sampler) and
proposal logic (SearchSpace.suggest) with Optuna; each proposed config's objective is its
grid measurement, so a replay trial costs what a tuning trial that hits the database costs.
Without warm start (the real tuner also enqueues defaults and neighbours' winners).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fa_autotune.spec.config import KernelConfig  # noqa: E402
from fa_autotune.spec.defaults import default_for  # noqa: E402
from fa_autotune.tune.search import FAILED_VALUE, make_sampler  # noqa: E402
from fa_autotune.spec.space import load_space  # noqa: E402
from fa_autotune.store import connect  # noqa: E402
from fa_autotune.store.filters import Filters  # noqa: E402
from fa_autotune.store.queries import trials  # noqa: E402
from fa_autotune.store.models import ProblemModel  # noqa: E402
from fa_autotune.spec.target import GpuInfo  # noqa: E402

TARGET = 1.02
# The tuner answers a repeated proposal from the database; it costs no measurement, so
# trials are counted as distinct configs measured, with repeats capped at this factor.
DUPLICATE_ALLOWANCE = 4


def grid_results(db, study_prefix: str) -> dict[str, dict]:
    """problem key -> {config key: median ms (inf when it failed)} from the grid studies."""
    out: dict[str, dict] = {}
    for row in trials(db, Filters()):
        if row.phase != "search" or not (row.study_name or "").startswith(study_prefix + ":"):
            continue
        config = KernelConfig.from_stored(row.config)
        value = row.median_ms if row.status == "ok" and config is not None else float("inf")
        if config is not None:
            out.setdefault(row.problem, {})[config.key] = value
    return out


def replay(space, problem, values: dict[str, float], sampler: str, seed: int, limit: int,
           warm: KernelConfig | None = None) -> int | None:
    """Trials until the best found is within TARGET of the grid best, or None."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best_possible = min(values.values())
    study = optuna.create_study(direction="minimize", sampler=make_sampler(sampler, seed))
    if warm is not None:
        study.enqueue_trial({p.name: getattr(warm, p.name) for p in space.parameters})
    best = float("inf")
    seen: set[str] = set()
    for _ in range(limit * DUPLICATE_ALLOWANCE):
        trial = study.ask()
        params = space.suggest(lambda n, c: trial.suggest_categorical(n, list(c)), problem)
        value = float("inf")
        if space.violated(params, problem) is None:
            key = KernelConfig.from_mapping(params).key
            seen.add(key)
            value = values.get(key, float("inf"))
        if value == float("inf"):
            trial.report(FAILED_VALUE, 0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
            best = min(best, value)
        if best <= best_possible * TARGET:
            return len(seen)
        if len(seen) >= limit:
            break
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--study", default="grid")
    args = parser.parse_args()
    db = connect(args.db)
    space = load_space()
    results = []
    with db.session() as s:
        problems = {p.key: p.to_problem() for p in s.query(ProblemModel).all()}
    for key, values in sorted(grid_results(db, args.study).items()):
        problem = problems[key]
        gpu_name = trials(db, Filters(problem=key), limit=1)[0].gpu
        gpu = _gpu_of(db, key)
        arch_space = space.for_arch(gpu.arch)
        grid = arch_space.grid(problem)
        measured_ok = {k: v for k, v in values.items() if v != float("inf")}
        best_key = min(measured_ok, key=measured_ok.get)
        best_cfg = next(c for c in grid if c.key == best_key)
        entry = {"problem": key, "gpu": gpu_name, "grid_valid_configs": len(grid), "measured": len(values),
                 "passed": len(measured_ok), "grid_best_ms": measured_ok[best_key], "grid_best_config": best_cfg.name}
        default = default_for(problem, gpu)
        for label, sampler, warm in (("tpe", "tpe", None), ("tpe_default_start", "tpe", default),
                                     ("random", "random", None)):
            needed = [replay(arch_space, problem, values, sampler, seed, len(grid), warm) for seed in range(args.seeds)]
            found = [n for n in needed if n is not None]
            entry[label] = {"trials_to_2pct": needed, "median": statistics.median(found) if found else None,
                              "max": max(found) if found else None, "misses": len(needed) - len(found),
                              "median_fraction_of_grid": (statistics.median(found) / len(grid)) if found else None}
        results.append(entry)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sample_efficiency.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"Trials to reach within 2% of the grid's best ({args.seeds} seeds each; median / max, misses = "
             "never within 2% before exhausting the grid's size)", "",
             "| problem | valid grid | grid best | TPE | TPE % of grid | TPE + default start | random |",
             "|---|---|---|---|---|---|---|"]

    def cell(d):
        return f"{d['median']} / {d['max']} ({d['misses']} misses)"

    for e in results:
        t = e["tpe"]
        lines.append(f"| {e['problem']} | {e['grid_valid_configs']} | {e['grid_best_ms']:.3f} ms `{e['grid_best_config']}` "
                     f"| {cell(t)} | {100 * (t['median_fraction_of_grid'] or 0):.0f}% | {cell(e['tpe_default_start'])} "
                     f"| {cell(e['random'])} |")
    text = "\n".join(lines) + "\n"
    (args.out / "sample_efficiency.md").write_text(text)
    print(text)


def _gpu_of(db, problem_key: str) -> GpuInfo:
    from sqlalchemy import select

    from fa_autotune.store.models import GpuModel, MeasurementModel, ProblemModel as P

    with db.session() as s:
        gpu = s.scalar(select(GpuModel).join(MeasurementModel, MeasurementModel.gpu_id == GpuModel.id)
                       .join(P, MeasurementModel.problem_id == P.id).where(P.key == problem_key).limit(1))
        return gpu.to_gpu()


if __name__ == "__main__":
    main()

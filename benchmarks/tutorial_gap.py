"""How much the wider search space buys over the Triton tutorial's config list, read from a
tuning database instead of timed side by side: per problem, the fastest search-phase
median of any config against the fastest of a tutorial-list config (same GPU, same
software and template hash).

    python3 benchmarks/tutorial_gap.py --db sqlite:///tune.sqlite --template-hash HASH [--gpu H200]

Search-phase timings (50 ms bursts) run a few percent fast and are noisy; `fa-autotune
bench` (interleaved, side by side) is the measurement; this is a cross-check.
"""
from __future__ import annotations

import argparse
import math

from fa_autotune.spec.config import KernelConfig
from fa_autotune.spec.space import load_space
from fa_autotune.store import connect
from fa_autotune.store.filters import Filters
from fa_autotune.store.queries import trials


def search_timings(url: str, gpu: str, template_hash: str) -> list[tuple[str, KernelConfig, float]]:
    """(problem key, config, median ms) of every passing search-phase measurement."""
    rows = trials(connect(url), Filters(gpu=gpu, status="ok", template_hash=template_hash))
    return [(r.problem, cfg, r.median_ms) for r in rows
            if r.phase == "search" and (cfg := KernelConfig.from_stored(r.config)) is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--template-hash", required=True)
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--preset", default="llm-prefill")
    args = parser.parse_args()
    tutorial = load_space("tutorial").for_arch("sm90")
    rows = search_timings(args.db, args.gpu, args.template_hash)
    print("| problem | tutorial-list configs measured | best tutorial-list / best overall (time) |\n|---|---|---|")
    ratios = []
    for problem in load_space("fwd").presets[args.preset].problems:
        grid = set(tutorial.grid(problem))
        mine = [(cfg, ms) for key, cfg, ms in rows if key == problem.key]
        best_all = min((ms for _, ms in mine), default=math.inf)
        best_tut = min((ms for cfg, ms in mine if cfg in grid), default=math.inf)
        ratio = best_tut / best_all if math.isfinite(best_tut) else None
        if ratio:
            ratios.append(ratio)
        measured = len({cfg for cfg, _ in mine if cfg in grid})
        print(f"| {problem.key} | {measured} of {len(grid)} | {f'{ratio:.3f}' if ratio else '-'} |")
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    print(f"\nGeomean over {len(ratios)} problems: {geo:.3f}")


if __name__ == "__main__":
    main()

"""PNG plots of a results database: TFLOPS of the winner per problem, and each study's
best-so-far against trial number."""
from __future__ import annotations

from pathlib import Path

from .errors import FaAutotuneError
from .store import Database, queries
from .store.filters import Filters


def write_report(db: Database, out_dir: str | Path, filters: Filters = Filters()) -> list[Path]:
    try:
        import matplotlib
    except ImportError:
        raise FaAutotuneError("fa-autotune report needs matplotlib: pip install 'fa-autotune[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    rows = queries.best(db, filters)
    if rows:
        fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows)), 5))
        labels = [f"{r.problem.key}\n{r.gpu.name}" if len({x.gpu.name for x in rows}) > 1 else r.problem.key for r in rows]
        ax.bar(range(len(rows)), [r.tflops for r in rows], color="tab:blue")
        ax.set_xticks(range(len(rows)), labels, rotation=80, fontsize=7)
        ax.set_ylabel("TFLOPS (winner, re-timed)")
        ax.set_title("Best config per problem")
        fig.tight_layout()
        paths.append(out / "tflops_per_problem.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    progress = queries.search_progress(db, filters)
    if progress:
        fig, ax = plt.subplots(figsize=(9, 5))
        studies = sorted({p.study_name for p in progress})
        for study in studies:
            points = [p for p in progress if p.study_name == study and p.best_so_far_ms is not None]
            if points:
                final = points[-1].best_so_far_ms
                ax.plot([p.trial for p in points], [final / p.best_so_far_ms for p in points], lw=1,
                        label=points[0].problem if len(studies) <= 12 else None)
        ax.set_xlabel("trial")
        ax.set_ylabel("best so far (fraction of the study's final best speed)")
        ax.set_title("Search convergence")
        if len(studies) <= 12:
            ax.legend(fontsize=6)
        fig.tight_layout()
        paths.append(out / "search_convergence.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths

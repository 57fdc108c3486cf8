"""The progress display of `tune --gpus` (the workers' combined count, read from the database)."""
from __future__ import annotations

import sys

from rich.console import Console

from fa_autotune.store.queries import LiveRow
from fa_autotune.tune.progress import WorkersProgress


def test_workers_progress_prints_a_line_when_it_moved(capsys):
    console = Console(file=sys.stdout, force_terminal=False)
    with WorkersProgress(["p1", "p2"], 3, 2, console=console, every=0.0) as progress:
        progress.update([LiveRow("p1", 1, 0, 1.0), LiveRow("p2", 0, 0, None)])
        progress.update([LiveRow("p1", 1, 0, 1.0), LiveRow("p2", 0, 0, None)])  # no change: no line
        last = progress.update([LiveRow("p1", 5, 1, 1.0), LiveRow("p2", 3, 0, 2.0)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["progress: 1/6 configs measured by 2 workers, 0/2 problems searched",
                     "progress: 6/6 configs measured by 2 workers, 2/2 problems searched, 1 failed configs"]
    assert last == lines[-1].removeprefix("progress: ")

"""The progress display of `tune --gpus` (the workers' combined count, read from the database)."""
from __future__ import annotations

import sys

from rich.console import Console

from fa_autotune.tune import progress as progress_module
from fa_autotune.tune.progress import WorkersProgress


def test_workers_progress_prints_a_line_when_it_moved(capsys, monkeypatch):
    """In a log: a line when the count moved and `every` seconds passed; a move inside the
    window is printed at the next poll after it (never lost); the finished line counts
    every problem searched."""
    now = [0.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    console = Console(file=sys.stdout, force_terminal=False)
    with WorkersProgress(["p1", "p2"], 3, 2, console=console, every=30.0) as progress:
        progress.update({"p1": 1, "p2": 0}, 0)
        now[0] = 10.0
        progress.update({"p1": 3, "p2": 0}, 0)  # moved, but inside the window: held back
        now[0] = 40.0
        progress.update({"p1": 3, "p2": 0}, 0)  # same count as the held-back move: shown now
        now[0] = 80.0
        progress.update({"p1": 3, "p2": 0}, 0)  # nothing new: no line
        last = progress.update({"p1": 5, "p2": 1}, 1, finished=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["progress: 1/6 configs settled by 2 workers, 0/2 problems searched",
                     "progress: 3/6 configs settled by 2 workers, 1/2 problems searched",
                     "progress: 4/6 configs settled by 2 workers, 2/2 problems searched, 1 failed configs"]
    assert last == lines[-1].removeprefix("progress: ")

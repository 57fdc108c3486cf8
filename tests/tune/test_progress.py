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


def test_tune_progress_fits_80_columns_and_never_counts_past_its_total():
    """The bars of a tune in a terminal 80 columns wide: labels, bars, counts and times all
    shown, the problem's key and best config under them cut to the width; a config proposed
    again (answered from the database) does not move the count, which stops at the total."""
    import io

    from fa_autotune.spec.config import KernelConfig
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.progress import RichReporter
    from fa_autotune.tune.search import ProblemOutcome

    live = Console(file=io.StringIO(), width=80, force_terminal=True)
    reporter = RichReporter(console=live)
    problems = [Problem(4, 32, 8, 16384, 16384, 128, "bfloat16", causal=True), Problem(1, 2, 2, 64, 64, 32, "float16")]
    reporter.start(problems, 4, interpreter=False)
    try:
        outcome = ProblemOutcome(problems[0], "study")
        reporter.problem_started(0, outcome, 4)
        outcome.best, outcome.best_ms, outcome.best_tflops = KernelConfig(BLOCK_M=128, BLOCK_N=64), 1.0, 512.0
        outcome.statuses.update({"ok": 5, "compile_error": 1})
        for settled in (1, 1, 2, 2, 3, 4, 4):  # seven trials, four distinct configs
            outcome.trials = settled
            reporter.trial_done(outcome, "ok", outcome.best, 1.0)
        screen = io.StringIO()
        Console(file=screen, width=80, force_terminal=True, color_system=None).print(
            reporter.progress.get_renderable())
    finally:
        reporter.finish([])
    lines = screen.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    overall = next(line for line in lines if line.startswith("all problems"))
    current = next(line for line in lines if line.startswith("problem 1/2"))
    assert "━" in overall and "4/4" in overall and "eta" in overall
    assert "4/4" in current and "7/4" not in screen.getvalue()
    assert lines[2].startswith("b4_hq32_hkv8_nq16384_nk16384_d128_bfloat16_causal")
    assert lines[3].startswith("best 512.0 TFLOPS attn_fwd_") and lines[3].endswith("…")


def test_tune_progress_in_a_log_is_a_line_per_problem_not_the_summary(capsys):
    from fa_autotune.spec.problem import Problem
    from fa_autotune.tune.progress import RichReporter
    from fa_autotune.tune.search import ProblemOutcome

    reporter = RichReporter(console=Console(file=sys.stdout, force_terminal=False))
    problem = Problem(1, 2, 2, 64, 64, 32, "float16")
    reporter.start([problem], 3, interpreter=True)
    outcome = ProblemOutcome(problem, "study", trials=1)  # resumed: one config settled before
    reporter.problem_started(0, outcome, 3)
    for settled in (2, 2, 3):
        outcome.trials = settled
        reporter.trial_done(outcome, "ok", None, None)
    reporter.problem_finished(outcome)
    reporter.finish([outcome])
    out = capsys.readouterr().out
    assert "progress: 1/1 problems, 2/2 configs: b1_hq2_hkv2_nq64_nk64_d32_float16_full searched (3 configs" in out
    assert "tuned problem" not in out and "━" not in out

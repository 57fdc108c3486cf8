"""Live progress of a tune (rich) and the summary table at its end."""
from __future__ import annotations

import time
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..spec.candidate import Candidate
from ..spec.problem import Problem
from .search import ProblemOutcome

INTERPRETER_NOTE = ("No CUDA GPU: kernels run in Triton's interpreter on the CPU. Timings are interpreter "
                    "timings, not GPU timings; the pipeline and the database are otherwise the same.")


class _TuneProgress(Progress):
    """Bars with short labels, so they fit 80 columns, and under them the current problem's
    key and its best config and failures so far, each one line cut to the width."""

    def __init__(self, *columns, **kwargs) -> None:
        self.lines: list[str] = []  # before Progress's own set-up, which renders once
        super().__init__(*columns, **kwargs)

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        for line in self.lines:
            yield Text(line, no_wrap=True, overflow="ellipsis")


class RichReporter:
    """On a terminal: a bar of configs settled over all problems (of those this run set out
    to settle, ETA) and one for the current problem, its key and its best config so far
    and failures by status under them. Elsewhere (a log, CI): a line per finished problem.
    Counts are distinct configs settled, never trials: a config the sampler proposes again
    (answered from the database) does not move them, so done never exceeds the total."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self.progress = _TuneProgress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self.total_task = None
        self.problem_task = None
        self.started = time.monotonic()
        self.statuses: Counter = Counter()
        self.interpreter = False
        self.problems = 0
        self.finished = 0
        self.target = 0
        self.base = 0  # configs the current problem's study had settled when this run took it up
        self.done = 0  # configs settled by this run in the problems finished
        self.total = 0  # configs this run set out to settle in the problems taken up so far

    def start(self, problems: list[Problem], trials: int, interpreter: bool) -> None:
        self.interpreter, self.problems = interpreter, len(problems)
        if interpreter:
            self.console.print(f"[yellow]{INTERPRETER_NOTE}[/yellow]")
        self.console.print(f"Tuning {len(problems)} problem(s).")
        if self.live:
            self.progress.start()
        self.total_task = self.progress.add_task("all problems", total=None)
        self.problem_task = self.progress.add_task("", total=None, visible=False)  # shown once a problem starts

    def _settled(self, outcome: ProblemOutcome) -> int:
        """Configs of the current problem this run has settled, up to its target."""
        return max(0, min(outcome.trials, self.target) - self.base)

    def problem_started(self, index: int, outcome: ProblemOutcome, target: int) -> None:
        self.target = target
        self.base = min(outcome.trials, target)
        self.total += target - self.base
        self.progress.update(self.total_task, total=self.total, completed=self.done)
        self.progress.reset(self.problem_task, total=target, completed=self.base, visible=True,
                            description=f"problem {index + 1}/{self.problems}")
        self.progress.lines = [outcome.problem.key]

    def trial_done(self, outcome: ProblemOutcome, status: str, config: Candidate | None, ms: float | None) -> None:
        self.progress.update(self.total_task, completed=self.done + self._settled(outcome))
        self.progress.update(self.problem_task, completed=self.base + self._settled(outcome))
        detail = self._detail(outcome)
        self.progress.lines = [outcome.problem.key] + ([detail] if detail else [])

    def _detail(self, outcome: ProblemOutcome) -> str:
        parts = []
        if outcome.best is not None:  # TFLOPS mean nothing in the interpreter
            speed = "" if self.interpreter else f" {outcome.best_tflops:.1f} TFLOPS"
            parts.append(f"best{speed} {outcome.best.name}")
        failures = {k: v for k, v in outcome.statuses.items() if k != "ok"}
        if failures:
            parts.append("failed: " + ", ".join(f"{k}={v}" for k, v in sorted(failures.items())))
        return " | ".join(parts)

    def problem_finished(self, outcome: ProblemOutcome) -> None:
        self.statuses.update(outcome.statuses)
        self.done += self._settled(outcome)
        self.finished += 1
        self.progress.update(self.total_task, completed=self.done)
        if not self.live:  # a log or CI: a progress line per problem; the summary comes once, at the end
            print(f"progress: {self.finished}/{self.problems} problems, {self.done}/{self.total} configs: "
                  f"{outcome.problem.key} searched ({outcome.trials} configs, {outcome.seconds:.1f} s)",
                  file=self.console.file, flush=True)

    def finish(self, outcomes: list[ProblemOutcome]) -> None:
        self.progress.lines = []
        if self.live:
            self.progress.stop()


_COLUMNS = ("problem", "best config", "ms", "TFLOPS", "vs before", "vs cuDNN", "ties", "configs", "new", "reused",
            "failures", "wall s")


def _speedup(reference_ms: float | None, best_ms: float | None, interpreter: bool) -> float | None:
    if interpreter or not reference_ms or not best_ms:
        return None
    return reference_ms / best_ms


def _cells(o: ProblemOutcome, interpreter: bool) -> tuple[str, ...]:
    """One problem's summary. vs before: the winner's speed over what a fresh install runs
    for the problem (the shipped file's config, else the built-in default, named), vs cuDNN:
    over SDPA's cuDNN backend, both timed in the winner's interleaved rounds. configs:
    distinct configs its study has settled (all runs); new: trials measured in this run;
    reused: configs answered from measurements this run did not make (earlier runs, or
    another run at the same time), each counted once: a config the sampler proposes again in
    this run is neither. Speeds mean nothing in the interpreter: '-'."""
    failures = ", ".join(f"{k}={v}" for k, v in sorted(o.statuses.items()) if k != "ok") or "-"
    tflops = f"{o.best_tflops:.1f}" if o.best_tflops and not interpreter else "-"
    before = _speedup(o.baseline_ms, o.best_ms, interpreter)
    cudnn = _speedup(o.cudnn_ms, o.best_ms, interpreter)
    return (o.problem.key, o.best.name if o.best else "(none passed)", f"{o.best_ms:.4f}" if o.best_ms else "-",
            tflops, f"{before:.2f}x {o.baseline_source}" if before else "-", f"{cudnn:.2f}x" if cudnn else "-",
            str(o.ties or "-"), str(o.trials), str(o.new_trials), str(o.reused), failures, f"{o.seconds:.1f}")


def summary_total(outcomes: list[ProblemOutcome], interpreter: bool) -> str | None:
    """What the tune bought over all its problems: the winners' summed time against the
    configs a fresh install runs (shipped or default) and against SDPA's cuDNN, each over
    the problems where both were timed. None in the interpreter (its timings are not speeds)."""
    if interpreter:
        return None
    parts = []
    for name, attr in (("the shipped or default configs", "baseline_ms"), ("SDPA's cuDNN backend", "cudnn_ms")):
        pairs = [(o.best_ms, getattr(o, attr)) for o in outcomes if o.best_ms and getattr(o, attr)]
        if pairs:
            ours, theirs = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            parts.append(f"{theirs / ours:.2f}x {name} ({ours:.3f} ms against {theirs:.3f} ms over "
                         f"{len(pairs)} problem{'s' if len(pairs) != 1 else ''})")
    return ("Total: the tuned configs run at " + "; ".join(parts)) if parts else None


def summary_line(o: ProblemOutcome, interpreter: bool) -> str:
    return "tuned " + "; ".join(f"{name}: {cell}" for name, cell in zip(_COLUMNS, _cells(o, interpreter)))


def summary_table(outcomes: list[ProblemOutcome], interpreter: bool) -> Table:
    table = Table(title="fa-autotune: best config per problem", show_lines=False)
    for column in _COLUMNS:
        table.add_column("ms (interpreter)" if interpreter and column == "ms" else column, overflow="fold")
    for o in outcomes:
        table.add_row(*(escape(cell) for cell in _cells(o, interpreter)))  # text, never rich markup
    return table


class WorkersProgress:
    """One display for the workers of `tune --gpus`: the configs their problems' studies have
    settled (read from the shared database, so it counts what any worker did), problems
    searched, failed configs. Live on a terminal; in a log, a line whenever the count moved
    and at least ``every`` seconds passed since the last line. ``target``: configs per
    problem (None: open-ended, a grid search without --trials); a problem whose space holds
    fewer is counted searched once its workers have finished."""

    def __init__(self, problems: list[str], target: int | None, workers: int, console: Console | None = None,
                 every: float = 30.0) -> None:
        self.problems, self.target, self.workers, self.every = problems, target, workers, every
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[detail]}"), console=self.console)
        self.task = None
        self.printed_at = float("-inf")
        self.printed: tuple | None = None

    def __enter__(self) -> "WorkersProgress":
        if self.live:
            self.progress.start()
            total = None if self.target is None else self.target * len(self.problems)
            self.task = self.progress.add_task(f"{self.workers} GPUs", total=total, detail="")
        return self

    def update(self, settled: dict[str, int], failed: int, finished: bool = False) -> str:
        """Show ``settled`` (distinct configs per problem) and ``failed`` configs; with
        ``finished`` (every worker done) each problem counts as searched. Returns the line."""
        cap = self.target if self.target is not None else float("inf")
        done = sum(min(settled.get(p, 0), cap) for p in self.problems)
        searched = len(self.problems) if finished else sum(settled.get(p, 0) >= cap for p in self.problems)
        of = "" if self.target is None else f"/{self.target * len(self.problems)}"
        detail = f"{searched}/{len(self.problems)} problems searched" + (f", {failed} failed configs" if failed else "")
        line = f"{done}{of} configs settled by {self.workers} worker{'s' if self.workers != 1 else ''}, {detail}"
        if self.live:
            self.progress.update(self.task, completed=done, detail=detail)
        elif (done, failed) != self.printed and time.monotonic() - self.printed_at >= self.every:
            print(f"progress: {line}", file=self.console.file, flush=True)
            self.printed_at, self.printed = time.monotonic(), (done, failed)
        return line

    def __exit__(self, *exc) -> None:
        if self.live:
            self.progress.stop()

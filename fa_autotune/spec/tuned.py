"""Tuned results: one record type per kind, the same from the database to the exported
file to the dispatcher.

* :class:`Winner`: the config a tune crowned for a problem on one GPU and software stack.
* :class:`FrontPoint`: one config of an FP8 problem's time/error Pareto front.
* :class:`Tuned`: what one source (a database, an exported file) knows for one GPU model,
  at most one winner and one front per problem; it answers "which tuned problem lends its
  config to this one".

Winners and front points carry a kernel ``config`` and, for FP8 problems, the ``recipe`` its
inputs are quantized with (None otherwise); ``candidate`` is the pair, whose key and name
are what the database and the files store.

The store builds them from rows, the file reader from JSON, and the dispatcher, the
exporter and ``fa-autotune query`` read nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .candidate import Candidate
from .config import KernelConfig
from .problem import Problem, nearest
from .recipe import Fp8Recipe
from .target import GpuInfo, SoftwareInfo


def _recipe_for(record: "Winner | FrontPoint") -> None:
    """A record's recipe as its problem wants it: the default for an FP8 problem given none,
    none for the others (a recipe there would be a caller's mistake)."""
    if record.problem.is_fp8 and record.recipe is None:
        object.__setattr__(record, "recipe", Fp8Recipe())
    elif not record.problem.is_fp8 and record.recipe is not None:
        raise ValueError(f"{record.problem.key} is not an FP8 problem; its {type(record).__name__} has no recipe")


@dataclass(frozen=True)
class Winner:
    """The config a tune crowned for ``problem`` on ``gpu`` and ``software`` (re-timed)."""

    problem: Problem
    config: KernelConfig
    median_ms: float
    tflops: float
    rel_error: float | None
    gpu: GpuInfo
    software: SoftwareInfo
    ties: int = 1  # configs within noise of the winner when it was picked
    source: str = "tune"  # "tune", or "import" when loaded from a file
    study_name: str | None = None
    decided_at: str = ""  # UTC "YYYY-MM-DD HH:MM:SS"; files carry no timestamps
    recipe: Fp8Recipe | None = None  # FP8 problems: how the inputs are quantized (default: Fp8Recipe())

    def __post_init__(self) -> None:
        _recipe_for(self)

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.config, self.recipe)

    def as_row(self) -> dict[str, Any]:
        """The flat view ``fa-autotune query best`` prints (table, JSON, CSV)."""
        candidate = self.candidate
        return {"gpu": self.gpu.name, "capability": self.gpu.capability, "problem": self.problem.key,
                "dtype": self.problem.dtype, "head_dim": self.problem.head_dim, "causal": self.problem.causal,
                "config_name": candidate.name, "config": candidate.to_dict(), "median_ms": self.median_ms,
                "tflops": self.tflops, "rel_error": self.rel_error, "ties": self.ties,
                "triton": self.software.triton, "torch": self.software.torch,
                "template_hash": self.software.template_hash, "source": self.source, "decided_at": self.decided_at}


WINNER_COLUMNS = ("gpu", "capability", "problem", "dtype", "head_dim", "causal", "config_name", "config", "median_ms",
                  "tflops", "rel_error", "ties", "triton", "torch", "template_hash", "source", "decided_at")


@dataclass(frozen=True)
class FrontPoint:
    """One config of an FP8 problem's time/error Pareto front (error: relative, against
    float32 on the unquantized inputs)."""

    problem: Problem
    config: KernelConfig
    median_ms: float
    tflops: float
    rel_error: float
    gpu: GpuInfo
    software: SoftwareInfo
    max_error: float | None = None  # the error budget the front was built under
    study_name: str | None = None
    decided_at: str = ""
    recipe: Fp8Recipe | None = None  # how the inputs are quantized (default: Fp8Recipe())

    def __post_init__(self) -> None:
        _recipe_for(self)

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.config, self.recipe)

    def as_row(self) -> dict[str, Any]:
        """The flat view ``fa-autotune query pareto`` prints."""
        candidate, recipe = self.candidate, self.recipe or Fp8Recipe()
        return {"gpu": self.gpu.name, "problem": self.problem.key, "config_name": candidate.name,
                "config": candidate.to_dict(), "fp8_scaling": recipe.scaling, "fp8_hadamard": recipe.hadamard,
                "fp8_sink_tile": recipe.sink_tile,
                "median_ms": self.median_ms, "tflops": self.tflops,
                "rel_error": self.rel_error, "max_error": self.max_error, "triton": self.software.triton,
                "decided_at": self.decided_at}


FRONT_COLUMNS = ("gpu", "problem", "config_name", "config", "fp8_scaling", "fp8_hadamard", "fp8_sink_tile",
                 "median_ms", "tflops", "rel_error", "max_error", "triton", "decided_at")


@dataclass(frozen=True)
class Tuned:
    """What one source knows for one GPU model: at most one winner per problem and the
    newest Pareto front of each FP8 problem. ``origin`` names the source (a database URL
    with its password masked, or a file path)."""

    gpu: GpuInfo
    winners: tuple[Winner, ...]
    fronts: tuple[FrontPoint, ...] = ()
    origin: str = ""
    _by_key: dict[str, Winner] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_key.update((w.problem.key, w) for w in self.winners)
        if len(self._by_key) != len(self.winners):
            raise ValueError("a Tuned holds at most one winner per problem; build it with Tuned.latest")

    @classmethod
    def latest(cls, gpu: GpuInfo, winners: Iterable[Winner], fronts: Iterable[FrontPoint] = (), origin: str = "",
               prefer_triton: str | None = None) -> "Tuned":
        """The latest decision per problem among rows given oldest first (several software
        stacks may have tuned a problem): its last winner, and the points of its last front's
        software stack. With ``prefer_triton``, rows of that Triton version override the
        others whatever their age (a dispatcher trusts measurements of the Triton it runs)."""
        def ordered(rows):
            rows = list(rows)
            return rows if prefer_triton is None else sorted(rows, key=lambda r: r.software.triton == prefer_triton)

        chosen: dict[str, Winner] = {}
        for winner in ordered(winners):
            chosen[winner.problem.key] = winner
        fronts = ordered(fronts)
        newest = {p.problem.key: p.software for p in fronts}
        points = tuple(p for p in fronts if p.software == newest[p.problem.key])
        return cls(gpu, tuple(chosen.values()), points, origin)

    def winner_for(self, problem: Problem) -> tuple[Winner, float] | None:
        """The winner of ``problem`` itself, else of the nearest tuned problem, with its
        distance; None when no tuned problem may lend its config."""
        exact = self._by_key.get(problem.key)
        if exact is not None:
            return exact, 0.0
        found = nearest(problem, (w.problem for w in self.winners))
        return (self._by_key[found[0].key], found[1]) if found is not None else None

    def front_of(self, problem: Problem) -> tuple[FrontPoint, ...]:
        """The stored front of exactly ``problem``, fastest first."""
        return tuple(sorted((p for p in self.fronts if p.problem == problem),
                            key=lambda p: (p.median_ms, p.candidate.canonical_json())))

"""The FP8 quantization recipe: how an FP8 problem's inputs are quantized for its kernel.

The recipe decides the error, the kernel config the speed, so FP8 problems tune the two
together (:class:`~fa_autotune.spec.candidate.Candidate`); but no template reads the
recipe, so it is not a template parameter (issue 40): the kernel a config renders is the
same whatever the inputs' scales look like. Its mapping form keeps the names search
spaces, stored configs and ``fa-autotune query pareto`` have always used for it
(``fp8_scaling``, ``fp8_hadamard``, ``fp8_sink_tile``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..errors import ConfigError

FP8_SCALINGS = ("per_tensor", "per_head", "per_block")
# The recipe's parameters under their mapping names -> the Fp8Recipe field each sets.
RECIPE_FIELDS = {"fp8_scaling": "scaling", "fp8_hadamard": "hadamard", "fp8_sink_tile": "sink_tile"}
# How a config name spells a non-default recipe (one part each, as names did before issue 40).
_SCALING_PARTS = {"per_tensor": "fp8tensor", "per_head": "fp8head", "per_block": ""}


@dataclass(frozen=True)
class Fp8Recipe:
    """How FP8 inputs are quantized: ``scaling`` is the group sharing one scale (the whole
    tensor, a head, or ``block_q`` / ``block_k`` rows of a head), ``hadamard`` whether Q and
    K are rotated first (spreads outlier channels; QK^T is unchanged), ``sink_tile`` whether
    the first K tile is scored from the unquantized Q and K (attention sinks, the first keys
    of a trained LLM's rows, score so high that FP8's rounding of Q and K moves whole units
    of the softmax's exponent). Defaults: FlashAttention-3's scaling, with the sink tile,
    the one recipe within 0.06 of float32 on both outlier-channel and attention-sink inputs
    (benchmarks/results/2026-12-06-cpu-fp8-default-recipe/)."""

    scaling: str = "per_block"
    hadamard: bool = True
    sink_tile: bool = True

    def __post_init__(self) -> None:
        if self.scaling not in FP8_SCALINGS:
            raise ConfigError("fp8_scaling", f"{self.scaling!r} is not one of {list(FP8_SCALINGS)}")
        for key, name in (("fp8_hadamard", "hadamard"), ("fp8_sink_tile", "sink_tile")):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(key, f"expected true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> "Fp8Recipe":
        """A recipe from its mapping form (``fp8_scaling``, ``fp8_hadamard``; either may be
        left out for its default); unknown keys are errors."""
        if isinstance(mapping, Fp8Recipe):
            return mapping
        if not isinstance(mapping, Mapping):
            raise ConfigError("recipe", f"expected a mapping of {', '.join(RECIPE_FIELDS)}, got "
                              f"{type(mapping).__name__}")
        for key in mapping:
            if key not in RECIPE_FIELDS:
                raise ConfigError(str(key), f"not a quantization recipe parameter; known: {', '.join(RECIPE_FIELDS)}")
        return cls(**{RECIPE_FIELDS[key]: value for key, value in mapping.items()})

    @classmethod
    def split(cls, mapping: Mapping[str, Any]) -> tuple[Mapping[str, Any], "Fp8Recipe | None"]:
        """(the rest of ``mapping``, the recipe its ``fp8_*`` keys give, or None without any):
        a config mapping as configs were written before issue 40, the recipe among the
        template parameters. Anything but a plain mapping comes back whole."""
        if not isinstance(mapping, Mapping) or not any(key in mapping for key in RECIPE_FIELDS):
            return mapping, None
        rest = {key: value for key, value in mapping.items() if key not in RECIPE_FIELDS}
        return rest, cls.from_mapping({key: mapping[key] for key in RECIPE_FIELDS if key in mapping})

    def to_dict(self) -> dict[str, Any]:
        """The mapping form (what :meth:`from_mapping` reads)."""
        return {key: getattr(self, name) for key, name in RECIPE_FIELDS.items()}

    def changes(self) -> dict[str, Any]:
        """The mapping form less the fields at their defaults: what a stored config's JSON
        adds for this recipe (a default recipe adds nothing, so its identity is the kernel's)."""
        default = Fp8Recipe()
        return {key: getattr(self, name) for key, name in RECIPE_FIELDS.items()
                if getattr(self, name) != getattr(default, name)}

    @property
    def name_part(self) -> str:
        """The recipe in a config name: ``fp8tensor`` / ``fp8head``, then ``nohad``, then
        ``nosink``, each only when it differs from the default ("" for the default recipe)."""
        parts = [_SCALING_PARTS[self.scaling], "" if self.hadamard else "nohad", "" if self.sink_tile else "nosink"]
        return "_".join(part for part in parts if part)

    def with_(self, scaling: str | None = None, hadamard: bool | None = None,
              sink_tile: bool | None = None) -> "Fp8Recipe":
        """This recipe with the parts given (None keeps a part): a caller's ``scaling=`` /
        ``hadamard=`` / ``sink_tile=`` over a tuned or default recipe."""
        given = (("scaling", scaling), ("hadamard", hadamard), ("sink_tile", sink_tile))
        changes = {name: value for name, value in given if value is not None}
        return replace(self, **changes) if changes else self

    def matches(self, scaling: str | None = None, hadamard: bool | None = None, sink_tile: bool | None = None) -> bool:
        """Whether this recipe has the parts given (None matches anything)."""
        return all(value is None or getattr(self, name) == value
                   for name, value in (("scaling", scaling), ("hadamard", hadamard), ("sink_tile", sink_tile)))


def default_recipe(fp8: bool) -> Fp8Recipe | None:
    """The recipe of a config nothing tuned a recipe for: the default on an FP8 problem, none
    on the others."""
    return Fp8Recipe() if fp8 else None

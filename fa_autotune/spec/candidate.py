"""What a tune measures and crowns: a kernel config and, for FP8 problems, the quantization
recipe its inputs get (the two are tuned together: the recipe decides the error, the kernel
the speed). The trial, the stored winner and front point, the exported file entry and the
dispatcher's choice all carry one.

A candidate keeps the identity its config had while the recipe was a template parameter
(before issue 40): its canonical JSON is the config's with the recipe's non-default fields
added under their old names, its name spells them where config names did. So every key in
databases and exported files stays the same text, a re-tune recognises its earlier trials,
and a stored config that lists ``fp8_scaling`` / ``fp8_hadamard`` reads as a candidate.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import ConfigError
from .config import KernelConfig, canonical_json, key_of
from .recipe import RECIPE_FIELDS, Fp8Recipe, default_recipe


@dataclass(frozen=True)
class Candidate:
    """A kernel ``config`` and the ``recipe`` of its inputs: an :class:`Fp8Recipe` on FP8
    problems, None on the others."""

    config: KernelConfig
    recipe: Fp8Recipe | None = None

    @classmethod
    def of(cls, config: KernelConfig, fp8: bool) -> "Candidate":
        """``config`` with the default recipe on an FP8 problem, with none otherwise (what a
        built-in default or a kernel-only config stands for)."""
        return cls(config, default_recipe(fp8))

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | KernelConfig | "Candidate", fp8: bool) -> "Candidate":
        """A config mapping with the recipe among its parameters (a search space's sample, a
        stored config, ``attention_fp8(config=...)``), split in two. On an FP8 problem the
        recipe is the one it names (defaults for the parts left out); on others there is
        none, and recipe keys there are only validated (they never reached a kernel)."""
        if isinstance(mapping, Candidate):
            config, recipe = mapping.config, mapping.recipe
        else:
            rest, recipe = Fp8Recipe.split(mapping)
            config = KernelConfig.from_mapping(rest)
        return cls(config, (recipe or Fp8Recipe()) if fp8 else None)

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | str, fp8: bool) -> "Candidate | None":
        """A candidate read back from a database, a file or a study, or None if this version
        of fa_autotune no longer accepts it (rules tighten when Triton bugs are found)."""
        try:
            return cls.from_mapping(json.loads(data) if isinstance(data, str) else data, fp8)
        except (ConfigError, ValueError, TypeError):
            return None

    def canonical_json(self) -> str:
        """The config's canonical JSON with the recipe's non-default fields: the identity
        stored in databases and files."""
        return canonical_json(self.config.to_dict() | (self.recipe.changes() if self.recipe else {}))

    @property
    def key(self) -> str:
        """Short stable hash of the canonical JSON (the stored config key)."""
        return key_of(self.canonical_json())

    @property
    def name(self) -> str:
        """The kernel's name with the recipe spelled in (``..._fp8tensor_nohad``)."""
        return self.config.named(self.recipe.name_part if self.recipe else "")

    def to_dict(self) -> dict[str, Any]:
        """Every template parameter, and the recipe's (``fp8_scaling``, ``fp8_hadamard``)
        where there is one: what ``attention_fp8(config=...)`` takes back."""
        return self.config.to_dict() | (self.recipe.to_dict() if self.recipe else {})

    def listed_value(self, name: str) -> Any:
        """Parameter ``name`` as a search space lists it (a recipe's part included, at its
        default where there is no recipe)."""
        if name in RECIPE_FIELDS:
            return getattr(self.recipe or Fp8Recipe(), RECIPE_FIELDS[name])
        return self.config.listed_value(name)

    def with_(self, **changes: Any) -> "Candidate":
        """The same recipe with template parameters changed."""
        return Candidate(self.config.with_(**changes), self.recipe)

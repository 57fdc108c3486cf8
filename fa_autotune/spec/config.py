"""Kernel configs: the typed, validated values every template is rendered from.

A :class:`KernelConfig` is problem-independent (it names a kernel variant); whether it
suits a given problem is checked separately by :func:`check_config_for_problem`.
Nothing reaches a template without passing through :meth:`KernelConfig.from_mapping`.

Why not pydantic for this and the file schemas (weighed in issue 40; measured with
pydantic 2.14 on the 2-core CI machine, medians of 10 processes): importing pydantic takes
74 ms, importing all of fa_autotune 33 ms, and user code imports the package for the
dispatcher, which promises a cheap import (pydantic-core would also be a new compiled
dependency). What it would speed up is off every hot path: a config is validated once, when a
file, a database row or a user's mapping is read (19 us here with every cross-field rule;
pydantic's type checks alone take 4 us), and the rules that matter are cross-field ones that
would stay hand-written either way, raising the ConfigError that names the parameter (the
tuner's invalid_config status). Revisit if the package starts importing pydantic anyway.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from ..errors import ConfigError
from .families import Family, family_of
from .recipe import Fp8Recipe

LOOP_ORDERS = ("q_outer", "kv_outer", "split_kv", "decode", "backward")
CAUSAL_MODES = ("masked", "split")
ACCESS_MODES = ("pointer", "block_ptr", "tensor_desc")
POW2_BLOCKS = (16, 32, 64, 128, 256)
WARPS = (2, 4, 8, 16)
STAGES = (1, 2, 3, 4, 5, 6, 7)
MAX_SPLITS = 128
MAX_Q_TILES = 64
TILE_ORDERS = ("seq", "head")
FP8_PV_MODES = ("separate", "inplace")
MAX_PERSISTENT = 4
MAX_SECTION = 4096
MAX_RESCALE_THRESHOLD = 16
LANGUAGES = ("triton", "gluon")
GLUON_BLOCK_M = (64, 128)  # rows per consumer warpgroup
GLUON_BLOCK_N = (64, 128, 256)  # 256: the FP8 forward's steps only (kernels.checks)
GLUON_CONSUMERS = (1, 2, 3)
# Registers of one warpgroup's threads when the SM's 64K are split evenly per 128 threads,
# what setmaxnreg redistributes; below 24 for the producer, ptxas drops setmaxnreg silently.
_WARPGROUP_REGS = 512
_MIN_REGS, _MAX_REGS = 24, 256
# Kernel-structure knobs added after the first release: the canonical JSON (the identity
# stored in databases and config files) leaves them out while they hold these defaults,
# so every config tuned before they existed keeps its key.
STRUCTURE_DEFAULTS = {"rescale_threshold": 0, "exp2_poly": False, "persistent": 0, "tile_order": "seq",
                      "maxnreg": 0, "fp8_pv": "separate", "language": "triton", "consumers": 2, "consumer_regs": 240,
                      "overlap": True, "pingpong": False, "one_loop": False, "dynamic": False, "section": 0,
                      "exp2_emu": 0, "half_step": False, "q_regs": False,
                      "dq_atomic": False, "group_split": 1,
                      "dq_block_m": 0, "dq_block_n": 0, "dq_warps": 0, "dq_stages": 0}
# The backward's dQ pass: its own tiles, warps and stages (0: the dK/dV pass's value). The
# passes are separate kernels and want different shapes (a tall Q tile streaming short K/V
# tiles for dQ, the transpose for dK/dV).
DQ_FIELDS = {"dq_block_m": "BLOCK_M", "dq_block_n": "BLOCK_N", "dq_warps": "num_warps", "dq_stages": "num_stages"}
# Gluon's FlashAttention-3 schedule (language="gluon"); Triton configs keep these at their defaults.
GLUON_FIELDS = ("consumers", "consumer_regs", "overlap", "pingpong", "one_loop", "dynamic", "section", "exp2_emu",
                "half_step", "q_regs")
# exp2_emu: one score in every N of an unmasked step exponentiated by polynomial on the FMA units.
GLUON_EXP2_EMU = (0, 4, 8, 16)
GROUP_SPLITS = (1, 2, 4, 8)


@dataclass(frozen=True)
class KernelConfig:
    """One forward-attention kernel variant (all template parameters)."""

    loop_order: str = "q_outer"
    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    causal_mode: str = "split"
    access: str = "pointer"
    warp_specialize: bool = False
    num_splits: int = 1
    q_tiles: int = 1
    # Q-outer forward: 0 rescales the accumulator every step; t keeps a row's stale max until
    # it grows by more than 2**t (FlashAttention-4). Triton: one branch for the whole tile;
    # Gluon: per row, a warp skipping the rescale while its rows keep theirs.
    rescale_threshold: int = 0
    exp2_poly: bool = False
    persistent: int = 0
    tile_order: str = "seq"
    maxnreg: int = 0
    # FP8 kernels: "separate" PV products descaled as they are added to the accumulator, or
    # "inplace" accumulation descaled once in the epilogue (one V descale per head only).
    fp8_pv: str = "separate"
    # "triton": the tl kernels (any GPU, and Triton's interpreter); "gluon": FlashAttention-3's
    # producer/consumer schedule written in Gluon (Hopper): a TMA producer warpgroup and
    # `consumers` consumer warpgroups of BLOCK_M query rows each, `consumer_regs` registers
    # per consumer thread (setmaxnreg), the next QK^T issued before this tile's softmax
    # (`overlap`), the consumers taking turns on the tensor cores (round robin) through a
    # named barrier each (`pingpong`, with or without the overlap).
    language: str = "triton"
    consumers: int = 2
    consumer_regs: int = 240
    overlap: bool = True
    pingpong: bool = False
    # Gluon, causal_mode "split": the unmasked and the masked K/V steps in one loop that picks
    # at run time, instead of two loops handing P across (that hand-over cost 32 extra SASS
    # register moves per step under Triton 3.6).
    one_loop: bool = False
    # Gluon, persistent grid: programs take their next tile from an atomic counter (balances
    # causal grids, whose tiles differ in length) instead of every programs-th tile.
    dynamic: bool = False
    # Gluon, persistent grid, causal problems: the heads per L2 section, whose longest tiles
    # run before the next section's (0: the L2 rule of kernels/launch.py, sized from the L2 cache, or
    # DYNAMIC_SECTION on a dynamic grid). Which size wins depends on heads, tiles and programs.
    section: int = 0
    # Gluon forward: one score in every `exp2_emu` of an unmasked step gets 2**x from a
    # degree-3 polynomial on the FMA units instead of the MUFU unit (FlashAttention-4's
    # emulation; at D=64 the MUFU unit's exp2 takes as long as the step's matrix products);
    # 0 keeps every exp2 on the MUFU unit.
    exp2_emu: int = 0
    # Gluon forward, steps one after the other (overlap=false): a masked step whose second
    # half of keys no row of the warpgroup sees (its diagonal tile when it holds the tile's
    # first rows) computes S and the softmax over the first half only, P through shared memory.
    half_step: bool = False
    # Gluon forward, with the overlap, 16-bit: Q K^T's Q read into registers once a tile
    # instead of from shared memory by every product (an m64nNk16 product reading both
    # operands from shared memory needs all of its bandwidth at N = 64).
    q_regs: bool = False
    # Backward: dQ accumulated with fp32 atomic adds inside the dK/dV pass (one pass less, run
    # to run bit differences) instead of its own Q-outer pass (deterministic).
    dq_atomic: bool = False
    # Gluon backward, GQA: the programs that share one KV head's query heads (each takes
    # ceil(group / group_split) of them) and add their dK and dV into fp32 buffers with atomics
    # (FlashAttention-3's GQA backward at group_split = group), so that a few KV heads still
    # fill the SMs; 1 keeps the whole group in one program, summed in registers.
    group_split: int = 1
    # Backward, dQ in its own pass: that pass's BLOCK_M (query rows per program), BLOCK_N (K/V
    # rows per step), num_warps and num_stages; 0 keeps the dK/dV pass's value.
    dq_block_m: int = 0
    dq_block_n: int = 0
    dq_warps: int = 0
    dq_stages: int = 0

    def __post_init__(self) -> None:
        if self.loop_order == "backward":  # a dQ knob equal to the dK/dV pass's value is that value:
            for name, base in DQ_FIELDS.items():  # one identity (key, name, grid point) per kernel
                if getattr(self, name) == getattr(self, base) and not isinstance(getattr(self, name), bool):
                    object.__setattr__(self, name, 0)
        _validate(self)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> "KernelConfig":
        """Build a config from user data (JSON, YAML, kwargs); unknown keys are errors. The
        FP8 quantization recipe (``fp8_scaling``, ``fp8_hadamard``) is not a template
        parameter: a mapping naming one other than its default is refused, since no kernel
        would honour it (give it to ``attention_fp8``, or read stored configs with
        :meth:`Candidate.from_mapping <fa_autotune.spec.candidate.Candidate.from_mapping>`);
        at their defaults they are dropped, as ``to_dict()`` listed them before issue 40."""
        if isinstance(mapping, KernelConfig):
            return mapping
        if not isinstance(mapping, Mapping):
            raise ConfigError("config", f"expected a mapping of template parameters, got {type(mapping).__name__}")
        mapping, recipe = Fp8Recipe.split(mapping)
        if recipe is not None and recipe != Fp8Recipe():
            name = next(iter(recipe.changes()))
            raise ConfigError(name, "the FP8 quantization recipe is not a kernel parameter: give it separately "
                              "(attention_fp8's scaling= and hadamard=, or an Fp8Recipe)")
        known = {f.name for f in fields(cls)}
        for key in mapping:
            if key not in known:
                raise ConfigError(str(key), f"unknown template parameter; known: {', '.join(sorted(known))}")
        return cls(**dict(mapping))

    @classmethod
    def from_json(cls, text: str) -> "KernelConfig":
        """Build a config from JSON text (what ``canonical_json`` writes, or a user's string);
        text that is not JSON raises :class:`ConfigError`, never a JSONDecodeError."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            shown = text if len(text) <= 80 else text[:80] + "…"
            raise ConfigError("config", f"not valid JSON ({exc.msg} at character {exc.pos}): {shown!r}") from None
        return cls.from_mapping(data)

    @property
    def family(self) -> Family:
        """The kernel family (template) this config renders: spec.families."""
        return family_of(self.loop_order, self.language)  # type: ignore[return-value]  # validated

    def parameters(self) -> dict[str, Any]:
        """The parameters this config's family reads (its loop order and language first): the
        config without the knobs its kernel ignores, as a user would write it."""
        names = ("loop_order", "language") + self.family.parameters
        return {name: getattr(self, name) for name in names}

    def dq_pass(self) -> tuple[int, int, int, int]:
        """The backward's dQ pass as (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
        return tuple(getattr(self, f) or getattr(self, base) for f, base in DQ_FIELDS.items())  # type: ignore[return-value]

    def listed_value(self, name: str) -> Any:
        """Template parameter ``name`` as a search space lists it: where there is a dQ pass,
        a dQ knob at 0 (inherited) is the dK/dV pass's value it stands for."""
        if name in DQ_FIELDS and self.loop_order == "backward" and not self.dq_atomic:
            return getattr(self, name) or getattr(self, DQ_FIELDS[name])
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def canonical_json(self) -> str:
        """Stable text form: sorted keys, no spaces, later knobs left out at their defaults;
        the identity used for hashing and storage."""
        return canonical_json(self.to_dict())

    @property
    def key(self) -> str:
        """Short stable hash of the canonical JSON."""
        return key_of(self.canonical_json())

    @property
    def name(self) -> str:
        """Deterministic kernel name that spells the variant, FlashInfer style."""
        return self.named()

    def named(self, recipe: str = "") -> str:
        """The name, with an FP8 recipe's part (:attr:`Fp8Recipe.name_part
        <fa_autotune.spec.recipe.Fp8Recipe.name_part>`) where Triton forward names spelled it
        while the recipe was a template parameter (before ``pvin``), so stored names stay as
        they were; the other families' names never spelled it."""
        if self.language == "gluon":
            return self._gluon_name()
        if self.loop_order == "decode":
            return self._decode_name()
        if self.loop_order == "backward":
            dq = "_dq{}x{}w{}s{}".format(*self.dq_pass()) if any(getattr(self, f) for f in DQ_FIELDS) else ""
            return f"attn_bwd_m{self.BLOCK_M}n{self.BLOCK_N}_w{self.num_warps}s{self.num_stages}_" + (
                "cband" if self.causal_mode == "split" else "cmask") + (
                "_dqatomic" if self.dq_atomic else dq)
        loop = {"q_outer": "qouter", "kv_outer": "kvouter", "split_kv": "splitkv"}[self.loop_order]
        access = {"pointer": "ptr", "block_ptr": "blk", "tensor_desc": "tma"}[self.access]
        parts = [
            f"attn_fwd_{loop}",
            f"m{self.BLOCK_M}n{self.BLOCK_N}",
            f"w{self.num_warps}s{self.num_stages}",
            access + ("_ws" if self.warp_specialize else ""),
            "cband" if self.causal_mode == "split" else "cmask",
        ]
        if self.loop_order == "split_kv":
            parts.append(f"x{self.num_splits}")
        if self.loop_order == "kv_outer" or self.q_tiles > 1:
            parts.append(f"q{self.q_tiles}")
        if self.rescale_threshold:
            parts.append(f"lazy{self.rescale_threshold}")
        if self.exp2_poly:
            parts.append("poly")
        if self.persistent:
            parts.append(f"pers{self.persistent}")
        if self.tile_order != "seq":
            parts.append(f"{self.tile_order}major")
        if self.maxnreg:
            parts.append(f"r{self.maxnreg}")
        if recipe:
            parts.append(recipe)
        if self.fp8_pv != "separate":
            parts.append("pvin")
        return "_".join(parts)

    def _decode_name(self) -> str:
        parts = [f"attn_decode_m{self.BLOCK_M}n{self.BLOCK_N}", f"w{self.num_warps}s{self.num_stages}",
                 "cband" if self.causal_mode == "split" else "cmask",
                 f"sk{self.persistent}" if self.persistent else f"x{self.num_splits}"]
        if self.access == "tensor_desc":
            parts.append("tma")
        if self.maxnreg:
            parts.append(f"r{self.maxnreg}")
        return "_".join(parts)

    def _gluon_name(self) -> str:
        if self.loop_order == "backward":
            dq = "_dq{}x{}w{}s{}".format(*self.dq_pass()) if any(getattr(self, f) for f in DQ_FIELDS) else ""
            return (f"attn_bwd_gluon_m{self.BLOCK_M}n{self.BLOCK_N}x{self.consumers}_s{self.num_stages}_"
                    f"r{self.consumer_regs}_" + ("cband" if self.causal_mode == "split" else "cmask")
                    + ("_dqatomic" if self.dq_atomic else dq) + (f"_pers{self.persistent}" if self.persistent else "")
                    + ("_dyn" if self.dynamic else "") + (f"_sec{self.section}" if self.section else "")
                    + (f"_gs{self.group_split}" if self.group_split != 1 else ""))
        parts = [f"attn_fwd_gluon_m{self.BLOCK_M}x{self.consumers}n{self.BLOCK_N}", f"s{self.num_stages}",
                 f"r{self.consumer_regs}", "cband" if self.causal_mode == "split" else "cmask"]
        if self.overlap:
            parts.append("ov")
        if self.pingpong:
            parts.append("pp")
        if self.one_loop:
            parts.append("1loop")
        if self.persistent:
            parts.append(f"pers{self.persistent}")
        if self.dynamic:
            parts.append("dyn")
        if self.section:
            parts.append(f"sec{self.section}")
        if self.exp2_emu:
            parts.append(f"emu{self.exp2_emu}")
        if self.half_step:
            parts.append("half")
        if self.q_regs:
            parts.append("qr")
        if self.rescale_threshold:
            parts.append(f"lazy{self.rescale_threshold}")
        return "_".join(parts)

    def with_(self, **changes: Any) -> "KernelConfig":
        return replace(self, **changes)


_KEEP = object()


def canonical_json(data: Mapping[str, Any]) -> str:
    """The stored text of a config's parameters: sorted keys, no spaces, the knobs of
    STRUCTURE_DEFAULTS left out at their defaults (so configs tuned before a knob existed keep
    their key); :class:`~fa_autotune.spec.candidate.Candidate` adds its recipe's fields."""
    data = {k: v for k, v in data.items() if STRUCTURE_DEFAULTS.get(k, _KEEP) != v}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def key_of(text: str) -> str:
    """The stored key of a canonical JSON text: a short hash of it."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(name, f"{value!r} is not one of {list(choices)}")


def _check_int(name: str, value: Any, choices: tuple | None = None, lo: int = 1, hi: int = 1 << 30) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"expected an integer, got {value!r}")
    if choices is not None:
        _check_choice(name, value, choices)
    elif not lo <= value <= hi:
        raise ConfigError(name, f"{value} is outside [{lo}, {hi}]")


def _validate(cfg: KernelConfig) -> None:
    _check_choice("loop_order", cfg.loop_order, LOOP_ORDERS)
    _check_int("BLOCK_M", cfg.BLOCK_M, POW2_BLOCKS)
    _check_int("BLOCK_N", cfg.BLOCK_N, POW2_BLOCKS)
    _check_int("num_warps", cfg.num_warps, WARPS)
    _check_int("num_stages", cfg.num_stages, STAGES)
    _check_choice("causal_mode", cfg.causal_mode, CAUSAL_MODES)
    _check_choice("access", cfg.access, ACCESS_MODES)
    if not isinstance(cfg.warp_specialize, bool):
        raise ConfigError("warp_specialize", f"expected true or false, got {cfg.warp_specialize!r}")
    _check_int("num_splits", cfg.num_splits, lo=1, hi=MAX_SPLITS)
    _check_int("q_tiles", cfg.q_tiles, lo=1, hi=MAX_Q_TILES)
    if cfg.num_splits != 1 and cfg.loop_order not in ("split_kv", "decode"):
        raise ConfigError("num_splits", "only loop_order='split_kv' or 'decode' splits the K/V sequence; use 1")
    if cfg.q_tiles > 2 and cfg.loop_order == "q_outer":
        raise ConfigError("q_tiles", "loop_order='q_outer' interleaves at most 2 Q tiles per program")
    if cfg.q_tiles != 1 and cfg.loop_order in ("split_kv", "decode"):
        raise ConfigError("q_tiles", f"loop_order={cfg.loop_order!r} owns one Q tile per program; use 1")
    if cfg.loop_order in ("decode", "backward"):
        _validate_decode(cfg)
    _validate_structure(cfg)
    _validate_backward(cfg)
    _validate_language(cfg)
    if cfg.warp_specialize and cfg.loop_order != "q_outer":
        # kv_outer nests its loops; split_kv + warp_specialize returned NaN on an H200
        # under Triton 3.6 (benchmarks/results/2026-11-29-h200-kernel-smoke/results.md).
        raise ConfigError("warp_specialize", "only loop_order='q_outer' supports warp specialization")
    if cfg.warp_specialize and (cfg.access != "tensor_desc" or cfg.causal_mode != "split" or cfg.num_stages != 2):
        # Triton 3.6 compiles it only over TMA loads, and on an H200 returned NaN from masked
        # loops and whenever num_stages >= 3 (26 of 26 such tuning trials, 2026-11-29).
        raise ConfigError("warp_specialize", "needs access='tensor_desc', causal_mode='split' and num_stages=2")
    _validate_family(cfg)


def _validate_family(cfg: KernelConfig) -> None:
    """After the rules above (whose messages say more): a parameter the config's family
    does not read holds its default, or the family's pinned value (spec.families)."""
    family = family_of(cfg.loop_order, cfg.language)
    if family is None:
        raise ConfigError("loop_order", f"no {cfg.language} kernel has loop_order={cfg.loop_order!r}")
    unread = _UNREAD.get(family.name)
    if unread is None:  # the parameters the family does not read, each with the value it must hold
        reads = set(family.parameters) | {"loop_order", "language"}
        unread = _UNREAD[family.name] = tuple((f.name, family.pinned.get(f.name, f.default))
                                              for f in fields(KernelConfig) if f.name not in reads)
    for name, wanted in unread:
        if getattr(cfg, name) != wanted:
            raise ConfigError(name, f"the {family.name} kernel ({family.template}) does not read it; use {wanted!r} "
                              f"(its parameters: {', '.join(family.parameters)})")


_UNREAD: dict[str, tuple[tuple[str, Any], ...]] = {}


def _validate_decode(cfg: KernelConfig) -> None:
    """The KV-cache kernel gathers cache rows through pointers (pages need per-row
    addresses) or, for a contiguous cache on Hopper, TMA descriptors (access='tensor_desc';
    a paged cache or a layout TMA cannot read falls back to pointers at launch), and forms its
    M tile from a KV group's query rows, at least 16 for the dot; the backward kernels read
    through pointers (for now)."""
    if cfg.loop_order == "backward" and cfg.language == "gluon":
        _validate_gluon_backward(cfg)
        return
    if cfg.loop_order == "decode" and cfg.access not in ("pointer", "tensor_desc"):
        raise ConfigError("access", "loop_order='decode' reads the cache through pointers or TMA descriptors; use "
                          "access='pointer' or 'tensor_desc'")
    if cfg.loop_order == "backward" and cfg.access != "pointer":
        raise ConfigError("access", "loop_order='backward' reads its tiles through pointers; use access='pointer'")
    if cfg.BLOCK_M > 128:
        raise ConfigError("BLOCK_M", f"loop_order={cfg.loop_order!r} tiles at most 128 query rows, got {cfg.BLOCK_M}")
    if cfg.language != "triton":
        raise ConfigError("language", f"loop_order={cfg.loop_order!r} is a Triton kernel; use language='triton'")
    if cfg.loop_order == "backward" and cfg.num_splits != 1:
        raise ConfigError("num_splits", "loop_order='backward' does not split K/V; use 1")
    if cfg.loop_order == "decode" and cfg.persistent and cfg.num_splits != 1:
        raise ConfigError("num_splits", "a persistent decode grid splits the keys itself (balanced over all "
                          "programs); use num_splits=1 with persistent")


def _validate_gluon_backward(cfg: KernelConfig) -> None:
    """The Gluon dK/dV pass (templates/attn_bwd_gluon.py.jinja): 64 query rows per step (128
    with dQ inside, where S and dP have query rows), 64 key rows per consumer warpgroup, Q/dO
    over TMA; dQ in the Triton pass beside it, or with dq_atomic added up in fp32 inside it."""
    if cfg.BLOCK_N != 64 or cfg.BLOCK_M not in ((64, 128) if cfg.dq_atomic else (64,)):
        raise ConfigError("BLOCK_M", "the Gluon backward steps 64 query rows (with dq_atomic 64 or 128) past 64 key "
                          f"rows per consumer, got BLOCK_M={cfg.BLOCK_M}, BLOCK_N={cfg.BLOCK_N}")
    if cfg.consumers > 2:
        raise ConfigError("consumers", f"the Gluon backward runs 1 or 2 consumer warpgroups, got {cfg.consumers}")
    _check_int("group_split", cfg.group_split, GROUP_SPLITS)
    for name in ("overlap", "pingpong", "one_loop", "exp2_emu", "half_step", "q_regs"):
        if getattr(cfg, name) != STRUCTURE_DEFAULTS[name]:
            raise ConfigError(name, f"the Gluon backward has no such schedule; use {STRUCTURE_DEFAULTS[name]!r}")


def _validate_structure(cfg: KernelConfig) -> None:
    """The FlashAttention-3/4 structure knobs; all but maxnreg shape the Q-outer loop."""
    _check_int("rescale_threshold", cfg.rescale_threshold, lo=0, hi=MAX_RESCALE_THRESHOLD)
    if not isinstance(cfg.exp2_poly, bool):
        raise ConfigError("exp2_poly", f"expected true or false, got {cfg.exp2_poly!r}")
    _check_int("persistent", cfg.persistent, lo=0, hi=MAX_PERSISTENT)
    _check_choice("tile_order", cfg.tile_order, TILE_ORDERS)
    _check_choice("fp8_pv", cfg.fp8_pv, FP8_PV_MODES)
    _check_int("maxnreg", cfg.maxnreg, lo=0, hi=255)
    if cfg.maxnreg and (cfg.maxnreg < 64 or cfg.maxnreg % 8):
        raise ConfigError("maxnreg", f"{cfg.maxnreg} is not 0 (no cap) or a multiple of 8 in [64, 248]")
    gluon_backward = cfg.loop_order == "backward" and cfg.language == "gluon"  # a persistent grid too
    if cfg.loop_order != "q_outer":
        own_grid = gluon_backward or cfg.loop_order == "decode"  # persistent: their own persistent grids
        for name in ("rescale_threshold", "exp2_poly", "tile_order") + (() if own_grid else ("persistent",)):
            if getattr(cfg, name) != STRUCTURE_DEFAULTS[name]:
                raise ConfigError(name, f"only loop_order='q_outer' supports it; use {STRUCTURE_DEFAULTS[name]!r}")


def _validate_backward(cfg: KernelConfig) -> None:
    if cfg.group_split != 1 and not (cfg.loop_order == "backward" and cfg.language == "gluon"):
        raise ConfigError("group_split", "only the Gluon backward splits a GQA group over programs; use 1")
    if not isinstance(cfg.dq_atomic, bool):
        raise ConfigError("dq_atomic", f"expected true or false, got {cfg.dq_atomic!r}")
    if cfg.dq_atomic and cfg.loop_order != "backward":
        raise ConfigError("dq_atomic", "only loop_order='backward' accumulates dQ; use false")
    allowed = {"dq_block_m": POW2_BLOCKS[:-1], "dq_block_n": POW2_BLOCKS[:-1], "dq_warps": WARPS, "dq_stages": STAGES}
    for name, values in allowed.items():
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or (value and value not in values):
            raise ConfigError(name, f"expected 0 (the dK/dV pass's value) or one of {list(values)}, got {value!r}")
        if value and (cfg.loop_order != "backward" or cfg.dq_atomic):
            raise ConfigError(name, "only a backward with dQ in its own pass (dq_atomic=false) has a dQ pass; use 0")


def _validate_language(cfg: KernelConfig) -> None:
    """Gluon variants: the FlashAttention-3 schedule has its own knobs; the Triton-only ones
    stay at their defaults, and Triton variants leave the Gluon knobs alone."""
    _check_choice("language", cfg.language, LANGUAGES)
    _check_choice("consumers", cfg.consumers, GLUON_CONSUMERS)
    _check_int("consumer_regs", cfg.consumer_regs, lo=_MIN_REGS, hi=_MAX_REGS)
    _check_int("exp2_emu", cfg.exp2_emu, GLUON_EXP2_EMU, lo=0)
    _check_int("section", cfg.section, lo=0, hi=MAX_SECTION)
    for name in ("overlap", "pingpong", "one_loop", "dynamic", "half_step", "q_regs"):
        if not isinstance(getattr(cfg, name), bool):
            raise ConfigError(name, f"expected true or false, got {getattr(cfg, name)!r}")
    if cfg.language == "triton":
        for name in GLUON_FIELDS:
            if getattr(cfg, name) != STRUCTURE_DEFAULTS[name]:
                raise ConfigError(name, f"only language='gluon' has it; use {STRUCTURE_DEFAULTS[name]!r}")
        return
    if cfg.loop_order not in ("q_outer", "backward"):
        raise ConfigError("loop_order", "language='gluon' has a Q-outer forward and a backward; use 'q_outer' or "
                          "'backward'")
    required = {"access": "tensor_desc", "num_warps": 4, "warp_specialize": False,
                "q_tiles": 1, "exp2_poly": False, "tile_order": "seq", "maxnreg": 0}
    for name, value in required.items():
        if getattr(cfg, name) != value:
            raise ConfigError(name, f"language='gluon' needs {name}={value!r} (its own schedule replaces it)")
    _check_choice("BLOCK_M", cfg.BLOCK_M, GLUON_BLOCK_M)
    _check_choice("BLOCK_N", cfg.BLOCK_N, GLUON_BLOCK_N)
    if cfg.num_stages > 4:
        raise ConfigError("num_stages", f"language='gluon' rings up to 4 K/V stages, got {cfg.num_stages}")
    if cfg.persistent > 1:
        raise ConfigError("persistent", "a Gluon program holds a whole SM's registers (512 per thread across its "
                          "warpgroups): use 0 (a program per tile) or 1 (a program per SM)")
    if cfg.consumer_regs % 8:
        raise ConfigError("consumer_regs", f"{cfg.consumer_regs} is not a multiple of 8 (setmaxnreg)")
    if _WARPGROUP_REGS - cfg.consumers * cfg.consumer_regs < _MIN_REGS:
        raise ConfigError("consumer_regs", f"{cfg.consumers} consumers at {cfg.consumer_regs} leave the producer "
                          f"fewer than {_MIN_REGS} registers (ptxas would drop setmaxnreg)")
    if cfg.one_loop and cfg.causal_mode != "split":
        raise ConfigError("one_loop", "one_loop merges the split mode's two K/V loops: it needs causal_mode='split'")
    if cfg.dynamic and cfg.persistent != 1:
        raise ConfigError("dynamic", "dynamic tile scheduling is for a persistent grid: it needs persistent=1")
    if cfg.section and cfg.persistent != 1:
        raise ConfigError("section", "L2 sections order the tiles of a persistent grid: it needs persistent=1")
    if cfg.pingpong and cfg.consumers < 2:
        raise ConfigError("pingpong", "ping-pong takes turns between consumer warpgroups: it needs consumers >= 2")
    if cfg.BLOCK_N == 256 and (cfg.loop_order != "q_outer" or cfg.overlap or cfg.consumers != 2):
        raise ConfigError("BLOCK_N", "language='gluon' takes 256-key steps in the forward with two consumers and "
                          "overlap=false only (a second 64 x 256 score tile does not fit beside the first)")
    if cfg.q_regs and (not cfg.overlap or cfg.loop_order != "q_outer"):
        raise ConfigError("q_regs", "Q in registers is the overlapped forward's (the steps after each tile's first): "
                          "it needs overlap=true")
    if cfg.half_step and (cfg.overlap or cfg.BLOCK_N != 128):
        raise ConfigError("half_step", "half steps run in the steps-in-turn schedule over 128-key tiles: they need "
                          "overlap=false and BLOCK_N=128")

from __future__ import annotations

import json

import pytest

from fa_autotune.spec.config import KernelConfig
from fa_autotune.errors import ConfigError


def test_canonical_json_and_key_are_stable():
    a = KernelConfig.from_mapping({"BLOCK_N": 32, "loop_order": "split_kv", "num_splits": 8})
    b = KernelConfig(loop_order="split_kv", num_splits=8, BLOCK_N=32)
    assert a == b and a.key == b.key and a.canonical_json() == b.canonical_json()
    assert json.loads(a.canonical_json())["num_splits"] == 8
    assert list(json.loads(a.canonical_json())) == sorted(json.loads(a.canonical_json()))


def test_names_spell_the_variant():
    cfg = KernelConfig(loop_order="split_kv", BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=2,
                       access="tensor_desc", num_splits=8, causal_mode="masked")
    assert cfg.name == "attn_fwd_splitkv_m16n64_w4s2_tma_cmask_x8"
    assert KernelConfig(access="tensor_desc", warp_specialize=True, num_stages=2).name == "attn_fwd_qouter_m128n64_w4s2_tma_ws_cband"
    assert KernelConfig(loop_order="kv_outer", q_tiles=4).name.endswith("_q4")


def test_distinct_configs_have_distinct_names_and_keys():
    configs = {KernelConfig(BLOCK_M=m, BLOCK_N=n, access=a) for m in (32, 64) for n in (16, 32)
               for a in ("pointer", "block_ptr", "tensor_desc")}
    assert len({c.name for c in configs}) == len(configs) == len({c.key for c in configs})


def test_config_is_frozen():
    with pytest.raises(Exception):
        KernelConfig().BLOCK_M = 32  # type: ignore[misc]


def test_from_mapping_round_trip():
    cfg = KernelConfig(loop_order="kv_outer", q_tiles=3, num_stages=1)
    assert KernelConfig.from_mapping(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError):
        KernelConfig.from_mapping({"BLOCK_M": 64.0})


GLUON = dict(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2)


def test_gluon_names_spell_the_schedule():
    assert KernelConfig(**GLUON).name == "attn_fwd_gluon_m64x2n128_s2_r240_cband_ov"
    cfg = KernelConfig(**GLUON, overlap=True, pingpong=True, persistent=1, consumer_regs=232)
    assert cfg.name == "attn_fwd_gluon_m64x2n128_s2_r232_cband_ov_pp_pers1"
    assert KernelConfig(**dict(GLUON, overlap=False, causal_mode="masked")).name.endswith("_cmask")
    assert KernelConfig(**GLUON, one_loop=True).name.endswith("_ov_1loop")
    assert KernelConfig(**GLUON, exp2_emu=8).name.endswith("_ov_emu8")
    assert KernelConfig(**GLUON, persistent=1, dynamic=True, section=8).name.endswith("_ov_pers1_dyn_sec8")
    assert KernelConfig(**GLUON, pingpong=True, rescale_threshold=8).name.endswith("_ov_pp_lazy8")
    assert KernelConfig(**GLUON, q_regs=True, rescale_threshold=8).name.endswith("_ov_qr_lazy8")


def test_triton_configs_keep_their_canonical_json():
    """Configs stored before the Gluon knobs existed keep their keys (no re-tune, no orphans)."""
    text = KernelConfig().canonical_json()
    for name in ("language", "consumers", "consumer_regs", "overlap", "pingpong", "one_loop", "exp2_emu", "q_regs"):
        assert f'"{name}"' not in text
    assert '"q_regs"' not in KernelConfig(**GLUON).canonical_json()  # Gluon configs tuned before it keep theirs
    assert json.loads(KernelConfig(**GLUON).canonical_json())["language"] == "gluon"


@pytest.mark.parametrize("changes, field", [
    (dict(access="pointer"), "access"),
    (dict(num_warps=8), "num_warps"),
    (dict(BLOCK_M=32), "BLOCK_M"),
    (dict(BLOCK_N=32), "BLOCK_N"),
    (dict(num_stages=5), "num_stages"),
    (dict(persistent=2), "persistent"),
    (dict(consumer_regs=252), "consumer_regs"),  # 2 x 252 leaves the producer 8 registers
    (dict(consumer_regs=236), "consumer_regs"),  # not a multiple of 8
    (dict(consumers=4, consumer_regs=120), "consumers"),
    (dict(consumers=3), "consumer_regs"),  # 3 x 240 registers: the producer has none left
    (dict(pingpong=True, consumers=1), "pingpong"),
    (dict(warp_specialize=True), "warp_specialize"),
    (dict(q_tiles=2), "q_tiles"),
    (dict(language="cuda"), "language"),
    (dict(one_loop=True, causal_mode="masked"), "one_loop"),
    (dict(one_loop=1), "one_loop"),
    (dict(exp2_emu=3), "exp2_emu"),  # not a divisor of any thread's score count
    (dict(exp2_emu=True), "exp2_emu"),
    (dict(loop_order="backward", BLOCK_N=64, exp2_emu=8), "exp2_emu"),  # the backward has no such step
    (dict(loop_order="backward", BLOCK_N=64, rescale_threshold=8), "rescale_threshold"),  # nor a running max
    (dict(rescale_threshold=17), "rescale_threshold"),
    (dict(section=4), "section"),  # sections order a persistent grid's tiles
    (dict(persistent=1, section=-1), "section"),
    (dict(persistent=1, section=True), "section"),
    (dict(q_regs=True, overlap=False), "q_regs"),  # Q enters registers after each tile's first, overlapped step
    (dict(q_regs=1), "q_regs"),
    (dict(loop_order="backward", BLOCK_N=64, q_regs=True), "q_regs"),
])
def test_gluon_configs_are_validated(changes, field):
    with pytest.raises(ConfigError) as info:
        KernelConfig.from_mapping(dict(GLUON, **changes))
    assert info.value.parameter == field


def test_triton_configs_refuse_gluon_knobs():
    for name, value in (("consumers", 1), ("overlap", False), ("pingpong", True), ("consumer_regs", 232),
                        ("one_loop", True), ("exp2_emu", 8), ("section", 4), ("q_regs", True)):
        with pytest.raises(ConfigError, match="only language='gluon'"):
            KernelConfig.from_mapping({name: value})


@pytest.mark.parametrize("changes, field", [
    (dict(loop_order="q_outer", dq_block_m=64), "dq_block_m"),  # no dQ pass in a forward
    (dict(dq_atomic=True, dq_warps=8), "dq_warps"),  # atomic dQ has no pass of its own
    (dict(dq_block_n=48), "dq_block_n"),
    (dict(dq_block_m=256), "dq_block_m"),
    (dict(dq_stages=True), "dq_stages"),
    (dict(dq_warps=3), "dq_warps"),
])
def test_backward_dq_pass_knobs_are_validated(changes, field):
    with pytest.raises(ConfigError) as info:
        KernelConfig.from_mapping(dict(dict(loop_order="backward", BLOCK_M=64, BLOCK_N=64), **changes))
    assert info.value.parameter == field


def test_backward_dq_pass_defaults_to_the_dkdv_pass_and_keeps_old_keys():
    plain = KernelConfig(loop_order="backward", BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    assert plain.dq_pass() == (64, 64, 4, 2) and "dq_" not in plain.canonical_json()
    tuned = plain.with_(dq_block_m=128, dq_warps=8)
    assert tuned.dq_pass() == (128, 64, 8, 2) and tuned.name.endswith("_dq128x64w8s2") and tuned.key != plain.key
    # a dQ knob equal to the dK/dV pass's value is that value: one identity per kernel
    same = plain.with_(dq_block_m=64, dq_block_n=64, dq_warps=4, dq_stages=2)
    assert same == plain and same.key == plain.key and same.name == plain.name


def test_a_normalized_dq_pass_is_listed_as_the_values_it_stands_for():
    """Warm start and grid search hand a config back to Optuna as the space's values: an
    inherited dQ knob (0) is listed as the dK/dV pass's value, except with atomic dQ."""
    plain = KernelConfig(loop_order="backward", BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
    assert [plain.listed_value(f) for f in ("dq_block_m", "dq_block_n", "dq_warps", "dq_stages")] == [16, 32, 4, 1]
    assert plain.with_(dq_atomic=True).listed_value("dq_block_m") == 0
    assert KernelConfig().listed_value("BLOCK_M") == 128


def test_gluon_backward_configs():
    """The Gluon dK/dV pass: 64-row tiles, its dQ in the Triton pass or added up inside it
    (then no dQ pass shape), none of the forward's schedule knobs; named apart from the
    Triton backward."""
    base = dict(loop_order="backward", language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=64)
    config = KernelConfig(**base, dq_block_m=128, dq_warps=8)
    assert config.name == "attn_bwd_gluon_m64n64x2_s3_r240_cband_dq128x64w8s3"
    assert KernelConfig(**base, dq_atomic=True).name == "attn_bwd_gluon_m64n64x2_s3_r240_cband_dqatomic"
    persistent = KernelConfig(**base, dq_atomic=True, persistent=1, dynamic=True, section=16)
    assert persistent.name == "attn_bwd_gluon_m64n64x2_s3_r240_cband_dqatomic_pers1_dyn_sec16"
    for changes, field in ((dict(BLOCK_N=128), "BLOCK_M"), (dict(dq_atomic=True, dq_warps=8), "dq_warps"),
                           (dict(consumers=3, consumer_regs=160), "consumers"), (dict(pingpong=True), "pingpong"),
                           (dict(access="pointer"), "access"), (dict(loop_order="decode"), None)):
        with pytest.raises(ConfigError) as caught:
            KernelConfig(**dict(base, **changes))
        if field:
            assert caught.value.parameter == field, caught.value


def test_every_config_has_one_family_that_reads_its_knobs():
    """Each (loop_order, language) a config can take is one family: one template, the
    parameters it reads and those it pins. A knob the family does not read must keep its
    default, refused with the family's name otherwise (never a silent no-op): fp8_pv outside
    the Triton forward, q_tiles in the Triton backward, which the rules before families let by."""
    from dataclasses import fields
    from pathlib import Path

    from fa_autotune.spec.defaults import GLUON_BACKWARD, GLUON_DEFAULT
    from fa_autotune.spec.families import FAMILIES

    templates = {p.name for p in (Path(__file__).parents[2] / "templates").glob("attn_*.jinja")}
    assert {f.template for f in FAMILIES.values()} == templates
    names = {f.name for f in fields(KernelConfig)}
    for family in FAMILIES.values():
        assert set(family.parameters) <= names and set(family.pinned) <= names - set(family.parameters)
    assert KernelConfig().family.name == "fwd_q_outer" and GLUON_BACKWARD.family.name == "bwd_gluon"
    assert GLUON_DEFAULT.family.name == "fwd_gluon"
    parameters = GLUON_BACKWARD.parameters()
    assert list(parameters)[:2] == ["loop_order", "language"] and parameters["group_split"] == 1
    assert "fp8_pv" not in parameters and "overlap" not in parameters and "access" not in parameters
    for changes, family, field in ((dict(loop_order="decode", fp8_pv="inplace"), "decode", "fp8_pv"),
                                   (dict(loop_order="backward", BLOCK_N=64, q_tiles=2), "bwd", "q_tiles"),
                                   (dict(GLUON_DEFAULT.to_dict(), fp8_pv="inplace"), "fwd_gluon", "fp8_pv"),
                                   (dict(GLUON_BACKWARD.to_dict(), fp8_pv="inplace"), "bwd_gluon", "fp8_pv")):
        with pytest.raises(ConfigError) as caught:
            KernelConfig.from_mapping(changes)
        assert caught.value.parameter == field and f"the {family} kernel" in str(caught.value), caught.value
    KernelConfig(loop_order="kv_outer", q_tiles=4, fp8_pv="inplace")  # read there: accepted


def test_kernel_variants_page_lists_each_family_with_its_parameters():
    """docs/reference/kernel-variants.md has a row per family naming its template and every
    parameter it reads beyond the tile (the table is written by hand; this keeps it from
    drifting)."""
    from pathlib import Path

    from fa_autotune.spec.families import FAMILIES

    page = (Path(__file__).parents[2] / "docs/reference/kernel-variants.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines() if line.startswith("| `")}
    for family in FAMILIES.values():
        row = rows[family.name]
        assert family.template in row
        tile = {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "causal_mode"}  # every family's, said above the table
        missing = [p for p in family.parameters if p not in tile and f"`{p}`" not in row]
        assert not missing, (family.name, missing)

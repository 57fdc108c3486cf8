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

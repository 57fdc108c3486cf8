"""The FP8 quantization recipe as a record of its own (issue 40): validated like a config,
split off the template parameters where configs were written with it, and tuned, stored,
exported and dispatched beside the kernel config as a Candidate whose identity (key, name,
canonical JSON) is what the config's was while the recipe was one of its fields."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fa_autotune import ConfigError, Fp8Recipe, KernelConfig
from fa_autotune.paths import data_dir
from fa_autotune.runtime import files
from fa_autotune.spec.candidate import Candidate
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.recipe import default_recipe
from fa_autotune.spec.space import load_space
from fa_autotune.spec.target import SoftwareInfo, interpreter_gpu
from fa_autotune.spec.tuned import FrontPoint, Winner

# Keys, names and canonical JSON of the shipped files' configs and of a sample of configs
# (FP8 ones with every recipe among them), computed on main at 3849d5a, before the recipe
# left KernelConfig.
BEFORE = json.loads((Path(__file__).parent / "data" / "identities_before_issue40.json").read_text())
FP8 = Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn")
FP16 = FP8.with_dtype("float16")


@pytest.mark.parametrize("mapping, parameter, message", [
    ({"fp8_scaling": "per_row"}, "fp8_scaling", "'per_row' is not one of"),
    ({"fp8_hadamard": 1}, "fp8_hadamard", "expected true or false, got 1"),
    ({"fp8_hadamard": "yes"}, "fp8_hadamard", "expected true or false"),
    ({"fp8_scale": "per_head"}, "fp8_scale", "not a quantization recipe parameter; known: fp8_scaling, fp8_hadamard"),
    ({"scaling": "per_head"}, "scaling", "not a quantization recipe parameter"),
])
def test_a_bad_recipe_names_the_parameter(mapping, parameter, message):
    with pytest.raises(ConfigError, match=message) as info:
        Fp8Recipe.from_mapping(mapping)
    assert info.value.parameter == parameter
    with pytest.raises(ConfigError) as info:  # wherever a config mapping carries it
        Candidate.from_mapping(dict(mapping, BLOCK_M=32), fp8=True)
    assert info.value.parameter == parameter


def test_the_record_validates_itself():
    with pytest.raises(ConfigError, match="fp8_scaling: 'blocks' is not one of"):
        Fp8Recipe("blocks")
    with pytest.raises(ConfigError, match="fp8_hadamard: expected true or false"):
        Fp8Recipe(hadamard=None)
    with pytest.raises(ConfigError, match="recipe: expected a mapping"):
        Fp8Recipe.from_mapping(["per_head"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fp8Recipe().scaling = "per_head"  # type: ignore[misc]


def test_mapping_form_round_trip_and_name_part():
    assert Fp8Recipe() == Fp8Recipe("per_block", True, True) == Fp8Recipe.from_mapping({})
    assert Fp8Recipe().name_part == "" and Fp8Recipe().changes() == {}
    for scaling, part in (("per_tensor", "fp8tensor"), ("per_head", "fp8head"), ("per_block", "")):
        for hadamard in (True, False):
            for sink in (True, False):
                recipe = Fp8Recipe(scaling, hadamard, sink)
                assert Fp8Recipe.from_mapping(recipe.to_dict()) == recipe
                assert recipe.to_dict() == {"fp8_scaling": scaling, "fp8_hadamard": hadamard, "fp8_sink_tile": sink}
                assert recipe.name_part == "_".join(
                    p for p in (part, "" if hadamard else "nohad", "" if sink else "nosink") if p)
    assert Fp8Recipe("per_head", False).changes() == {"fp8_scaling": "per_head", "fp8_hadamard": False}
    assert Fp8Recipe(sink_tile=False).changes() == {"fp8_sink_tile": False}
    assert Fp8Recipe().with_(sink_tile=False) == Fp8Recipe(sink_tile=False)
    assert not Fp8Recipe().matches(sink_tile=False) and Fp8Recipe().matches("per_block", True, True)
    with pytest.raises(ConfigError, match="fp8_sink_tile: expected true or false"):
        Fp8Recipe(sink_tile="yes")
    assert Fp8Recipe("per_tensor").with_(hadamard=False) == Fp8Recipe("per_tensor", False)
    assert Fp8Recipe("per_tensor").with_() == Fp8Recipe("per_tensor")
    assert Fp8Recipe("per_head").matches("per_head") and not Fp8Recipe("per_head").matches(hadamard=False)
    assert default_recipe(True) == Fp8Recipe() and default_recipe(False) is None


def test_split_takes_the_recipe_off_a_config_mapping():
    rest, recipe = Fp8Recipe.split({"BLOCK_M": 32, "fp8_scaling": "per_tensor"})
    assert rest == {"BLOCK_M": 32} and recipe == Fp8Recipe("per_tensor", True)
    assert Fp8Recipe.split({"BLOCK_M": 32}) == ({"BLOCK_M": 32}, None)
    config = KernelConfig()
    assert Fp8Recipe.split(config) == (config, None)


def test_the_recipe_is_no_template_parameter():
    """KernelConfig has no recipe fields; a mapping naming a recipe other than the default is
    refused, naming the parameter and where the recipe goes; at the defaults (every
    ``to_dict()`` before issue 40 listed them) the keys are dropped."""
    assert not {"fp8_scaling", "fp8_hadamard"} & set(KernelConfig().to_dict())
    with pytest.raises(TypeError):
        KernelConfig(fp8_scaling="per_tensor")  # type: ignore[call-arg]
    for mapping, parameter in (({"fp8_scaling": "per_tensor"}, "fp8_scaling"),
                               ({"BLOCK_M": 32, "fp8_hadamard": False}, "fp8_hadamard")):
        with pytest.raises(ConfigError, match="recipe is not a kernel parameter: give it separately") as info:
            KernelConfig.from_mapping(mapping)
        assert info.value.parameter == parameter
    old_dump = dict(KernelConfig(BLOCK_M=32).to_dict(), fp8_scaling="per_block", fp8_hadamard=True)
    assert KernelConfig.from_mapping(old_dump) == KernelConfig(BLOCK_M=32)
    with pytest.raises(ConfigError, match="fp8_scaling: 'x' is not one of"):
        KernelConfig.from_mapping({"fp8_scaling": "x"})
    assert KernelConfig.from_json('{"BLOCK_M": 32, "fp8_hadamard": true}') == KernelConfig(BLOCK_M=32)


def test_a_candidate_has_a_recipe_on_fp8_problems_only():
    mapping = {"BLOCK_M": 32, "fp8_scaling": "per_head"}
    assert Candidate.from_mapping(mapping, fp8=True) == Candidate(KernelConfig(BLOCK_M=32), Fp8Recipe("per_head"))
    assert Candidate.from_mapping({"BLOCK_M": 32}, fp8=True).recipe == Fp8Recipe()
    assert Candidate.from_mapping(mapping, fp8=False) == Candidate(KernelConfig(BLOCK_M=32))
    assert Candidate.of(KernelConfig(), True) == Candidate(KernelConfig(), Fp8Recipe())
    assert Candidate.from_stored('{"BLOCK_M": 7}', fp8=True) is None  # no longer valid: left out
    assert Candidate.from_stored("not json", fp8=False) is None
    candidate = Candidate(KernelConfig(BLOCK_M=32, fp8_pv="inplace"), Fp8Recipe("per_tensor", False))
    assert candidate.name == "attn_fwd_qouter_m32n64_w4s3_ptr_cband_fp8tensor_nohad_pvin"
    assert candidate.config.name == "attn_fwd_qouter_m32n64_w4s3_ptr_cband_pvin"
    assert Candidate.from_mapping(candidate.to_dict(), fp8=True) == candidate
    assert candidate.listed_value("fp8_hadamard") is False and candidate.listed_value("BLOCK_M") == 32
    assert Candidate(KernelConfig()).listed_value("fp8_scaling") == "per_block"  # a space's fallback
    assert candidate.with_(BLOCK_M=16).recipe == candidate.recipe


def test_winners_and_front_points_carry_the_recipe_of_fp8_problems_only():
    gpu, sw = interpreter_gpu(), SoftwareInfo("3.6.0", "2.11", "none", "0.1.0", "x")
    assert Winner(FP8, KernelConfig(), 1.0, 1.0, 0.01, gpu, sw).recipe == Fp8Recipe()
    assert Winner(FP16, KernelConfig(), 1.0, 1.0, 0.01, gpu, sw).recipe is None
    with pytest.raises(ValueError, match="not an FP8 problem"):
        Winner(FP16, KernelConfig(), 1.0, 1.0, 0.01, gpu, sw, recipe=Fp8Recipe())
    point = FrontPoint(FP8, KernelConfig(), 1.0, 1.0, 0.01, gpu, sw, recipe=Fp8Recipe("per_head", False))
    row = point.as_row()
    assert (row["fp8_scaling"], row["fp8_hadamard"]) == ("per_head", False)
    assert row["config"]["fp8_scaling"] == "per_head" and row["config_name"].endswith("_fp8head_nohad")


@pytest.mark.parametrize("sample", BEFORE["samples"], ids=lambda s: s["name"])
def test_identities_are_what_they_were_before_the_split(sample):
    """A stored config with a recipe among its parameters reads as a candidate whose JSON, key
    and name are the stored ones, so a re-tune recognises its earlier trials."""
    stored = json.loads(sample["json"])
    identity = (sample["json"], sample["key"], sample["name"])
    candidate = Candidate.from_mapping(stored, fp8=True)
    assert (candidate.canonical_json(), candidate.key, candidate.name) == identity
    if candidate.recipe == Fp8Recipe():  # a default recipe adds nothing: the kernel's own identity
        kernel = Candidate.from_mapping(stored, fp8=False)
        assert kernel.recipe is None and (kernel.canonical_json(), kernel.key, kernel.name) == identity
        assert (candidate.config.canonical_json(), candidate.config.key, candidate.config.name) == identity


def test_fp8_candidates_of_the_space_keep_their_keys():
    """The FP8 sample above covers every recipe: the search space still yields them all, and
    each keeps the key its config had."""
    recipes = {Candidate.from_mapping(json.loads(s["json"]), fp8=True).recipe for s in BEFORE["samples"]}
    assert recipes == {Fp8Recipe(s, h) for s in ("per_tensor", "per_head", "per_block") for h in (True, False)}
    grid = load_space("fwd").for_arch("interpreter").grid(Problem(1, 2, 2, 64, 64, 32, "float8_e4m3fn", True))
    by_key = {c.key: c for c in grid}
    sampled = [s for s in BEFORE["samples"] if s["key"] in by_key]
    assert len(sampled) >= 10 and all(by_key[s["key"]].name == s["name"] for s in sampled)


def test_shipped_files_load_with_the_same_identities(tmp_path):
    """Every entry of tuning_db/ loads unchanged: an entry shipped before the split still
    has the key computed then for its name (entries re-tuned since, a different name in the
    same slot, are new configs: only FP8 ones so far), FP8 entries load with their recipes,
    and writing the loaded records back gives the file's bytes."""
    expected = {(r["file"], r["problem"], r["slot"]): (r["key"], r["name"]) for r in BEFORE["shipped"]}
    seen = {}
    for path in sorted(data_dir("tuning_db").glob("*.json")):
        tuned = files.load(path)
        for winner in tuned.winners:
            seen[(path.name, winner.problem.key, "winner")] = (winner.candidate.key, winner.candidate.name)
            assert (winner.recipe is not None) == winner.problem.is_fp8
            for i, point in enumerate(tuned.front_of(winner.problem)):
                seen[(path.name, winner.problem.key, f"pareto[{i}]")] = (point.candidate.key, point.candidate.name)
        for family in files.FAMILIES:
            if any(w.problem.family == family for w in tuned.winners):
                assert files.write(tuned, tmp_path, family=family).read_bytes() == path.read_bytes()
    key_of = {name: key for key, name in expected.values()}
    assert all(key == key_of[name] for key, name in seen.values() if name in key_of)  # wherever a name is now
    kept = {slot for slot, ids in expected.items() if seen.get(slot) == ids}
    retuned = set(expected) - kept  # the H200 FP8 entries, re-tuned on 2026-12-07
    assert len(kept) >= 50 and all("float8" in problem for _, problem, _ in retuned), sorted(retuned)
    assert {(f, problem) for f, problem, _ in expected} <= {(f, problem) for f, problem, _ in seen}  # none dropped
    recipes = {point.recipe for t in map(files.load, data_dir("tuning_db").glob("*.json")) for w in t.winners
               for point in (w, *t.front_of(w.problem))}
    assert Fp8Recipe() in recipes and {"per_tensor", "per_block"} <= {r.scaling for r in recipes if r}
    assert {True, False} <= {r.sink_tile for r in recipes if r}

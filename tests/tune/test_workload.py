"""`fa-autotune tune --model CONFIG` (problems from a Hugging Face config.json) and
`tune --recorded PATH` (problems a workload ran), down to one tiny tune in the interpreter each."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fa_autotune.runtime import record
from fa_autotune.spec.problem import Problem
from fa_autotune.tune.workload import ModelConfigError, find_config, load_model, model_problems

LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
             "torch_dtype": "bfloat16"}
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
            "sliding_window": 131072, "use_sliding_window": False, "torch_dtype": "bfloat16"}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
              "sliding_window": 4096, "torch_dtype": "bfloat16"}
GEMMA_7B = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 3072, "head_dim": 256,
            "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 8192,
            "torch_dtype": "bfloat16"}
TINY = {"architectures": ["TinyForCausalLM"], "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 64, "torch_dtype": "float16"}


def config(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_llama3_8b(tmp_path):
    model = load_model(str(config(tmp_path, LLAMA3_8B)))
    assert (model.heads, model.kv_heads, model.head_dim, model.dtype, model.causal) == (32, 8, 128, "bfloat16", True)
    work = model_problems(model)
    assert work.problems == tuple(Problem(b, 32, 8, n, n, 128, "bfloat16", True)
                                  for b, n in ((16, 1024), (4, 4096), (2, 8192)))
    assert work.notes == ()
    train = model_problems(model, seqlens=[2048], batch=3, training=True).problems
    assert [p.key for p in train] == ["b3_hq32_hkv8_nq2048_nk2048_d128_bfloat16_causal-top_left",
                                      "b3_hq32_hkv8_nq2048_nk2048_d128_bfloat16_causal-top_left_bwd"]
    serve = [p for p in model_problems(model, serving=True, page_size=16).problems if p.decode]
    assert {(p.batch, p.seqlen_q, p.seqlen_k, p.page_size, p.causal_align) for p in serve} == {
        (b, 1, n, 16, "bottom_right") for b in (1, 16, 64) for n in (1024, 4096, 8192)}


def test_qwen_gqa_7_and_an_unused_window(tmp_path):
    model = load_model(str(config(tmp_path, QWEN2_7B)))
    assert (model.heads, model.kv_heads, model.head_dim, model.sliding_window) == (28, 4, 128, None)
    work = model_problems(model, dtype="float16")
    assert {p.gqa_group for p in work.problems} == {7} and {p.dtype for p in work.problems} == {"float16"}
    assert work.notes == ()


def test_mistral_window_is_tuned_as_causal_and_said(tmp_path):
    work = model_problems(load_model(str(config(tmp_path, MISTRAL_7B))))
    assert all(p.causal for p in work.problems)
    assert any("sliding window of 4096" in n and "do not implement" in n for n in work.notes)


def test_gemma_head_dim_256_and_max_positions_cap(tmp_path):
    model = load_model(str(config(tmp_path, dict(GEMMA_7B, max_position_embeddings=4096))))
    assert model.head_dim == 256  # given, not hidden_size / heads (192)
    work = model_problems(model)
    assert [p.seqlen_q for p in work.problems] == [1024, 4096]
    assert any("max_position_embeddings (4096)" in n for n in work.notes)


def test_float32_configs_tune_half_precision_with_a_note(tmp_path):
    model = load_model(str(config(tmp_path, dict(LLAMA3_8B, torch_dtype="float32"))))
    gpu = model_problems(model)
    assert {p.dtype for p in gpu.problems} == {"bfloat16"} and "float32" in gpu.notes[0]
    assert {p.dtype for p in model_problems(model, interpreter=True).problems} == {"float16"}
    assert {p.dtype for p in model_problems(model, dtype="float32").problems} == {"float32"}  # --dtype wins


def test_encoders_are_not_causal(tmp_path):
    bert = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768, "num_attention_heads": 12,
            "max_position_embeddings": 512, "torch_dtype": "float32"}
    work = model_problems(load_model(str(config(tmp_path, bert))))
    assert [(p.seqlen_q, p.causal, p.heads_kv, p.head_dim) for p in work.problems] == [(512, False, 12, 64)]


@pytest.mark.parametrize("change, message", [
    ({"num_attention_heads": None}, "no num_attention_heads"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer"),
    ({"num_attention_heads": "32"}, "num_attention_heads must be a positive integer"),
    ({"num_key_value_heads": 5}, "not a multiple of num_key_value_heads"),
    ({"hidden_size": 4100}, "hidden_size (4100) is not a multiple"),
    ({"hidden_size": None}, "neither head_dim nor hidden_size"),
    ({"head_dim": 512}, "head_dim 512 is outside"),
    ({"torch_dtype": "int8"}, "torch_dtype 'int8'"),
    ({"sliding_window": -1}, "sliding_window must be a positive integer"),
    ({"max_position_embeddings": True}, "max_position_embeddings must be a positive integer"),
    ({"kv_lora_rank": 512, "qk_rope_head_dim": 64}, "multi-head latent attention"),
    ({"head_dim": 128, "v_head_dim": 64}, "v_head_dim 64 differs from head_dim 128"),
])
def test_bad_configs_are_clear_errors(tmp_path, change, message):
    data = {k: v for k, v in {**LLAMA3_8B, **change}.items() if v is not None}
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(str(config(tmp_path, data)))


def test_attention_free_and_broken_files(tmp_path):
    mamba = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 768}
    with pytest.raises(ModelConfigError, match="model_type 'mamba'.*describes no attention heads"):
        load_model(str(config(tmp_path, mamba)))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_model(str(tmp_path / "bad.json"))
    with pytest.raises(ModelConfigError, match="a config.json is a JSON object"):
        load_model(str(config(tmp_path, [1, 2], "list.json")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelConfigError, match="has no config.json"):
        load_model(str(tmp_path / "empty"))


def test_model_ids_come_from_the_local_hugging_face_cache_only(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelConfigError, match="not in the local Hugging Face cache.*downloads nothing"):
        find_config("meta-llama/Meta-Llama-3-8B")
    repo = tmp_path / "hf" / "hub" / "models--meta-llama--Meta-Llama-3-8B"
    for rev in ("aaa", "bbb"):
        (repo / "snapshots" / rev).mkdir(parents=True)
        config(repo / "snapshots" / rev, dict(LLAMA3_8B, num_key_value_heads=8 if rev == "bbb" else 32))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("bbb\n")
    model = load_model("meta-llama/Meta-Llama-3-8B")
    assert model.path == repo / "snapshots" / "bbb" / "config.json" and model.kv_heads == 8
    with pytest.raises(ModelConfigError, match="not a model id"):
        find_config("no/such/thing.json")


def here(capsys, *args):
    from fa_autotune import cli as cli_module

    capsys.readouterr()
    try:
        code = cli_module.main(list(args))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_lists_the_problems_and_tunes_nothing(tmp_path, capsys):
    db = tmp_path / "never.sqlite"
    code, out, err = here(capsys, "tune", "--model", str(config(tmp_path, MISTRAL_7B)), "--seqlens", "2048",
                          "--training", "--serving", "--batch", "8", "--dry-run", "--db", f"sqlite:///{db}")
    assert code == 0 and not db.exists()
    assert out.split() == ["b8_hq32_hkv8_nq2048_nk2048_d128_bfloat16_causal-top_left",
                           "b8_hq32_hkv8_nq2048_nk2048_d128_bfloat16_causal-top_left_bwd",
                           "b8_hq32_hkv8_nq1_nk2048_d128_bfloat16_causal-bottom_right_kvcache"]
    assert "sliding window" in err and "32 heads, 8 KV heads, head dim 128" in err


@pytest.mark.parametrize("args, message", [
    (["--heads", "8"], "drop --heads"),
    (["--preset", "smoke"], "drop --preset"),
    (["--space", "bwd"], "drop --space"),
    (["--page-size", "16"], "add --serving"),
    (["--seqlens", "1024,x"], "--seqlens takes comma-separated positive integers"),
    (["--seqlens", "0"], "--seqlens takes comma-separated positive integers"),
    (["--causal-align", "bottom_right"], "drop --causal-align"),
])
def test_conflicting_flags_are_one_line_errors(tmp_path, capsys, args, message):
    code, _, err = here(capsys, "tune", "--model", str(config(tmp_path, LLAMA3_8B)), "--dry-run", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) <= 2, err


def test_model_flags_need_a_model(capsys):
    code, _, err = here(capsys, "tune", "--training", "--dry-run")
    assert code == 2 and "use with --model" in err


def test_recorded_order_and_refusals(tmp_path, capsys):
    fwd = Problem(1, 2, 2, 32, 32, 16, "float16")
    hot = Problem(1, 2, 2, 48, 48, 16, "float16")
    decode = Problem(2, 2, 1, 1, 32, 16, "float16", kind="decode")
    path = record.write_record(tmp_path / "rec.json", [record.Recorded(fwd, 50, "exact", "database", fwd.key),
                                                       record.Recorded(hot, 9, "nearest", "database", fwd.key),
                                                       record.Recorded(decode, 20, "default", "default", None)])
    code, out, err = here(capsys, "tune", "--recorded", str(path), "--dry-run")
    assert code == 0 and out.split() == [decode.key, hot.key, fwd.key], out
    assert "2 without a tuned entry of their own" in err
    code, _, err = here(capsys, "tune", "--recorded", str(path), "--dtype", "fp16", "--dry-run")
    assert code == 2 and "drop --dtype" in err
    (tmp_path / "bad.json").write_text("{}")
    code, _, err = here(capsys, "tune", "--recorded", str(tmp_path / "bad.json"), "--dry-run")
    assert code == 2 and "not an fa_autotune record file" in err
    code, _, err = here(capsys, "tune", "--recorded", str(tmp_path / "none.json"), "--dry-run")
    assert code == 2 and "no such record file" in err


def cli(*args, env):
    done = subprocess.run([sys.executable, "-m", "fa_autotune", *args], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture
def env(kernel_cache):
    import os

    e = dict(os.environ, FA_AUTOTUNE_CACHE=str(kernel_cache))
    e.pop("TRITON_INTERPRET", None)
    return e


def test_recorded_tune_end_to_end_in_the_interpreter(tmp_path, env):
    decode = Problem(2, 4, 2, 1, 64, 32, "float16", kind="decode")  # the decode smoke preset's shape
    fwd = Problem(1, 2, 2, 32, 32, 16, "float16")
    path = record.write_record(tmp_path / "rec.json", [record.Recorded(fwd, 3, "default", "default", None),
                                                       record.Recorded(decode, 7, "default", "default", None)])
    db = f"sqlite:///{tmp_path / 'tune.sqlite'}"
    done = cli("tune", "--recorded", str(path), "--trials", "3", "--jobs", "1", "--seed", "2", "--db", db, "--quiet",
               env=env)
    lines = [x for x in done.stdout.splitlines() if x.startswith("tuned problem:")]
    assert [decode.key in lines[0], fwd.key in lines[1]] == [True, True], done.stdout
    assert "attn_decode_" in lines[0] and "attn_fwd_" in lines[1]


def test_model_tune_on_several_gpus_shares_one_study_per_problem(tmp_path, env, monkeypatch, capsys):
    """`tune --gpus all --model`: a tiny made-up GQA model, forward and backward at one short
    length; two workers (faked GPUs, the interpreter) share the database, tune both problems,
    each in its family's space, both finish, no config is measured twice, and the progress
    counts every search trial once."""
    import collections
    import re

    from helpers import measurements

    import torch

    from fa_autotune import cli as cli_module

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    db = f"sqlite:///{tmp_path / 'tune.sqlite'}"
    code = cli_module.main(["tune", "--gpus", "all", "--model", str(config(tmp_path, TINY)), "--seqlens", "32",
                            "--batch", "1", "--training", "--trials", "2", "--jobs", "2", "--seed", "1", "--db", db])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "with 2 worker(s) (GPUs 0, 1)" in out and "--- GPU 0 (exit 0) ---" in out and "--- GPU 1 (exit 0) ---" in out
    done = re.search(r"Done: (\d+)/(\d+) configs settled by 2 workers, (\d+)/(\d+) problems searched", out)
    assert done and done[4] == "2" and done[3] == "2", out
    pairs = [(r[3], r[0]) for r in measurements(db) if r[2] == "search"]
    assert len(set(pairs)) >= 3 and len(pairs) == len(set(pairs))
    assert int(done[2]) == 2 * int(done[4])  # read from the database: every search trial counted once
    assert int(done[1]) == sum(min(n, 2) for n in collections.Counter(problem for problem, _ in pairs).values())
    key = "b1_hq2_hkv1_nq32_nk32_d16_float16_causal-top_left"
    assert f"{key}_bwd; best config: attn_bwd_" in out and f"{key}; best config: attn_fwd_" in out, out


def test_no_causal_overrides_a_decoder_models_mask(tmp_path, capsys):
    """--no-causal on a decoder model tunes its problems without a mask (the flag is not lost
    behind the model's own default); --recorded refuses both spellings, its problems carry
    their masks."""
    code, out, _ = here(capsys, "tune", "--model", str(config(tmp_path, LLAMA3_8B)), "--seqlens", "1024", "--dry-run",
                        "--no-causal")
    assert code == 0 and out.split() and all(key.endswith("_full") for key in out.split()), out
    code, out, _ = here(capsys, "tune", "--model", str(config(tmp_path, LLAMA3_8B)), "--seqlens", "1024", "--dry-run")
    assert code == 0 and all("_causal-" in key for key in out.split()), out
    fwd = Problem(1, 2, 2, 32, 32, 16, "float16")
    path = record.write_record(tmp_path / "rec.json", [record.Recorded(fwd, 5, "default", "default", None)])
    for flag in ("--causal", "--no-causal"):
        code, _, err = here(capsys, "tune", "--recorded", str(path), "--dry-run", flag)
        assert code == 2 and f"drop {flag}" in err, err

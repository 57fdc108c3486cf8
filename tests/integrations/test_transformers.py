"""transformers integration: a tiny random-initialised Llama-style model (no download) runs
prefill and cached greedy generation through fa_autotune, against SDPA with the same weights."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from fa_autotune import InputError  # noqa: E402
from fa_autotune.integrations import transformers as fa_hf  # noqa: E402


def tiny_llama(device="cpu", dtype=torch.float32, layers=2, hidden=64, heads=4, kv_heads=2):
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=fa_hf.register())
    return model.to(device=device, dtype=dtype).eval()


@pytest.fixture
def calls(monkeypatch):
    """Counts of the fa_autotune entry points the integration called (prefill, KV cache)."""
    counts = {"attention": 0, "attention_with_kvcache": 0}
    for name in counts:
        real = getattr(fa_hf, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(fa_hf, name, spy)
    return counts


def logits(model, implementation, **inputs):
    model.config._attn_implementation = implementation
    with torch.no_grad():
        return model(**inputs).logits.float()


def test_prefill_logits_match_sdpa_within_eager_tolerance(device, calls):
    model = tiny_llama(device)
    ids = torch.randint(0, 128, (2, 24), device=device)
    ours, sdpa, eager = (logits(model, impl, input_ids=ids) for impl in ("fa_autotune", "sdpa", "eager"))
    assert calls == {"attention": 2, "attention_with_kvcache": 0}  # one prefill per layer, through fa_autotune
    eager_gap = (eager - sdpa).abs().max().item()
    assert (ours - sdpa).abs().max().item() <= max(4 * eager_gap, 1e-4)


def test_cached_greedy_generation_matches_sdpa(device, calls):
    model = tiny_llama(device)
    ids = torch.randint(0, 128, (2, 9), device=device)
    runs = {}
    for impl in ("fa_autotune", "sdpa"):
        model.config._attn_implementation = impl
        with torch.no_grad():
            runs[impl] = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                        pad_token_id=0)
    assert runs["fa_autotune"].shape == (2, 15)
    assert calls == {"attention": 2, "attention_with_kvcache": 2 * 5}  # prefill, then 5 cached decode steps
    assert torch.equal(runs["fa_autotune"], runs["sdpa"])


def test_static_cache_lengths_come_from_the_mask(device, calls):
    """A static cache hands the layer every slot with a mask hiding the unused ones: the
    integration reads the lengths off the mask."""
    model = tiny_llama(device, layers=1)
    ids = torch.randint(0, 128, (1, 7), device=device)
    runs = {}
    for impl in ("fa_autotune", "sdpa"):
        model.config._attn_implementation = impl
        with torch.no_grad():
            runs[impl] = model.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static",
                                        pad_token_id=0)
    # One layer, four forward passes; the three decode steps read their lengths off the mask
    # (over the whole static cache the zero slots would change the tokens).
    assert calls["attention"] + calls["attention_with_kvcache"] == 4 and calls["attention_with_kvcache"] >= 3
    assert torch.equal(runs["fa_autotune"], runs["sdpa"])


def test_left_padding_is_refused_not_ignored(device):
    model = tiny_llama(device, layers=1)
    ids = torch.randint(1, 128, (2, 8), device=device)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    model.config._attn_implementation = "fa_autotune"
    with pytest.raises(InputError, match="left padding"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


def test_training_step_matches_sdpa_and_attention_weights_are_refused(device):
    """A training step (grad mode on) runs our backward: the weight gradients equal SDPA's
    to float32 precision; output_attentions is refused, not answered with None."""
    model = tiny_llama(device, layers=1)
    ids = torch.randint(0, 128, (2, 16), device=device)
    grads = {}
    for impl in ("fa_autotune", "sdpa"):
        model.config._attn_implementation = impl
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        grads[impl] = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    assert rel_err(grads["fa_autotune"], grads["sdpa"]) < 1e-4
    model.config._attn_implementation = "fa_autotune"
    with pytest.raises(InputError, match="output_attentions"), torch.no_grad():
        model(input_ids=ids, output_attentions=True)


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_realistic_llama_prefill_and_generation():
    """A 1B-parameter-shaped layer stack (hidden 2048, 32 heads, 8 KV heads, D 64) in bf16:
    logits within the gap eager shows, greedy tokens equal to SDPA's for most steps."""
    model = tiny_llama("cuda", torch.bfloat16, layers=4, hidden=2048, heads=32, kv_heads=8)
    ids = torch.randint(1, 128, (4, 512), device="cuda")  # no pad token (0) in the prompt
    ours, sdpa, eager = (logits(model, impl, input_ids=ids) for impl in ("fa_autotune", "sdpa", "eager"))
    eager_gap = (eager - sdpa).abs().max().item()
    assert (ours - sdpa).abs().max().item() <= max(2 * eager_gap, 1e-2)
    runs = {}
    for impl in ("fa_autotune", "sdpa"):
        model.config._attn_implementation = impl
        with torch.no_grad():
            runs[impl] = model.generate(ids[:, :64], attention_mask=torch.ones_like(ids[:, :64]), max_new_tokens=16,
                                        do_sample=False, pad_token_id=0)
    agree = (runs["fa_autotune"][:, 64:] == runs["sdpa"][:, 64:]).float().mean().item()
    assert agree >= 0.9, f"greedy tokens agree on {agree:.0%}"

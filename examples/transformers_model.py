"""Hugging Face transformers with attn_implementation="fa_autotune": a tiny random Llama-style
model built from a config in code (nothing downloaded), its logits compared with "sdpa", then
a few greedy tokens generated through the KV-cache path.

    pip install 'fa-autotune[transformers]'
    GPU: python examples/transformers_model.py
    CPU: TRITON_INTERPRET=1 python examples/transformers_model.py   (Triton's interpreter: slow, tiny shapes)
"""
import copy
import sys

import torch

import fa_autotune.integrations.transformers as fa_hf
from _device import pick_device

try:
    import transformers
except ImportError:
    sys.exit("this example needs transformers: pip install 'fa-autotune[transformers]'")

device, dtype = pick_device()
torch.manual_seed(0)

name = fa_hf.register()  # adds attn_implementation="fa_autotune" to transformers' AttentionInterface
config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
input_ids = torch.randint(0, config.vocab_size, (2, 24), device=device)


def build(implementation):
    """The model with this attention implementation; the same random weights every time."""
    torch.manual_seed(1)
    # A copy of the config each: from_config records the implementation in the config it is
    # given, so models sharing one config would all run the last one built.
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=implementation)
    return model.to(device=device, dtype=dtype).eval()


models = {implementation: build(implementation) for implementation in (name, "sdpa", "eager")}
in_use = models[name].config._attn_implementation  # what transformers will call
print(f"  attention implementation in use: {in_use!r}")
with torch.no_grad():
    logits = {implementation: model(input_ids=input_ids).logits.float() for implementation, model in models.items()}
difference = (logits[name] - logits["sdpa"]).abs().max().item()
eager_difference = (logits["eager"] - logits["sdpa"]).abs().max().item()  # transformers' own eager attention
print(f"  max abs logit difference vs sdpa: fa_autotune {difference:.1e}, eager {eager_difference:.1e}")

# Generation: the prompt runs through attention(), each cached decode step through the
# KV-cache kernel (attention_with_kvcache).
tokens = {}
for implementation in (name, "sdpa"):
    with torch.no_grad():
        prompt = input_ids[:, :8]
        tokens[implementation] = models[implementation].generate(prompt, attention_mask=torch.ones_like(prompt),
                                                                 max_new_tokens=5, do_sample=False, pad_token_id=0)
same_tokens = torch.equal(tokens[name], tokens["sdpa"])
print(f"  greedy generation, 5 new tokens: identical to sdpa's: {same_tokens}")

print(f"transformers_model: max abs logit difference {difference:.1e} vs sdpa ({device}, "
      f"{str(dtype).removeprefix('torch.')}, transformers {transformers.__version__})")
rounding = torch.finfo(dtype).eps * logits["sdpa"].abs().max().item()  # one rounding of the largest logit
if in_use != name or difference > max(4 * eager_difference, 2 * rounding):
    sys.exit("transformers_model: FAILED (not fa_autotune, or logits further from sdpa's than 4x eager attention's)")

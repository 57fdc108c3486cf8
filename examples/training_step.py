"""Training with attention() in the forward: a tiny causal language model (embedding, one
GQA self-attention layer, MLP) trained a few steps under autocast, its gradients checked once
against the same model with SDPA.

    GPU: python examples/training_step.py
    CPU: TRITON_INTERPRET=1 python examples/training_step.py   (Triton's interpreter: slow, tiny shapes)
"""
import sys

import torch
import torch.nn.functional as F

from fa_autotune import attention
from _device import pick_device

device, dtype = pick_device()
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]  # gradient difference, relative to its largest
torch.manual_seed(0)


def sdpa(q, k, v, is_causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=32, dim=32, heads=2, kv_heads=1):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens, attention_fn=attention):
        x = self.embed(tokens)
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                     self.kv_heads * self.head_dim], dim=-1)
        q, k, v = (t.view(b, n, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (b, heads, n, head_dim)
        a = attention_fn(q, k, v, is_causal=True)  # differentiable: the backward runs fa_autotune's dQ/dK/dV kernels
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, -1))
        return self.head(x + self.mlp(x))


def loss_of(model, tokens, attention_fn=attention):
    with torch.autocast(device, dtype=dtype):  # fp32 weights, fp16/bf16 activations: q, k, v reach attention in dtype
        logits = model(tokens[:, :-1], attention_fn).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


model = TinyLM().to(device)
# A learnable pattern: every token repeats the one 3 places back, so attention has work to do.
tokens = torch.randint(0, 32, (4, 24), device=device)
tokens[:, 3:] = tokens[:, :-3].clone()

# Gradients once, against the same model with SDPA in the same precision.
grads = {}
for name, fn in (("fa_autotune", attention), ("sdpa", sdpa)):
    model.zero_grad()
    loss_of(model, tokens, fn).backward()
    grads[name] = [p.grad.clone() for p in model.parameters()]
grad_error = max((ours - ref).abs().max().item() / ref.abs().max().item()
                 for ours, ref in zip(grads["fa_autotune"], grads["sdpa"]))

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
losses = []
for step in range(8):
    loss = loss_of(model, tokens)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(f"  loss per step: {' '.join(f'{x:.3f}' for x in losses)}")

print(f"training_step: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps; gradients within "
      f"{grad_error:.1e} of SDPA's (relative) ({device}, {str(dtype).removeprefix('torch.')})")
if grad_error > TOLERANCE or not losses[-1] < losses[0]:
    sys.exit(f"training_step: FAILED (gradient tolerance {TOLERANCE:.0e}, or the loss did not go down)")

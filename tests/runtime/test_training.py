"""A real training check: a tiny GPT-style model trained from one seed with fa_autotune's
attention and with SDPA gives the same loss curve (fp32 in Triton's interpreter)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fa_autotune


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, use_ours: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.use_ours = heads, kv_heads, dim // heads, use_ours
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                                 self.kv_heads * self.head_dim], -1)
        q, k, v = (t.view(b, n, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.use_ours:
            a = fa_autotune.attention(q, k, v, causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, -1))
        return x + self.mlp(self.norm2(x))


def train(use_ours: bool, steps: int = 15, device: str = "cpu", dim: int = 64, heads: int = 4, kv_heads: int = 2,
          layers: int = 2, tokens: int = 25, batch: int = 4, dtype: torch.dtype = torch.float32) -> list[float]:
    torch.manual_seed(0)
    vocab = 64
    embed = torch.nn.Embedding(vocab, dim)
    blocks = torch.nn.Sequential(*(Block(dim, heads, kv_heads, use_ours) for _ in range(layers)))
    head = torch.nn.Linear(dim, vocab)
    model = torch.nn.ModuleList([embed, blocks, head]).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(1)).to(device)
    # A learnable pattern: every token repeats the one 3 back, so attention matters.
    data[:, 3:] = data[:, :-3].clone()
    losses = []
    for _ in range(steps):
        logits = head(blocks(embed(data[:, :-1]))).float()
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_tiny_gpt_trains_like_sdpa(device):
    ours, sdpa = train(True, device=device), train(False, device=device)
    assert ours[-1] < 0.8 * ours[0]  # it learns
    assert max(abs(a - b) for a, b in zip(ours, sdpa)) < 1e-3, (ours, sdpa)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_gpt_trains_like_sdpa_in_bf16():
    """A realistic width in bf16 (4 layers, 512 wide, 8/2 heads of 64, 512 tokens): after
    60 steps both curves have learned and stay within bf16 noise of each other."""
    kwargs = dict(steps=60, device="cuda", dim=512, heads=8, kv_heads=2, layers=4, tokens=513, batch=8,
                  dtype=torch.bfloat16)
    ours, sdpa = train(True, **kwargs), train(False, **kwargs)
    assert ours[-1] < 0.5 * ours[0] and sdpa[-1] < 0.5 * sdpa[0]
    assert max(abs(a - b) / b for a, b in zip(ours, sdpa)) < 0.05, (ours, sdpa)

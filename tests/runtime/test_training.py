"""A real training check: a tiny GPT-style model trained from one seed with fa_autotune's
attention and with SDPA gives the same loss curve (fp32 in Triton's interpreter)."""
from __future__ import annotations

import contextlib
import statistics

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

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
          layers: int = 2, tokens: int = 25, batch: int = 4, dtype: torch.dtype = torch.float32, lr: float = 3e-3,
          autocast: torch.dtype | None = None, sdpa_backend=None) -> list[float]:
    """Loss per step of a `layers`-block GPT from seed 0; `autocast` runs it in mixed precision
    (fp32 weights, as models are trained), `sdpa_backend` pins SDPA's kernel."""
    torch.manual_seed(0)
    vocab = 64
    embed = torch.nn.Embedding(vocab, dim)
    blocks = torch.nn.Sequential(*(Block(dim, heads, kv_heads, use_ours) for _ in range(layers)))
    head = torch.nn.Linear(dim, vocab)
    model = torch.nn.ModuleList([embed, blocks, head]).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(1)).to(device)
    # A learnable pattern: every token repeats the one 3 back, so attention matters.
    data[:, 3:] = data[:, :-3].clone()
    losses = []
    for _ in range(steps):
        with torch.autocast(device, dtype=autocast or torch.float32, enabled=autocast is not None), \
                (sdpa_kernel(sdpa_backend) if sdpa_backend else contextlib.nullcontext()):
            logits = head(blocks(embed(data[:, :-1]))).float()
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_tiny_gpt_trains_like_sdpa(device):
    # 6 steps of batch 2: the interpreter takes ~3 s per step
    ours, sdpa = (train(use_ours, steps=6, batch=2, device=device) for use_ours in (True, False))
    assert ours[-1] < 0.8 * ours[0]  # it learns
    assert max(abs(a - b) for a, b in zip(ours, sdpa)) < 1e-3, (ours, sdpa)


def compare_curves(ours: list[float], ref: list[float], other: list[float], early: int = 30) -> dict[str, float]:
    """What "same training within bf16 noise" means here. Early on, before the loss is small
    enough for bf16 rounding to send runs apart, the largest relative gap of ours to the
    reference against that of `other` (a second same-precision kernel, the noise floor);
    at the end, the median loss of the last 20 steps (single spikes come and go in every run).
    The early gaps measured on an H200: ours 0.042 and 0.004 against SDPA flash's 0.040 and 0.022."""
    gap = lambda a, b: max(abs(x - y) / y for x, y in zip(a[:early], b[:early]))  # noqa: E731
    tail = lambda c: statistics.median(c[-20:])  # noqa: E731
    return dict(early_gap=gap(ours, ref), early_noise=gap(other, ref), first=ref[0], end=tail(ours),
                end_ref=tail(ref), end_other=tail(other))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_gpt_trains_like_sdpa_in_bf16():
    """A realistic width in mixed precision (fp32 weights, bf16 autocast; 4 layers, 512 wide,
    8/2 heads of 64, 512 tokens, 200 steps) trained with ours and with SDPA's cuDNN and
    flash kernels: ours tracks cuDNN as closely as flash does, and learns as they do."""
    kwargs = dict(steps=200, device="cuda", dim=512, heads=8, kv_heads=2, layers=4, tokens=513, batch=8,
                  lr=1e-3, autocast=torch.bfloat16)
    ours = train(True, **kwargs)
    cudnn = train(False, sdpa_backend=SDPBackend.CUDNN_ATTENTION, **kwargs)
    flash = train(False, sdpa_backend=SDPBackend.FLASH_ATTENTION, **kwargs)
    c = compare_curves(ours, cudnn, flash)
    # all three learned (late in the run, bf16 runs part ways: SDPA's two kernels ended at
    # 0.054 and 0.044 in one H200 run, 0.157 and 0.05 in another)
    assert max(c["end"], c["end_ref"], c["end_other"]) < 0.1 * c["first"], c
    # Early gaps are chaotic too: flash's own ranged 0.005-0.04 over H200 runs, and ours
    # 0.004-0.042 (0.014 against flash's 0.005 in one run); the gradients below are the exact check.
    assert c["early_gap"] <= max(2 * c["early_noise"], 0.02), c
    # The same attention's gradients (B 8, 8/2 heads of 64, 512 tokens, causal, bf16) against
    # float32 autograd: ours within 5% of cuDNN's own error.
    torch.manual_seed(0)
    q, dout = (torch.randn(8, 8, 512, 64, device="cuda") for _ in range(2))
    k, v = (torch.randn(8, 2, 512, 64, device="cuda") for _ in range(2))

    def grads(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward(dout.to(dtype))
        return [t.grad.float() for t in leaves]

    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    exact = grads(sdpa, torch.float32)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        theirs = grads(sdpa, torch.bfloat16)
    mine = grads(lambda q, k, v: fa_autotune.attention(q, k, v, causal=True), torch.bfloat16)
    for a, b, w in zip(mine, theirs, exact):
        assert (a - w).norm() <= 1.05 * (b - w).norm() + 1e-6 * w.norm()

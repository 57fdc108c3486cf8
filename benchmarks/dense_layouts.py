"""Dense attention() on 64 x 1024 (bf16, 32/8 heads, D 128) in (B, H, N, D) storage and in
flash-attn's (B, N, H, D) (what packed varlen tensors look like to TMA: rows H * D apart).

Usage: python3 benchmarks/dense_layouts.py   (prints one line per case)
"""
import torch

import fa_autotune
from fa_autotune.tune.measure import time_callable
for causal in (False, True):
    for layout in ("bhnd", "bnhd"):
        if layout == "bhnd":
            q = torch.randn(64, 32, 1024, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(64, 8, 1024, 128, device="cuda", dtype=torch.bfloat16)
        else:
            q = torch.randn(64, 1024, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            k = torch.randn(64, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        v = torch.randn_like(k)
        g = lambda: fa_autotune.attention(q, k, v, causal=causal)
        g()
        ms = time_callable(g).median_ms
        print(f"causal={causal} {layout}: {ms:.3f} ms {64 * 4.0 * 32 * 1024 * 1024 * 128 / (2 if causal else 1) / ms / 1e9:.0f} TFLOPS", flush=True)

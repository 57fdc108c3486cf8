"""Dense attention() on 64 x 1024 (bf16, 32/8 heads, D 128) in (B, H, N, D) storage and in
flash-attn's (B, N, H, D) (what packed varlen tensors look like to TMA: rows H * D apart).
Every output is checked against float32 attention before it is timed.

Usage: python3 benchmarks/dense_layouts.py   (prints one line per case)
"""
import sys
from pathlib import Path

import torch

import fa_autotune
from fa_autotune.tune.reference import reference_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from varlen_ragged import checked_ms  # noqa: E402


def main() -> None:
    for causal in (False, True):
        for layout in ("bhnd", "bnhd"):
            if layout == "bhnd":
                q = torch.randn(64, 32, 1024, 128, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(64, 8, 1024, 128, device="cuda", dtype=torch.bfloat16)
            else:
                q = torch.randn(64, 1024, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                k = torch.randn(64, 1024, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            v = torch.randn_like(k)

            def call():
                return fa_autotune.attention(q, k, v, causal=causal)

            ms = checked_ms(call, reference_attention(q, k, v, causal=causal)[0], f"attention() ({layout})")
            flops = 64 * 4.0 * 32 * 1024 * 1024 * 128 / (2 if causal else 1)
            print(f"causal={causal} {layout}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOPS", flush=True)


if __name__ == "__main__":
    main()

"""attention_varlen on 64 packed sequences: the varlen_bench lengths, the same rounded up to
128-row tiles, all 1024 and all 1088 tokens, against dense attention() on 64 x 1024 (bf16, 32/8
heads, D 128, lengths unchecked). Equal lengths isolate the varlen kernel from ragged tiles.

Usage: python3 benchmarks/varlen_ragged.py   (prints one line per case)
"""
import torch

import fa_autotune
from fa_autotune.tune.measure import time_callable
HQ, HKV, D = 32, 8, 128
gen = torch.Generator().manual_seed(0)
torch.randint(256, 4097, (16,), generator=gen)
L = torch.randint(64, 2049, (64,), generator=gen).tolist()
cases = {"as bench": L, "rounded up to 128": [-(-n // 128) * 128 for n in L], "all 1024": [1024] * 64,
         "all 1088": [1088] * 64}
for causal in (False, True):
    for name, lens in cases.items():
        total = sum(lens)
        q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
        f = lambda: fa_autotune.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal, check_lengths=False)
        f()
        ms = time_callable(f).median_ms
        fl = sum(4.0 * HQ * n * n * D for n in lens) / (2 if causal else 1)
        print(f"causal={causal} {name}: {ms:.3f} ms {fl / ms / 1e9:.0f} TFLOPS", flush=True)
    qd = torch.randn(64, HQ, 1024, D, device="cuda", dtype=torch.bfloat16)
    kd = torch.randn(64, HKV, 1024, D, device="cuda", dtype=torch.bfloat16)
    vd = torch.randn_like(kd)
    g = lambda: fa_autotune.attention(qd, kd, vd, causal=causal)
    g()
    ms = time_callable(g).median_ms
    print(f"causal={causal} dense 64x1024: {ms:.3f} ms {64 * 4.0 * HQ * 1024 * 1024 * D / (2 if causal else 1) / ms / 1e9:.0f} TFLOPS", flush=True)

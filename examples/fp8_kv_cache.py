"""attention_with_kvcache() over an FP8 (e4m3) KV cache: half the bytes a decode step reads.
The cache holds k / k_descale (one descale per sequence and KV head, flash-attn 3's names);
new tokens are quantized as they are appended. Checked against SDPA over the dequantized
cache, and compared with the same steps over a 16-bit cache.

    GPU: python examples/fp8_kv_cache.py
    CPU: TRITON_INTERPRET=1 python examples/fp8_kv_cache.py   (Triton's interpreter: slow, tiny shapes)
"""
import sys

import torch
import torch.nn.functional as F

from fa_autotune import attention_with_kvcache
from _device import pick_device

device, dtype = pick_device()
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]  # max abs error vs float32 over the same cache
torch.manual_seed(0)

batch, heads_q, heads_kv, head_dim, capacity = 2, 4, 2, 32, 64
prompt_lengths, steps = [21, 7], 3

# Prefilled caches: the 16-bit one, and its e4m3 copy with a descale per (sequence, KV head)
# that maps each head's largest value to e4m3's largest, 448.
k16 = torch.zeros(batch, capacity, heads_kv, head_dim, device=device, dtype=dtype)
v16 = torch.zeros_like(k16)
for b, n in enumerate(prompt_lengths):
    k16[b, :n], v16[b, :n] = (torch.randn(n, heads_kv, head_dim, device=device, dtype=dtype) for _ in range(2))
k_descale = (k16.float().abs().amax(dim=(1, 3)) * 2 / 448).clamp_min(1e-6)  # (batch, heads_kv), room for new tokens
v_descale = (v16.float().abs().amax(dim=(1, 3)) * 2 / 448).clamp_min(1e-6)
k8 = (k16.float() / k_descale[:, None, :, None]).to(torch.float8_e4m3fn)
v8 = (v16.float() / v_descale[:, None, :, None]).to(torch.float8_e4m3fn)
lengths = torch.tensor(prompt_lengths, device=device, dtype=torch.int32)

error = 0.0
for step in range(steps):
    q = torch.randn(batch, 1, heads_q, head_dim, device=device, dtype=dtype)
    k_new, v_new = (torch.randn(batch, 1, heads_kv, head_dim, device=device, dtype=dtype) for _ in range(2))
    out16 = attention_with_kvcache(q, k16, v16, k_new, v_new, cache_seqlens=lengths.clone(), causal=True)
    out8 = attention_with_kvcache(q, k8, v8, k_new, v_new, cache_seqlens=lengths, causal=True,
                                  k_descale=k_descale, v_descale=v_descale)  # appends quantized, then attends
    lengths += 1
    for b in range(batch):  # reference: SDPA in float32 over what the FP8 cache now holds, dequantized
        n = int(lengths[b])
        keys = k8[b, :n].float() * k_descale[b][None, :, None]
        values = v8[b, :n].float() * v_descale[b][None, :, None]
        qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q[b].float(), keys, values))
        reference = F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)[0].transpose(0, 1)
        error = max(error, (out8[b].float() - reference).abs().max().item())
    # What e4m3 costs: the relative error against the same step over the 16-bit cache (larger on
    # the CPU, whose interpreter rounds some appended values to fp8 wrong: 7.9 becomes 4.0).
    gap = ((out8.float() - out16.float()).norm() / out16.float().norm()).item()
    print(f"  step {step}: lengths {lengths.tolist()}, relative difference from the 16-bit cache {gap:.3f}")

print(f"fp8_kv_cache: max abs error {error:.1e} vs SDPA over the dequantized cache, {steps} decode steps "
      f"({device}, {str(dtype).removeprefix('torch.')} q)")
if error > TOLERANCE:
    sys.exit(f"fp8_kv_cache: FAILED (tolerance {TOLERANCE:.0e})")

"""attention(): the SDPA drop-in, causal with GQA, its log-sum-exp, and explain().

    GPU: python examples/dense.py
    CPU: TRITON_INTERPRET=1 python examples/dense.py   (Triton's interpreter: slow, tiny shapes)
"""
import sys

import torch
import torch.nn.functional as F

from fa_autotune import attention, explain
from _device import pick_device

device, dtype = pick_device()
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]  # max abs error vs float32
torch.manual_seed(0)

# SDPA's layout: (batch, heads, seqlen, head_dim). GQA: 8 query heads share 2 K/V heads.
batch, heads_q, heads_kv, seqlen, head_dim = 2, 8, 2, 100, 64
q = torch.randn(batch, heads_q, seqlen, head_dim, device=device, dtype=dtype)
k = torch.randn(batch, heads_kv, seqlen, head_dim, device=device, dtype=dtype)
v = torch.randn(batch, heads_kv, seqlen, head_dim, device=device, dtype=dtype)

# The call SDPA users already write: same keyword names, same result.
out = attention(q, k, v, is_causal=True)
reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)

# The log-sum-exp of each query row's scores (natural log, float32, (batch, heads, seqlen)),
# checked against plain torch ops in float32.
out2, lse = attention(q, k, v, is_causal=True, return_lse=True)
scores = q.float() @ k.float().repeat_interleave(heads_q // heads_kv, dim=1).transpose(-1, -2) / head_dim**0.5
future = torch.ones(seqlen, seqlen, dtype=torch.bool, device=device).triu(1)  # key j > query i
lse_reference = scores.masked_fill(future, float("-inf")).logsumexp(dim=-1)

# explain(): which kernel variant the dispatcher picked for this problem, and where from
# ("database", "exported", "shipped" or "default"). It never launches or tunes anything.
info = explain(q, k, v, causal=True)
print(f"explain: {info['kernel']} from source '{info['source']}' ({info['origin']}; "
      f"matched problem: {info['matched_problem']}); backward: {info['backward']['kernel']}")

error = (out.float() - reference).abs().max().item()
error_with_lse = (out2.float() - reference).abs().max().item()
error_lse = (lse - lse_reference).abs().max().item()
print(f"return_lse: output max abs error {error_with_lse:.1e} vs SDPA, LSE {error_lse:.1e} vs float32 logsumexp")
print(f"dense: max abs error {error:.1e} vs SDPA ({device}, {str(dtype).removeprefix('torch.')})")
if max(error, error_with_lse, error_lse) > TOLERANCE:
    sys.exit(f"dense: FAILED (tolerance {TOLERANCE:.0e})")

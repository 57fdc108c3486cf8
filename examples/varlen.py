"""attention_varlen(): sequences of different lengths packed without padding, flash-attn's
flash_attn_varlen_func layout, checked sequence by sequence against SDPA.

    GPU: python examples/varlen.py
    CPU: TRITON_INTERPRET=1 python examples/varlen.py   (Triton's interpreter: slow, tiny shapes)
"""
import sys

import torch
import torch.nn.functional as F

from fa_autotune import attention_varlen
from _device import pick_device

device, dtype = pick_device()
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]  # max abs error vs float32
torch.manual_seed(0)

# Four sequences of different lengths, packed back to back: no padding anywhere.
lengths = [37, 5, 64, 20]
heads_q, heads_kv, head_dim = 4, 2, 32
total = sum(lengths)
q = torch.randn(total, heads_q, head_dim, device=device, dtype=dtype)  # (total_tokens, heads, head_dim)
k = torch.randn(total, heads_kv, head_dim, device=device, dtype=dtype)
v = torch.randn(total, heads_kv, head_dim, device=device, dtype=dtype)
# int32 offsets: sequence b owns rows cu_seqlens[b]:cu_seqlens[b + 1] ([0, 37, 42, 106, 126]).
cu_seqlens = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)

# Self-attention, so queries and keys share offsets. (With different query and key lengths,
# causal aligns the diagonal bottom-right per sequence, as flash-attn does.)
out = attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True)

# Each sequence on its own: SDPA in float32 on its rows, in SDPA's (1, heads, seqlen, head_dim).
error = 0.0
for b, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
    qb, kb, vb = (t[start:end].transpose(0, 1).unsqueeze(0).float() for t in (q, k, v))
    reference = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
    seq_error = (out[start:end].float() - reference[0].transpose(0, 1)).abs().max().item()
    print(f"  sequence {b}: {end - start:3d} tokens, max abs error {seq_error:.1e}")
    error = max(error, seq_error)

print(f"varlen: max abs error {error:.1e} vs SDPA per sequence, {len(lengths)} sequences "
      f"({device}, {str(dtype).removeprefix('torch.')})")
if error > TOLERANCE:
    sys.exit(f"varlen: FAILED (tolerance {TOLERANCE:.0e})")

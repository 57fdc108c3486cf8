"""attention_with_kvcache(): decode steps over a paged KV cache (flash-attn's
flash_attn_with_kvcache with block_table), checked against SDPA over the dense history.

    GPU: python examples/paged_kv_cache.py
    CPU: TRITON_INTERPRET=1 python examples/paged_kv_cache.py   (Triton's interpreter: slow, tiny shapes)
"""
import sys

import torch
import torch.nn.functional as F

from fa_autotune import attention_with_kvcache
from _device import pick_device

device, dtype = pick_device()
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]  # max abs error vs float32
torch.manual_seed(0)

heads_q, heads_kv, head_dim = 4, 2, 32
page_size, num_pages, pages_per_seq = 16, 10, 4      # each sequence may grow to 4 * 16 = 64 tokens
prompt_lengths = [21, 7]                              # two sequences, already prefilled
batch, steps = len(prompt_lengths), 3

# The paged cache, flash-attn's layout: (num_pages, page_size, heads_kv, head_dim), and a
# block table mapping each sequence's i-th page to a page of the pool (any order).
k_cache = torch.zeros(num_pages, page_size, heads_kv, head_dim, device=device, dtype=dtype)
v_cache = torch.zeros_like(k_cache)
block_table = torch.randperm(num_pages, device=device)[:batch * pages_per_seq]
block_table = block_table.reshape(batch, pages_per_seq).to(torch.int32)


def rows(b, n):
    """Where token positions 0..n-1 of sequence b live in the paged cache: (page, slot)."""
    position = torch.arange(n, device=device)
    return block_table[b, position // page_size].long(), position % page_size


# Prefill (what a serving engine's prompt pass leaves behind): each prompt's keys and values
# written into its pages. `history` keeps the same rows densely, for the reference.
history = []
for b, n in enumerate(prompt_lengths):
    keys, values = (torch.randn(n, heads_kv, head_dim, device=device, dtype=dtype) for _ in range(2))
    k_cache[rows(b, n)], v_cache[rows(b, n)] = keys, values
    history.append((keys, values))
cache_seqlens = torch.tensor(prompt_lengths, device=device, dtype=torch.int32)

error = 0.0
for step in range(steps):
    # One new token per sequence: its query, key and value, flash-attn's (batch, 1, heads, head_dim).
    q = torch.randn(batch, 1, heads_q, head_dim, device=device, dtype=dtype)
    k_new = torch.randn(batch, 1, heads_kv, head_dim, device=device, dtype=dtype)
    v_new = torch.randn(batch, 1, heads_kv, head_dim, device=device, dtype=dtype)
    # Writes k_new/v_new into the pages at position cache_seqlens[b], then attends over all
    # cache_seqlens[b] + 1 keys of each sequence.
    out = attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                 block_table=block_table, causal=True)
    cache_seqlens += 1  # the caller advances the lengths (the cache itself was updated in place)

    for b in range(batch):  # reference: SDPA in float32 over this sequence's dense history
        keys, values = (torch.cat([h, new[b]]) for h, new in zip(history[b], (k_new, v_new)))
        history[b] = (keys, values)
        qb, kb, vb = (t.transpose(0, 1).unsqueeze(0).float() for t in (q[b], keys, values))
        reference = F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)[0].transpose(0, 1)
        error = max(error, (out[b].float() - reference).abs().max().item())
    print(f"  step {step}: sequence lengths now {cache_seqlens.tolist()}")

# The new tokens' keys and values were appended into the pages, in place.
appended = all(torch.equal(k_cache[rows(b, n)], history[b][0]) and torch.equal(v_cache[rows(b, n)], history[b][1])
               for b, n in enumerate(cache_seqlens.tolist()))
print(f"  cache pages hold every sequence's whole history: {appended}")
print(f"paged_kv_cache: max abs error {error:.1e} vs SDPA over the dense history, {steps} decode steps, "
      f"page size {page_size} ({device}, {str(dtype).removeprefix('torch.')})")
if error > TOLERANCE or not appended:
    sys.exit(f"paged_kv_cache: FAILED (tolerance {TOLERANCE:.0e})")

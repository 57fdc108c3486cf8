"""One dispatched backward (B 4, H 16, N 4096, D from argv, causal bf16) after a warm-up: for ncu."""
import sys
import torch
import fa_autotune
d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
q, k, v = (torch.randn(4, 16, 4096, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for _ in range(2):
    out = fa_autotune.attention(q, k, v, causal=True)
    out.backward(torch.ones_like(out))
torch.cuda.synchronize()
print("done", d)

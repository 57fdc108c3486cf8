"""attention_fp8(): e4m3 attention against the fp16/bf16 result of attention(), with the
quantization recipe (scaling groups, Hadamard rotation) that made the difference, and the sink
tile that keeps inputs with attention sinks accurate.

    GPU: python examples/fp8.py
    CPU: TRITON_INTERPRET=1 python examples/fp8.py   (Triton's interpreter emulates FP8: slow, tiny shapes)
"""
import sys

import torch

from fa_autotune import attention, attention_fp8, quantize_fp8
from _device import pick_device

device, dtype = pick_device()
TOLERANCE = 0.1  # relative error e4m3 is tuned to (fa_autotune.spec.problem.TOLERANCE)
torch.manual_seed(0)


def relative_error(out, reference):
    """Frobenius norm of the difference over that of the reference (what the tuner measures)."""
    return ((out.float() - reference.float()).norm() / reference.float().norm()).item()


# LLM-like activations: Q and K with a few loud head-dim channels, where FP8 rounding hurts most.
batch, heads_q, heads_kv, seqlen, head_dim = 1, 4, 2, 128, 64
q = torch.randn(batch, heads_q, seqlen, head_dim, device=device) * 0.25
k = torch.randn(batch, heads_kv, seqlen, head_dim, device=device) * 0.25
v = torch.randn(batch, heads_kv, seqlen, head_dim, device=device)
for t in (q, k):
    t[..., [3, 17, 40, 61]] *= 20.0
q, k, v = (t.to(dtype) for t in (q, k, v))

reference = attention(q, k, v, is_causal=True)  # the fp16/bf16 kernel on the same inputs

# Quantize once with an explicit recipe, then attend: descales are applied inside the kernel.
results = {}
for scaling, hadamard in (("per_tensor", False), ("per_block", True)):
    x = quantize_fp8(q, k, v, scaling=scaling, hadamard=hadamard, fmt="e4m3")  # FP8 q, k, v + float32 descales
    out = attention_fp8(x, is_causal=True)  # output in bf16 for prequantized inputs
    recipe = f"{x.fmt} {x.scaling}{' + Hadamard' if x.hadamard else ''}"
    if x.scaling == "per_block":
        recipe += f" ({x.block_q}-row blocks)"
    results[scaling, hadamard] = relative_error(out, reference)
    print(f"  {recipe}: relative error {results[scaling, hadamard]:.3f}")

# Or let attention_fp8 quantize fp16/bf16 inputs itself (output in their dtype), with the
# recipe the dispatcher picks for this problem (tuned, or per-block + Hadamard + sink tile by default).
out = attention_fp8(q, k, v, is_causal=True)
print(f"  attention_fp8(q, k, v) quantizing itself: relative error {relative_error(out, reference):.3f}, "
      f"output {str(out.dtype).removeprefix('torch.')}")

# Attention sinks (a trained LLM's first tokens: keys that score far above the rest) turn FP8's
# rounding of Q and K into large softmax errors; the sink tile (on by default) scores the first
# K tile from the unquantized q and k. sink_tile=False shows what it saves.
sink_q, sink_k, sink_v = (torch.randn(batch, h, seqlen, head_dim, device=device) for h in (heads_q, heads_kv, heads_kv))
sink_k[:, :, :4] *= 40  # the first 4 keys: norms 40x the rest, their values 10x
sink_v[:, :, :4] *= 10
sink_q, sink_k, sink_v = (t.to(dtype) for t in (sink_q, sink_k, sink_v))
sink_reference = attention(sink_q, sink_k, sink_v, is_causal=True)
for sink_tile in (False, None):
    out = attention_fp8(sink_q, sink_k, sink_v, is_causal=True, sink_tile=sink_tile)
    name = "without the sink tile" if sink_tile is False else "default recipe"
    print(f"  with attention sinks, {name}: relative error {relative_error(out, sink_reference):.3f}")

error = results["per_block", True]
print(f"fp8: relative error {error:.3f} vs attention(), recipe e4m3 per_block + Hadamard "
      f"({device}, {str(dtype).removeprefix('torch.')} inputs)")
if error > TOLERANCE:
    sys.exit(f"fp8: FAILED (tolerance {TOLERANCE})")

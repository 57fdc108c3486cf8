"""A training step of a Llama-style attention layer (q/k/v/o projections, rotary embeddings,
GQA, causal), forward and backward, with its attention from fa_autotune, SDPA's cuDNN backend
or FlashAttention-4: tokens per second in interleaved rounds, after every backend's output and
gradients (input, every weight) are checked against the same layer in float32 on the batch's
first sequence (flash-attn's rule: at most twice the error of PyTorch's math attention at the
layer's precision).

    python3 benchmarks/training_step.py --out DIR [--hidden 4096 --heads 32 --kv-heads 8 --head-dim 128]
        [--seqlen 4096 8192] [--tokens 16384] [--backends fa_autotune,cudnn,fa4] [--rounds 3] [--rep-ms 200]

Writes DIR/training_step.json and .md. ``--small`` runs a tiny layer in fp16 (on a CPU:
Triton's interpreter, which proves the code path, never a speed); FA4 is reported unavailable
where flash-attn-4 is not importable.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

BACKENDS = ("fa_autotune", "cudnn", "fa4")


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (B, N, H, D) x, Llama's half-split form."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def attention_fn(backend: str):
    """(B, N, H, D) q and (B, N, Hkv, D) k, v -> (B, N, H, D), causal, through ``backend``."""
    if backend == "fa_autotune":
        import fa_autotune

        return lambda q, k, v: fa_autotune.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     causal=True).transpose(1, 2)
    if backend == "fa4":
        from flash_attn.cute import flash_attn_func  # pip flash-attn-4 (the [fa4] extra)

        def fa4(q, k, v):
            out = flash_attn_func(q, k, v, causal=True)
            return out[0] if isinstance(out, tuple) else out
        return fa4
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"cudnn": [SDPBackend.CUDNN_ATTENTION], "math": [SDPBackend.MATH]}[backend]

    def sdpa(q, k, v):
        with sdpa_kernel(chosen):
            out = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                             is_causal=True, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)
    return sdpa


class AttentionLayer(nn.Module):
    """Llama's attention block without the norm: projections, rotary, attention, output."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, backend: str) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.wq = nn.Linear(hidden, heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, hidden, bias=False)
        self.attend = attention_fn(backend)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = rotary(self.wq(x).view(b, n, self.heads, self.head_dim), cos, sin)
        k = rotary(self.wk(x).view(b, n, self.kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).view(b, n, self.kv_heads, self.head_dim)
        return self.wo(self.attend(q.contiguous(), k.contiguous(), v).reshape(b, n, -1))


def rotary_tables(n: int, head_dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
    return (angles.cos()[None, :, None, :].to(dtype), angles.sin()[None, :, None, :].to(dtype))


def step_grads(layer: AttentionLayer, x: torch.Tensor, dout: torch.Tensor, cos, sin) -> list[torch.Tensor]:
    """Output, then the gradients of the input and of every weight, of one forward + backward."""
    x = x.detach().clone().requires_grad_(True)
    out = layer(x, cos, sin)
    grads = torch.autograd.grad(out, [x, *layer.parameters()], dout)
    return [out.detach(), *grads]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm())


def run_shape(args, batch: int, seqlen: int, device: str, dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    shape = (args.hidden, args.heads, args.kv_heads, args.head_dim)
    base = AttentionLayer(*shape, "math").to(device)
    for p in base.parameters():
        nn.init.normal_(p, std=args.hidden ** -0.5)
    x = torch.randn(batch, seqlen, args.hidden, device=device)
    dout = torch.randn_like(x) * 1e-2
    # Checked on the first sequence (sequences are independent; math attention's float32
    # scores of a whole batch would not fit on the GPU), timed on the whole batch.
    x1, dout1 = x[:1], dout[:1]
    cos32, sin32 = rotary_tables(seqlen, args.head_dim, device, torch.float32)
    exact = step_grads(base, x1, dout1, cos32, sin32)
    cos, sin = rotary_tables(seqlen, args.head_dim, device, dtype)

    def layer_for(backend: str) -> AttentionLayer:
        layer = AttentionLayer(*shape, backend).to(device=device, dtype=dtype)
        layer.load_state_dict(base.state_dict())
        return layer

    names = ["output", "d_input", "d_wq", "d_wk", "d_wv", "d_wo"]
    same = step_grads(layer_for("math"), x1.to(dtype), dout1.to(dtype), cos, sin)
    bound = {n: 2 * _rel(s, e) + 1e-4 for n, s, e in zip(names, same, exact)}
    del same
    calls, cells = {}, {}
    for backend in args.backends:
        try:
            layer = layer_for(backend)
            got = step_grads(layer, x1.to(dtype), dout1.to(dtype), cos, sin)
        except Exception as exc:  # an unavailable backend (FA4 not installed, no cuDNN here) is a result
            cells[backend] = {"status": "unavailable", "detail": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        errors = {n: _rel(g, e) for n, g, e in zip(names, got, exact)}
        bad = [n for n in names if not (errors[n] <= bound[n])]
        if bad:
            cells[backend] = {"status": "wrong_result", "rel_error": errors, "bound": bound, "over": bad}
            continue
        del got
        cells[backend] = {"status": "ok", "rel_error": errors, "round_ms": []}
        xd, dd = x.to(dtype), dout.to(dtype)
        calls[backend] = lambda layer=layer, xd=xd, dd=dd: step_grads(layer, xd, dd, cos, sin)
    del exact
    if device == "cuda":
        torch.cuda.empty_cache()
    from fa_autotune.tune.measure import time_callable

    order = list(calls)
    for r in range(args.rounds if calls else 0):
        for backend in order[r % len(order):] + order[:r % len(order)]:
            cells[backend]["round_ms"].append(time_callable(calls[backend], rep_ms=args.rep_ms, device=device).median_ms)
    for backend in calls:
        ms = statistics.median(cells[backend]["round_ms"])
        cells[backend].update(ms=ms, tokens_per_s=batch * seqlen / (ms * 1e-3))
    row = {"batch": batch, "seqlen": seqlen, "cells": cells, "bound": bound}
    for base_name in ("cudnn", "fa4"):
        base_cell = cells.get(base_name, {})
        if base_cell.get("status") == "ok" and cells.get("fa_autotune", {}).get("status") == "ok":
            ours, theirs = cells["fa_autotune"]["round_ms"], base_cell["round_ms"]
            row[f"fa_autotune_vs_{base_name}"] = statistics.median(t / o for o, t in zip(ours, theirs))
    print(json.dumps({k: v for k, v in row.items() if k != "bound"}, default=str), flush=True)
    return row


def _markdown(result: dict) -> str:
    a = result["args"]
    lines = [f"# Training step of a Llama-style attention layer ({result['environment'].get('gpu', 'cpu')})", "",
             f"hidden {a['hidden']}, {a['heads']}:{a['kv_heads']} heads, head dim {a['head_dim']}, causal, "
             f"{a['dtype']}; forward + backward of projections, rotary and attention; tokens per second "
             f"(median of {a['rounds']} interleaved rounds); ratios: median of the rounds' ratios.", "",
             f"Command: `{result['command']}`", "",
             "| batch x seqlen | " + " | ".join(a["backends"]) + " | vs cuDNN | vs FA4 |",
             "|---" * (len(a["backends"]) + 3) + "|"]
    for row in result["rows"]:
        cells = []
        for b in a["backends"]:
            c = row["cells"].get(b, {})
            cells.append(f"{c['tokens_per_s'] / 1e3:.1f}k tok/s" if c.get("status") == "ok" else c.get("status", "-"))
        ratios = [f"{row[k]:.3f}x" if k in row else "-" for k in ("fa_autotune_vs_cudnn", "fa_autotune_vs_fa4")]
        lines.append(f"| {row['batch']} x {row['seqlen']} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--tokens", type=int, default=16384, help="batch x seqlen per step")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=200.0)
    parser.add_argument("--small", action="store_true", help="a tiny fp16 layer (CPU: Triton's interpreter)")
    args = parser.parse_args()
    args.backends = [b.strip() for b in args.backends.split(",")]
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.small:
        args.hidden, args.heads, args.kv_heads, args.head_dim, args.seqlen, args.tokens = 64, 4, 2, 32, [48], 96
        args.dtype = "float16"  # the interpreter's bf16 dots are wrong
    dtype = getattr(torch, args.dtype)
    from fa_autotune.spec.target import environment

    result = {"command": "python3 benchmarks/training_step.py " + " ".join(sys.argv[1:]),
              "environment": environment() if device == "cuda" else {"device": "cpu (Triton's interpreter)"},
              "args": {k: v for k, v in vars(args).items() if k != "out"},
              "rows": [run_shape(args, max(1, args.tokens // n), n, device, dtype) for n in args.seqlen]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training_step.json").write_text(json.dumps(result, indent=2, default=str))
    (args.out / "training_step.md").write_text(_markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()

"""Float32 reference attention and the error measures every kernel is judged by."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..spec.problem import TOLERANCE


@dataclass(frozen=True)
class ErrorReport:
    max_abs: float
    rel: float  # ||out - ref|| / ||ref||
    finite: bool

    def passes(self, dtype: str, limit: float | None = None) -> bool:
        """Finite and within ``limit`` (default: the dtype's tolerance)."""
        return self.finite and self.rel <= (TOLERANCE[dtype] if limit is None else limit)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    causal_align: str = "top_left",
    heads_per_chunk: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in float32, a few heads at a time (bounded memory); returns (out, lse).

    Rows that see no key (bottom-right causal with more queries than keys) give zeros and
    lse = -inf, the convention the kernels follow.
    """
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    group = heads // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty((batch, heads, n_q, d), device=q.device, dtype=torch.float32)
    lse = torch.empty((batch, heads, n_q), device=q.device, dtype=torch.float32)
    mask = None
    if causal:
        offset = n_k - n_q if causal_align == "bottom_right" else 0
        rows = torch.arange(n_q, device=q.device)[:, None]
        mask = torch.arange(n_k, device=q.device)[None, :] <= rows + offset
    for h0 in range(0, heads, heads_per_chunk):
        hs = slice(h0, min(heads, h0 + heads_per_chunk))
        kv_heads = torch.arange(hs.start, hs.stop, device=q.device) // group
        qf = q[:, hs].float()
        kf = k[:, kv_heads].float()
        vf = v[:, kv_heads].float()
        scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf)
        chunk_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - chunk_lse.unsqueeze(-1).clamp_min(-3.0e38)).nan_to_num(0.0)
        out[:, hs] = torch.matmul(probs, vf)
        lse[:, hs] = chunk_lse
    return out, lse


def compare(out: torch.Tensor, ref: torch.Tensor) -> ErrorReport:
    """Max absolute and relative Frobenius error; NaN or Inf anywhere fails."""
    diff = out.float() - ref
    finite = bool(torch.isfinite(out).all())
    denom = float(ref.norm()) or 1.0
    return ErrorReport(float(diff.abs().max()) if diff.numel() else 0.0, float(diff.norm()) / denom, finite)


def reference_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, causal: bool = False,
                        scale: float | None = None, causal_align: str = "top_left",
                        heads_per_chunk: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention in float32 autograd, a few query heads at a time (bounded
    memory); dK and dV summed over each KV group."""
    batch, heads, n_q, d = q.shape
    n_k, group = k.shape[2], heads // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    dq = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    dk = torch.zeros(k.shape, device=q.device, dtype=torch.float32)
    dv = torch.zeros(v.shape, device=q.device, dtype=torch.float32)
    mask = None
    if causal:
        offset = n_k - n_q if causal_align == "bottom_right" else 0
        mask = torch.arange(n_k, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None] + offset
    for h0 in range(0, heads, heads_per_chunk):
        hs = slice(h0, min(heads, h0 + heads_per_chunk))
        kv_heads = torch.arange(hs.start, hs.stop, device=q.device) // group
        with torch.enable_grad():
            qf = q[:, hs].float().requires_grad_(True)
            kf = k[:, kv_heads].float().requires_grad_(True)
            vf = v[:, kv_heads].float().requires_grad_(True)
            scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
            if mask is not None:
                scores = scores.masked_fill(~mask, -math.inf)
            probs = torch.softmax(scores, -1).nan_to_num(0.0)
            torch.matmul(probs, vf).backward(dout[:, hs].float())
        dq[:, hs] = qf.grad
        dk.index_add_(1, kv_heads, kf.grad)
        dv.index_add_(1, kv_heads, vf.grad)
    return dq, dk, dv


def compare_all(outs, refs) -> ErrorReport:
    """Several outputs judged as one: the worst relative error, the largest absolute one."""
    return worst(*(compare(o, r) for o, r in zip(outs, refs)))


def worst(*reports: ErrorReport) -> ErrorReport:
    """Several reports as one: the worst relative error, the largest absolute one, finite
    only if every one is."""
    return ErrorReport(max(r.max_abs for r in reports), max(r.rel for r in reports), all(r.finite for r in reports))

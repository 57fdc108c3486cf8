"""The attention problem: shapes, dtype and masking, and the checks on user tensors.

A :class:`Problem` is what tuning results are keyed by; it deliberately leaves out
strides and devices (a tuned config serves every layout of the same shapes).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    import torch

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
DTYPES = ("float16", "bfloat16", "float32") + FP8_DTYPES
DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32",
                 "fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
                 "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2"}
CAUSAL_ALIGNS = ("top_left", "bottom_right")
# What a problem is, each a kernel family of its own: forward attention, attention over a
# KV cache (attention_with_kvcache), the backward pass (dQ, dK, dV).
KINDS = ("fwd", "decode", "bwd")
FAMILIES = {"fwd": "attn_fwd", "decode": "attn_decode", "bwd": "attn_bwd"}
MAX_DIM = 2**31 - 1  # sizes and lengths the kernels index with 32-bit program ids
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 256
MIN_CAPABILITY = (8, 0)
# Relative (Frobenius) error against float32 that a correct kernel stays under, by input
# dtype. fp16/bf16 operands with fp32 accumulation land near 1e-3; P is rounded to the input
# dtype for the PV product, which bf16's 8-bit mantissa turns into a few 1e-3. FP8 (against
# attention on the unquantized inputs): e4m3 keeps 3 mantissa bits, e5m2 2, for Q, K, V and
# P alike; per-tensor scaling of plain normal data lands near 0.05 / 0.1.
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-4, "float8_e4m3fn": 0.1, "float8_e5m2": 0.2}


def canonical_dtype(name: str) -> str:
    """Map user spellings (fp16, torch.float16, half...) to the canonical dtype name."""
    text = str(name).removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise InputError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")
    return text


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Problem:
    """One forward-attention shape; SDPA's (B, H, N, D) vocabulary."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    causal: bool = False
    causal_align: str = "top_left"
    # "decode": KV-cache attention (attention_with_kvcache), seqlen_q new query tokens per
    # sequence against seqlen_k cached keys, the cache contiguous (page_size 0) or paged.
    # "bwd": the backward pass of the forward problem with these shapes.
    kind: str = "fwd"
    page_size: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DIM:
                raise InputError(f"{name} must be an integer in 0..{MAX_DIM}, got {value!r}")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if not isinstance(self.causal, bool):
            raise InputError(f"causal must be true or false, got {self.causal!r}")
        if self.causal_align not in CAUSAL_ALIGNS:
            raise InputError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {self.causal_align!r}")
        if not self.causal:
            object.__setattr__(self, "causal_align", "top_left")
        if self.heads_kv == 0 or self.heads_q % self.heads_kv:
            raise InputError(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv}) for GQA/MQA"
            )
        if self.kind not in KINDS:
            raise InputError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or not 0 <= self.page_size <= MAX_DIM:
            raise InputError(f"page_size must be an integer in 0..{MAX_DIM}, got {self.page_size!r}")
        if self.page_size and not self.decode:
            raise InputError("page_size describes a KV cache: it needs kind='decode'")
        if not MIN_HEAD_DIM <= self.head_dim <= MAX_HEAD_DIM:
            raise InputError(
                f"head_dim {self.head_dim} is not supported; fa_autotune kernels take {MIN_HEAD_DIM}..{MAX_HEAD_DIM}"
            )

    @property
    def is_empty(self) -> bool:
        """No query rows or no keys: attention() needs no kernel (an output of zeros, or none),
        and there is nothing to tune."""
        return 0 in (self.batch, self.heads_q, self.seqlen_q, self.seqlen_k)

    @property
    def decode(self) -> bool:
        return self.kind == "decode"

    @property
    def backward(self) -> bool:
        return self.kind == "bwd"

    @property
    def family(self) -> str:
        """The kernel family that serves it, and the exported file it is stored in."""
        return FAMILIES[self.kind]

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V a pass reads (decode is bound by them)."""
        size = {"float16": 2, "bfloat16": 2, "float32": 4}.get(self.dtype, 1)
        return 2 * self.batch * self.heads_kv * self.seqlen_k * self.head_dim * size

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    @property
    def head_dim_pad(self) -> int:
        """Head dim rounded up to the power of two the kernel tiles use (FP8 dots need 32)."""
        return max(32, next_pow2(self.head_dim)) if self.is_fp8 else next_pow2(self.head_dim)

    @property
    def gqa_group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def causal_offset(self) -> int:
        """Shift of the causal diagonal: query i sees keys j <= i + offset."""
        if self.causal and self.causal_align == "bottom_right":
            return self.seqlen_k - self.seqlen_q
        return 0

    @property
    def flops(self) -> float:
        """FLOPs counted as FlashAttention does: forward 4·B·H·Nq·Nk·D, halved when causal; the
        backward 2.5 times that (five matmuls to the forward's two)."""
        total = 4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        total = total / 2 if self.causal else total
        return 2.5 * total if self.backward else total

    def tflops(self, ms: float) -> float:
        """Throughput of one forward pass taking ``ms`` milliseconds."""
        return self.flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0

    @property
    def tolerance(self) -> float:
        """Relative error a correct kernel stays under for this dtype."""
        return TOLERANCE[self.dtype]

    def with_dtype(self, dtype: str) -> "Problem":
        return replace(self, dtype=dtype)

    def with_kind(self, kind: str) -> "Problem":
        return replace(self, kind=kind)

    def to_dict(self) -> dict[str, Any]:
        """The fields; kind and page_size only where they differ from a forward problem's (so
        forward problems read and write as they did before those existed)."""
        data = asdict(self)
        if self.kind == "fwd":
            del data["kind"]
        if not self.page_size:
            del data["page_size"]
        return data

    @property
    def key(self) -> str:
        """Human-readable key used in databases and exported files."""
        causal = f"causal-{self.causal_align}" if self.causal else "full"
        key = (f"b{self.batch}_hq{self.heads_q}_hkv{self.heads_kv}_nq{self.seqlen_q}_nk{self.seqlen_k}"
               f"_d{self.head_dim}_{self.dtype}_{causal}")
        if self.decode:
            key += f"_paged{self.page_size}" if self.page_size else "_kvcache"
        elif self.backward:
            key += "_bwd"
        return key


def _dtype_name(t: "torch.Tensor") -> str:
    return str(t.dtype).removeprefix("torch.")


def check_qkv(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", dtypes: tuple[str, ...]) -> None:
    """The checks SDPA makes on q, k, v: 4-dim tensors of one dtype (from ``dtypes``) on
    one device, k and v alike, batch and head dim shared."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name} must have 4 dims (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
        if _dtype_name(t) not in dtypes:
            raise InputError(f"{name} has dtype {t.dtype}; supported: {', '.join(dtypes)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise InputError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise InputError(f"batch differs: q has {q.shape[0]}, k/v have {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise InputError(f"head_dim differs: q has {q.shape[3]}, k/v have {k.shape[3]}")


def problem_from_tensors(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", causal: bool = False, causal_align: str = "top_left"
) -> Problem:
    """Check q, k, v the way SDPA would and describe them as a :class:`Problem`."""
    check_qkv(q, k, v, DTYPES)
    check_runnable(q)
    if not isinstance(causal, bool):
        raise InputError(f"causal must be True or False, got {causal!r}")
    return Problem(
        batch=q.shape[0],
        heads_q=q.shape[1],
        heads_kv=k.shape[1],
        seqlen_q=q.shape[2],
        seqlen_k=k.shape[2],
        head_dim=q.shape[3],
        dtype=_dtype_name(q),
        causal=causal,
        causal_align=causal_align,
    )


def check_runnable(q: "torch.Tensor", bf16_dots: bool = True) -> None:
    """q's device can run the kernels: a CUDA GPU of compute capability 8.0 or newer, or the
    CPU through Triton's interpreter (which computes bfloat16 dot products wrong: refused
    unless ``bf16_dots`` is False, as over an FP8 KV cache, whose products are fp16)."""
    _check_device(q.device)
    if q.device.type == "cpu" and _dtype_name(q) == "bfloat16" and bf16_dots:
        raise InputError("bfloat16 tensors on the CPU: Triton's interpreter computes bfloat16 dot products wrong "
                         "(NumPy has no bfloat16); use float16 or float32 on the CPU, or CUDA tensors")


def _check_device(device: "torch.device") -> None:
    import torch

    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise InputError(f"device {device} is not supported; use a CUDA tensor (or CPU for Triton's interpreter)")
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        raise InputError(f"GPU compute capability {cap[0]}.{cap[1]} is too old; fa_autotune needs 8.0 or newer")


def distance(a: Problem, b: Problem) -> float:
    """How far tuned problem ``b`` is from ``a``, for borrowing ``b``'s config.

    Infinite unless dtype, head dim, causal masking (and its alignment), the kind (and, for KV
    caches, paged or not) and, for backward and KV-cache problems, the GQA group match: those
    change which kernels are valid or how they behave (a decode tile packs a KV group's query
    rows; the backward walks a group's heads per K/V tile). Otherwise ``|log2(Nq_a/Nq_b)| +
    |log2(Nk_a/Nk_b)| + 0.5 * |log2(BH_a/BH_b)|`` with BH = batch * heads_q: sequence lengths
    decide tile shapes and loop trip counts, batch * heads only how many programs fill the
    GPU, so it weighs half; a forward problem's GQA group (any forward kernel reads K/V head
    h // group, so it only changes how often a K/V tile is re-read from L2) adds half its log
    ratio plus a quarter (more than a batch twice as large: an entry of the problem's own
    group at its lengths wins over another group's); paged caches add half the page sizes' log ratio. Decode shapes change
    every step, so a tuned decode problem serves as the bucket of the shapes nearest it.
    """
    forward = a.kind == "fwd"
    if (a.dtype, a.head_dim, a.causal, a.causal_align, a.kind, a.page_size == 0) != (
        b.dtype, b.head_dim, b.causal, b.causal_align, b.kind, b.page_size == 0
    ) or (not forward and a.gqa_group != b.gqa_group):
        return math.inf

    def log_ratio(x: int, y: int) -> float:
        return abs(math.log2(max(x, 1) / max(y, 1)))

    group = 0.5 * log_ratio(a.gqa_group, b.gqa_group) + 0.25 if a.gqa_group != b.gqa_group else 0.0
    return (log_ratio(a.seqlen_q, b.seqlen_q) + log_ratio(a.seqlen_k, b.seqlen_k)
            + 0.5 * log_ratio(a.batch * a.heads_q, b.batch * b.heads_q) + 0.5 * log_ratio(a.page_size, b.page_size)
            + group)


def nearest(problem: Problem, candidates) -> tuple[Problem, float] | None:
    """The candidate problem nearest to ``problem`` by :func:`distance`: itself if present,
    else the closest (ties go to the smaller key); None when none can lend its config."""
    ranked = sorted(((distance(problem, c), c != problem, c.key, c) for c in set(candidates)),
                    key=lambda item: item[:3])
    if not ranked or not math.isfinite(ranked[0][0]):
        return None
    return ranked[0][3], ranked[0][0]

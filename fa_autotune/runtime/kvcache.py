"""``attention_with_kvcache``: flash-attn's ``flash_attn_with_kvcache`` for serving.

New query tokens attend a KV cache, contiguous (batch, seqlen_cache, heads_kv, D) or paged
(num_pages, page_size, heads_kv, D) through a block table, after new keys and values are
written into it in place. Sequence lengths stay on the device: nothing is read back when a
CUDA graph is being captured (serving engines replay decode with changing lengths), and
otherwise only to check them before any kernel runs. The config comes from the dispatcher's
``attn_decode`` family (tuned buckets by batch, cache length, heads and page size).
"""
from __future__ import annotations

import math
import numbers
import threading
from typing import Any, Mapping

import torch

from ..errors import ConfigError, InputError
from ..kernels.checks import cache_tma_ok
from ..kernels.decode import DecodePlan
from ..kernels.launch import check_interpretable, explained, resolve_scale
from ..spec.config import MAX_SPLITS, KernelConfig
from ..spec.defaults import decode_default
from ..spec.problem import Problem, check_runnable
from .api import _refuse_grad, sdpa_alias
from .dispatch import DISPATCHER, gpu_of
from .select import for_fp8_cache, runnable_decode

_PLANS: dict[tuple, DecodePlan] = {}
_PLANS_LOCK = threading.Lock()
_MAX_PLANS = 1024
_DTYPES = ("float16", "bfloat16", "float32")
_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _forget_plans() -> None:
    with _PLANS_LOCK:
        _PLANS.clear()


DISPATCHER.on_reset(_forget_plans)


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    config: Mapping[str, Any] | KernelConfig | str | None = None,
    check_lengths: bool | None = None,
    scale: float | None = None,
    is_causal: bool | None = None,
    k_descale: float | torch.Tensor | None = None,
    v_descale: float | torch.Tensor | None = None,
):
    """Attention of ``q`` (batch, seqlen_q, heads_q, D) over a KV cache, flash-attn's
    ``flash_attn_with_kvcache`` (same names, order, layouts and semantics).

    ``k_cache``/``v_cache``: (batch, seqlen_cache, heads_kv, D), or with ``block_table``
    (batch, max_pages) int32, paged (num_pages, page_size, heads_kv, D). ``cache_seqlens``:
    an int or an int32 (batch,) tensor of cached lengths (None: the whole cache).
    ``k``/``v`` (batch, seqlen_new, heads_kv, D) are written into the cache at
    ``cache_seqlens`` first, in place, and attended too. ``causal`` aligns the diagonal
    bottom-right per sequence. ``num_splits``: 0 takes the tuned choice (a fixed split, or
    a balanced one sharing all sequences' keys over the SMs), n > 0 splits each sequence's
    keys over n programs. Returns out (batch, seqlen_q, heads_q, D), and with
    ``return_softmax_lse`` also the natural-log LSE (batch, heads_q, seqlen_q), fp32.

    Extra (keyword-only): ``config`` runs that kernel variant (a mapping, a KernelConfig, or
    its JSON text; under torch.compile only the text); ``check_lengths`` (default:
    unless a CUDA graph is being captured) reads the lengths and block table back to refuse
    out-of-range values, and appends into a page that another sequence of the call writes or
    reads (pages only read may be shared), and descale tensors that are not positive and
    finite, before any kernel runs. Appending into a
    ``k_cache`` that shares memory with ``v_cache`` is refused always (no read-back).
    flash-attn options this kernel does not implement (rotary, cache_batch_idx,
    cache_leftpad, window_size, softcap, alibi_slopes) raise when set rather than being
    ignored. SDPA's names ``scale`` (``softmax_scale``) and
    ``is_causal`` (``causal``) are taken too (an option and its alias together raise);
    ``causal=None`` is False. ``is_causal`` keeps flash-attn's bottom-right diagonal here
    (SDPA's is top-left: they differ wherever the query and key lengths differ).

    FP8 caches (flash-attn 3's names): ``k_cache``/``v_cache`` in float8_e4m3fn or
    float8_e5m2 with ``k_descale``/``v_descale``, each a number or a float32 tensor of shape
    (batch, heads_kv) (or one element): the cache holds k / k_descale. q, k and v stay fp16
    or bf16; new k/v are quantized with the descales as they are appended (saturating at the
    format's largest value), and the output is in q's dtype. Decode then reads half the bytes.
    """
    softmax_scale = sdpa_alias("softmax_scale", softmax_scale, "scale", scale)
    causal = sdpa_alias("causal", causal, "is_causal", is_causal)
    causal = False if causal is None else causal
    _refuse_unsupported(rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, window_size, softcap, alibi_slopes)
    _refuse_grad(q, k_cache, v_cache, k, v)
    if torch.compiler.is_compiling():  # one opaque op for torch.compile (the cache mutates in place)
        if config is not None and not isinstance(config, str):
            raise InputError("under torch.compile, config= takes a JSON string (KernelConfig.canonical_json()) or "
                             "None; a mapping cannot be traced")
        text = config
        tensor_lengths = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
        int_length = -1 if cache_seqlens is None or tensor_lengths is not None else int(cache_seqlens)
        k_descale, v_descale = _descales(q, k_cache, k_descale, v_descale) or (None, None)
        out, lse = torch.ops.fa_autotune.attention_with_kvcache(
            q, k_cache, v_cache, k, v, tensor_lengths, int_length, block_table, softmax_scale, causal, num_splits,
            return_softmax_lse, text, k_descale, v_descale)
        return (out, lse) if return_softmax_lse else out
    problem, capacity = _problem(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal)
    descales = _descales(q, k_cache, k_descale, v_descale)
    n_new = 0 if k is None else k.shape[1]
    seqlen = _check_seqlens(cache_seqlens, q, n_new, capacity)
    capturing = q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if check_lengths is None:
        check_lengths = not capturing
    elif check_lengths and capturing:
        raise InputError("check_lengths=True reads the lengths back to the host, which a CUDA graph capture "
                         "cannot do; leave it None (checks off while capturing)")
    if check_lengths:
        given = {name: d for name, d in (("k_descale", k_descale), ("v_descale", v_descale))
                 if isinstance(d, torch.Tensor) and descales is not None}  # numbers are checked already
        _check_values(cache_seqlens, block_table, k_cache.shape[0], n_new, capacity, given)
    scale = resolve_scale(softmax_scale, problem.head_dim)
    out = torch.empty_like(q)
    lse = (torch.empty((problem.batch, problem.heads_q, problem.seqlen_q), device=q.device, dtype=torch.float32)
           if return_softmax_lse else None)
    if problem.batch and problem.seqlen_q or n_new:
        chosen = runnable_decode(_config(problem, q, config, num_splits, descales is not None),
                                 cache_tma_ok(k_cache, v_cache, block_table is not None))
        check_interpretable(q)
        tensor_lengths = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
        key = (chosen, q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.stride(), q.dtype, q.device,
               None if k is None else (k.shape, k.stride(), v.stride()), tensor_lengths is None,
               None if block_table is None else block_table.stride(), scale, causal, return_softmax_lse,
               k_cache.dtype, None if descales is None else (descales[0].stride(), descales[1].stride()),
               v_cache.data_ptr() % 16 == 0)  # decode.v_pairs reads an FP8 V in 16-byte words
        plan = _PLANS.get(key)

        def build_and_run() -> None:
            built = plan
            if built is None:
                built = DecodePlan(chosen, q, k_cache, v_cache, k, v, out, lse, block_table, scale, causal, descales)
                with _PLANS_LOCK:
                    if len(_PLANS) >= _MAX_PLANS:
                        _PLANS.clear()
                    _PLANS[key] = built
            built(q, k_cache, v_cache, k, v, tensor_lengths, block_table, seqlen, out, lse, *(descales or (None, None)))

        explained(chosen, build_and_run)()
    elif lse is not None:
        lse.fill_(-math.inf)
    return (out, lse) if return_softmax_lse else out


def _descales(q, k_cache, k_descale, v_descale) -> tuple[torch.Tensor, torch.Tensor] | None:
    """An FP8 cache's descales as float32 (batch, heads_kv) tensors on q's device (a number or
    a one-element tensor broadcast with stride 0); None for a 16-bit cache, which takes none."""
    fp8 = isinstance(k_cache, torch.Tensor) and str(k_cache.dtype).removeprefix("torch.") in _FP8
    if not fp8:
        if k_descale is not None or v_descale is not None:
            raise InputError(f"k_descale/v_descale describe an FP8 cache ({', '.join(_FP8)}); this one is "
                             f"{getattr(k_cache, 'dtype', type(k_cache).__name__)}")
        return None
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise InputError(f"an FP8 cache is attended by float16 or bfloat16 q, got {q.dtype}")
    if k_cache.dtype == torch.float8_e4m3fn and q.device.type == "cuda" \
            and torch.cuda.get_device_capability(q.device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(q.device)
        raise InputError(f"a float8_e4m3fn cache needs an sm_89 (Ada) or newer GPU, this is sm_{major}{minor}")
    shape = (q.shape[0], k_cache.shape[2])
    out = []
    for name, d in (("k_descale", k_descale), ("v_descale", v_descale)):
        if d is None:
            raise InputError(f"an FP8 cache needs {name} (the cache holds values divided by it): a number or a "
                             f"float32 tensor of shape {shape}")
        if isinstance(d, numbers.Real) and not isinstance(d, bool):
            if not (math.isfinite(d) and d > 0):
                raise InputError(f"{name} must be a positive finite number, got {d!r}")
            d = torch.full((1, 1), float(d), device=q.device, dtype=torch.float32)
        if not isinstance(d, torch.Tensor) or d.dtype != torch.float32 or d.device != q.device \
                or (d.numel() != 1 and tuple(d.shape) != shape):
            got = f"{d.dtype} {tuple(d.shape)} on {d.device}" if isinstance(d, torch.Tensor) else type(d).__name__
            raise InputError(f"{name} must be a number or a float32 tensor of shape {shape} (or one element) on "
                             f"{q.device}, got {got}")
        out.append(d.reshape(1, 1).expand(shape) if d.numel() == 1 else d)
    return out[0], out[1]


def _refuse_unsupported(rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, window_size, softcap,
                        alibi_slopes) -> None:
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad), ("alibi_slopes", alibi_slopes)):
        if value is not None:
            raise InputError(f"{name} is not supported by fa_autotune.attention_with_kvcache; apply it before the "
                             "call (rotary) or lay the cache out per batch row")
    if tuple(window_size) != (-1, -1):
        raise InputError(f"window_size={tuple(window_size)}: sliding-window attention is not supported; use (-1, -1)")
    if softcap:
        raise InputError(f"softcap={softcap}: score soft-capping is not supported; use 0.0")


def _problem(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal) -> tuple[Problem, int]:
    """Shapes, dtypes, devices and layouts; the KV-cache problem and the cache's capacity
    (keys a sequence can hold)."""
    # flash-attn's (batch, seqlen, heads, D) as the (batch, heads, seqlen, D) views the
    # dense checks take.
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise InputError(f"{name} must be a 4-dim tensor (batch or pages, seqlen, heads, head_dim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if str(t.dtype).removeprefix("torch.") not in _DTYPES + (_FP8 if t is not q else ()):
            raise InputError(f"{name} has dtype {t.dtype}; attention_with_kvcache takes {', '.join(_DTYPES)}"
                             + (f" (a cache also {', '.join(_FP8)})" if t is not q else ""))
        fp8_cache = t is not q and str(t.dtype).removeprefix("torch.") in _FP8
        if (t.dtype != q.dtype and not fp8_cache) or t.device != q.device:
            raise InputError(f"{name} is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}: they must match")
    if k_cache.dtype != v_cache.dtype:
        raise InputError(f"k_cache is {k_cache.dtype}, v_cache {v_cache.dtype}: they must match")
    if k_cache.shape != v_cache.shape:
        raise InputError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if k_cache.shape[3] != q.shape[3]:
        raise InputError(f"head_dim differs: q has {q.shape[3]}, the cache {k_cache.shape[3]}")
    batch, n_q, heads_q, head_dim = q.shape
    slots, page_rows, heads_kv, _ = k_cache.shape
    if heads_kv == 0 or heads_q % heads_kv:
        raise InputError(f"heads of q ({heads_q}) must be a multiple of the cache's heads ({heads_kv})")
    if block_table is None:
        if slots < batch:
            raise InputError(f"k_cache holds {slots} sequences, q has {batch}")
        capacity, page_size = page_rows, 0
    else:
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.dtype != torch.int32:
            raise InputError("block_table must be a 2-dim int32 tensor (batch, max_pages), got "
                             f"{(block_table.dtype, tuple(block_table.shape)) if isinstance(block_table, torch.Tensor) else type(block_table).__name__}")
        if block_table.shape[0] != batch:
            raise InputError(f"block_table has {block_table.shape[0]} rows, q has batch {batch}")
        if block_table.device != q.device:
            raise InputError(f"block_table is on {block_table.device}, q on {q.device}")
        if block_table.stride(1) != 1 and block_table.shape[1] > 1:
            raise InputError("block_table's rows must be contiguous (stride 1 along max_pages)")
        if page_rows == 0:
            raise InputError("a paged cache needs pages of at least one row")
        capacity, page_size = block_table.shape[1] * page_rows, page_rows
    if (k is None) != (v is None):
        raise InputError("pass both k and v (new keys and values to append), or neither")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise InputError(f"{name} must be a 4-dim tensor (batch, seqlen_new, heads_kv, head_dim)")
            if t.dtype != q.dtype or t.device != q.device:
                raise InputError(f"{name} must be {q.dtype} on {q.device} like q, got {t.dtype} on {t.device}")
            if (t.shape[0], t.shape[2], t.shape[3]) != (batch, heads_kv, head_dim):
                raise InputError(f"{name} has shape {tuple(t.shape)}; expected ({batch}, seqlen_new, {heads_kv}, "
                                 f"{head_dim}) to append to this cache")
        if k.shape[1] != v.shape[1]:
            raise InputError(f"k and v append different numbers of tokens ({k.shape[1]} and {v.shape[1]})")
        if cache_seqlens is None:
            raise InputError("appending k/v needs cache_seqlens (where each sequence's new tokens go)")
        if _overlap(k_cache, v_cache):
            raise InputError("k_cache and v_cache share memory: the appended values would overwrite the appended "
                             "keys (and the kernel read one for the other); pass two separate caches, or two "
                             "non-overlapping views of one buffer")
    if not isinstance(causal, bool):
        raise InputError(f"causal must be True or False, got {causal!r}")
    n_new = 0 if k is None else k.shape[1]
    seqlen_k = cache_seqlens + n_new if isinstance(cache_seqlens, numbers.Integral) and not isinstance(
        cache_seqlens, bool) else capacity
    check_runnable(q, bf16_dots=k_cache.element_size() > 1)
    problem = Problem(batch, heads_q, heads_kv, n_q, max(0, min(seqlen_k, capacity)), head_dim,
                      str(q.dtype).removeprefix("torch."), causal, "bottom_right" if causal else "top_left",
                      kind="decode", page_size=page_size)
    return problem, capacity


def _overlap(a: torch.Tensor, b: torch.Tensor, budget: int = 4096) -> bool:
    """Whether two tensors share any element's memory, from their pointers, shapes and
    strides alone (no device work): disjoint address ranges never do; two views of one
    buffer with the same strides (K and V interleaved in one allocation, as paged caches
    often are) do when their offset is a reachable index difference, found by a bounded
    search over the dims from the largest stride down; anything else that spans the same
    range (or a search past ``budget`` steps) counts as overlapping."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    size = a.element_size()

    def span(t: torch.Tensor) -> tuple[int, int]:
        return t.data_ptr(), t.data_ptr() + size * (1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())))

    (a_lo, a_hi), (b_lo, b_hi) = span(a), span(b)
    if a_hi <= b_lo or b_hi <= a_lo:
        return False
    delta, rem = divmod(b.data_ptr() - a.data_ptr(), size)
    if rem or a.shape != b.shape or a.stride() != b.stride():
        return True
    dims = sorted(((abs(st), n - 1) for n, st in zip(a.shape, a.stride()) if n > 1 and st), reverse=True)
    reach = [sum(st * n for st, n in dims[i + 1:]) for i in range(len(dims))]  # what smaller dims add up to
    steps = [0]

    def found(i: int, rest: int) -> bool:
        steps[0] += 1
        if steps[0] > budget:
            return True
        if i == len(dims):
            return rest == 0
        stride, top = dims[i]
        low, high = max(-top, -((reach[i] - rest) // stride)), min(top, (rest + reach[i]) // stride)
        return any(found(i + 1, rest - c * stride) for c in range(low, high + 1))

    return found(0, delta)


def _check_seqlens(cache_seqlens, q, n_new: int, capacity: int) -> int:
    """Types and shapes of ``cache_seqlens``; the scalar length the kernel takes when it is
    an int (or None: the whole cache)."""
    if cache_seqlens is None:
        return capacity
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        if not 0 <= cache_seqlens <= capacity - n_new:
            raise InputError(f"cache_seqlens={cache_seqlens} with {n_new} new tokens does not fit the cache's "
                             f"{capacity} rows")
        return int(cache_seqlens)
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 \
            or cache_seqlens.shape != (q.shape[0],):
        raise InputError(f"cache_seqlens must be an int or an int32 tensor of shape ({q.shape[0]},), got "
                         f"{(cache_seqlens.dtype, tuple(cache_seqlens.shape)) if isinstance(cache_seqlens, torch.Tensor) else cache_seqlens!r}")
    if cache_seqlens.device != q.device:
        raise InputError(f"cache_seqlens is on {cache_seqlens.device}, q on {q.device}")
    return 0


def _check_descale_values(descales: dict[str, torch.Tensor], flags: list) -> list[bool]:
    """Reads back ``flags`` with the descale tensors' check, raising if a descale is not
    positive and finite; the flags' values otherwise."""
    bad = [~(torch.isfinite(d) & (d > 0)).all() for d in descales.values()]
    found = torch.stack(flags + bad).tolist()
    for (name, d), flag in zip(descales.items(), found[len(flags):]):
        if flag:
            index = tuple(int(i) for i in (~(torch.isfinite(d) & (d > 0))).nonzero()[0])
            where = str(list(index)) if index else ""
            raise InputError(f"{name}{where} = {float(d[index])}: descales must be positive and finite")
    return found[:len(flags)]


def _check_values(cache_seqlens, block_table, num_pages: int, n_new: int, capacity: int,
                  descales: dict[str, torch.Tensor] | None = None) -> None:
    """Lengths within the cache, the block-table entries they reach naming real pages and,
    when appending to a paged cache, each page being written reached by no other entry
    (another sequence's, or the same one's twice): two sequences whose new rows land in one
    page row would silently corrupt one of them, and a page one appends into while another
    reads it changes the other's keys. Pages only read may be shared (prefix caching). An FP8
    cache's descales positive and finite (a zero one would turn appended tokens into NaN or
    infinity). One read-back for all; raises before anything is written."""
    if not isinstance(cache_seqlens, torch.Tensor) and block_table is None:
        if descales:
            _check_descale_values(descales, [])
        return
    device = block_table.device if block_table is not None else cache_seqlens.device
    if isinstance(cache_seqlens, torch.Tensor):
        used = cache_seqlens.to(torch.int64) + n_new
        bad_length = (cache_seqlens < 0) | (used > capacity)
    else:
        used = torch.full((block_table.shape[0],), capacity if cache_seqlens is None else cache_seqlens + n_new,
                          device=device, dtype=torch.int64)
        bad_length = torch.zeros_like(used, dtype=torch.bool)
    flags = [bad_length.any()]
    if block_table is not None:
        page_size = capacity // max(block_table.shape[1], 1)
        pages = (used.clamp(0, capacity) + page_size - 1) // page_size
        columns = torch.arange(block_table.shape[1], device=device)[None, :]
        reached = columns < pages[:, None]
        outside = (block_table < 0) | (block_table >= num_pages)
        flags.append((reached & outside).any())
        if n_new:
            shared = _written_pages_shared(block_table, reached & ~outside, used, n_new, page_size, num_pages)
            flags.append(shared.any())
    found = _check_descale_values(descales, flags) if descales else torch.stack(flags).tolist()
    if found[0]:
        row = int(bad_length.nonzero()[0, 0])
        raise InputError(f"cache_seqlens[{row}] = {int(cache_seqlens[row])} with {n_new} new tokens is outside the "
                         f"cache's {capacity} rows")
    if len(found) > 1 and found[1]:
        raise InputError(f"block_table names pages outside the cache's {num_pages} within the sequences' lengths")
    if len(found) > 2 and found[2]:
        row, column = (int(i) for i in shared.nonzero()[0])
        page = int(block_table[row, column])
        raise InputError(f"block_table: sequence {row} appends into page {page}, which this call's sequences reach "
                         "more than once (another sequence's new rows land in it, or another sequence reads it): "
                         "one would silently corrupt the other; give each sequence the pages it writes to itself "
                         "(copy a shared page first); shared pages that are only read are fine")


def _written_pages_shared(block_table: torch.Tensor, valid: torch.Tensor, used: torch.Tensor, n_new: int,
                          page_size: int, num_pages: int) -> torch.Tensor:
    """(batch, max_pages) bool: the entries holding rows this call appends whose page some
    other valid entry (one reached by a sequence's length, naming a real page) names too.
    Device ops only: a count of references per page, then a gather."""
    columns = torch.arange(block_table.shape[1], device=block_table.device)[None, :]
    first = (used - n_new).clamp_min(0) // page_size  # the column of each sequence's first new row
    written = valid & (columns >= first[:, None])
    pages = torch.where(valid, block_table.to(torch.int64), num_pages)  # invalid entries count on a spare slot
    counts = torch.zeros(num_pages + 1, device=block_table.device, dtype=torch.int32)
    counts.scatter_add_(0, pages.flatten(), valid.flatten().to(torch.int32))
    return written & (counts[pages] > 1)


def _config(problem: Problem, q, config, num_splits, fp8_cache: bool = False) -> KernelConfig:
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral) or not 0 <= num_splits <= MAX_SPLITS:
        raise InputError(f"num_splits must be 0 (tuned) or 1..{MAX_SPLITS}, got {num_splits!r}")
    if isinstance(config, str):
        chosen = KernelConfig.from_json(config)
    elif config is not None:
        chosen = KernelConfig.from_mapping(config)
    else:
        chosen = DISPATCHER.choose(problem, q.device.type, q.device.index or 0).config
        if DISPATCHER.recorder is not None:  # fa_autotune.record / FA_AUTOTUNE_RECORD
            DISPATCHER.recorder.count_by_value(problem)
        if chosen.loop_order != "decode":  # a foreign config in a tuned file: the built-in one
            gpu = gpu_of(q.device.type, q.device.index or 0)
            chosen = decode_default(problem, gpu.capability_tuple, max(gpu.sm_count, 1))
        if fp8_cache and q.device.type == "cuda":  # tuned on 16-bit caches: steps of as many bytes
            chosen = for_fp8_cache(chosen, problem)
    if chosen.loop_order != "decode":
        raise ConfigError("loop_order", f"attention_with_kvcache runs loop_order='decode' configs, got {chosen.name}")
    if num_splits:  # n programs per sequence, as asked: not a balanced (persistent) grid
        chosen = chosen.with_(num_splits=int(num_splits), persistent=0)
    return chosen


# ------------------------------------------------------------------ torch.compile
@torch.library.custom_op("fa_autotune::attention_with_kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None,
                v: torch.Tensor | None, cache_seqlens: torch.Tensor | None, int_length: int,
                block_table: torch.Tensor | None, softmax_scale: float | None, causal: bool, num_splits: int,
                return_lse: bool, config: str | None, k_descale: torch.Tensor | None = None,
                v_descale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_with_kvcache as one op (lengths checked only outside CUDA-graph capture)."""
    lengths = cache_seqlens if cache_seqlens is not None else (None if int_length < 0 else int_length)
    result = attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, block_table=block_table,
                                    softmax_scale=softmax_scale, causal=causal, num_splits=num_splits,
                                    return_softmax_lse=return_lse, config=config, k_descale=k_descale,
                                    v_descale=v_descale)
    if return_lse:
        return result
    return result, result.new_empty((0,), dtype=torch.float32)


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, int_length, block_table, softmax_scale, causal, num_splits,
      return_lse, config, k_descale=None, v_descale=None):
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)

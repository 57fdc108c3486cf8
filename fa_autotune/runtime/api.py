"""The public entry points: ``attention`` (a drop-in for SDPA's forward) and ``explain``.

The eager hot path is a dict lookup keyed by the call's shapes, strides, dtypes, device
and options: the first call validates, consults the dispatcher, imports the kernel module
and prepares its launch; later calls allocate the output and launch. Under
``torch.compile`` the call goes through the ``fa_autotune::attention`` custom op instead,
so graphs compile without breaks.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..errors import ConfigError, InputError
from ..fp8.quantize import FMT_OF_DTYPE, Fp8Inputs, quantize_fp8, tile_blocks, v_order_for
from ..kernels.checks import (MAX_OFFSET, Layout, check_config, check_fp8_scales, check_offsets,
                              check_tma_output, gluon_backward_error, per_block, tma_output_reason,
                              why_not)
from ..kernels.bwd import BackwardPlan, wide_backward_error
from ..kernels.fwd import ForwardPlan, allocate_outputs, prepare, q_regs_error, run, wide_steps
from ..kernels.launch import check_interpretable, explained, resolve_scale
from ..kernels.varlen import run_varlen, varlen_config, varlen_d_rest
from ..spec.candidate import Candidate
from ..spec.config import DQ_FIELDS, KernelConfig
from ..spec.defaults import GLUON_BACKWARD_TWO_PASS, backward_default, default_for, defaults_for
from ..spec.problem import Problem, problem_from_tensors
from ..spec.recipe import RECIPE_FIELDS, Fp8Recipe
from .dispatch import DISPATCHER, Choice, gpu_of
from .select import runnable, select


@dataclass(frozen=True)
class _Plan:
    problem: Problem
    config: KernelConfig
    launch: ForwardPlan | None  # None when there is nothing to launch
    tma: bool  # base pointers must stay 16-byte aligned for this plan


_PLANS: dict[tuple, Any] = {}  # forward _Plans; ("bwd", ...) and ("varlen", ...) keys: (config, plan) tuples
_PLANS_LOCK = threading.Lock()
_MAX_PLANS = 4096


def _forget_plans() -> None:
    with _PLANS_LOCK:
        _PLANS.clear()


DISPATCHER.on_reset(_forget_plans)


def _keep(key: tuple, plan: Any) -> None:
    """Keep ``plan`` for the next call with ``key`` (all kept plans dropped at the cap)."""
    with _PLANS_LOCK:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan


def _scale_key(scale: Any) -> Any:
    """``scale`` as a plan key holds it: as given, once resolve_scale accepts it (so a bad
    one is an InputError, not an unhashable key)."""
    if scale is not None:
        resolve_scale(scale, 1)
    return scale


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool | None = None,
    scale: float | None = None,
    config: Mapping[str, Any] | KernelConfig | None = None,
    *,
    causal_align: str = "top_left",
    return_lse: bool = False,
    deterministic: bool = False,
    is_causal: bool | None = None,
    enable_gqa: bool | None = None,
    attn_mask: None = None,
    dropout_p: float = 0.0,
):
    """Scaled dot-product attention on (batch, heads, seqlen, head_dim) tensors, differentiable
    in q, k and v (the backward kernels run on ``loss.backward()``; ``deterministic=True``
    keeps them to configs whose gradients are bitwise reproducible, no atomics).

    Returns what ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True)`` returns. ``causal_align="bottom_right"`` aligns the diagonal to the
    last key instead (flash-attn / KV-cache convention); query rows that then see no key
    get zeros. ``return_lse=True`` also returns the natural-log log-sum-exp of each row's
    scores, shape (batch, heads, seqlen_q), fp32, differentiable (a loss may use it, as ring
    attention's merge of partial results does). ``config`` runs exactly that kernel
    variant (a mapping of template parameters); ``None`` asks the dispatcher (tuned
    results for this GPU, else a built-in default). CPU tensors run in Triton's
    interpreter (slow; for tests).

    SDPA's keyword names are taken where the meaning is the same, so calls port unchanged:
    ``is_causal`` (``causal``; not both), ``scale``, ``enable_gqa`` (GQA always works when
    heads_q % heads_kv == 0; ``False`` with differing head counts raises, as SDPA does);
    ``attn_mask`` other than None and ``dropout_p`` other than 0 raise. ``causal=None`` is
    False. Unlike SDPA, the LSE is differentiable, and there is no double backward: a loss
    of the gradients (create_graph=True) raises on its backward.
    """
    if is_causal is not None or enable_gqa is not None or attn_mask is not None or dropout_p:
        causal = _sdpa_options(q, k, causal, is_causal, enable_gqa, attn_mask, dropout_p)
    elif causal is None:
        causal = False
    if _wants_grad(q, k, v):
        return _differentiable(q, k, v, causal, scale, config, causal_align, return_lse, deterministic)
    if torch.compiler.is_compiling():
        return _through_custom_op(q, k, v, causal, scale, config, causal_align, return_lse)
    # causal joins the key only as a bool: 1 == True hashes alike, and a plan found for True
    # must not answer causal=1 (which _run_once refuses) just because True came first.
    if config is None and causal.__class__ is bool and isinstance(q, torch.Tensor) and isinstance(
            k, torch.Tensor) and isinstance(v, torch.Tensor):
        key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
               q.device, k.device, v.device, causal, _scale_key(scale), causal_align, return_lse)
        plan = _PLANS.get(key)
        if plan is None:
            plan = _make_plan(key, q, k, v, causal, scale, causal_align, return_lse)
        # Strides are part of the key; for TMA only the base addresses can still be misaligned.
        if plan.launch is not None and (not plan.tma or not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15):
            if DISPATCHER.recorder is not None:  # fa_autotune.record / FA_AUTOTUNE_RECORD
                DISPATCHER.recorder.count(plan.problem)
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32) if return_lse else None
            plan.launch(q, k, v, out, lse)
            return (out, lse) if return_lse else out
    return _run_once(q, k, v, causal, scale, config, causal_align, return_lse)


def _sdpa_options(q, k, causal, is_causal, enable_gqa, attn_mask, dropout_p) -> Any:
    """``causal`` given SDPA's names for attention's options (``causal`` None when not
    passed); raises where SDPA's meaning is one fa_autotune does not implement."""
    if attn_mask is not None:
        raise InputError("attn_mask is not supported: fa_autotune runs no mask but the causal one (causal=True or "
                         "is_causal=True, causal_align for its diagonal); pass attn_mask=None")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or dropout_p != 0:
        raise InputError(f"dropout_p={dropout_p!r}: attention dropout is not supported; pass 0.0")
    if enable_gqa is not None:
        if not isinstance(enable_gqa, bool):
            raise InputError(f"enable_gqa must be True or False, got {enable_gqa!r}")
        heads = [getattr(t, "shape", (None, None))[1] if getattr(t, "dim", lambda: 0)() == 4 else None
                 for t in (q, k)]
        if not enable_gqa and None not in heads and heads[0] != heads[1]:
            raise InputError(f"enable_gqa=False but q has {heads[0]} heads and k/v {heads[1]}: pass enable_gqa=True "
                             "(or leave it out) for grouped-query attention, as SDPA requires")
    causal = sdpa_alias("causal", causal, "is_causal", is_causal)
    return False if causal is None else causal


def sdpa_alias(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    """An option given under its own name or under SDPA's (None: not given); both raises,
    since one of the two would be silently ignored."""
    if alias_value is None:
        return value
    if value is not None:
        raise InputError(f"pass {name} or its SDPA name {alias}, not both")
    return alias_value


def _wants_grad(q, k, v) -> bool:
    """Whether autograd must see this call. On attention()'s hot path: three attribute
    reads, grad mode only when one is set."""
    wanted = getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False) or getattr(
        v, "requires_grad", False)
    return bool(wanted) and torch.is_grad_enabled()


def _refuse_grad(*tensors) -> None:
    """For entry points without a backward (FP8): an output without grad_fn would silently
    cut the graph."""
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise InputError("inputs require grad, but this fa_autotune entry point has no backward: call it under "
                         "torch.no_grad() / torch.inference_mode(), or pass detached tensors")


class _Attention(torch.autograd.Function):
    """attention() with a backward: the forward keeps the output and the log-sum-exp, the
    backward runs the backward kernels (dQ, dK, dV). The LSE is differentiable (ring /
    context-parallel attention merges partial results through it): d lse_i / d s_ij = P_ij,
    so its gradient folds into the backward's row term, delta_i = rowsum(dO_i * O_i) - dLSE_i."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config, causal_align, deterministic):
        out, lse = attention(q, k, v, causal, scale, config, causal_align=causal_align, return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, scale, causal_align, deterministic)
        ctx.set_materialize_grads(False)  # an unused LSE (or output) costs no zeros and no fold
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None and dlse is None:
            return None, None, None, None, None, None, None, None
        if dout is None:  # a loss of the LSE alone
            dout = torch.zeros_like(out)
        if torch.is_grad_enabled():  # create_graph=True: gradients whose own backward refuses
            dq, dk, dv = _AttentionGradients.apply(q, k, v, out, lse, dout, dlse, *ctx.options)
        else:
            dq, dk, dv = attention_backward(q, k, v, out, lse, dout, *ctx.options, dlse=dlse)
        return dq, dk, dv, None, None, None, None, None


DOUBLE_BACKWARD_MESSAGE = (
    "fa_autotune.attention has no double backward: its gradients come from kernels autograd cannot "
    "differentiate, so a loss built from them (a gradient penalty, a Hessian-vector product through "
    "create_graph=True) would silently get no gradient through attention. Use "
    "torch.nn.functional.scaled_dot_product_attention for that part of the model")


class _AttentionGradients(torch.autograd.Function):
    """The backward kernels as a node of their own under ``create_graph=True``: the gradients
    then carry a graph (so they are not silently constants) whose backward raises, instead of
    a second-order term that silently contributes nothing."""

    @staticmethod
    def forward(ctx, q, k, v, out, lse, dout, dlse, causal, scale, causal_align, deterministic):
        return attention_backward(q, k, v, out, lse, dout, causal, scale, causal_align, deterministic, dlse=dlse)

    @staticmethod
    def backward(ctx, *grads):
        raise InputError(DOUBLE_BACKWARD_MESSAGE)


def _backward_config(problem: Problem, q, k, v, dout, deterministic: bool = False) -> KernelConfig:
    """The dispatcher's backward config for ``problem`` (kind "bwd"): the built-in one when
    what it finds is not a backward kernel, the Triton built-in one when it is a Gluon kernel
    these tensors' layouts cannot feed, and its dQ in its own pass and each GQA group in one
    program when ``deterministic``."""
    capability = gpu_of(q.device.type, q.device.index or 0).capability_tuple
    chosen = DISPATCHER.choose(problem, q.device.type, q.device.index or 0).config
    if chosen.loop_order != "backward":
        chosen = backward_default(problem, capability)
    if chosen.language == "gluon" and (gluon_backward_error(q, k, v, dout) is not None or (
            problem.head_dim_pad > 128 and (deterministic or wide_backward_error(chosen) is not None))):
        # past D=128 the Gluon pass adds dQ up inside it (run-to-run bit differences)
        chosen = backward_default(problem, capability, gluon=False)
    if deterministic and chosen.group_split != 1:  # dK and dV of a split group are added up by atomics
        chosen = chosen.with_(group_split=1)
    if deterministic and chosen.dq_atomic:  # its own dQ pass, shaped as the Triton built-in one
        if chosen.language == "gluon":  # beside the dQ pass the Gluon pass steps 64 query rows
            return GLUON_BACKWARD_TWO_PASS.with_(consumers=chosen.consumers)
        dq_pass = backward_default(problem, capability, gluon=False).dq_pass()
        return chosen.with_(dq_atomic=False, **dict(zip(DQ_FIELDS, dq_pass)))
    return chosen


def _differentiable(q, k, v, causal, scale, config, causal_align, return_lse, deterministic):
    if torch.compiler.is_compiling():  # the custom op, with its registered autograd
        if deterministic:
            raise InputError("deterministic=True is not supported under torch.compile yet; call it eagerly")
        out, lse = _through_custom_op(q, k, v, causal, scale, config, causal_align, True)
    else:
        _plain_problem(q, k, v, causal, causal_align)  # bad input raises here, before autograd sees it
        out, lse = _Attention.apply(q, k, v, causal, scale, config, causal_align, deterministic)
    return (out, lse) if return_lse else out


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       dout: torch.Tensor, causal: bool = False, scale: float | None = None,
                       causal_align: str = "top_left", deterministic: bool = False, *,
                       dlse: torch.Tensor | None = None):
    """(dq, dk, dv) of attention(q, k, v, causal, scale, causal_align=...) given its output,
    its log-sum-exp and the output's gradient (any strides); ``dlse``, the gradient of the
    (natural-log) LSE, (batch, heads_q, seqlen_q), is folded into the row term the kernels
    read (delta - dlse), one elementwise op more. The config and launch plan of
    each layout are kept (with the forward's plans): building them sends every kernel through
    Triton's JIT path, which cost the Gluon backward about 0.4 ms a call at N=1024 on an H200."""
    key = cached = None
    # else the checks below say what is wrong (causal=1 among them: it would share True's key)
    if causal.__class__ is bool and all(isinstance(t, torch.Tensor) for t in (q, k, v, out, dout)):
        aligned = not (q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr() | dout.data_ptr()) & 15
        key = ("bwd", q.shape, k.shape, v.shape, out.shape, dout.shape, q.stride(), k.stride(), v.stride(),
               out.stride(), dout.stride(), q.dtype, k.dtype, v.dtype, out.dtype, dout.dtype, q.device, k.device,
               v.device, out.device, dout.device, aligned, causal, _scale_key(scale), causal_align, deterministic)
        cached = _PLANS.get(key)
    if cached is None:
        problem = _plain_problem(q, k, v, causal, causal_align)
        for name, t in (("out", out), ("dout", dout)):
            if not isinstance(t, torch.Tensor) or t.device != q.device:
                raise InputError(f"{name} must be a tensor on q's device ({q.device}), got "
                                 f"{t.device if isinstance(t, torch.Tensor) else type(t).__name__}")
        if dout.shape != out.shape:
            raise InputError(f"the output gradient has shape {tuple(dout.shape)}, the output {tuple(out.shape)}")
        if not problem.is_empty:
            check_interpretable(q)
        problem = problem.with_kind("bwd")  # the shapes, offsets and mask of the forward's, as recorded
        cached = (problem, None if problem.is_empty else _backward_config(problem, q, k, v, dout, deterministic), None)
    if dlse is not None:
        _check_dlse(dlse, q)
    problem, config, plan = cached
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if config is None:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if DISPATCHER.recorder is not None:
        DISPATCHER.recorder.count(problem)

    def build_and_run() -> None:
        built = plan
        if built is None:
            built = BackwardPlan(config, q, k, v, out, dout, dq, dk, dv, resolve_scale(scale, problem.head_dim),
                                 problem.causal_offset, problem.causal)
            if key is not None:
                _keep(key, (problem, config, built))
        built(q, k, v, out, dout, lse, dq, dk, dv, dlse=dlse)

    explained(config, build_and_run)()
    return dq, dk, dv


def _check_dlse(dlse, q) -> None:
    """The LSE gradient: fp32 (batch, heads_q, seqlen_q) on q's device, as the LSE is."""
    if not isinstance(dlse, torch.Tensor) or dlse.shape != q.shape[:3] or dlse.dtype != torch.float32 \
            or dlse.device != q.device:
        got = (f"{dlse.dtype} {tuple(dlse.shape)} on {dlse.device}" if isinstance(dlse, torch.Tensor)
               else type(dlse).__name__)
        raise InputError(f"dlse must be a float32 tensor of shape {tuple(q.shape[:3])} on {q.device}, got {got}")


def _run_once(q, k, v, causal, scale, config, causal_align, return_lse):
    """The general path: validate everything, pick or parse the config, launch."""
    problem = _plain_problem(q, k, v, causal, causal_align)
    sm_scale = resolve_scale(scale, problem.head_dim)
    chosen = _dispatched(problem, q, k, v).config if config is None else KernelConfig.from_mapping(config)
    if config is None and DISPATCHER.recorder is not None and not problem.is_empty:
        DISPATCHER.recorder.count_by_value(problem)  # by value: this problem object is built per call
    check_config(chosen, problem, q, k, v)
    out, lse = allocate_outputs(q, problem, return_lse)
    run(chosen, problem, q, k, v, sm_scale, out, lse)
    return (out, lse) if return_lse else out


def _plain_problem(q, k, v, causal, causal_align) -> Problem:
    problem = problem_from_tensors(q, k, v, causal=causal, causal_align=causal_align)
    if problem.is_fp8:
        raise InputError(f"FP8 tensors ({q.dtype}) need their descale factors: call "
                         "fa_autotune.attention_fp8(fa_autotune.quantize_fp8(q, k, v)) or attention_fp8(q, k, v) "
                         "on fp16/bf16 tensors")
    return problem


def attention_fp8(
    q: torch.Tensor | Fp8Inputs,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    causal: bool | None = None,
    scale: float | None = None,
    config: Mapping[str, Any] | KernelConfig | Candidate | None = None,
    *,
    max_error: float | None = None,
    scaling: str | None = None,
    hadamard: bool | None = None,
    fmt: str = "e4m3",
    block_q: int | None = None,
    block_k: int | None = None,
    causal_align: str = "top_left",
    out_dtype: torch.dtype | None = None,
    return_lse: bool = False,
    is_causal: bool | None = None,
    enable_gqa: bool | None = None,
    attn_mask: None = None,
    dropout_p: float = 0.0,
    sink_tile: bool | None = None,
):
    """Attention with FP8 Q, K, V: pass what :func:`fa_autotune.quantize_fp8` returned, or
    fp16/bf16/fp32 q, k, v to have them quantized here. ``config=None`` asks the dispatcher:
    the fastest tuned config whose measured error (relative, against float32) is within
    ``max_error`` (`fa-autotune tune --dtype fp8` stores each problem's time/error Pareto
    front); its quantization recipe (:class:`~fa_autotune.Fp8Recipe`) is used unless ``scaling`` /
    ``hadamard`` / ``sink_tile`` say otherwise. A ``config`` given may name a recipe beside its
    template parameters (``fp8_scaling``, ``fp8_hadamard``, ``fp8_sink_tile``, as stored configs
    and ``query pareto`` list them; the default recipe where it names none); for inputs
    quantized already it must be theirs, and ``scaling`` / ``hadamard`` other than theirs are
    an InputError. ``fmt``, ``block_q``, ``block_k`` as quantize_fp8 takes them
    (default: 128 rows, or the chosen kernel's tile where that is larger).
    Descales are applied in the kernel; the Hadamard rotation needs nothing (QK^T is
    unchanged). Output in ``out_dtype`` (default: the inputs' dtype when they were
    fp16/bf16, else bfloat16); otherwise as :func:`attention` (SDPA's keyword names too).
    ``sink_tile``: whether the first K tile is scored from the unquantized q and k (the
    recipe's ``sink_tile``; for Fp8Inputs, those quantize_fp8 kept): accurate with attention
    sinks, at the cost of one 16-bit score tile per Q tile and of warp specialization
    (1.03-1.07x the kernel's time on an H100 at D=128). None: as the Fp8Inputs were
    quantized, or the chosen recipe's when quantizing here (the default recipe's: on).
    """
    if sink_tile is not None and not isinstance(sink_tile, bool):
        raise InputError(f"sink_tile must be True, False or None, got {sink_tile!r}")
    causal = _sdpa_options(q.q if isinstance(q, Fp8Inputs) else q, q.k if isinstance(q, Fp8Inputs) else k, causal,
                           is_causal, enable_gqa, attn_mask, dropout_p)
    _refuse_grad(q, k, v, *((q.q, q.k, q.v) if isinstance(q, Fp8Inputs) else ()))
    if max_error is not None and not (isinstance(max_error, (int, float)) and max_error > 0):
        raise InputError(f"max_error must be a positive number, got {max_error!r}")
    key = _fp8_key(q, k, v, causal, scale, config, max_error, scaling, hadamard, fmt, block_q, block_k, out_dtype,
                   return_lse, sink_tile, causal_align)
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None:
        return plan(q, k, v)
    if isinstance(q, Fp8Inputs):
        if k is not None or v is not None:
            raise InputError("pass either one Fp8Inputs or q, k, v, not both")
        inputs, source_dtype = q, None
        if sink_tile and q.sources is None:
            raise InputError("sink_tile=True needs q and k before quantization: quantize them with "
                             "quantize_fp8(..., sink_tile=True)")
        if sink_tile is False and q.sources is not None:
            inputs = dataclasses.replace(q, sources=None)
        held_recipe = inputs.recipe
        for name, given, held in (("scaling", scaling, q.scaling), ("hadamard", hadamard, q.hadamard)):
            if given is not None and given != held:  # their scales are fixed: it would be ignored
                raise InputError(f"these Fp8Inputs were quantized with {name}={held!r}, not {name}={given!r}: "
                                 f"quantize again with quantize_fp8(..., {name}={given!r}), or leave {name} out")
        problem = problem_from_tensors(q.q, q.k, q.v, causal=causal, causal_align=causal_align)
        if not problem.is_fp8:
            raise InputError(f"Fp8Inputs hold {q.q.dtype} tensors, not float8_e4m3fn / float8_e5m2")
        chosen = _fp8_choice(problem, q.q.device, config, max_error, held_recipe, quantized=True).config
    else:
        dtype = {fmt_: name for name, fmt_ in FMT_OF_DTYPE.items()}.get(fmt)
        if dtype is None:
            raise InputError(f"fmt must be one of {sorted(FMT_OF_DTYPE.values())}, got {fmt!r}")
        problem = problem_from_tensors(q, k, v, causal=causal, causal_align=causal_align).with_dtype(dtype)
        parts = (scaling, hadamard, sink_tile)
        candidate = _fp8_choice(problem, q.device, config, max_error, parts)
        chosen, recipe = candidate.config, candidate.recipe.with_(*parts)
        tiles = tile_blocks(chosen.BLOCK_M, chosen.BLOCK_N)
        inputs = quantize_fp8(q, k, v, scaling=recipe.scaling, hadamard=recipe.hadamard, fmt=fmt,
                              block_q=tiles[0] if block_q is None else block_q,
                              block_k=tiles[1] if block_k is None else block_k, check_finite=False,
                              sink_tile=recipe.sink_tile, v_order=v_order_for(chosen.warp_specialize, k.shape[2]))
        source_dtype = q.dtype
    out_dtype = out_dtype or (source_dtype if source_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16)
    if out_dtype not in (torch.float16, torch.bfloat16):
        raise InputError(f"out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
    q8, k8, v8 = inputs.q, inputs.k, inputs.v
    _check_scales(inputs, problem)
    _check_sources(inputs)
    chosen = _fp8_usable(chosen, problem, inputs, explicit=config is not None)
    out = torch.empty(q8.shape, device=q8.device, dtype=out_dtype)
    lse = torch.empty(q8.shape[:3], device=q8.device, dtype=torch.float32) if return_lse else None
    sm_scale = resolve_scale(scale, problem.head_dim)
    if key is None or problem.is_empty:
        run(chosen, problem, q8, k8, v8, sm_scale, out, lse, inputs.scales)
        return (out, lse) if return_lse else out
    check_interpretable(q8)
    prepared = explained(chosen, lambda: prepare(chosen, q8, k8, v8, out, lse, sm_scale, problem.causal_offset,
                                                 problem.causal, inputs.scales))()
    plan = _Fp8Plan(chosen, prepared, out_dtype, return_lse, None if isinstance(q, Fp8Inputs) else (
        dict(scaling=recipe.scaling, hadamard=recipe.hadamard, fmt=fmt, block_q=inputs.block_q,
             block_k=inputs.block_k, check_finite=False, sink_tile=recipe.sink_tile, v_order=inputs.v_order)),
                    sink_tile is not False)
    _keep(key, plan)
    explained(chosen, lambda: prepared(q8, k8, v8, out, lse, inputs.scales))()
    return (out, lse) if return_lse else out


@dataclass(frozen=True)
class _Fp8Plan:
    """A kept attention_fp8 call: its kernel's prepared launch and, when it quantizes, the
    quantize_fp8 arguments it was planned with; everything else the key fixed."""

    config: KernelConfig
    launch: ForwardPlan
    out_dtype: torch.dtype
    return_lse: bool
    quantize: dict | None  # None: the call passes Fp8Inputs
    sources: bool  # whether Fp8Inputs' sink-tile sources are read (sink_tile was not False)

    def __call__(self, q, k, v):
        inputs = q if self.quantize is None else quantize_fp8(q, k, v, **self.quantize)
        scales = inputs.scales if self.sources else inputs.scales[:6]
        out = torch.empty(inputs.q.shape, device=inputs.q.device, dtype=self.out_dtype)
        lse = torch.empty(inputs.q.shape[:3], device=out.device, dtype=torch.float32) if self.return_lse else None
        explained(self.config, lambda: self.launch(inputs.q, inputs.k, inputs.v, out, lse, scales))()
        return (out, lse) if self.return_lse else out


def _fp8_key(q, k, v, causal, scale, config, max_error, scaling, hadamard, fmt, block_q, block_k, out_dtype,
             return_lse, sink_tile, causal_align) -> tuple | None:
    """The attention_fp8 plan key: everything the first call's checks and choices read (the
    tensors' shapes, strides, dtypes, devices and 16-byte alignment, the options), or None
    where a call is not kept (an explicit config, options of other types)."""
    if config is not None or causal.__class__ is not bool or not all(
            x is None or x.__class__ in (bool, int, float, str) for x in (max_error, scaling, hadamard, fmt, block_q,
                                                                         block_k, sink_tile, causal_align)):
        return None
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        return None
    if isinstance(q, Fp8Inputs):
        if k is not None or v is not None:
            return None
        tensors = (q.q, q.k, q.v, q.q_scale, q.k_scale, q.v_scale, *(q.sources or ()))
        held = (q.scaling, q.hadamard, q.fmt, q.block_q, q.block_k, q.sources is not None, q.v_order)
    else:
        tensors, held = (q, k, v), None
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    aligned = not any(t.data_ptr() & 15 for t in tensors)
    return ("fp8", held, aligned, *((t.shape, t.stride(), t.dtype, t.device) for t in tensors), causal,
            _scale_key(scale), max_error, scaling, hadamard, fmt, block_q, block_k, out_dtype, return_lse, sink_tile,
            causal_align)


def _fp8_choice(problem: Problem, device: torch.device, config, max_error, parts: tuple | Fp8Recipe,
                quantized: bool = False) -> Candidate:
    """The kernel and recipe attention_fp8 runs: ``config`` with the recipe it names (the
    default where it names none), else the dispatcher's choice among recipes with the
    ``parts`` given ((scaling, hadamard, sink_tile), None for any). ``quantized``: ``parts``
    is the inputs' own recipe, which a recipe in ``config`` must not contradict (it could not
    be honoured)."""
    if isinstance(parts, Fp8Recipe):
        parts = (parts.scaling, parts.hadamard, parts.sink_tile)
    if config is None:
        return DISPATCHER.choose_fp8(problem, device.type, device.index or 0, max_error, *parts).candidate
    candidate = Candidate.from_mapping(config, fp8=True)
    named = config.recipe if isinstance(config, Candidate) else Fp8Recipe.split(config)[1]  # None: it names none
    if quantized and named is not None and not named.matches(*parts):
        held = Fp8Recipe(*parts)
        differs = next(key for key, name in RECIPE_FIELDS.items() if getattr(named, name) != getattr(held, name))
        raise ConfigError(differs, f"config names the recipe {named.to_dict()}, but the inputs were quantized "
                          f"with {held.to_dict()}: quantize them with the config's recipe "
                          "(quantize_fp8's scaling=, hadamard= and sink_tile=), or leave the recipe out of the config")
    return candidate


def _fp8_usable(config: KernelConfig, problem: Problem, inputs, explicit: bool) -> KernelConfig:
    """``config`` if it can run these FP8 inputs. A dispatched one that cannot is adapted as
    attention()'s dispatch adapts (:func:`.select.runnable`), after its tiles shrink into the inputs'
    scaling blocks; the FP8 default, adapted
    alike, is the last resort."""
    if explicit:
        _check_fp8_config(config, problem, inputs)
        return config
    default = default_for(problem, gpu_of(inputs.q.device.type, inputs.q.device.index or 0))
    layout = Layout.of(problem, inputs.q, inputs.k, inputs.v)
    for candidate in (config, default):
        if inputs.v_order == "wgmma" and candidate.warp_specialize:
            continue  # reads V's keys in order only (fwd.fp8_flag)
        candidate = _within_scale_blocks(candidate, inputs)
        fitted = runnable(candidate, problem, layout)
        if fitted is not None:
            return fitted
    _check_fp8_config(default, problem, inputs)  # raises, naming the parameter
    return default


def _within_scale_blocks(config: KernelConfig, inputs) -> KernelConfig:
    """The same kernel with tiles no larger than the inputs' per-block scaling blocks, and
    its PV products kept separate when V has per-block descales."""
    block_m, block_n, pv = config.BLOCK_M, config.BLOCK_N, config.fp8_pv
    if per_block(inputs.q_scale):
        block_m = min(block_m, inputs.block_q)
    if per_block(inputs.k_scale):
        block_n = min(block_n, inputs.block_k)
    if per_block(inputs.v_scale):
        pv = "separate"
    return config.with_(BLOCK_M=block_m, BLOCK_N=block_n, fp8_pv=pv)


def _check_fp8_config(config: KernelConfig, problem: Problem, inputs) -> None:
    check_config(config, problem, inputs.q, inputs.k, inputs.v)
    check_fp8_scales(config, inputs.q_scale, inputs.k_scale, inputs.v_scale, inputs.block_q, inputs.block_k)


def _check_scales(inputs, problem: Problem) -> None:
    """Descales must be fp32 (batch, heads, row blocks) tensors on the inputs' device."""
    for name, t, heads, rows, block in (("q_scale", inputs.q_scale, problem.heads_q, problem.seqlen_q, inputs.block_q),
                                        ("k_scale", inputs.k_scale, problem.heads_kv, problem.seqlen_k, inputs.block_k),
                                        ("v_scale", inputs.v_scale, problem.heads_kv, problem.seqlen_k, inputs.block_k)):
        expected = (problem.batch, heads, -(-rows // block))
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != expected:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise InputError(f"{name} must be a float32 tensor of shape {expected}, got {got}")
        if t.device != inputs.q.device:
            raise InputError(f"{name} is on {t.device}, the inputs on {inputs.q.device}")


def _check_sources(inputs) -> None:
    """The sink tile reads the q and k the FP8 ones were quantized from: same shapes and device,
    one floating dtype of 16 or 32 bits, each head addressable with 32-bit offsets."""
    if inputs.sources is None:
        return
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    for name, source, quantized in zip("qk", inputs.sources, (inputs.q, inputs.k)):
        if not isinstance(source, torch.Tensor) or source.dtype not in dtypes or source.shape != quantized.shape:
            got = f"{source.dtype} {tuple(source.shape)}" if isinstance(source, torch.Tensor) else type(source).__name__
            raise InputError(f"the sink tile's {name} must be the float16/bfloat16/float32 tensor of shape "
                             f"{tuple(quantized.shape)} that {name} was quantized from, got {got}")
        if source.device != quantized.device:
            raise InputError(f"the sink tile's {name} is on {source.device}, the FP8 inputs on {quantized.device}")
        span = (source.shape[2] - 1) * abs(source.stride(2)) + (source.shape[3] - 1) * abs(source.stride(3))
        if span > MAX_OFFSET:
            raise InputError(f"the sink tile's {name}: one head spans {span} elements, past the 32-bit offsets "
                             "the sink tile reads it with; store its heads outermost (batch, heads, seqlen, head_dim)")
    if inputs.sources[0].dtype != inputs.sources[1].dtype:
        raise InputError(f"the sink tile's q and k must share a dtype, got {inputs.sources[0].dtype} and "
                         f"{inputs.sources[1].dtype}")


def _dispatched(problem: Problem, q, k, v) -> Choice:
    """The dispatcher's choice, made runnable on these tensors (:func:`.select.select`)."""
    gpu = gpu_of(q.device.type, q.device.index or 0)
    choice = DISPATCHER.choose(problem, q.device.type, q.device.index or 0)
    return select(problem, Layout.of(problem, q, k, v), choice, defaults_for(problem, gpu))


def _make_plan(key, q, k, v, causal, scale, causal_align, return_lse) -> _Plan:
    problem = _plain_problem(q, k, v, causal, causal_align)
    sm_scale = resolve_scale(scale, problem.head_dim)
    config = _dispatched(problem, q, k, v).config
    prepared = None
    if not problem.is_empty and problem.seqlen_k > 0:  # otherwise _run_once handles it without a kernel
        check_interpretable(q)
        out, lse = allocate_outputs(q, problem, return_lse)
        prepared = prepare(config, q, k, v, out, lse, sm_scale, problem.causal_offset, problem.causal)
    plan = _Plan(problem, config, prepared, config.access == "tensor_desc")
    _keep(key, plan)
    return plan


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_softmax_lse: bool = False,
    config: Mapping[str, Any] | KernelConfig | None = None,
    check_lengths: bool | None = None,
    scale: float | None = None,
    is_causal: bool | None = None,
):
    """Attention over a batch of sequences of different lengths, packed without padding: a
    drop-in for flash-attn's ``flash_attn_varlen_func``. q (total_q, heads_q, D), k and v
    (total_k, heads_kv, D); sequence b owns rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q
    and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of k and v (int32, length batch + 1).
    ``causal=True`` aligns the diagonal bottom-right per sequence (the last query sees every
    key), as flash-attn does. Returns the output (total_q, heads_q, D) and, with
    ``return_softmax_lse=True``, also the natural-log LSE (heads_q, total_q), fp32. The
    lengths are checked on the host (one small copy, which waits for the GPU) unless
    ``check_lengths=False`` (what a serving engine that built them passes) or a CUDA graph
    is being captured, where they are trusted. By default (None) the offsets tensors last
    checked are not read again while torch has not changed them (a model's later layers
    pass the same ones); writes torch does not see (``.data``, numpy, a custom kernel) need
    ``check_lengths=True``, which always reads back. ``config``: as for :func:`attention` (a
    Q-outer Triton variant; TMA access becomes plain pointers). The config and launch plan
    of each layout, batch size and longest sequence are kept for the next call.

    flash-attn's other arguments are taken in its order so calls port unchanged:
    ``deterministic`` (the forward always is), ``return_attn_probs=True`` returns
    (out, lse, None) as flash-attn's (out, softmax_lse, S_dmask) minus the probabilities;
    dropout, sliding windows, softcapping and ALiBi are refused with an InputError. SDPA's
    names ``scale`` (``softmax_scale``) and ``is_causal`` (``causal``) are taken too (an
    option and its alias together raise); ``causal=None`` is False. ``is_causal`` keeps this
    function's bottom-right diagonal (SDPA's is top-left: they differ where a sequence's query
    and key lengths differ)."""
    softmax_scale = sdpa_alias("softmax_scale", softmax_scale, "scale", scale)
    causal = sdpa_alias("causal", causal, "is_causal", is_causal)
    causal = False if causal is None else causal
    _refuse_grad(q, k, v)
    unsupported = {"dropout_p": dropout_p not in (0, 0.0), "window_size": tuple(window_size) != (-1, -1),
                   "softcap": softcap not in (0, 0.0), "alibi_slopes": alibi_slopes is not None}
    for name, given in unsupported.items():
        if given:
            raise InputError(f"{name}: not supported by attention_varlen (dropout, sliding windows, softcapping "
                             "and ALiBi are not implemented); pass the default")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise InputError(f"{name} must be a 3-dim tensor (total_tokens, heads, head_dim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    # The (1, heads, tokens, D) views get the same checks attention() makes.
    views = tuple(t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
    dense = problem_from_tensors(*views, causal=causal)
    if dense.is_fp8:
        raise InputError("attention_varlen takes float16, bfloat16 or float32 tensors, not FP8")
    batch = _check_cu_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_lengths)
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    want_lse = return_softmax_lse or return_attn_probs
    cacheable = config is None or isinstance(config, KernelConfig)
    aligned = not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15
    key = ("varlen", q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
           q.device, k.device, v.device, aligned, batch, max_seqlen_q, max_seqlen_k, causal,
           _scale_key(softmax_scale), want_lse, config)
    cached = _PLANS.get(key) if cacheable else None
    if cached is not None:
        chosen, sm_scale, plan = cached
        out = torch.empty_like(q)
        lse = torch.empty((q.shape[1], q.shape[0]), device=q.device, dtype=torch.float32) if want_lse else None
        run_varlen(chosen, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, sm_scale, causal, out, lse, plan)
        return _varlen_result(out, lse, return_softmax_lse, return_attn_probs)
    problem = Problem(batch, dense.heads_q, dense.heads_kv, max_seqlen_q, max_seqlen_k, dense.head_dim, dense.dtype,
                      causal, "bottom_right")
    sm_scale = resolve_scale(softmax_scale, problem.head_dim)
    out = torch.empty_like(q)  # a Gluon kernel stores its full tiles through TMA: checked with q, k, v
    out_view = out.unsqueeze(0).transpose(1, 2)
    if config is None:
        # The dispatched config: a Gluon one runs its own varlen kernel where it can read these
        # tensors (0.71-0.89x of dense attention against 0.62-0.67x for Triton's on an H200,
        # benchmarks/results/2026-12-01-h200-varlen-gluon/results.md), on the persistent grid
        # varlen_grid picks (static, or tiles from a counter for few sequences); otherwise
        # the Triton varlen kernel.
        gpu = gpu_of(q.device.type, q.device.index or 0)
        dispatched = DISPATCHER.choose(problem, q.device.type, q.device.index or 0).config
        chosen = None
        if dispatched.language == "gluon":
            equal = q.shape[0] == batch * max_seqlen_q and k.shape[0] == batch * max_seqlen_k
            candidate = varlen_fit(varlen_grid(dispatched, causal, equal, batch), dense)
            if why_not(candidate, dense, Layout.of(dense, *views)) is None and tma_output_reason(out_view) is None:
                chosen = candidate
        if chosen is None:
            chosen = varlen_config(dispatched, default_for(problem, gpu, gluon=False))
    else:
        chosen = varlen_config(KernelConfig.from_mapping(config), gluon=True)
        if chosen.language == "gluon":  # Hopper, fp16/bf16, TMA-readable (1, heads, tokens, D) views
            check_config(chosen, dense, *views)
            check_tma_output(out_view)
    for name, t, rows in (("q", q, max_seqlen_q), ("k", k, max_seqlen_k), ("v", v, max_seqlen_k)):
        check_offsets(name, rows, t.shape[2], t.stride(0), t.stride(2), chosen.access)
    lse = torch.empty((q.shape[1], q.shape[0]), device=q.device, dtype=torch.float32) if want_lse else None
    if k.shape[0] == 0:  # no keys anywhere: zeros, as for attention()
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
    else:
        plan = run_varlen(chosen, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, sm_scale, causal, out, lse)
        if cacheable and plan is not None:
            _keep(key, (chosen, sm_scale, plan))
    return _varlen_result(out, lse, return_softmax_lse, return_attn_probs)


VARLEN_DYNAMIC_BELOW = 16  # sequences: fewer, and attention_varlen takes its tiles from a counter


def varlen_grid(dispatched: KernelConfig, causal: bool, equal_lengths: bool, batch: int) -> KernelConfig:
    """The persistent grid attention_varlen runs a dispatched Gluon config's varlen kernel on:
    the static one (every programs-th tile; with the producer posting each tile and no spill
    in the consumers it led the counter on the H200 with 16 or more sequences: by 0.4-5.5% on
    mixed lengths, causal or not, and 2.4% on equal ones without a mask), except for fewer than VARLEN_DYNAMIC_BELOW sequences, whose
    tiles differ most in work: tiles from a counter there (4 sequences of 1024-16384: 0.9%
    ahead, causal 2.2%; benchmarks/results/2026-12-04-h200-varlen-no-spill/results.md). A causal batch
    whose sequences all have the longest length (tokens = batch * max_seqlen) is the dense
    problem the config was chosen for: its own grid, persistent. Never a program per tile
    (slower for varlen, benchmarks/results/2026-12-02-h200-varlen-grids/results.md)."""
    if causal and equal_lengths:
        return dispatched.with_(persistent=max(dispatched.persistent, 1))
    if batch < VARLEN_DYNAMIC_BELOW:
        return dispatched.with_(persistent=1, dynamic=True)
    return dispatched.with_(persistent=max(dispatched.persistent, 1), dynamic=False)


def varlen_fit(config: KernelConfig, problem: Problem) -> KernelConfig:
    """A dispatched Gluon config as the varlen kernel holds it: that kernel stages tiles padded
    to a power of two, so where the dense kernel takes 128-key steps over unpadded column
    chunks (head dims 129-192, kernels.fwd.wide_steps) it takes 64-key ones, where Q would stay
    in registers as one part past 128 columns it reads Q from shared memory, and where a
    persistent grid's second Q buffer does not fit beside the K/V ring (past D=128) it runs a
    program per tile, which does."""
    from ..kernels.resources import fits  # (it imports the ahead-of-time compiler: not at import time)

    if wide_steps(config, problem.head_dim, 2):
        config = config.with_(BLOCK_N=64)
    if q_regs_error(config, problem.head_dim, problem.head_dim_pad,
                    varlen_d_rest(problem.head_dim, problem.head_dim_pad)):
        config = config.with_(q_regs=False)
    if config.persistent and not fits(config, problem, (9, 0)):
        config = config.with_(persistent=0, dynamic=False, section=0)
    return config


def _varlen_result(out, lse, return_softmax_lse: bool, return_attn_probs: bool):
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_softmax_lse else out


def _check_cu_seqlens(q, k, cu_q, cu_k, max_q, max_k, check_lengths: bool | None = None) -> int:
    """Shapes, dtypes and devices always; the values (0 first, non-decreasing, ending at the
    token counts, no sequence longer than its max_seqlen: past it rows would silently go
    unwritten) unless ``check_lengths`` is False or (None) a CUDA graph is being captured.
    Returns the batch size."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype != torch.int32 or cu.numel() < 1:
            raise InputError(f"{name} must be a 1-dim int32 tensor of batch + 1 offsets, got "
                             f"{(cu.dtype, tuple(cu.shape)) if isinstance(cu, torch.Tensor) else type(cu).__name__}")
        if cu.device != q.device:
            raise InputError(f"{name} is on {cu.device}, q on {q.device}")
        if not cu.is_contiguous():
            raise InputError(f"{name} must be contiguous (the kernel reads the offsets in a row)")
    if cu_q.numel() != cu_k.numel():
        raise InputError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{cu_q.numel()} and {cu_k.numel()}")
    for name, value in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise InputError(f"{name} must be a non-negative int, got {value!r}")
    capturing = q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if check_lengths and capturing:
        raise InputError("check_lengths=True reads the lengths back to the host, which a CUDA graph capture "
                         "cannot do; leave it None (checks off while capturing)")
    remembered = check_lengths is None  # an explicit check_lengths=True always reads back
    if check_lengths is None:
        check_lengths = not capturing
    if check_lengths:
        state = _LAST_CHECKED.state(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)  # before the read-back
    if check_lengths and not (remembered and _LAST_CHECKED.holds(cu_q, cu_k, state)):
        both = torch.cat((cu_q, cu_k)).tolist()  # one copy back, one wait
        for name, offsets, total, longest in (("cu_seqlens_q", both[:cu_q.numel()], q.shape[0], max_q),
                                              ("cu_seqlens_k", both[cu_q.numel():], k.shape[0], max_k)):
            lengths = [b - a for a, b in zip(offsets, offsets[1:])]
            if offsets[0] != 0 or any(n < 0 for n in lengths) or offsets[-1] != total:
                raise InputError(f"{name} must start at 0, never decrease and end at the {total} packed tokens, "
                                 f"got {offsets[:8]}{'...' if len(offsets) > 8 else ''}")
            if lengths and max(lengths) > longest:
                raise InputError(f"a sequence has {max(lengths)} tokens, more than max_seqlen "
                                 f"{longest} ({name})")
        _LAST_CHECKED.remember(cu_q, cu_k, state)
    return cu_q.numel() - 1


class _CheckedLengths:
    """The offsets tensors the last length check passed, held weakly with their version
    counters as they were before the read-back: a model's layers pass one step's cu_seqlens
    to every layer, so only the first waits for the copy back. Any change through torch's
    operations bumps the version (checked again); a new tensor, even at the same address,
    is a different object. Writes torch does not see (through ``.data``, a numpy array
    sharing the memory, a custom kernel) are not noticed: attention_varlen's docstring says
    to pass check_lengths=True there. Inference tensors (torch.inference_mode) keep no
    version counter: they are checked every call."""

    def __init__(self) -> None:
        self._refs: tuple = ()
        self._state: tuple | None = None
        self._lock = threading.Lock()

    @staticmethod
    def state(cu_q, cu_k, *rest) -> tuple | None:
        if cu_q.is_inference() or cu_k.is_inference():
            return None
        return (cu_q._version, cu_k._version) + rest

    def holds(self, cu_q, cu_k, state: tuple | None) -> bool:
        with self._lock:
            refs, remembered = self._refs, self._state
        return state is not None and bool(refs) and refs[0]() is cu_q and refs[1]() is cu_k and remembered == state

    def remember(self, cu_q, cu_k, state: tuple | None) -> None:
        if state is not None:
            with self._lock:
                self._refs, self._state = (weakref.ref(cu_q), weakref.ref(cu_k)), state


_LAST_CHECKED = _CheckedLengths()


def explain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool | None = None, *,
            causal_align: str = "top_left", is_causal: bool | None = None) -> dict[str, Any]:
    """What ``attention(q, k, v, causal)`` would run, and why (never launches or tunes);
    SDPA's ``is_causal`` is taken as ``attention`` takes it."""
    causal = sdpa_alias("causal", causal, "is_causal", is_causal)
    problem = problem_from_tensors(q, k, v, causal=False if causal is None else causal, causal_align=causal_align)
    choice = _dispatched(problem, q, k, v)
    info = _choice_info(problem, choice)
    if not problem.is_fp8:  # what loss.backward() would run
        bwd = problem.with_kind("bwd")
        found = DISPATCHER.choose(bwd, q.device.type, q.device.index or 0)
        config = _backward_config(bwd, q, k, v, q)  # dO: the output's layout, allocated like q
        info["backward"] = _choice_info(bwd, found if found.config == config else
                                        Choice(config, "default", None, math.inf, "built-in"))
    return info


def _choice_info(problem: Problem, choice: Choice) -> dict[str, Any]:
    return {
        "source": choice.source,
        "config": choice.candidate.to_dict(),  # FP8: with its recipe, as attention_fp8(config=) takes it
        "kernel": choice.candidate.name,
        "problem": problem.key,
        "matched_problem": choice.matched.key if choice.matched is not None else None,
        "distance": choice.distance if math.isfinite(choice.distance) else None,  # JSON has no Infinity
        "origin": choice.origin,
    }


# ------------------------------------------------------------------ torch.compile
@torch.library.custom_op("fa_autotune::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                  causal_align: str, config: str | None, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    parsed = KernelConfig.from_json(config) if config is not None else None
    if return_lse:
        return _run_once(q, k, v, causal, scale, parsed, causal_align, True)
    out = _run_once(q, k, v, causal, scale, parsed, causal_align, False)
    return out, out.new_empty((0,), dtype=torch.float32)


@_attention_op.register_fake
def _(q, k, v, causal, scale, causal_align, config, return_lse):
    out = torch.empty_like(q)
    lse = q.new_empty(q.shape[:3] if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _through_custom_op(q, k, v, causal, scale, config, causal_align, return_lse):
    text = None
    if config is not None:
        text = KernelConfig.from_mapping(config).canonical_json()
    out, lse = torch.ops.fa_autotune.attention(q, k, v, causal, scale, causal_align, text, return_lse)
    return (out, lse) if return_lse else out


@torch.library.custom_op("fa_autotune::attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                           dout: torch.Tensor, causal: bool, scale: float | None, causal_align: str,
                           dlse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return attention_backward(q, k, v, out, lse, dout, causal, scale, causal_align, dlse=dlse)


@_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, causal, scale, causal_align, dlse=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_backward(ctx, inputs, output) -> None:
    q, k, v, causal, scale, causal_align, _config, _return_lse = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.options = (causal, scale, causal_align)


def _op_backward(ctx, dout, dlse):
    """As _Attention.backward: the LSE's gradient folds into the row term. (torch.compile's
    autograd has no double backward of its own: it refuses create_graph=True itself.)"""
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.fa_autotune.attention_backward(q, k, v, out, lse, dout, *ctx.options, dlse)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("fa_autotune::attention", _op_backward, setup_context=_setup_backward)

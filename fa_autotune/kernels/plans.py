"""The plan of a config on a problem, bound to tensors: the one place that tells the forward,
KV-cache and backward families apart for the ahead-of-time compiler, the tuner's compile step,
the correctness gate and the timing (the public API builds its plans from the caller's
tensors, per entry point)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..fp8.quantize import FMT_OF_DTYPE, empty_fp8_inputs, tile_blocks, v_order_for
from ..spec.config import KernelConfig
from ..spec.problem import Problem
from ..spec.recipe import Fp8Recipe
from .bwd import BackwardPlan
from .decode import DecodePlan
from .fwd import prepare
from .launch import Launch, Plan, explained, resolve_scale


@dataclass(frozen=True)
class Operands:
    """The tensors one call of a problem's kernels reads and writes. Forward: q, k, v, out
    (B, H, N, D) and FP8 ``scales``. KV cache: q (B, Nq, Hq, D), k and v the cache, ``lengths``
    and ``block_table``, out like q. Backward: also ``dout`` and ``lse`` (the forward's) and
    ``grads`` (dq, dk, dv) to write."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    scales: tuple | None = None
    lengths: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    dout: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    grads: tuple | None = None
    k_new: torch.Tensor | None = None  # KV cache: one appended token (the append kernel)
    v_new: torch.Tensor | None = None


@dataclass(frozen=True)
class Bound:
    """A plan with the arguments of one call: calling it runs the call (``warmup``: compile
    only) and returns the compiled kernels, :meth:`launches` gives each launch's full
    argument list (what ahead-of-time compilation specialises on)."""

    config: KernelConfig
    plan: Plan
    args: tuple

    def __call__(self, warmup: bool = False) -> list:
        return self.plan(*self.args, warmup=warmup)

    def explained(self) -> list:
        """One call, with Triton's resource and compile failures as errors naming the variant."""
        return explained(self.config, lambda: self.plan(*self.args))()

    def launches(self) -> list[tuple[Launch, tuple]]:
        return [(launch, args + launch.fixed) for launch, args in self.plan.launches(*self.args)]


def bind(config: KernelConfig, problem: Problem, x: Operands) -> Bound:
    """``config``'s plan for ``problem`` on the layout of ``x``, with ``x`` as its call."""
    for kind, loop_order in (("decode", "decode"), ("bwd", "backward")):
        if (problem.kind == kind) != (config.loop_order == loop_order):
            raise ConfigError("loop_order", f"{config.name} runs {'on' if config.loop_order == loop_order else 'off'} "
                              f"problems of kind {kind!r}; this one is {problem.kind!r}")
    scale = resolve_scale(None, problem.head_dim)
    if problem.decode:
        plan = DecodePlan(config, x.q, x.k, x.v, x.k_new, x.v_new, x.out, None, x.block_table, scale, problem.causal)
        return Bound(config, plan, (x.q, x.k, x.v, x.k_new, x.v_new, x.lengths, x.block_table, 0, x.out, None))
    if problem.backward:
        plan = BackwardPlan(config, x.q, x.k, x.v, x.out, x.dout, *x.grads, scale, problem.causal_offset,
                            problem.causal)
        return Bound(config, plan, (x.q, x.k, x.v, x.out, x.dout, x.lse, *x.grads))
    plan = prepare(config, x.q, x.k, x.v, x.out, None, scale, problem.causal_offset, problem.causal, x.scales)
    return Bound(config, plan, (x.q, x.k, x.v, x.out, None, x.scales))


def example(config: KernelConfig, problem: Problem, device: torch.device | str, append: bool = False,
            recipe: Fp8Recipe | None = None) -> Operands:
    """Uninitialized operands in the layout a launch of ``problem`` reads (``device`` "meta"
    for ahead-of-time compiling): contiguous (B, H, N, D), FP8 inputs as
    :func:`~fa_autotune.quantize_fp8` lays them out for ``recipe`` (default:
    :class:`Fp8Recipe`'s; its scaling decides the descales' shapes) and this config's tiles; a
    KV-cache step with its cache contiguous or paged (a full block table) and per-sequence
    int32 lengths, ``append`` adding one new token; a backward pass with its gradients."""
    if problem.decode:
        return _decode_example(problem, device, append)
    q_shape = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    kv_shape = (problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim)
    if problem.is_fp8:
        block_q, block_k = tile_blocks(config.BLOCK_M, config.BLOCK_N)
        recipe = recipe or Fp8Recipe()
        x = empty_fp8_inputs(q_shape, kv_shape, device, FMT_OF_DTYPE[problem.dtype], recipe.scaling, block_q, block_k,
                             sink_tile=recipe.sink_tile, v_order=v_order_for(config.warp_specialize, problem.seqlen_k))
        return Operands(x.q, x.k, x.v, torch.empty(q_shape, device=device, dtype=torch.bfloat16), x.scales)
    dtype = getattr(torch, problem.dtype)
    q, out = (torch.empty(q_shape, device=device, dtype=dtype) for _ in range(2))
    k, v = (torch.empty(kv_shape, device=device, dtype=dtype) for _ in range(2))
    if not problem.backward:
        return Operands(q, k, v, out)
    lse = torch.empty(q_shape[:3], device=device, dtype=torch.float32)
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    return Operands(q, k, v, out, dout=torch.empty_like(q), lse=lse, grads=grads)


def _decode_example(problem: Problem, device: torch.device | str, append: bool) -> Operands:
    dtype = getattr(torch, problem.dtype)
    q = torch.empty((problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim), device=device, dtype=dtype)
    page = problem.page_size
    if page:
        pages = -(-problem.seqlen_k // page)
        shape = (problem.batch * pages, page, problem.heads_kv, problem.head_dim)
        table = torch.empty((problem.batch, pages), device=device, dtype=torch.int32)
    else:
        shape, table = (problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim), None
    k_cache, v_cache = (torch.empty(shape, device=device, dtype=dtype) for _ in range(2))
    new = (problem.batch, 1, problem.heads_kv, problem.head_dim)
    k_new, v_new = (torch.empty(new, device=device, dtype=dtype) if append else None for _ in range(2))
    lengths = torch.empty((problem.batch,), device=device, dtype=torch.int32)
    return Operands(q, k_cache, v_cache, torch.empty_like(q), lengths=lengths, block_table=table, k_new=k_new,
                    v_new=v_new)

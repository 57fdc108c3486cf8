"""Built-in configs: the last link of the dispatch chain, used when nothing is tuned.

Chosen to be correct everywhere and reasonable on Hopper: the D=64 and D=128 picks won
the sweep in benchmarks/results/2026-11-29-h200-kernel-smoke/results.md. The tuner exists to beat them.
"""
from __future__ import annotations

from .config import KernelConfig
from .problem import Problem
from .target import GpuInfo

# Below this many Q tiles x heads, one program per Q tile leaves most SMs idle and the
# K/V sequence is split across programs instead (Flash-Decoding).
_SPLIT_KV_MAX_QROWS = 64


# FlashAttention-3 in Gluon on Hopper, fp16/bf16 with 64 < D <= 128: two 64-row consumer
# warpgroups over 128-row K/V steps, a persistent grid with two Q buffers. On an H200 it ran
# 0.99-1.02x cuDNN on the non-causal D=128 llm-prefill problems and 1.12-1.16x the D=128 geomean
# of the Triton winners tuned before it (benchmarks/results/2026-12-01-h200-gluon-bench-llm-prefill/results.md).
GLUON_DEFAULT = KernelConfig(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=128, num_warps=4,
                             num_stages=2, persistent=1)
# Past D=128 (192 runs padded to 256): 64-key steps two deep, one Q buffer per consumer (a
# persistent grid's second one does not fit beside the ring), O staged in the Q buffer, lazy
# rescaling. On an H200 it ran 0.90-0.96x FlashAttention-4 and 1.03-1.07x cuDNN at D=256,
# 0.76-0.79x FA4 at D=192, against 0.43-0.63x FA4 for the Triton kernel before it
# (benchmarks/results/2026-12-04-h200-gluon-wide/gluon_sweep.md).
GLUON_WIDE = KernelConfig(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=64, num_warps=4,
                          num_stages=2, rescale_threshold=8)


# FP8 in Gluon (e4m3 Q, K and V^T tiles, V's keys in the wgmma order): 256-key steps taken in
# turn by two 64-row consumers (P in 8 bits fits beside the 64 x 256 score tile only without
# the overlap), a persistent grid, dynamic on causal ones. On an H100 at B 2, H 16, N 8192,
# D 128 it ran 918 TFLOPS without a mask and 802 causal: 1.06x the warp-specialized Triton
# 128 x 256 kernel without a mask (which cannot run causal) and 1.29x the Triton kernel the
# H200 file dispatched causal before its 2026-12-07 re-tune, on the same inputs; past D=128 128-key
# steps in turn with one exp2 in 8 on the FMA units ran 1082 at D=256, 2.2x the Triton
# default before it (benchmarks/results/2026-12-07-h100-fp8-gluon-wide-steps/).
GLUON_FP8 = GLUON_DEFAULT.with_(BLOCK_N=256, overlap=False, pingpong=True)
GLUON_FP8_WIDE = KernelConfig(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=128, num_warps=4,
                              num_stages=2, overlap=False, exp2_emu=8)


def gluon_candidates(problem: Problem, capability: tuple[int, int] | None) -> list[KernelConfig]:
    """Gluon structures a tune should measure first on Hopper (fp16/bf16), each the
    best of an H200 sweep somewhere: the default; on causal grids the same with dynamic tile
    scheduling (1.00-1.06x cuDNN at N >= 4096) and without the intra-warpgroup overlap in one
    K/V loop, dynamic and static (the best Gluon kernels at D=64); three consumers at D <= 64
    without a mask; at D <= 64 the best D=64 structure with part of its exp2 on the FMA units
    (benchmarks/results/2026-12-01-h200-gluon-dynamic/results.md, benchmarks/results/2026-12-01-h200-gluon-short-causal/results.md,
    benchmarks/results/2026-12-01-h200-gluon-sweep/consumers.md, benchmarks/results/2026-12-01-h200-gluon-exp2-emu/results.md); at D <= 64 causal, both with half diagonal steps
    (benchmarks/results/2026-12-02-h200-half-step/d64.md); at D <= 64 three consumers taking turns, and on causal
    grids two (benchmarks/results/2026-12-02-h200-pingpong-3c/d64.md); past D=64 the default with lazy rescaling
    (benchmarks/results/2026-12-02-h200-lazy-rescale/results.md); past D=128 the wide default, without lazy rescaling and
    with the consumers taking turns (2026-12-04-h200-gluon-wide). FP8 (forward; the H100
    sweep of 2026-12-07-h100-fp8-gluon-wide-steps): up to D=128 the 256-key default, the same
    without turns, with part of the exp2 on the FMA units, and 128-key steps in turn with
    it (the best of those); past D=128 the wide FP8 default, without that exp2 split and with
    64-key steps."""
    if capability is None or capability[0] != 9 or problem.decode or problem.backward:
        return []
    if problem.is_fp8:  # FP8 Q, K and V^T tiles, both products in FP8 (no half steps)
        if problem.head_dim_pad > 128:
            return [GLUON_FP8_WIDE, GLUON_FP8_WIDE.with_(exp2_emu=0), GLUON_FP8_WIDE.with_(BLOCK_N=64, exp2_emu=0)]
        dyn = dict(dynamic=problem.causal)
        return [GLUON_FP8.with_(**dyn), GLUON_FP8.with_(pingpong=False, **dyn),
                GLUON_FP8.with_(pingpong=False, exp2_emu=8, **dyn),
                GLUON_DEFAULT.with_(overlap=False, exp2_emu=8, **dyn)]
    if problem.dtype not in ("float16", "bfloat16"):
        return []
    if problem.head_dim_pad > 128:
        return [GLUON_WIDE, GLUON_WIDE.with_(rescale_threshold=0), GLUON_WIDE.with_(pingpong=True)]
    out = [GLUON_DEFAULT]
    if problem.causal:
        out += [GLUON_DEFAULT.with_(dynamic=True),
                GLUON_DEFAULT.with_(dynamic=True, overlap=False, one_loop=True),
                GLUON_DEFAULT.with_(overlap=False, one_loop=True)]
    else:
        out.append(GLUON_DEFAULT.with_(overlap=False))
        if problem.head_dim_pad <= 64:
            out.append(GLUON_DEFAULT.with_(consumers=3, consumer_regs=160))
    if problem.head_dim <= 64:
        # three consumers in turn, round robin: the best D=64 kernels at N >= 4096 without a
        # mask and at N=16384 causal (benchmarks/results/2026-12-02-h200-pingpong-3c/d64.md)
        out.append(GLUON_DEFAULT.with_(consumers=3, consumer_regs=160, overlap=False, pingpong=True))
    if problem.head_dim <= 64 and problem.causal:  # part of the exp2 on the FMA units (benchmarks/results/2026-12-01-h200-gluon-exp2-emu/results.md)
        emu = GLUON_DEFAULT.with_(dynamic=True, overlap=False, one_loop=True, exp2_emu=16)
        # half diagonal steps: the best D=64 causal kernels at N=1024-16384 (benchmarks/results/2026-12-02-h200-half-step/d64.md);
        # two consumers in turn: at or next to cuDNN at N=1024-4096 (benchmarks/results/2026-12-02-h200-pingpong-3c/d64.md)
        out += [GLUON_DEFAULT.with_(overlap=False, half_step=True), emu.with_(half_step=True), emu,
                GLUON_DEFAULT.with_(overlap=False, pingpong=True)]
    elif problem.head_dim <= 64:
        out.append(GLUON_DEFAULT.with_(overlap=False, exp2_emu=8))
    else:  # a warp skips the rescale while its rows keep their max: +1-2% at D=128 (benchmarks/results/2026-12-02-h200-lazy-rescale/results.md)
        out.append(GLUON_DEFAULT.with_(rescale_threshold=8))
    return out


def default_config(problem: Problem, capability: tuple[int, int] | None = None, sm_count: int = 132,
                   gluon: bool = True) -> KernelConfig:
    """A safe, decent config for ``problem`` on a GPU of ``capability`` (None: interpreter);
    ``gluon=False`` gives the Triton one where the Gluon kernel would be picked (for inputs
    the Gluon kernel cannot read)."""
    if problem.decode:
        return decode_default(problem, capability, sm_count)
    if problem.backward:
        return backward_default(problem, capability, gluon)
    d = problem.head_dim_pad
    hopper = capability is not None and capability >= (9, 0)
    access = "tensor_desc" if hopper else "pointer"
    if problem.is_fp8:  # FP8 runs Q-outer only; its tiles take half the shared memory of fp16
        if gluon and capability is not None and capability[0] == 9 and d > 64:  # as measured: D 128, 256
            return GLUON_FP8_WIDE if d > 128 else GLUON_FP8.with_(dynamic=problem.causal)
        return _fp8_default(problem, d, hopper)
    if problem.seqlen_q <= _SPLIT_KV_MAX_QROWS and problem.seqlen_k >= 1024:
        block_m = 16 if problem.seqlen_q <= 16 else 64
        programs = problem.batch * problem.heads_q * -(-problem.seqlen_q // block_m)
        splits = max(1, min(32, -(-2 * sm_count // max(programs, 1)), problem.seqlen_k // 256))
        return KernelConfig(
            loop_order="split_kv", BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=2,
            access=access, num_splits=splits,
        )
    if d <= 64:  # H200 sweep: plain pointers with 8 warps beat TMA at D=64
        return KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, access="pointer")
    if gluon and capability is not None and capability[0] == 9 and 64 < d \
            and problem.dtype in ("float16", "bfloat16"):
        return GLUON_DEFAULT if d <= 128 else GLUON_WIDE
    if d <= 128:
        return KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, access=access)
    return KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, access=access)


# Split counts the decode search space offers (search_spaces/decode.yaml): 33, 66 and 99
# fill 132 SMs exactly with 4 or 8 KV heads.
DECODE_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 33, 48, 66, 99, 128)


def decode_default(problem: Problem, capability: tuple[int, int] | None = None, sm_count: int = 132) -> KernelConfig:
    """KV-cache attention: one program per KV group's query rows, 64-key steps. A contiguous
    cache is split across about one program per SM, 4 stages deep; a paged one across four
    per SM, 2 stages deep (Triton spends pipeline stages on the page lookup, so paged loads
    hide their latency by occupancy instead). On an H200 these were within 1-3% of the best
    of a sweep on every row of benchmarks/results/2026-12-01-h200-decode-sweep/results.md."""
    return decode_candidates(problem, capability, sm_count)[0]


def decode_candidates(problem: Problem, capability: tuple[int, int] | None = None,
                      sm_count: int = 132) -> list[KernelConfig]:
    """The decode default first, then the neighbours a tune should measure first (the split
    counts around it, both pipeline depths, and for a contiguous cache 128-key steps 3 deep,
    the best or next-best tile on every row of issue 15's table in
    benchmarks/results/2026-12-02-h200-decode-splits/results.md, and 2 deep, the best through TMA at
    64 x 4096 in benchmarks/results/2026-12-03-h200-decode-wide2/grid-tma.md), and on Hopper each of those again
    with the contiguous cache read through TMA descriptors. Balanced splits (`persistent`) are
    neither here nor in the default search space: on the uniform lengths a tune measures they
    ran 5-12% behind the fixed splits (benchmarks/results/2026-12-02-h200-decode-balanced/results.md)."""
    rows = problem.seqlen_q * problem.gqa_group
    block_m = min(128, max(16, 1 << max(0, (rows - 1).bit_length())))
    programs = max(1, problem.batch * problem.heads_kv * -(-rows // block_m))
    keys_per_split = max(1, problem.seqlen_k // 512)

    def splits(per_sm: int) -> int:
        wanted = sm_count * per_sm / programs
        near = min(DECODE_SPLITS, key=lambda s: (abs(s - wanted), s)) if programs < sm_count else 1
        return max(1, min(near, max(s for s in DECODE_SPLITS if s <= keys_per_split)))

    if capability is None:  # the interpreter: no pipelining
        return [KernelConfig(loop_order="decode", BLOCK_M=block_m, BLOCK_N=64, num_stages=1, num_splits=splits(1))]
    first = (splits(4), 2) if problem.page_size else (splits(1), 4)
    out = []
    for split, stages in (first, (splits(1), 4), (splits(1), 2), (splits(2), 2), (splits(4), 2), (1, 2), (1, 4)):
        config = KernelConfig(loop_order="decode", BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=stages,
                              num_splits=split)
        if config not in out:
            out.append(config)
    wide = not problem.page_size and problem.head_dim_pad <= 128 and block_m <= 64  # 3 stages of 128 x 128 fit
    if wide:
        # 3 stages: one program per SM; 2 stages: two (106 KB each through TMA, as cuDNN's decode
        # kernel runs two 86 KB CTAs per SM; split to about two per SM where the batch is small),
        # so one's start hides behind the other's stream.
        for split, stages in dict.fromkeys(((splits(1), 3), (1, 3), (splits(2), 2))):
            config = KernelConfig(loop_order="decode", BLOCK_M=block_m, BLOCK_N=128, num_warps=4, num_stages=stages,
                                  num_splits=split)
            if split * 128 <= problem.seqlen_k and config not in out:
                out.append(config)
    if not problem.page_size and problem.head_dim % 8 == 0 and capability >= (9, 0):  # Hopper: TMA too (16-byte rows)
        out += [config.with_(access="tensor_desc") for config in out]
    return out


# FlashAttention-3's backward in Gluon on Hopper (fp16/bf16, D <= 128): a TMA producer and two
# consumer warpgroups of 64 key rows, dQ added up inside it by TMA bulk reduces. On an H200
# (benchmarks/results/2026-12-02-h200-bwd-sweep-dq-rows/results.md): 0.89-1.00x cuDNN at D=128 and
# 0.99-1.00x at D=64 (128 query rows a step) at N=4096, 0.92-0.97x at N=1024, against 0.75-0.81x
# for the Gluon pass beside the Triton dQ pass and 0.73-0.93x for the Triton kernels.
GLUON_BACKWARD = KernelConfig(loop_order="backward", language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=64,
                              num_warps=4, num_stages=3, dq_atomic=True)
GLUON_BACKWARD_TWO_PASS = KernelConfig(loop_order="backward", language="gluon", access="tensor_desc", BLOCK_M=64,
                                       BLOCK_N=64, num_warps=4, num_stages=2, dq_block_m=128, dq_block_n=64,
                                       dq_warps=8, dq_stages=3)
"""The Gluon dK/dV pass beside the Triton dQ pass: deterministic=True's Hopper backward."""
# Past D=128 (192 padded to 256, its zero columns not multiplied): FlashAttention-3's hdim-256
# split, both consumers on one 64-key block, S and dP split by key columns, dK and dV by
# head-dim halves, dQ in 64-column chunks; a Q ring of 2 and one dO tile fit in 208 KB
# (kernels/gluon_bwd_wide.py).
GLUON_WIDE_BACKWARD = GLUON_BACKWARD.with_(num_stages=2)


def backward_default(problem: Problem, capability: tuple[int, int] | None = None, gluon: bool = True) -> KernelConfig:
    """The backward kernels from H200 sweeps: on Hopper in fp16/bf16 for 16 < D <= 128 the
    Gluon pass with dQ added up inside it (GLUON_BACKWARD: 64 query rows a step and a ring of
    3 past D=64, 128 rows and 2 up to D=64; benchmarks/results/2026-12-02-h200-bwd-sweep-dq-rows/results.md;
    causal GQA split to a query head per program;
    not below D=32, where each consumer's dQ half would be 8 columns, a case never run on a
    GPU; ``gluon=False`` for inputs it cannot read); past D=128 the same with a ring of 2
    (GLUON_WIDE_BACKWARD: kernels.gluon_bwd_wide, 0.90-1.05x cuDNN on an H100 where the
    Triton kernels ran 0.37-0.43x; benchmarks/results/2026-12-05-h100-bwd-wide/README.md);
    otherwise the Triton kernels
    (benchmarks/results/2026-12-01-h200-bwd-sweep/results.md): dK/dV keeps 64 K/V rows
    against 64 streamed query rows at D=128 (2 stages; 128 against 32 with 3 stages at
    D<=64), 4 warps; dQ keeps 128 query rows against 64 streamed K/V rows with 8 warps and
    3 stages; 32 x 32 tiles past D=128; 16 x 16 in the interpreter."""
    if capability is None:
        return KernelConfig(loop_order="backward", BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    hopper_gluon = gluon and capability[0] == 9 and problem.dtype in ("float16", "bfloat16")
    if problem.head_dim_pad > 128 and not hopper_gluon:
        return KernelConfig(loop_order="backward", BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    if problem.head_dim_pad > 128:  # kernels.gluon_bwd_wide's kernel: both consumers on one key block
        chosen = GLUON_WIDE_BACKWARD
        if problem.causal and problem.gqa_group > 1:
            chosen = chosen.with_(group_split=min(8, 1 << (problem.gqa_group - 1).bit_length()))
        return chosen
    if hopper_gluon and problem.head_dim_pad >= 32:
        chosen = GLUON_BACKWARD if problem.head_dim_pad > 64 else GLUON_BACKWARD.with_(BLOCK_M=128, num_stages=2)
        # Without a mask every tile is as long as the next: one program per SM taking tiles
        # from a counter, its producer loading the next tile's first Q/dO tiles while the
        # consumers finish this one (1-5% at llm-prefill's non-causal shapes). Causal grids keep a program per tile,
        # which the hardware hands out longest first (benchmarks/results/2026-12-02-h200-bwd-persistent/results.md).
        if not problem.causal:
            return chosen.with_(persistent=1, dynamic=True)
        # Causal GQA: one query head of a KV group per program, dK/dV added up by fp32 atomics
        # (FlashAttention-3's GQA backward): 1.06x (32:8, N=8192) to 1.62x (28:4, N=3000) the
        # whole group in one program on an H100; without a mask (32:8, N=4096) 0.96-0.97x, so
        # not there (benchmarks/results/2026-12-05-h100-bwd-group-split/bwd_sweep.md).
        if problem.gqa_group > 1:
            chosen = chosen.with_(group_split=min(8, 1 << (problem.gqa_group - 1).bit_length()))
        return chosen
    dq = dict(dq_block_m=128, dq_block_n=64, dq_warps=8, dq_stages=3)
    if problem.head_dim_pad <= 64:
        return KernelConfig(loop_order="backward", BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3, **dq)
    return KernelConfig(loop_order="backward", BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, **dq)


def _fp8_default(problem: Problem, d: int, hopper: bool) -> KernelConfig:
    """The Triton FP8 default (Hopper's Gluon default, GLUON_FP8, aside). H200 sweeps at
    D=128 (benchmarks/results/2026-11-30-h200-fp8-*/): 128x256 tiles
    warp-specialized over TMA on a persistent grid where Triton 3.6 allows it (no causal
    mask, whole K/V tiles); elsewhere 64x128 with 4 warps over plain pointers on Hopper,
    128x128 with 8 warps and 2 stages (less shared memory) before it."""
    if d > 128:
        return KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, access="tensor_desc" if hopper else "pointer")
    if hopper and not problem.causal and problem.seqlen_k % 256 == 0:
        return KernelConfig(BLOCK_M=128, BLOCK_N=256, num_warps=4, num_stages=2, access="tensor_desc",
                            warp_specialize=True, persistent=1)
    if hopper:
        return KernelConfig(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3, access="pointer")
    return KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, access="pointer")


def default_for(problem: Problem, gpu: GpuInfo, gluon: bool = True) -> KernelConfig:
    """The built-in config for ``problem`` on ``gpu`` (the interpreter included)."""
    return default_config(problem, gpu.capability_tuple, max(gpu.sm_count, 1), gluon)


def defaults_for(problem: Problem, gpu: GpuInfo) -> list[KernelConfig]:
    """The built-in configs to try in turn: the default, then its Triton stand-in if it is a
    Gluon kernel (which runs on Hopper with TMA-readable inputs only); for KV-cache problems
    the decode default and its neighbours (a tune's warm start)."""
    if problem.decode:
        return decode_candidates(problem, gpu.capability_tuple, max(gpu.sm_count, 1))
    first, second = default_for(problem, gpu), default_for(problem, gpu, gluon=False)
    return [first] if first == second else [first, second]

"""attention_varlen: flash-attn's packed variable-length layout, in Triton's interpreter,
against float32 attention on each sequence alone."""
from __future__ import annotations

import pytest
import torch

import fa_autotune
from fa_autotune import ConfigError, InputError, KernelConfig
from helpers import assert_close_to_reference


def packed(lens_q, lens_k, heads_q=4, heads_kv=2, head_dim=32, dtype=torch.float16, device="cpu"):
    q = torch.randn(sum(lens_q), heads_q, head_dim, dtype=dtype, device=device)
    k = torch.randn(sum(lens_k), heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.randn(sum(lens_k), heads_kv, head_dim, dtype=dtype, device=device)

    def offsets(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    return q, k, v, offsets(lens_q), offsets(lens_k)


def check_each_sequence(out, lse, q, k, v, cu_q, cu_k, causal, scale=None):
    for b in range(cu_q.numel() - 1):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if rows.stop == rows.start:
            continue
        as_dense = [t[s].transpose(0, 1).unsqueeze(0) for t, s in ((q, rows), (k, keys), (v, keys))]
        assert_close_to_reference(out[rows].transpose(0, 1).unsqueeze(0), *as_dense, causal=causal, scale=scale,
                                  causal_align="bottom_right",
                                  lse=None if lse is None else lse[:, rows].unsqueeze(0))


CONFIGS = {
    "dispatched": None,
    "block_ptr": {"BLOCK_M": 16, "BLOCK_N": 16, "access": "block_ptr", "num_stages": 1},
    "two-q-tiles": {"BLOCK_M": 16, "BLOCK_N": 32, "q_tiles": 2},
    "masked": {"BLOCK_M": 32, "BLOCK_N": 16, "causal_mode": "masked"},
    "tma-borrowed": {"BLOCK_M": 16, "BLOCK_N": 16, "access": "tensor_desc"},  # runs over pointers
    "kv-outer-borrowed": {"loop_order": "kv_outer", "BLOCK_M": 16, "BLOCK_N": 16, "q_tiles": 2},
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_mixed_lengths_match_each_sequence(config, causal):
    """Sequences longer and shorter than their keys, an empty one, odd lengths, GQA."""
    q, k, v, cu_q, cu_k = packed([5, 0, 33, 17, 1], [9, 4, 33, 40, 1])
    out, lse = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 33, 40, causal=causal, return_softmax_lse=True,
                                            config=CONFIGS[config])
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    check_each_sequence(out, lse, q, k, v, cu_q, cu_k, causal)


@pytest.mark.parametrize("dtype, head_dim", [(torch.float32, 80), (torch.float16, 16)])
def test_dtypes_head_dims_scale_and_mqa(dtype, head_dim):
    q, k, v, cu_q, cu_k = packed([20, 7], [20, 30], heads_q=4, heads_kv=1, head_dim=head_dim, dtype=dtype)
    out = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 20, 30, softmax_scale=0.2, causal=True)
    check_each_sequence(out, None, q, k, v, cu_q, cu_k, True, scale=0.2)


def test_sequences_without_keys_give_zeros():
    q, k, v, cu_q, cu_k = packed([3, 4], [0, 5])
    out, lse = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 4, 5, return_softmax_lse=True)
    assert torch.equal(out[:3], torch.zeros_like(out[:3])) and torch.isinf(lse[:, :3]).all()
    check_each_sequence(out, lse, q, k, v, cu_q, cu_k, False)
    q, k, v, cu_q, cu_k = packed([3], [0])  # no keys at all
    assert torch.equal(fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 3, 0), torch.zeros_like(q))


def test_packed_equals_dense_when_lengths_are_equal():
    """Equal lengths: the same numbers as attention() on the (B, H, N, D) view."""
    q, k, v, cu_q, cu_k = packed([24, 24, 24], [24, 24, 24])
    config = {"BLOCK_M": 16, "BLOCK_N": 16}
    out = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 24, 24, causal=True, config=config)
    dense = [t.view(3, 24, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v)]
    expected = fa_autotune.attention(*dense, causal=True, config=config).transpose(1, 2).reshape(q.shape)
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("mutate, message", [
    (lambda a: dict(a, q=a["q"][None]), "3-dim tensor"),
    (lambda a: dict(a, cu_seqlens_q=a["cu_seqlens_q"].long()), "int32"),
    (lambda a: dict(a, cu_seqlens_k=a["cu_seqlens_k"][:-1]), "same length"),
    (lambda a: dict(a, cu_seqlens_q=torch.tensor([0, 9, 5, 12], dtype=torch.int32)), "never decrease"),
    (lambda a: dict(a, cu_seqlens_q=torch.tensor([0, 5, 9, 11], dtype=torch.int32)), "end at the 12"),
    (lambda a: dict(a, max_seqlen_q=4), "more than max_seqlen 4"),
    (lambda a: dict(a, max_seqlen_k=-1), "max_seqlen_k must be"),
    (lambda a: dict(a, k=a["k"][:, :, :16], v=a["v"][:, :, :16]), "head_dim differs"),
    (lambda a: dict(a, q=a["q"].to(torch.bfloat16), k=a["k"].to(torch.bfloat16), v=a["v"].to(torch.bfloat16)),
     "bfloat16 tensors on the CPU"),
    (lambda a: dict(a, q=a["q"].clone().requires_grad_()), "has no backward"),
    (lambda a: dict(a, cu_seqlens_q=torch.stack([a["cu_seqlens_q"], a["cu_seqlens_q"]], 1).reshape(-1)[::2]),
     "must be contiguous"),
    (lambda a: dict(a, dropout_p=0.1), "dropout_p: not supported"),
    (lambda a: dict(a, window_size=(128, 0)), "window_size: not supported"),
    (lambda a: dict(a, softcap=30.0), "softcap: not supported"),
    (lambda a: dict(a, softmax_scale=[0.1]), "scale must be a finite number"),  # unhashable: never a plan key
])
def test_bad_input_is_refused_before_any_kernel(mutate, message):
    q, k, v, cu_q, cu_k = packed([5, 4, 3], [6, 6, 6])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=6)
    with pytest.raises(InputError, match=message):
        fa_autotune.attention_varlen(**mutate(args))


def test_plans_are_kept_and_lengths_can_go_unchecked(monkeypatch):
    """The second call of a layout reuses its config and plan (no dispatch, no JIT path) with
    new lengths of the same batch and longest sequence; a different longest sequence gets its
    own plan. check_lengths=False skips the host read-back (a serving engine's lengths are
    trusted; a wrong one is then the caller's)."""
    from fa_autotune.kernels import varlen
    from fa_autotune.runtime import api

    built = []

    class Counting(varlen.VarlenPlan):
        def __init__(self, *args, **kwargs):
            built.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(api, "_PLANS", {})
    monkeypatch.setattr(varlen, "VarlenPlan", Counting)
    q, k, v, cu_q, cu_k = packed([5, 12, 3], [9, 12, 7])
    first = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 12, 12, causal=True)
    check_each_sequence(first, None, q, k, v, cu_q, cu_k, True)
    _, _, _, cu_q2, cu_k2 = packed([12, 4, 4], [12, 2, 14])  # same totals and longest: the kept plan
    second = fa_autotune.attention_varlen(q, k, v, cu_q2, cu_k2, 12, 14, causal=True)
    assert len(built) == 2  # max_seqlen_k differs: a new plan
    again = fa_autotune.attention_varlen(q, k, v, cu_q2, cu_k2, 12, 14, causal=True, check_lengths=False)
    assert len(built) == 2 and torch.equal(second, again)
    check_each_sequence(second, None, q, k, v, cu_q2, cu_k2, True)
    with pytest.raises(InputError, match="more than max_seqlen 4"):  # checked by default
        fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 4, 12, causal=True)
    # unchecked: no read-back, so a too-small max_seqlen_q is not seen (rows past it stay unwritten)
    fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 4, 12, causal=True, check_lengths=False)


def test_lengths_checked_once_per_offsets_tensor(monkeypatch):
    """The same offsets tensors, unchanged (a model's next layer), are not read back again;
    changed in place, or a new tensor with the same values, they are checked again, and a
    bad value is still refused."""
    from fa_autotune.runtime import api

    q, k, v, cu_q, cu_k = packed([5, 12, 3], [9, 12, 7])
    reads = []

    class Counting(api._CheckedLengths):
        def holds(self, *args):
            held = super().holds(*args)
            reads.extend([] if held else [1])
            return held

    monkeypatch.setattr(api, "_LAST_CHECKED", Counting())
    for _ in range(3):
        fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 12, 12)
    assert len(reads) == 1
    fa_autotune.attention_varlen(q, k, v, cu_q.clone(), cu_k, 12, 12)  # another tensor: read again
    assert len(reads) == 2
    cu_q[1] = 13  # in place (its version moves): read again, and refused
    with pytest.raises(InputError, match="more than max_seqlen 12"):
        fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 12, 12)
    assert len(reads) == 3
    with pytest.raises(InputError, match="more than max_seqlen 12"):  # a refused tensor is not remembered
        fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 12, 12)
    with torch.inference_mode():  # inference tensors keep no version counter: checked every call
        inference_q, inference_k = cu_q.clone(), cu_k.clone()
        inference_q[1] = 5
        for _ in range(2):
            fa_autotune.attention_varlen(q, k, v, inference_q, inference_k, 12, 12)
        inference_q[1] = 13
        with pytest.raises(InputError, match="more than max_seqlen 12"):
            fa_autotune.attention_varlen(q, k, v, inference_q, inference_k, 12, 12)
    assert len(reads) == 7  # 4 before the block, then one read-back per inference-mode call


def test_explicit_check_reads_back_what_torch_did_not_see():
    """Offsets changed behind torch's back (a numpy array sharing the memory) keep their
    version: the default check, which remembered them, cannot tell; check_lengths=True
    always reads them back and refuses the bad length."""
    import numpy as np

    q, k, v, _, cu_k = packed([5, 12, 3], [9, 12, 7])
    memory = np.array([0, 5, 17, 20], dtype=np.int32)
    cu_q = torch.from_numpy(memory)
    fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 12, 12)
    memory[1] = 2  # sequence 1 now 15 long, past max_seqlen_q
    with pytest.raises(InputError, match="more than max_seqlen 12"):
        fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 12, 12, check_lengths=True)


def test_bad_config_names_the_parameter():
    q, k, v, cu_q, cu_k = packed([5], [6])
    with pytest.raises(ConfigError) as info:
        fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 5, 6, config={"BLOCK_M": 48})
    assert info.value.parameter == "BLOCK_M"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [128, 192])
def test_gpu_mixed_lengths(dtype, causal, head_dim):
    """Realistic sizes on the GPU, through the dispatcher (on Hopper a Gluon config, whose
    own varlen kernel runs where it fits: varlen_fit; elsewhere a Q-outer Triton one)."""
    lens_q, lens_k = [1, 777, 2048, 0, 1500, 64], [300, 777, 2048, 10, 3000, 64]
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, heads_q=16, heads_kv=4, head_dim=head_dim, dtype=dtype,
                                 device="cuda")
    out, lse = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                            return_softmax_lse=True)
    check_each_sequence(out, lse, q, k, v, cu_q, cu_k, causal)


GLUON = {"language": "gluon", "access": "tensor_desc", "num_warps": 4, "BLOCK_M": 64}
HOPPER = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="needs a Hopper GPU (Gluon kernels)")


def check_named_config(config, lens_q, lens_k, causal, heads_q=16, heads_kv=4, head_dim=128, dtype=torch.bfloat16):
    """attention_varlen with `config` named on random packed sequences of these lengths (on
    the GPU), every sequence's output and LSE against float32 attention."""
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype,
                                 device="cuda")
    out, lse = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                            return_softmax_lse=True, config=config)
    check_each_sequence(out, lse, q, k, v, cu_q, cu_k, causal)


def test_varlen_fit_keeps_dispatched_gluon_configs_in_shared_memory():
    """Past D=128 the Gluon varlen kernel's padded tiles leave no room for a persistent grid's
    second Q buffer (256 KB at D=192 with 64-key steps), nor for the dense kernel's 128-key
    steps over unpadded chunks: the dispatched config runs there as 64-key steps, a program
    per tile; at D=128 it is kept as varlen_grid made it."""
    from fa_autotune.kernels.checks import Layout, why_not
    from fa_autotune.kernels.resources import fits
    from fa_autotune.runtime.api import varlen_fit, varlen_grid
    from fa_autotune.spec.problem import Problem

    d192 = Problem(4, 16, 4, 2048, 2048, 192, "bfloat16", True)
    wide = KernelConfig.from_mapping(dict(GLUON, BLOCK_N=128, num_stages=2, overlap=False, pingpong=True))
    padded = KernelConfig.from_mapping(dict(GLUON, BLOCK_N=64, num_stages=2, rescale_threshold=8))
    for dispatched in (wide, padded):
        grid = varlen_grid(dispatched, False, False, 2)  # few sequences: persistent, tiles from a counter
        assert grid.persistent == 1 and not fits(grid.with_(BLOCK_N=64), d192, (9, 0))
        chosen = varlen_fit(grid, d192)
        assert chosen == dispatched.with_(BLOCK_N=64) and fits(chosen, d192, (9, 0))
    # Q in registers (q_regs) past D=128: the padded varlen kernel stages Q as one 256-column
    # part, which would spill, so it reads Q from shared memory there; the dense kernel's
    # launch rules refuse the same at D=256, where the dense kernel stages one part too
    chosen = varlen_fit(varlen_grid(padded.with_(q_regs=True), False, False, 2), d192)
    assert chosen == padded and not chosen.q_regs
    d256 = Problem(4, 16, 4, 2048, 2048, 256, "bfloat16", True)
    hopper = Layout("cuda", (9, 0), (None, None, None), (0, 0, 0))
    refused = why_not(padded.with_(q_regs=True), d256, hopper)
    assert isinstance(refused, ConfigError) and refused.parameter == "q_regs"
    assert why_not(padded.with_(q_regs=True), d192, hopper) is None
    d128 = Problem(4, 16, 4, 2048, 2048, 128, "bfloat16", True)
    grid = varlen_grid(KernelConfig.from_mapping(dict(GLUON, BLOCK_N=128, num_stages=2)), True, False, 2)
    assert varlen_fit(grid, d128) == grid
    assert varlen_fit(grid.with_(q_regs=True), d128) == grid.with_(q_regs=True)


def test_varlen_grid_is_static_but_for_few_sequences():
    """attention_varlen's grid for a dispatched Gluon config: the static persistent grid from
    VARLEN_DYNAMIC_BELOW sequences on, tiles from a counter below (few sequences' tiles differ
    most in work), and a causal batch of equal lengths (the dense problem the config was
    tuned for) keeps the config's own persistent grid; never a program per tile."""
    from fa_autotune.runtime.api import VARLEN_DYNAMIC_BELOW, varlen_grid

    static = KernelConfig.from_mapping(dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, section=4))
    tiles = KernelConfig.from_mapping(dict(GLUON, BLOCK_N=128, num_stages=2))  # a program per tile
    many, few = VARLEN_DYNAMIC_BELOW, VARLEN_DYNAMIC_BELOW - 1
    for causal, equal in ((False, False), (False, True), (True, False)):
        chosen = varlen_grid(static.with_(dynamic=True), causal, equal, many)
        assert not chosen.dynamic and chosen.persistent == 1 and chosen.section == 4
        assert varlen_grid(tiles, causal, equal, many) == tiles.with_(persistent=1)
        chosen = varlen_grid(static, causal, equal, few)
        assert chosen.dynamic and chosen.persistent == 1 and chosen.section == 4
    for batch in (few, many):
        assert varlen_grid(static, True, True, batch) == static
        assert varlen_grid(tiles, True, True, batch) == tiles.with_(persistent=1)
        assert varlen_grid(static.with_(dynamic=True), True, True, batch).dynamic


def test_a_named_gluon_config_says_where_it_runs():
    """The interpreter (or a GPU other than Hopper) cannot run the Gluon varlen kernel: the
    shared config check refuses it by name before anything launches."""
    q, k, v, cu_q, cu_k = packed([4, 6], [4, 6])
    with pytest.raises(ConfigError, match="language='gluon' runs on Hopper GPUs only"):
        fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, 6, 6, config=dict(GLUON, BLOCK_N=64))
GLUON_VARLEN = {
    "persistent-overlap": dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1),
    "plain": dict(GLUON, BLOCK_N=64, num_stages=3, overlap=False),
    "masked-one-loop": dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, causal_mode="masked"),
    "dynamic": dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True),
    "3c-n64-dynamic": dict(GLUON, BLOCK_N=64, num_stages=2, consumers=3, consumer_regs=160, persistent=1,
                           dynamic=True),
    # the consumers taking turns (named barriers), shared last tiles included
    "pingpong-dynamic": dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=True, pingpong=True),
    "plain-pingpong": dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, overlap=False, pingpong=True),
    "3c-n64-pingpong-dynamic": dict(GLUON, BLOCK_N=64, num_stages=2, consumers=3, consumer_regs=160, persistent=1,
                                    dynamic=True, pingpong=True),
}


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("head_dim", [128, 64, 80])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("config", list(GLUON_VARLEN))
def test_gpu_gluon_varlen_kernel(config, causal, dtype, head_dim):
    """A Gluon config's own varlen kernel (named explicitly): tiles past each sequence's end
    skipped, keys past it masked, rows past it never stored (the next sequence's output
    must survive), an empty sequence, queries longer than keys, GQA."""
    check_named_config(GLUON_VARLEN[config], [1, 777, 2048, 0, 1500, 64, 129], [300, 777, 2048, 10, 3000, 64, 100],
                       causal, head_dim=head_dim, dtype=dtype)


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("heads_q, heads_kv", [(8, 8), (8, 4), (8, 1), (6, 2)], ids=["mha", "gqa2", "mqa", "gqa3"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gpu_gluon_varlen_shared_last_tiles(dynamic, causal, heads_q, heads_kv):
    """A sequence's last tile whose rows fit one warpgroup (1, 64, 9 and 3 rows past a
    128-row edge) is shared by two query heads of a KV group where the group is even (gqa2,
    mqa), not where it is 1 or odd (mha; gqa3, 3 per group); 92 rows past the edge are one
    head's; queries shorter than keys, causal bottom-right."""
    config = dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=dynamic)
    check_named_config(config, [1, 64, 137, 259, 220, 3], [40, 64, 300, 259, 220, 3], causal, heads_q=heads_q,
                       heads_kv=heads_kv)


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("batch", [1, 33, 1500])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gpu_gluon_varlen_finds_the_sequence_of_every_tile(dynamic, batch):
    """The kernel's 32-way search over the tile table: one sequence (no search; Triton
    passes the count as a constant 1), more than one round's worth (33: two rounds, the
    second over one entry; 1500: three), runs of empty ones among them (ties go to the
    sequence after), lengths 0-300."""
    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(0, 301, (batch,), generator=gen)
    lens[torch.randint(0, batch, (batch // 4,), generator=gen)] = 0
    lens = lens.tolist() if batch > 1 else [300]
    config = dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, dynamic=dynamic)
    check_named_config(config, lens, lens, True, heads_q=4, heads_kv=2, head_dim=64)


@pytest.mark.gpu
@HOPPER
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("one_loop, dynamic, pingpong", [(False, False, False), (False, True, False),
                                                         (True, True, False), (True, True, True)],
                         ids=["two-loops", "two-loops-dynamic", "one-loop-dynamic", "one-loop-dynamic-pingpong"])
def test_gpu_gluon_varlen_half_steps(one_loop, dynamic, pingpong, dtype):
    """Half diagonal steps (D <= 64 causal) in the varlen kernel: each sequence's own diagonal,
    on the grids attention_varlen dispatches a shipped half-step config to (dynamic) and not,
    also with the consumers taking turns."""
    config = dict(GLUON, BLOCK_N=128, num_stages=2, persistent=1, overlap=False, half_step=True,
                  one_loop=one_loop, dynamic=dynamic, pingpong=pingpong)
    check_named_config(config, [1, 777, 2048, 0, 1500, 64, 129], [300, 777, 2048, 10, 3000, 64, 100], True,
                       head_dim=64, dtype=dtype)


@pytest.mark.gpu
@HOPPER
def test_gpu_output_layout_tma_cannot_store_falls_back():
    """q, k, v sliced from padded buffers (D=100 in rows of 104: TMA reads them): the output,
    allocated dense, has 200-byte rows, which TMA cannot store: the dispatched Gluon config
    gives way to the Triton varlen kernel, and a named one is refused by name."""
    lens = [300, 129, 64]
    *padded, cu, _ = packed(lens, lens, heads_q=8, heads_kv=2, head_dim=104, dtype=torch.bfloat16, device="cuda")
    q, k, v = (t[..., :100] for t in padded)
    out = fa_autotune.attention_varlen(q, k, v, cu, cu, 300, 300, causal=True)
    check_each_sequence(out, None, q, k, v, cu, cu, True)
    with pytest.raises(ConfigError, match="output's head stride"):
        fa_autotune.attention_varlen(q, k, v, cu, cu, 300, 300, causal=True, config=dict(GLUON, BLOCK_N=128,
                                                                                           num_stages=2))


def test_flash_attn_call_forms_port_unchanged():
    """flash_attn_varlen_func's positional order (dropout_p before softmax_scale), numpy ints
    for the lengths, return_attn_probs giving the LSE, an fp8_pv knob borrowed from a dense
    config (its LSE must land in the packed layout)."""
    import numpy as np

    q, k, v, cu_q, cu_k = packed([10, 20, 5], [10, 20, 5], heads_q=2, heads_kv=2)
    out, lse, probs = fa_autotune.attention_varlen(q, k, v, cu_q, cu_k, np.int64(20), np.int32(20), 0.0, None, True,
                                                   return_attn_probs=True,
                                                   config={"BLOCK_M": 16, "BLOCK_N": 16, "fp8_pv": "inplace"})
    assert probs is None
    check_each_sequence(out, lse, q, k, v, cu_q, cu_k, True)


def test_heads_past_32_bit_offsets_are_refused():
    """A sequence whose rows span more than 2**31 elements cannot be addressed by the pointer
    kernels: a clear error, not a wrapped-around read."""
    q, k, v, cu_q, cu_k = packed([4], [4], heads_q=2, heads_kv=2)
    wide = torch.empty(0, dtype=q.dtype).set_(q.untyped_storage(), 0, (4, 2, 32), (2**30, 32, 1))  # never read
    with pytest.raises(ConfigError, match="32-bit offsets"):
        fa_autotune.attention_varlen(wide, k, v, cu_q, cu_k, 4, 4)

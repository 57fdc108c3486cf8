"""attention_with_kvcache: flash-attn's KV-cache call, contiguous and paged, with appends, in
Triton's interpreter (and on a GPU when there is one), against float32 attention on each
sequence's keys alone."""
from __future__ import annotations

import pytest
import torch

import fa_autotune
from fa_autotune import ConfigError, InputError
from helpers import assert_close_to_reference

DECODE = {"loop_order": "decode", "BLOCK_M": 16, "BLOCK_N": 16, "num_stages": 1}


def make_cache(batch, capacity, heads_kv, head_dim, page=0, dtype=torch.float16, device="cpu"):
    """A cache holding `capacity` rows per sequence: contiguous, or pages in shuffled order
    (plus two spare pages) with their block table."""
    if not page:
        k = torch.randn(batch, capacity, heads_kv, head_dim, dtype=dtype, device=device)
        return k, torch.randn_like(k), None
    per = capacity // page
    pages = batch * per + 2
    k = torch.randn(pages, page, heads_kv, head_dim, dtype=dtype, device=device)
    table = torch.randperm(pages, device=device)[: batch * per].reshape(batch, per).to(torch.int32)
    return k, torch.randn_like(k), table


def sequence_kv(cache, table, b, length):
    """Sequence b's first `length` cached rows as (length, heads_kv, D)."""
    if table is None:
        return cache[b, :length]
    page = cache.shape[1]
    return cache[table[b, : -(-length // page)].long()].flatten(0, 1)[:length]


def check(out, lse, q, k_cache, v_cache, table, lengths, causal, scale=None):
    for b, length in enumerate(lengths):
        keys = [sequence_kv(c, table, b, length).transpose(0, 1).unsqueeze(0) for c in (k_cache, v_cache)]
        assert_close_to_reference(out[b:b + 1].transpose(1, 2), q[b:b + 1].transpose(1, 2), *keys, causal=causal,
                                  scale=scale, causal_align="bottom_right",
                                  lse=None if lse is None else lse[b:b + 1])


def appended(cache, table, new, lengths):
    """What the cache must hold after appending `new` (batch, n_new, heads_kv, D)."""
    cache = cache.clone()
    for b, start in enumerate(lengths):
        for i in range(new.shape[1]):
            pos = start + i
            if table is None:
                cache[b, pos] = new[b, i]
            else:
                cache[table[b, pos // cache.shape[1]], pos % cache.shape[1]] = new[b, i]
    return cache


CASES = {  # (page size, config changes)
    "contiguous": (0, {}),
    "contiguous-split3": (0, {"num_splits": 3}),
    "paged16-block32": (16, {"BLOCK_N": 32, "num_splits": 2}),  # a K/V step spans two pages
    "paged32-block16": (32, {"causal_mode": "masked"}),  # two steps per page
    "paged16-split4-rows32": (16, {"BLOCK_M": 32, "num_splits": 4}),
    # balanced splits: row tiles cut where the runs of 2 (4) programs per "SM" end
    "contiguous-balanced": (0, {"persistent": 1}),
    "paged16-balanced-rows32": (16, {"BLOCK_M": 32, "persistent": 2}),
    # TMA descriptors over a contiguous cache; a paged one falls back to pointers
    "contiguous-tma": (0, {"access": "tensor_desc"}),
    "contiguous-tma-split3": (0, {"access": "tensor_desc", "num_splits": 3}),
    "contiguous-tma-balanced": (0, {"access": "tensor_desc", "persistent": 2}),
    "paged16-tma": (16, {"access": "tensor_desc", "num_splits": 2}),
}


@pytest.mark.parametrize("n_q", [1, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(CASES))
def test_append_and_attend(case, causal, n_q, device):
    """GQA 4:1, per-sequence lengths (an empty cache among them), two new tokens appended in
    place before attending; the LSE too."""
    page, changes = CASES[case]
    batch, heads_q, heads_kv, head_dim, capacity = 3, 8, 2, 32, 64
    k_cache, v_cache, table = make_cache(batch, capacity, heads_kv, head_dim, page, device=device)
    q = torch.randn(batch, n_q, heads_q, head_dim, dtype=torch.float16, device=device)
    k_new = torch.randn(batch, 2, heads_kv, head_dim, dtype=torch.float16, device=device)
    v_new = torch.randn_like(k_new)
    lengths = [37, 0, 62]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    want_k, want_v = appended(k_cache, table, k_new, lengths), appended(v_cache, table, v_new, lengths)
    out, lse = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                                  block_table=table, causal=causal, return_softmax_lse=True,
                                                  config={**DECODE, **changes})
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    assert out.shape == q.shape and lse.shape == (batch, heads_q, n_q)
    check(out, lse, q, k_cache, v_cache, table, [n + 2 for n in lengths], causal)


@pytest.mark.parametrize("access", ["pointer", "tensor_desc"])
@pytest.mark.parametrize("dtype, head_dim", [(torch.float16, 32), (torch.float32, 80)])
def test_cache_rows_past_the_lengths_may_hold_nan(access, dtype, head_dim, device):
    """What a cache holds past a sequence's length is never attended: NaN there (a freed
    page's leftovers) changes nothing, whether the kernel reads through pointers or TMA
    boxes (which read whole tiles; head dim 80 pads the box to 128 columns)."""
    from fa_autotune.kernels.decode import DecodePlan

    k_cache, v_cache, _ = make_cache(3, 64, 2, head_dim, dtype=dtype, device=device)
    lengths = [5, 64, 23]
    for b, n in enumerate(lengths):
        k_cache[b, n:] = float("nan")
        v_cache[b, n:] = float("nan")
    q = torch.randn(3, 2, 4, head_dim, dtype=dtype, device=device)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    config = fa_autotune.KernelConfig(**{**DECODE, "access": access, "num_splits": 2})
    out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, config=config)
    assert torch.isfinite(out).all()
    check(out, None, q, k_cache, v_cache, None, lengths, True)
    plan = DecodePlan(config, q, k_cache, v_cache, None, None, out, None, None, 1.0, True)
    assert plan.config.access == access and (plan.box is not None) == (access == "tensor_desc")


def test_tma_falls_back_to_pointers_where_tma_cannot_read(device):
    """A TMA decode config over a layout no descriptor can address (rows 20 fp16 = 40 bytes
    apart), a paged cache or one KV head expanded to two (stride 0) runs the same tiles on
    pointers, chosen before the plan (runtime.select.runnable_decode), and is right; the plan
    itself refuses TMA there rather than rewriting the config it was given."""
    from fa_autotune.kernels.checks import cache_tma_ok
    from fa_autotune.kernels.decode import DecodePlan
    from fa_autotune.runtime.select import runnable_decode

    config = fa_autotune.KernelConfig(**{**DECODE, "access": "tensor_desc"})
    k_cache, v_cache, _ = make_cache(2, 32, 1, 20, device=device)
    k_paged, v_paged, table = make_cache(2, 32, 1, 32, page=16, device=device)
    k_one, v_one, _ = make_cache(2, 32, 1, 32, device=device)
    k_two, v_two = k_one.expand(2, 32, 2, 32), v_one.expand(2, 32, 2, 32)
    for k, v, tab, heads, length in ((k_cache, v_cache, None, 2, 17), (k_paged, v_paged, table, 2, 30),
                                     (k_two, v_two, None, 4, 30)):
        q = torch.randn(2, 1, heads, k.shape[3], dtype=torch.float16, device=device)
        assert not cache_tma_ok(k, v, tab is not None)
        assert runnable_decode(config, False) == config.with_(access="pointer")
        with pytest.raises(ConfigError, match="access='pointer'"):
            DecodePlan(config, q, k, v, None, None, torch.empty_like(q), None, tab, 1.0, False)
        out = fa_autotune.attention_with_kvcache(q, k, v, cache_seqlens=length, block_table=tab, config=config)
        check(out, None, q, k, v, tab, [length, length], False)
    assert runnable_decode(config, True) == config


def test_dispatched_config_int_lengths_and_whole_cache(device):
    """No config (the dispatcher's decode default); cache_seqlens as an int and as None."""
    k_cache, v_cache, _ = make_cache(2, 48, 2, 64, device=device)
    q = torch.randn(2, 1, 4, 64, dtype=torch.float16, device=device)
    out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=29)
    check(out, None, q, k_cache, v_cache, None, [29, 29], False)
    out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache)
    check(out, None, q, k_cache, v_cache, None, [48, 48], False)


@pytest.mark.parametrize("dtype, head_dim", [(torch.float32, 80), (torch.float16, 16)])
def test_dtypes_head_dims_mqa_scale_and_num_splits(dtype, head_dim, device):
    k_cache, v_cache, table = make_cache(2, 64, 1, head_dim, page=16, dtype=dtype, device=device)
    q = torch.randn(2, 2, 4, head_dim, dtype=dtype, device=device)
    seqlens = torch.tensor([33, 64], dtype=torch.int32, device=device)
    out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                             softmax_scale=0.3, causal=True, num_splits=5, config=DECODE)
    check(out, None, q, k_cache, v_cache, table, [33, 64], True, scale=0.3)


@pytest.mark.parametrize("programs", [3, 7, 64])
def test_balanced_split_cuts_row_tiles_anywhere(monkeypatch, programs, device):
    """A balanced (persistent) grid of 3, 7 and 64 programs over row tiles of 0 to 7 key
    steps, several row tiles per sequence (6 tokens x group 4 = 24 rows, 16-row tiles),
    causal: runs that start and end inside a row tile, one tile shared by several runs,
    programs with nothing to do (64 > the steps), tiles without keys (zeros and -inf LSE);
    then num_splits=2 asked explicitly over the same persistent config (a fixed split)."""
    from fa_autotune.kernels import decode
    from fa_autotune.runtime import kvcache

    monkeypatch.setattr(decode, "_sm_count", lambda device: programs)
    monkeypatch.setattr(kvcache, "_PLANS", {})
    lengths = [100, 0, 7, 61, 2]
    k_cache, v_cache, table = make_cache(len(lengths), 112, 2, 32, page=16, device=device)
    q = torch.randn(len(lengths), 6, 8, 32, dtype=torch.float16, device=device)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    for extra in ({}, {"num_splits": 2}):
        out, lse = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                      causal=True, return_softmax_lse=True,
                                                      config={**DECODE, "persistent": 1}, **extra)
        assert torch.isfinite(out).all()
        check(out, lse, q, k_cache, v_cache, table, lengths, True)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and bool((lse[1] == float("-inf")).all())


def test_balanced_split_merges_a_row_tile_cut_into_more_pieces_than_one_load(monkeypatch, device):
    """One long sequence on 40 programs of 2 key steps each: its row tile is cut into 22
    pieces, more than the combine loads at once (MERGE_PIECES), so each row's merge takes
    several rounds; the padding rows of the 16-row tile (group 2, one token) get no program."""
    from fa_autotune.kernels import decode
    from fa_autotune.runtime import kvcache

    monkeypatch.setattr(decode, "_sm_count", lambda device: 40)
    monkeypatch.setattr(kvcache, "_PLANS", {})
    k_cache, v_cache, table = make_cache(1, 720, 1, 32, device=device)
    q = torch.randn(1, 1, 2, 32, dtype=torch.float16, device=device)
    seqlens = torch.tensor([700], dtype=torch.int32, device=device)
    out, lse = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, return_softmax_lse=True,
                                                  config={**DECODE, "persistent": 1})
    check(out, lse, q, k_cache, v_cache, table, [700], False)


def test_balanced_split_refuses_what_its_int32_step_count_cannot_hold():
    """32768 row tiles x 2**16 steps of 32 keys: the units scan would wrap; the plan says so."""
    from fa_autotune.kernels.decode import DecodePlan

    config = fa_autotune.KernelConfig(loop_order="decode", BLOCK_M=16, BLOCK_N=32, persistent=1)
    q = torch.empty(256, 1, 128, 16, device="meta", dtype=torch.float16)
    cache = torch.empty(256, 1 << 21, 128, 16, device="meta", dtype=torch.float16)
    with pytest.raises(ConfigError, match="32 bits"):
        DecodePlan(config, q, cache, cache, None, None, torch.empty_like(q), None, None, 0.1, False)
    DecodePlan(config.with_(persistent=0, num_splits=4), q, cache, cache, None, None, torch.empty_like(q), None, None,
               0.1, False)


def test_many_query_rows_take_several_tiles(device):
    """Chunked prefill: 9 tokens x group 4 = 36 rows, more than one 16-row tile."""
    k_cache, v_cache, _ = make_cache(1, 40, 2, 32, device=device)
    q = torch.randn(1, 9, 8, 32, dtype=torch.float16, device=device)
    out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor(
        [40], dtype=torch.int32, device=device), causal=True, config={**DECODE, "num_splits": 2})
    check(out, None, q, k_cache, v_cache, None, [40], True)


def test_empty_batch_and_empty_cache(device):
    k_cache, v_cache, _ = make_cache(2, 16, 1, 32, device=device)
    q = torch.randn(2, 1, 2, 32, dtype=torch.float16, device=device)
    out, lse = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=0, return_softmax_lse=True,
                                                  config=DECODE)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    none = fa_autotune.attention_with_kvcache(q[:0], k_cache, v_cache, cache_seqlens=0)
    assert none.shape == (0, 1, 2, 32)


def _bad_call(device, **changes):
    k_cache, v_cache, table = make_cache(2, 32, 2, 32, page=16, device=device)
    args = {"q": torch.randn(2, 1, 4, 32, dtype=torch.float16, device=device), "k_cache": k_cache,
            "v_cache": v_cache, "k": torch.randn(2, 1, 2, 32, dtype=torch.float16, device=device),
            "v": torch.randn(2, 1, 2, 32, dtype=torch.float16, device=device),
            "cache_seqlens": torch.tensor([3, 5], dtype=torch.int32, device=device), "block_table": table,
            "config": DECODE}
    args.update(changes)
    return args


@pytest.mark.parametrize("changes, match", [
    ({"cache_seqlens": "lengths 31 and 32"}, "cache_seqlens"),  # replaced below
    ({"block_table": "page 99"}, "block_table names pages"),
    ({"cache_seqlens": "negative"}, "cache_seqlens"),
    ({"cache_seqlens": 40}, "does not fit"),
    ({"cache_seqlens": "int64"}, "int32"),
    ({"q": "float32 q"}, "must match"),
    ({"q": "5 heads"}, "multiple"),
    ({"v": None}, "both k and v"),
    ({"block_table": "int64"}, "int32"),
    ({"window_size": (8, 0)}, "sliding-window"),
    ({"softcap": 30.0}, "soft-capping"),
    ({"rotary_cos": "tensor"}, "rotary_cos"),
    ({"num_splits": -1}, "num_splits"),
])
def test_bad_input_raises_before_touching_the_cache(changes, match, device):
    args = _bad_call(device)
    name, value = next(iter(changes.items()))
    value = {"lengths 31 and 32": torch.tensor([31, 32], dtype=torch.int32, device=device),
             "page 99": torch.tensor([[0, 99], [99, 3]], dtype=torch.int32, device=device),
             "negative": torch.tensor([-1, 3], dtype=torch.int32, device=device),
             "int64": (args[name].long() if isinstance(args.get(name), torch.Tensor) else None),
             "float32 q": args["q"].float(), "5 heads": torch.randn(2, 1, 5, 32, dtype=torch.float16, device=device),
             "tensor": torch.zeros(1, device=device)}.get(value, value) if isinstance(value, str) else value
    args[name] = value
    before = args["k_cache"].clone(), args["v_cache"].clone()
    with pytest.raises(InputError, match=match):
        fa_autotune.attention_with_kvcache(**args)
    assert torch.equal(args["k_cache"], before[0]) and torch.equal(args["v_cache"], before[1])


def test_forward_config_and_grad_are_refused(device):
    args = _bad_call(device, config={"BLOCK_M": 16, "BLOCK_N": 16})
    with pytest.raises(ConfigError, match="decode"):
        fa_autotune.attention_with_kvcache(**args)
    args = _bad_call(device)
    args["q"].requires_grad_(True)
    with pytest.raises(InputError, match="backward"):
        fa_autotune.attention_with_kvcache(**args)


@pytest.mark.parametrize("text, message", [("{", "not valid JSON"), ("[1]", "mapping"), ('{"BLOCK_Q": 1}', "BLOCK_Q")])
def test_config_text_that_is_not_a_config_is_a_config_error(device, text, message):
    """config= as JSON text (what torch.compile's custom op takes): text that is not JSON, or
    not a mapping of template parameters, is a ConfigError naming what is wrong."""
    with pytest.raises(ConfigError, match=message):
        fa_autotune.attention_with_kvcache(**_bad_call(device, config=text))


def test_decode_config_validation():
    with pytest.raises(ConfigError, match="pointers or TMA"):
        fa_autotune.KernelConfig(loop_order="decode", access="block_ptr")
    with pytest.raises(ConfigError, match="backward.*pointers"):
        fa_autotune.KernelConfig(loop_order="backward", access="tensor_desc")
    tma = fa_autotune.KernelConfig(loop_order="decode", BLOCK_M=16, num_splits=8, access="tensor_desc")
    assert tma.name == "attn_decode_m16n64_w4s3_cband_x8_tma"
    with pytest.raises(ConfigError, match="128"):
        fa_autotune.KernelConfig(loop_order="decode", BLOCK_M=256)
    cfg = fa_autotune.KernelConfig(loop_order="decode", BLOCK_M=16, num_splits=8)
    assert cfg.name == "attn_decode_m16n64_w4s3_cband_x8"
    balanced = fa_autotune.KernelConfig(loop_order="decode", BLOCK_M=16, persistent=2)
    assert balanced.name == "attn_decode_m16n64_w4s3_cband_sk2"
    with pytest.raises(ConfigError, match="num_splits=1 with persistent"):
        fa_autotune.KernelConfig(loop_order="decode", persistent=1, num_splits=4)
    with pytest.raises(ConfigError, match="persistent"):
        fa_autotune.KernelConfig(loop_order="decode", persistent=8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("page", [0, 16, 128])
@pytest.mark.parametrize("kind", ["dispatched", "balanced", "tma-split4"])
def test_gpu_cuda_graph_replays_with_changing_lengths(page, kind):
    """Captured once, replayed after the lengths (and the appended tokens) change: the graph
    reads them on the device (the balanced grid's units scan too: its run boundaries move
    with the lengths; TMA descriptors captured by value still address the same cache).
    bf16, a realistic GQA shape, the dispatched config, a balanced one or a TMA one."""
    config = {"dispatched": None,
              "balanced": dict(loop_order="decode", BLOCK_M=16, BLOCK_N=64, num_stages=2, persistent=2),
              "tma-split4": dict(loop_order="decode", BLOCK_M=16, BLOCK_N=128, num_stages=3, num_splits=4,
                                 access="tensor_desc")}[kind]
    batch, capacity = 4, 4096
    k_cache, v_cache, table = make_cache(batch, capacity, 8, 128, page=page, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    k_new = torch.randn(batch, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    v_new = torch.randn_like(k_new)
    seqlens = torch.tensor([100, 4000, 1, 2047], dtype=torch.int32, device="cuda")
    fa_autotune.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table,
                                       config=config)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                                 block_table=table, config=config)
    for lengths in ([7, 3000, 0, 4094], [4094, 1, 512, 64]):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        k_new.normal_()
        v_new.normal_()
        graph.replay()
        torch.cuda.synchronize()
        check(out, None, q, k_cache, v_cache, table, [n + 1 for n in lengths], False)


def test_traced_by_torch_compile_as_one_op(device):
    """Under torch.compile (fullgraph: no breaks) the call is one custom op that appends to
    the cache in place and gives what the eager call gives."""
    k_cache, v_cache, table = make_cache(2, 32, 2, 32, page=16, device=device)
    q = torch.randn(2, 1, 4, 32, dtype=torch.float16, device=device)
    k_new = torch.randn(2, 1, 2, 32, dtype=torch.float16, device=device)
    v_new = torch.randn_like(k_new)
    seqlens = torch.tensor([5, 30], dtype=torch.int32, device=device)
    want_k = appended(k_cache, table, k_new, [5, 30])

    text = fa_autotune.KernelConfig.from_mapping(DECODE).canonical_json()

    def step(q, k_cache, v_cache, k_new, v_new, seqlens, table):
        return fa_autotune.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                                  block_table=table, return_softmax_lse=True, config=text)

    out, lse = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k_cache, v_cache, k_new, v_new, seqlens,
                                                                          table)
    assert torch.equal(k_cache, want_k)
    check(out, lse, q, k_cache, v_cache, table, [6, 31], False)


def _paged_append(device, table, lengths, page=4, pages=8, n_new=2):
    """Arguments for a paged append (page rows, GQA 2:1) over ``table`` and ``lengths``."""
    k_cache = torch.randn(pages, page, 1, 16, dtype=torch.float16, device=device)
    return {"q": torch.randn(len(lengths), 1, 2, 16, dtype=torch.float16, device=device), "k_cache": k_cache,
            "v_cache": torch.randn_like(k_cache),
            "k": torch.randn(len(lengths), n_new, 1, 16, dtype=torch.float16, device=device),
            "v": torch.randn(len(lengths), n_new, 1, 16, dtype=torch.float16, device=device),
            "cache_seqlens": torch.tensor(lengths, dtype=torch.int32, device=device),
            "block_table": torch.tensor(table, dtype=torch.int32, device=device), "config": DECODE}


@pytest.mark.parametrize("table, lengths", [
    ([[0, 1], [2, 1]], [5, 5]),  # both append rows 5-6 of page 1: the same page rows
    ([[0, 1, 5], [1, 3, 6]], [4, 5]),  # one appends into page 1, which the other only reads
    ([[0, 3], [0, 4]], [2, 2]),  # a shared page that is not full, both appending into it
    ([[0, 0], [2, 3]], [3, 0]),  # a sequence reaching its own page twice, appending into it
])
def test_appends_into_a_page_another_entry_reaches_are_refused(table, lengths, device):
    """Two sequences whose new rows land in one page (or that write a page the other reads)
    corrupted one of them without error: refused before the cache is touched."""
    args = _paged_append(device, table, lengths)
    before = args["k_cache"].clone(), args["v_cache"].clone()
    with pytest.raises(InputError, match="appends into page"):
        fa_autotune.attention_with_kvcache(**args)
    assert torch.equal(args["k_cache"], before[0]) and torch.equal(args["v_cache"], before[1])
    args["check_lengths"] = False  # what a serving engine that built the table passes: not checked
    fa_autotune.attention_with_kvcache(**args)


def test_shared_read_only_prefix_pages_stay_allowed(device):
    """Prefix caching: sequences share their earlier full pages and append into their own."""
    table, lengths = [[0, 1, 2], [0, 1, 3], [0, 4, 5]], [9, 8, 4]
    args = _paged_append(device, table, lengths)
    want_k = appended(args["k_cache"], args["block_table"], args["k"], lengths)
    want_v = appended(args["v_cache"], args["block_table"], args["v"], lengths)
    out, lse = fa_autotune.attention_with_kvcache(**args, return_softmax_lse=True)
    assert torch.equal(args["k_cache"], want_k) and torch.equal(args["v_cache"], want_v)
    check(out, lse, args["q"], args["k_cache"], args["v_cache"], args["block_table"], [n + 2 for n in lengths],
          False)


def test_k_cache_sharing_memory_with_v_cache_is_refused_when_appending(device):
    """k_cache is v_cache (or overlapping views): the appended keys were overwritten by the
    values. Interleaved views of one buffer that share no element stay allowed."""
    args = _paged_append(device, [[0, 1], [2, 3]], [3, 5])
    kv = torch.randn(8, 2, 4, 1, 16, dtype=torch.float16, device=device)  # (pages, K|V, rows, heads, D)
    overlapping = torch.randn(9 * 4, 1, 16, dtype=torch.float16, device=device)
    for k_cache, v_cache in ((args["k_cache"], args["k_cache"]), (overlapping[:32].view(8, 4, 1, 16),
                                                                  overlapping[4:].view(8, 4, 1, 16))):
        with pytest.raises(InputError, match="share memory"):
            fa_autotune.attention_with_kvcache(**{**args, "k_cache": k_cache, "v_cache": v_cache})
    fa_autotune.attention_with_kvcache(**{**args, "k": None, "v": None, "v_cache": args["k_cache"]})  # read only
    k_cache, v_cache = kv[:, 0], kv[:, 1]
    want_k = appended(k_cache, args["block_table"], args["k"], [3, 5])
    want_v = appended(v_cache, args["block_table"], args["v"], [3, 5])
    fa_autotune.attention_with_kvcache(**{**args, "k_cache": k_cache, "v_cache": v_cache})
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def _quantized(cache, descale):
    """An FP8 e4m3 copy of a (.., heads_kv, D) cache with one descale per KV head."""
    return (cache.float() / descale.reshape(1, 1, -1, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)


def _dequantized(cache8, descale):
    return cache8.float() * descale.reshape(1, 1, -1, 1)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", ["contiguous", "contiguous-split3", "paged16-block32", "contiguous-balanced",
                                  "paged16-balanced-rows32", "contiguous-tma"])
def test_fp8_cache_appends_quantized_and_attends_dequantized(case, causal, device):
    """An e4m3 cache with per-KV-head descales (flash-attn 3's k_descale / v_descale): the two
    appended tokens land quantized with them (saturating at 448), and the output is attention
    over the dequantized cache (within fp16's tolerance), in q's dtype; TMA configs run on
    pointers. Descales are powers of two and the new values lie on the e4m3 grid, so the
    appended bytes are exact: Triton 3.6's interpreter rounds fp32 -> fp8 wrong where rounding
    carries into the exponent (7.9 -> 4.0), which a GPU's conversion does not."""
    page, changes = CASES[case]
    batch, heads_q, heads_kv, head_dim, capacity = 3, 8, 2, 32, 64
    k16, v16, table = make_cache(batch, capacity, heads_kv, head_dim, page, device=device)
    k_descale = torch.tensor([2.0 ** -6, 2.0 ** -5], device=device)
    v_descale = torch.tensor([2.0 ** -4, 2.0 ** -7], device=device)
    k_cache, v_cache = _quantized(k16, k_descale), _quantized(v16, v_descale)
    q = torch.randn(batch, 2, heads_q, head_dim, dtype=torch.float16, device=device)
    k_new = torch.randn(batch, 2, heads_kv, head_dim, device=device)
    v_new = torch.randn_like(k_new)
    v_new[0, 0, 1, 0] = 1000.0  # past 448 * 2**-7: saturates
    k_new, v_new = (_dequantized(_quantized(t, d), d).half() for t, d in ((k_new, k_descale), (v_new, v_descale)))
    lengths = [37, 0, 62]
    want = [appended(c, table, _quantized(t, d), lengths) for c, t, d in ((k_cache, k_new, k_descale),
                                                                           (v_cache, v_new, v_descale))]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    v_new[0, 0, 1, 0] = 1000.0  # the byte `want` holds is 448's
    out, lse = fa_autotune.attention_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table, causal=causal,
        return_softmax_lse=True, config={**DECODE, **changes},
        k_descale=k_descale.expand(batch, heads_kv), v_descale=v_descale.expand(batch, heads_kv))
    assert out.dtype == torch.float16 and k_cache.dtype == torch.float8_e4m3fn
    for got, expected in zip((k_cache, v_cache), want):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    check(out, lse, q, _dequantized(k_cache, k_descale), _dequantized(v_cache, v_descale), table,
          [n + 2 for n in lengths], causal)


@pytest.mark.parametrize("head_dim, page, changes", [(32, 16, {}), (80, 0, {"num_splits": 3}),
                                                     (64, 16, {"persistent": 1})], ids=["paged", "split3", "balanced"])
@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_fp8_v_cache_read_as_column_pairs_matches_bytes(fmt, head_dim, page, changes, device, monkeypatch):
    """An FP8 V cache read as 16-bit words of two columns (`decode.v_pairs`: aligned, an even
    head dim; the GPU splits them with a packed cvt, the interpreter by integer arithmetic)
    gives the output of V read byte by byte, and attention over the dequantized cache; a NaN
    byte in a visible key's odd or even column makes exactly that column of its KV head's rows NaN
    (the interpreter's own e4m3 conversion, the byte path here, turns NaN finite).
    A cache whose rows are not 16-byte aligned is read as bytes."""
    from fa_autotune.kernels import decode
    from fa_autotune.runtime import kvcache

    k16, v16, table = make_cache(2, 48, 2, head_dim, page, device=device)
    descale = torch.tensor([2.0 ** -5, 2.0 ** -6], device=device)
    k_cache, v_cache = ((t.float() / descale.reshape(1, 1, -1, 1)).to(fmt) for t in (k16, v16))
    q = torch.randn(2, 1, 8, head_dim, dtype=torch.float16, device=device)
    kwargs = dict(cache_seqlens=torch.tensor([40, 21], dtype=torch.int32, device=device), block_table=table,
                  config={**DECODE, **changes}, k_descale=descale.expand(2, 2), v_descale=descale.expand(2, 2))
    config = fa_autotune.KernelConfig(**DECODE, **changes)
    assert decode.v_pairs(config, v_cache, head_dim) == (1 if fmt == torch.float8_e4m3fn else 2) + 2 * (device == "cpu")
    assert decode.v_pairs(config, torch.empty(4, 8, 2, head_dim + 8, dtype=fmt)[..., :head_dim], head_dim) == 0
    pairs = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, **kwargs)
    check(pairs, None, q, _dequantized(k_cache, descale), _dequantized(v_cache, descale), table, [40, 21], False)
    with monkeypatch.context() as patch:
        patch.setattr(decode, "v_pairs", lambda config, v, head_dim: 0)
        kvcache._forget_plans()
        plain = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, **kwargs)
    kvcache._forget_plans()
    torch.testing.assert_close(pairs, plain, atol=2e-3, rtol=0)
    first = [table[b, 0].item() if page else b for b in (0, 1)]
    v_cache.view(torch.uint8)[first[0], 5, 1, 7] = 0x7F  # NaN in both formats: sequence 0, key 5, KV head 1
    v_cache.view(torch.uint8)[first[1], 3, 0, 10] = 0xFF  # and -NaN: sequence 1, key 3, KV head 0
    pairs = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, **kwargs)
    nan = torch.zeros_like(pairs, dtype=torch.bool)
    nan[0, 0, 4:, 7] = nan[1, 0, :4, 10] = True  # query heads 4-7 share KV head 1, 0-3 KV head 0
    assert torch.equal(pairs.isnan(), nan)


@pytest.mark.parametrize("magnitude", [1e-6, 1.0, 1e5])
def test_fp8_cache_attends_bf16_q_of_any_magnitude(magnitude, device):
    """bf16 q over an e4m3 cache: the kernels multiply fp16 operands (K and V upcast in one
    packed conversion, q scaled into fp16's range by a power of two that the score scale takes
    back), so queries past fp16's range (1e5) or below its normal numbers (1e-6) still give
    attention over the dequantized cache; a NaN in one query row makes that row NaN and leaves
    every other row of its tile bit for bit as it was."""
    k16, v16, _ = make_cache(2, 48, 2, 32, device=device)
    k_descale = torch.tensor([2.0 ** -6, 2.0 ** -5], device=device)
    v_descale = torch.tensor([2.0 ** -4, 2.0 ** -7], device=device)
    k_cache, v_cache = _quantized(k16, k_descale), _quantized(v16, v_descale)
    q = (torch.randn(2, 1, 8, 32, device=device) * magnitude / 4).bfloat16()
    descales = dict(k_descale=k_descale.expand(2, 2), v_descale=v_descale.expand(2, 2))
    out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=40, config=DECODE, **descales)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    check(out, None, q, _dequantized(k_cache, k_descale), _dequantized(v_cache, v_descale), None, [40, 40], False)
    q[0, 0, 3, 5] = float("nan")  # query head 3: the last row of KV head 0's tile
    poisoned = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=40, config=DECODE, **descales)
    assert poisoned[0, 0, 3].isnan().all()
    poisoned[0, 0, 3] = out[0, 0, 3]
    assert torch.equal(poisoned, out)


def test_fp8_cache_takes_one_number_per_cache_and_refuses_mistakes(device):
    """Scalar descales broadcast to every sequence and KV head; a missing descale, descales
    for a 16-bit cache, a wrong shape, fp32 q, or K and V caches of different dtypes are clear
    errors that write nothing."""
    k16, v16, _ = make_cache(2, 48, 2, 32, device=device)
    k_cache, v_cache = _quantized(k16, torch.full((2,), 0.01, device=device)), \
        _quantized(v16, torch.full((2,), 0.02, device=device))
    q = torch.randn(2, 1, 4, 32, dtype=torch.float16, device=device)
    out = fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=40, config=DECODE,
                                             k_descale=0.01, v_descale=torch.tensor(0.02, device=device))
    check(out, None, q, k_cache.float() * 0.01, v_cache.float() * 0.02, None, [40, 40], False)
    with pytest.raises(InputError, match="needs k_descale"):
        fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=40)
    with pytest.raises(InputError, match="describe an FP8 cache"):
        fa_autotune.attention_with_kvcache(q, k16, v16, cache_seqlens=40, k_descale=1.0, v_descale=1.0)
    with pytest.raises(InputError, match="shape \\(2, 2\\)"):
        fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=40, k_descale=torch.ones(2, 3),
                                           v_descale=1.0)
    with pytest.raises(InputError, match="positive finite"):
        fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=40, k_descale=0.0, v_descale=1.0)
    with pytest.raises(InputError, match="float16 or bfloat16 q"):
        fa_autotune.attention_with_kvcache(q.float(), k_cache, v_cache, cache_seqlens=40, k_descale=1.0,
                                           v_descale=1.0)
    with pytest.raises(InputError, match="must match"):
        fa_autotune.attention_with_kvcache(q, k_cache, v16, cache_seqlens=40, k_descale=1.0, v_descale=1.0)


@pytest.mark.parametrize("lengths", ["number", "tensor"])
def test_fp8_cache_descale_tensors_must_be_positive_and_finite(lengths, device):
    """A zero, negative or NaN descale tensor would append infinities or NaN into the cache:
    refused in check_lengths' one read-back (also when the lengths are a number), before
    anything is written; with check_lengths=False nothing is read back."""
    k16, v16, _ = make_cache(2, 48, 2, 32, device=device)
    k_cache, v_cache = _quantized(k16, torch.full((2,), 0.01, device=device)), \
        _quantized(v16, torch.full((2,), 0.02, device=device))
    before = k_cache.clone(), v_cache.clone()
    q = torch.randn(2, 1, 4, 32, dtype=torch.float16, device=device)
    k_new = torch.randn(2, 1, 2, 32, dtype=torch.float16, device=device)
    seqlens = 40 if lengths == "number" else torch.tensor([40, 41], dtype=torch.int32, device=device)
    good = torch.full((2, 2), 0.01, device=device)
    for bad, value in ((0, 0.0), (1, -1.0), (0, float("nan")), (1, float("inf"))):
        descale = good.clone()
        descale[1, bad] = value
        with pytest.raises(InputError, match=f"v_descale\\[1, {bad}\\] = {value}: descales must be positive"):
            fa_autotune.attention_with_kvcache(q, k_cache, v_cache, k_new, k_new, cache_seqlens=seqlens,
                                               config=DECODE, k_descale=good, v_descale=descale)
        assert torch.equal(k_cache.view(torch.uint8), before[0].view(torch.uint8))
        assert torch.equal(v_cache.view(torch.uint8), before[1].view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_fp8_cache_appends_nan_as_nan_and_refuses_e4m3_before_sm89(monkeypatch):
    """A NaN in an appended token stays NaN in the cache (a saturating clamp that dropped it
    would store a finite value that looks right); an e4m3 cache on a GPU before sm_89 is a
    clear error (Triton has no e4m3 conversion there)."""
    k16, v16, _ = make_cache(1, 64, 2, 32, dtype=torch.bfloat16, device="cuda")
    k_cache, v_cache = (_quantized(t, torch.full((2,), 0.01, device="cuda")) for t in (k16, v16))
    q = torch.randn(1, 1, 4, 32, dtype=torch.bfloat16, device="cuda")
    k_new = torch.randn(1, 1, 2, 32, dtype=torch.bfloat16, device="cuda")
    k_new[0, 0, 1, 3] = float("nan")
    fa_autotune.attention_with_kvcache(q, k_cache, v_cache, k_new, k_new, cache_seqlens=10, config=DECODE,
                                       k_descale=0.01, v_descale=0.01)
    assert torch.isnan(k_cache[0, 10, 1, 3].float()) and torch.isnan(v_cache[0, 10, 1, 3].float())
    assert torch.isfinite(k_cache[0, 10, 0].float()).all()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(InputError, match="float8_e4m3fn cache needs an sm_89"):
        fa_autotune.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=10, k_descale=0.01, v_descale=0.01)

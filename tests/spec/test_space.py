from __future__ import annotations

import dataclasses
import pickle

import pytest

from fa_autotune.errors import SearchSpaceError
from fa_autotune.spec.candidate import Candidate
from fa_autotune.spec.problem import Problem
from fa_autotune.spec.recipe import Fp8Recipe
from fa_autotune.spec.defaults import backward_default
from fa_autotune.spec.space import Expression, PARAMETER_NAMES, PROBLEM_NAMES, load_space, parse_space

NAMES = PARAMETER_NAMES + PROBLEM_NAMES


def _kernels(space, problem: Problem) -> list:
    """The kernel configs of ``space``'s grid on ``problem`` (its candidates less their recipes)."""
    return [candidate.config for candidate in space.grid(problem)]


def test_default_space_presets():
    space = load_space()
    prefill = space.presets["llm-prefill"].problems
    assert len(prefill) == 24
    assert {p.head_dim for p in prefill} == {64, 128} and {p.seqlen_q for p in prefill} == {1024, 4096, 16384}
    assert all(p.batch * p.seqlen_q == 16384 and p.heads_q * p.head_dim == 2048 for p in prefill)
    assert {p.dtype for p in prefill} == {"float16", "bfloat16"} and {p.causal for p in prefill} == {True, False}
    assert len(space.presets["smoke"].problems) == 2


def test_arch_overrides_and_grid():
    space = load_space()
    problem = Problem(4, 16, 16, 4096, 4096, 128, "float16", causal=False)
    hopper = _kernels(space.for_arch("sm90"), problem)
    assert hopper and all(c.loop_order == "q_outer" for c in hopper)  # kv_outer/split_kv excluded at N=4096
    assert any(c.warp_specialize for c in hopper) and any(c.access == "tensor_desc" for c in hopper)
    assert all(c.num_stages == 2 for c in hopper if c.warp_specialize)
    # a persistent grid only under warp specialization or in Gluon; the FP8 knobs stay at their
    # defaults, and a problem that is not FP8 has no recipe
    assert any(c.persistent for c in hopper)
    assert all(c.warp_specialize or c.language == "gluon" for c in hopper if c.persistent)
    assert {(c.fp8_pv, c.tile_order) for c in hopper} == {("separate", "seq")}
    assert {c.recipe for c in space.for_arch("sm90").grid(problem)} == {None}
    fp8 = space.for_arch("sm90").grid(problem.with_dtype("float8_e4m3fn"))
    kernels = [c.config for c in fp8]
    assert {c.fp8_pv for c in kernels} == {"separate", "inplace"} and {c.tile_order for c in kernels} == {"seq", "head"}
    assert all(c.loop_order == "q_outer" and c.BLOCK_N >= 32 for c in kernels)
    # the recipe is searched beside the kernel, and a constraint may read both
    assert {c.recipe for c in fp8} == {Fp8Recipe(s, h, t) for s in ("per_tensor", "per_head", "per_block")
                                       for h in (False, True) for t in (False, True)}
    # warp-specialized kernels go with every recipe (a side kernel scores the sink tile)
    assert {c.recipe.sink_tile for c in fp8 if c.config.warp_specialize} == {False, True}
    assert not any(c.config.fp8_pv == "inplace" and c.recipe.scaling == "per_block" for c in fp8)
    ampere = _kernels(space.for_arch("sm80"), problem)
    assert ampere and not any(c.access == "tensor_desc" or c.warp_specialize for c in ampere)
    decode = Problem(1, 32, 8, 1, 8192, 128, "float16")
    assert any(c.loop_order == "split_kv" and c.num_splits > 1 for c in _kernels(space.for_arch("sm90"), decode))


def test_conditional_parameters_take_their_fallback():
    space = load_space().for_arch("sm90")
    problem = Problem(1, 8, 8, 512, 512, 64, "float16", causal=False)
    picks = iter(["q_outer", 64, 64, 4, 2, "pointer", 1])
    params = space.suggest(lambda name, choices: next(picks), problem)
    assert params["causal_mode"] == "split" and params["num_splits"] == 1 and params["q_tiles"] == 1
    assert params["warp_specialize"] is False  # pointer access: not offered


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "BLOCK_M.bit_length()", "[BLOCK_M][0]",
                                  "(lambda: 1)()", "BLOCK_M if causal else 1", "x == 1", "BLOCK_M ** 2"])
def test_safe_evaluator_rejects(text):
    with pytest.raises(SearchSpaceError):
        Expression.parse(text, "here", NAMES)


def test_safe_evaluator_evaluates():
    expr = Expression.parse('not causal and (BLOCK_M * 2 <= head_dim or loop_order == "q_outer")', "x", NAMES)
    assert expr.evaluate({"causal": False, "BLOCK_M": 64, "head_dim": 64, "loop_order": "q_outer"})
    assert not expr.evaluate({"causal": True, "BLOCK_M": 64, "head_dim": 64, "loop_order": "q_outer"})


BASE = """\
version: 1
parameters:
  loop_order: [q_outer]
  BLOCK_M: [64]
  BLOCK_N: [64]
  num_warps: [4]
  num_stages: [2]
  access: [pointer]
  causal_mode: [split]
  warp_specialize: [false]
  num_splits: [1]
  q_tiles: [1]
constraints:
  - BLOCK_N <= head_dim
"""


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda t: t.replace("BLOCK_M: [64]", "BLOCK_M: [48]"), r"bad\.yaml:4 \(parameters\.BLOCK_M\): value 48 rejected"),
        (lambda t: t.replace("BLOCK_M: [64]", "BLOCK_Q: [64]"), r":4 \(parameters\.BLOCK_Q\): unknown parameter"),
        (lambda t: t.replace("BLOCK_M: [64]", "BLOCK_M: 64"), r":4 \(parameters\.BLOCK_M\): expected a non-empty list"),
        (lambda t: t.replace("  - BLOCK_N <= head_dim", "  - BLOCK_N <= headdim"), r":14 \(constraints\.0\): .*unknown name 'headdim'"),
        (lambda t: t.replace("  - BLOCK_N <= head_dim", "  - BLOCK_N <="), r":14 \(constraints\.0\): .*not an expression"),
        (lambda t: t.replace("version: 1", "version: 9"), r":1 \(version\): version must be 1"),
        (lambda t: t.replace("  q_tiles: [1]\n", ""), r"missing parameters \['q_tiles'\]"),
        (lambda t: t + "arch:\n  sm70: {}\n", r"\(arch\.sm70\): unknown architecture"),
        (lambda t: t + "presets:\n  p:\n    problems:\n      - {seqlen: 64, head_dim: 8, heads: 2}\n", r"presets\.p\.problems\.0\): head_dim 8"),
        (lambda t: t + "presets:\n  p:\n    problems:\n      - {seqlen: 64, head_dim: 64, heads: 2, color: red}\n", r"unknown key 'color'"),
        (lambda t: t + "bogus: 1\n", r"unknown top-level key 'bogus'"),
        (lambda t: t.replace("parameters:", "parameters: [", 1), r"bad\.yaml:\d+: not valid YAML"),
    ],
)
def test_malformed_files_name_file_line_and_key(edit, expected):
    with pytest.raises(SearchSpaceError, match=expected):
        parse_space(edit(BASE), "bad.yaml")


def test_load_from_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(BASE)
    space = load_space(path)
    assert space.path == str(path) and space.grid(Problem(1, 1, 1, 64, 64, 64, "float16"))
    with pytest.raises(SearchSpaceError, match="does not exist"):
        load_space(tmp_path / "nope.yaml")


def test_gluon_configs_only_on_hopper_and_only_valid_ones():
    """sm90 adds FlashAttention-3 in Gluon with its own knobs (two consumers, three at D <= 64:
    one ran at 0.28x);
    other architectures and fp32 problems get Triton kernels only."""
    space = load_space()
    problem = Problem(4, 16, 16, 4096, 4096, 128, "bfloat16", causal=True)
    hopper = _kernels(space.for_arch("sm90"), problem)
    gluon = [c for c in hopper if c.language == "gluon"]
    assert gluon and len(gluon) < len(hopper)
    assert all(c.access == "tensor_desc" and c.num_warps == 4 and c.consumers == 2 and c.BLOCK_M == 64 for c in gluon)
    assert {c.persistent for c in gluon} == {0, 1} and {c.overlap for c in gluon} == {True, False}
    turns = {(c.pingpong, c.overlap) for c in gluon if c.consumers == 2}
    assert turns == {(p, o) for p in (False, True) for o in (False, True)}  # ping-pong with or without overlap
    assert {c.causal_mode for c in gluon} == {"split", "masked"}
    assert {c.one_loop for c in gluon} == {False, True} and all(c.causal_mode == "split" for c in gluon if c.one_loop)
    assert not any(c.one_loop for c in hopper if c.language == "triton")
    d64 = [c for c in _kernels(space.for_arch("sm90"), dataclasses.replace(problem, head_dim=64))
           if c.language == "gluon"]
    assert {(c.consumers, c.consumer_regs) for c in d64} == {(2, 232), (2, 240), (3, 160)}
    assert {c.pingpong for c in d64 if c.consumers == 3} == {False, True}  # turns round three consumers too
    # part of the exp2 on the FMA units only where the MUFU unit bounds the step (D <= 64)
    assert {c.exp2_emu for c in d64} == {0, 8, 16} and {c.exp2_emu for c in gluon} == {0}
    assert not any(c.exp2_emu for c in hopper if c.language == "triton")
    # lazy rescaling by warps: every Gluon forward searches it, Triton's (0.94x) never
    assert {c.rescale_threshold for c in gluon} == {0, 8}
    assert not any(c.rescale_threshold for c in hopper if c.language == "triton")
    assert not any(c.language == "gluon" for c in _kernels(space.for_arch("sm80"), problem))
    assert not any(c.language == "gluon" for c in _kernels(space.for_arch("sm90"), problem.with_dtype("float32")))
    # FP8: the Gluon kernel with FP8 products, without half steps (P held in 16 bits)
    fp8 = [c for c in _kernels(space.for_arch("sm90"), problem.with_dtype("float8_e4m3fn")) if c.language == "gluon"]
    assert fp8 and not any(c.half_step for c in fp8) and {c.fp8_pv for c in fp8} == {"separate"}
    # 256-key steps: FP8 only, two consumers in the steps-in-turn schedule
    wide = [c for c in fp8 if c.BLOCK_N == 256]
    assert wide and not any(c.overlap or c.consumers != 2 for c in wide)
    assert not any(c.BLOCK_N == 256 for c in gluon)


# ---- every bad constraint the promised error, at bounded cost (issue 14)
ENV = {"BLOCK_M": 64, "BLOCK_N": 64, "head_dim": 64, "loop_order": "q_outer", "causal": False, "num_splits": 1}


@pytest.mark.parametrize("text, message", [
    ("BLOCK_M / (BLOCK_N - 64) > 1", "div by zero"),
    ("BLOCK_M % 0 == 0", "mod by zero"),
    ("BLOCK_M // 0 == 0", "floordiv by zero"),
    ('loop_order < 5', "cannot order"),
    ('-loop_order == 1', "a sign needs numbers"),
    ('loop_order * 100000000000 == "x"', "needs numbers"),
    ("BLOCK_M + 1", "not true or false"),
    ("causal < BLOCK_M", "cannot order"),
])
def test_constraints_that_cannot_be_evaluated_name_their_place(text, message):
    expr = Expression.parse(text, "bad.yaml:9 (constraints.0)", NAMES)
    with pytest.raises(SearchSpaceError, match=r"bad\.yaml:9 \(constraints\.0\): .*" + message):
        expr.evaluate(ENV)


@pytest.mark.parametrize("text", ["not " * 3000 + "causal", " + ".join(["BLOCK_M"] * 200_000) + " > 0",
                                  "(" * 5000 + "causal" + ")" * 5000, "x" * 100_000])
def test_huge_or_deep_constraints_are_refused_quickly(text):
    import time

    start = time.perf_counter()
    with pytest.raises(SearchSpaceError, match="here: .*(too complex|nested too deeply|characters long)"):
        Expression.parse(text, "here", NAMES)
    assert time.perf_counter() - start < 2


def test_when_must_be_an_expression():
    with pytest.raises(SearchSpaceError, match=r"bad\.yaml:11 \(parameters\.num_splits\)\.when: expected an expression"):
        parse_space(BASE.replace("num_splits: [1]", "num_splits: {values: [1], when: 5, otherwise: 1}"), "bad.yaml")
    parse_space(BASE.replace("num_splits: [1]", "num_splits: {values: [1], when: true, otherwise: 1}"), "ok.yaml")


def test_presets_that_multiply_out_huge_are_refused_quickly():
    import time

    lengths = list(range(64, 64 + 64 * 200, 64))
    huge = BASE + f"presets:\n  p:\n    problems:\n      - {{seqlen: {lengths}, seqlen_k: {lengths}, head_dim: 64, heads: 2}}\n"
    start = time.perf_counter()
    with pytest.raises(SearchSpaceError, match="expands to more than"):
        parse_space(huge, "big.yaml")
    assert time.perf_counter() - start < 2
    many = BASE + f"presets:\n  p:\n    problems:\n      - {{seqlen: {lengths[:90]}, seqlen_k: {lengths[:90]}, head_dim: 64, heads: 2}}\n"
    start = time.perf_counter()
    assert len(parse_space(many, "many.yaml").presets["p"].problems) == 8100
    assert time.perf_counter() - start < 10


def test_decode_space_and_presets():
    """search_spaces/decode.yaml: KV-cache problems (bottom-right causal), decode configs only,
    every serving problem has configs on Hopper and in the interpreter; fixed splits only
    (balanced ones lost on every uniform row measured; they stay valid named configs)."""
    from fa_autotune.spec.space import load_space

    space = load_space("decode")
    assert space.name == "attn_decode"
    serving = space.presets["serving"].problems
    assert len(serving) == 18 and all(p.decode for p in serving)
    assert {p.page_size for p in serving} == {0, 16, 128}
    spec = space.presets["speculative"].problems
    assert all(p.causal and p.causal_align == "bottom_right" and p.seqlen_q == 4 for p in spec)
    for arch in ("sm90", "interpreter"):
        resolved = space.for_arch(arch)
        for problem in serving[:3] + spec[:1]:
            grid = _kernels(resolved, problem)
            assert grid and all(c.loop_order == "decode" for c in grid)
            assert all(c.num_splits * c.BLOCK_N <= problem.seqlen_k for c in grid)
            assert not any(c.persistent for c in grid) and any(c.num_splits > 1 for c in grid)
            # TMA for a contiguous cache with 16-byte rows only
            assert {c.access for c in grid} == ({"pointer", "tensor_desc"} if not problem.page_size else {"pointer"})
    odd = Problem(2, 8, 2, 1, 4096, 20, "float16", kind="decode")
    assert {c.access for c in _kernels(space.for_arch("sm90"), odd)} == {"pointer"}
    assert {c.access for c in _kernels(space.for_arch("sm80"), serving[0])} == {"pointer"}


def test_page_size_only_in_decode_spaces():
    from fa_autotune.errors import SearchSpaceError
    from fa_autotune.spec.space import parse_space

    text = open(__file__.replace("tests/spec/test_space.py", "search_spaces/fwd.yaml")).read()
    text = text.replace("seqlen: 64, head_dim: 32, dtype: float16,", "seqlen: 64, head_dim: 32, dtype: float16, page_size: 16,")
    with pytest.raises(SearchSpaceError, match="page_size"):
        parse_space(text)


def test_backward_space_and_presets():
    space = load_space("bwd")
    assert space.name == "attn_bwd" and space.kind == "bwd"
    problems = space.presets["llm-prefill"].problems
    assert len(problems) == 24 and all(p.backward and p.key.endswith("_bwd") for p in problems)
    for arch in ("sm90", "interpreter"):
        grid = _kernels(space.for_arch(arch), problems[0])
        assert grid and all(c.loop_order == "backward" for c in grid)
        assert {c.dq_atomic for c in grid} == {False, True}
        # the dQ pass has its own shapes, and the built-in default is a point of the grid (so a
        # re-tune measures the incumbent first)
        assert len({c.dq_pass() for c in grid if not c.dq_atomic}) > 1
        capability = None if arch == "interpreter" else (9, 0)
        for problem in (problems[0], Problem(1, 8, 8, 512, 512, 256, "bfloat16", kind="bwd")):
            assert backward_default(problem, capability) in _kernels(space.for_arch(arch), problem), (arch, problem.key)
    # Hopper: the Gluon pass beside the Triton kernels (both built-in defaults are grid points,
    # at D=64 with dQ inside it, at D=128 with the dQ pass), never for fp32
    hopper = space.for_arch("sm90")
    for problem in (problems[0], next(p for p in problems if p.head_dim == 128)):
        grid = _kernels(hopper, problem)
        assert {c.language for c in grid} == {"triton", "gluon"}
        assert {c.dq_atomic for c in grid if c.language == "gluon"} == {False, True}
        for gluon in (True, False):
            assert backward_default(problem, (9, 0), gluon) in grid, (problem.key, gluon)
    fp32 = Problem(1, 8, 8, 512, 512, 64, "float32", kind="bwd")
    assert {c.language for c in _kernels(hopper, fp32)} == {"triton"}


@pytest.mark.parametrize("name, arch", [("fwd", "sm80"), ("bwd", "sm90"), ("decode", "sm90")])
def test_grid_prunes_early_to_the_same_configs(name, arch):
    """The walk drops a branch once a constraint on the parameters set so far fails; the grid
    is the one that checks every constraint on every full combination, in the same order."""
    space = load_space(name).for_arch(arch)
    problem = Problem(2, 32, 8, 1 if name == "decode" else 1000, 1000, 64, "float16", causal=True, kind=name)
    every = []
    for params, active, _ in space._leaves(problem, [()] * len(space.parameters)):
        if space.violated(params, problem) is None:
            try:
                every.append(({n: params[n] for n in active}, Candidate.from_mapping(params, problem.is_fp8)))
            except Exception:
                continue
    assert every and space.grid_rows(problem) == every


def test_fp8_grid_walk_prunes_what_the_leaves_would_refuse():
    """The Hopper FP8 grids (the largest: 65k configs causal at D=128) walk few leaves they
    then throw away: a constraint that fails once its parameters are set drops the branch,
    and Gluon configs do not search the Triton-only tile order (which KernelConfig refuses).
    Here at D=256 without a mask 1.21 leaves a config, where it was 6.4 (the causal D=128
    walk took 14.5 s a problem at tune start on two cores, now 3.5 s). What the walk compiled
    is kept off the space, which stays picklable."""
    space = load_space("fwd").for_arch("sm90")
    problem = Problem(2, 16, 16, 8192, 8192, 256, "float8_e4m3fn", causal=False)
    leaves = space._leaves(problem, space._checks_by_depth())
    rows = space.grid_rows(problem)
    assert len(rows) > 10_000 and len(leaves) <= 1.25 * len(rows)
    small = Problem(1, 2, 2, 256, 256, 64, "float16")
    assert pickle.loads(pickle.dumps(space)).grid(small) == space.grid(small)


GUARDED = BASE.replace("num_warps: [4]", "num_warps: [4, 8]").replace("num_stages: [2]", "num_stages: [2, 3]") \
    .replace("BLOCK_M: [64]", "BLOCK_M: [32, 64]")


def test_grid_keeps_constraints_in_file_order():
    """A constraint listed first still guards the ones after it, though the walk checks each
    as soon as its parameters are set (here the guard reads a later parameter than the
    division it protects); one that cannot be evaluated where the file order reaches it
    still raises, naming it."""
    problem = Problem(1, 2, 2, 64, 64, 64, "float16")
    guarded = parse_space(GUARDED + "  - num_warps != 4 or num_stages > 10\n"
                          "  - BLOCK_M / (num_warps - 4) >= 4\n", "guarded.yaml")
    assert {(c.BLOCK_M, c.num_warps) for c in _kernels(guarded, problem)} == {(32, 8), (64, 8)}
    unguarded = parse_space(GUARDED + "  - BLOCK_M / (num_warps - 4) >= 4\n", "unguarded.yaml")
    with pytest.raises(SearchSpaceError, match="cannot be evaluated"):
        unguarded.grid(problem)


def test_grid_drops_a_branch_once(monkeypatch):
    """A constraint on the first parameters that fails drops its branch: it is evaluated
    once per value there, not once per config under it."""
    from fa_autotune.spec import space as space_module

    space = parse_space(GUARDED.replace("BLOCK_N: [64]", "BLOCK_N: [32]") + "  - BLOCK_M > BLOCK_N\n", "drop.yaml")
    problem = Problem(1, 2, 2, 64, 64, 64, "float16")
    seen = []
    evaluate = space_module.Expression.evaluate
    monkeypatch.setattr(space_module.Expression, "evaluate",
                        lambda self, env: seen.append((self.text, env.get("num_warps"))) or evaluate(self, env))
    assert {c.BLOCK_M for c in _kernels(space, problem)} == {64} and len(space.grid(problem)) == 4
    seen.clear()
    space.grid(problem)
    # once for BLOCK_M 32 (dropped) and once for 64, before num_warps is set; not per config
    assert [w for text, w in seen if text == "BLOCK_M > BLOCK_N"] == [None, None]

"""FP8 quantization of attention inputs: layout, scales, Hadamard rotation, accuracy."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import fa_autotune
from fa_autotune import InputError
from fa_autotune.fp8.hadamard import hadamard_transform, random_hadamard_signs
from fa_autotune.fp8.quantize import FORMATS, SCALINGS, Fp8Inputs, fp8_dtype, quantize_fp8
from fa_autotune.tune.reference import compare, reference_attention
from helpers import make_qkv

HEAD_DIMS = [16, 64, 80, 96, 128, 256]
DEQUANT_TOLERANCE = {"e4m3": 0.05, "e5m2": 0.1}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def expected_inputs(q, k, v, hadamard: bool, seed: int = 0):
    """What dequantization should approximate: the rotated q, k and the plain v."""
    if not hadamard:
        return q.float(), k.float(), v.float()
    signs = random_hadamard_signs(q.shape[-1], seed)
    return hadamard_transform(q, signs), hadamard_transform(k, signs), v.float()


def sylvester(n: int) -> torch.Tensor:
    """The n x n Hadamard matrix by Kronecker products, normalized to be orthonormal."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_outputs_dtype_shape_layout(scaling, fmt):
    # GQA, ragged last blocks, and non-contiguous (B, N, H, D)-transposed inputs.
    q, k, v = make_qkv(2, 4, 2, 40, 70, 32, layout="bnhd")
    fp8 = quantize_fp8(q, k, v, scaling=scaling, fmt=fmt, block_q=16, block_k=32)
    for name, t, ref in (("q", fp8.q, q), ("k", fp8.k, k), ("v", fp8.v, v)):
        assert t.dtype == fp8_dtype(fmt), name
        assert t.shape == ref.shape, name
    assert fp8.q.is_contiguous() and fp8.k.is_contiguous()
    assert fp8.q.stride(3) == 1 and fp8.k.stride(3) == 1
    assert fp8.v.stride(2) == 1
    assert fp8.v.stride(3) == 80  # sequence rows padded to 16 bytes, so TMA can read V at any length
    assert fp8.q_scale.shape == (2, 4, 3)
    assert fp8.k_scale.shape == fp8.v_scale.shape == (2, 2, 3)
    for s in (fp8.q_scale, fp8.k_scale, fp8.v_scale):
        assert s.dtype == torch.float32
        assert bool((s > 0).all()) and bool(torch.isfinite(s).all())
    assert (fp8.scaling, fp8.fmt, fp8.hadamard, fp8.block_q, fp8.block_k, fp8.seed) == (scaling, fmt, True, 16, 32, 0)


@pytest.mark.parametrize("scaling, zero_dims", [("per_tensor", (0, 1, 2)), ("per_head", (2,)), ("per_block", ())])
def test_scale_broadcasting(scaling, zero_dims):
    q, k, v = make_qkv(2, 4, 2, 64, 64, 32)
    fp8 = quantize_fp8(q, k, v, scaling=scaling, block_q=16, block_k=16)
    for s in (fp8.q_scale, fp8.k_scale, fp8.v_scale):
        assert [d for d in range(3) if s.stride(d) == 0] == list(zero_dims)
    if scaling == "per_tensor":
        assert fp8.q_scale.unique().numel() == 1
    if scaling == "per_head":
        assert bool((fp8.q_scale == fp8.q_scale[..., :1]).all())
        assert fp8.q_scale[..., 0].unique().numel() == 8


@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_dequantize_error_small(scaling, fmt, hadamard):
    q, k, v = make_qkv(1, 4, 2, 50, 70, 64, dtype=torch.float32)
    fp8 = quantize_fp8(q, k, v, scaling=scaling, fmt=fmt, hadamard=hadamard, block_q=16, block_k=32)
    for name, got, ref in zip("qkv", fp8.dequantize(), expected_inputs(q, k, v, hadamard)):
        assert got.dtype == torch.float32
        err = rel_err(got, ref)
        assert err < DEQUANT_TOLERANCE[fmt], f"{name}: relative error {err:.4f}"


def test_dequantize_matches_documented_contract():
    q, k, v = make_qkv(1, 2, 1, 40, 40, 32)
    fp8 = quantize_fp8(q, k, v, block_q=16, block_k=32)
    dq = fp8.dequantize()
    for x8, scale, block, got in ((fp8.q, fp8.q_scale, 16, dq[0]), (fp8.v, fp8.v_scale, 32, dq[2])):
        for n in (0, 15, 16, 39):
            torch.testing.assert_close(got[0, 0, n], x8[0, 0, n].float() * scale[0, 0, n // block], rtol=0, atol=0)


def test_per_block_scales_track_block_magnitude():
    n, d, block = 64, 32, 16
    magnitude = 2.0 ** torch.arange(n // block).repeat_interleave(block)
    k = torch.ones(1, 1, n, d) * magnitude[:, None]
    fp8 = quantize_fp8(k, k, k, scaling="per_block", hadamard=False, block_q=block, block_k=block)
    torch.testing.assert_close(fp8.k_scale[0, 0], 2.0 ** torch.arange(4.0) / 448)
    per_tensor = quantize_fp8(k, k, k, scaling="per_tensor", hadamard=False, block_k=block)
    assert per_tensor.k_scale.unique().numel() == 1


def test_per_block_scales_differ_after_hadamard():
    q, k, v = make_qkv(1, 1, 1, 64, 64, 64, dtype=torch.float32)
    k[:, :, 32:] *= 10
    fp8 = quantize_fp8(q, k, v, scaling="per_block", block_k=32)
    ratio = float(fp8.k_scale[0, 0, 1] / fp8.k_scale[0, 0, 0])
    assert 5 < ratio < 20


@pytest.mark.parametrize("d", HEAD_DIMS + [24, 3])
def test_hadamard_preserves_scores(d):
    q, k, _ = make_qkv(2, 2, 2, 32, 48, d, dtype=torch.float32)
    signs = random_hadamard_signs(d, seed=7)
    rotated = hadamard_transform(q, signs) @ hadamard_transform(k, signs).transpose(-1, -2)
    torch.testing.assert_close(rotated, q @ k.transpose(-1, -2), rtol=1e-4, atol=1e-4 * math.sqrt(d))


@pytest.mark.parametrize("d", HEAD_DIMS + [24, 3])
def test_hadamard_is_an_involution_and_keeps_norms(d):
    x = torch.randn(3, 5, d)
    torch.testing.assert_close(hadamard_transform(hadamard_transform(x)), x, rtol=1e-5, atol=1e-5)
    signed = hadamard_transform(x, random_hadamard_signs(d, seed=1))
    torch.testing.assert_close(signed.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d, block", [(16, 16), (64, 64), (96, 32), (80, 16)])
def test_hadamard_is_block_diagonal_sylvester(d, block):
    eye = torch.eye(d)
    expected = torch.block_diag(*[sylvester(block)] * (d // block))
    torch.testing.assert_close(hadamard_transform(eye), expected, rtol=0, atol=1e-6)


def test_hadamard_spreads_an_outlier():
    x = torch.zeros(128)
    x[5] = 100.0
    y = hadamard_transform(x, random_hadamard_signs(128))
    torch.testing.assert_close(y.abs(), torch.full((128,), 100.0 / math.sqrt(128)))


def test_hadamard_transform_rejects_wrong_signs():
    with pytest.raises(InputError, match="signs must have shape"):
        hadamard_transform(torch.randn(4, 16), torch.ones(8))


def test_random_signs_are_plus_minus_one_and_seeded():
    s = random_hadamard_signs(256, seed=3)
    assert s.dtype == torch.float32 and bool((s.abs() == 1).all())
    assert torch.equal(s, random_hadamard_signs(256, seed=3))
    assert not torch.equal(s, random_hadamard_signs(256, seed=4))


@pytest.mark.parametrize("scaling", SCALINGS)
def test_all_zero_inputs(scaling):
    z = torch.zeros(1, 2, 20, 16, dtype=torch.float16)
    fp8 = quantize_fp8(z, z, z, scaling=scaling, block_q=16, block_k=16)
    for x8, scale in ((fp8.q, fp8.q_scale), (fp8.k, fp8.k_scale), (fp8.v, fp8.v_scale)):
        assert bool((x8.float() == 0).all())
        assert bool(torch.isfinite(scale).all()) and bool((scale > 0).all())
    assert all(bool((t == 0).all()) for t in fp8.dequantize())


def test_zero_block_among_nonzero_blocks():
    q, k, v = make_qkv(1, 1, 1, 32, 32, 16, dtype=torch.float32)
    v[:, :, :16] = 0
    fp8 = quantize_fp8(q, k, v, block_k=16)
    assert float(fp8.v_scale[0, 0, 0]) == 1.0
    assert bool((fp8.dequantize()[2][:, :, :16] == 0).all())


def test_gqa_shapes():
    q, k, v = make_qkv(2, 8, 2, 130, 200, 64, dtype=torch.bfloat16)
    fp8 = quantize_fp8(q, k, v)
    assert fp8.q.shape == (2, 8, 130, 64) and fp8.k.shape == fp8.v.shape == (2, 2, 200, 64)
    assert fp8.q_scale.shape == (2, 8, 2) and fp8.k_scale.shape == fp8.v_scale.shape == (2, 2, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_input_dtypes_and_device(dtype, device):
    q, k, v = make_qkv(1, 2, 2, 32, 32, 64, dtype=dtype, device=device)
    fp8 = quantize_fp8(q, k, v)
    assert fp8.q.device == q.device and fp8.q_scale.device == q.device
    err = rel_err(fp8.dequantize()[2], v)
    assert err < DEQUANT_TOLERANCE["e4m3"]


def test_same_seed_is_deterministic():
    q, k, v = make_qkv(1, 2, 2, 48, 48, 64)
    a, b = quantize_fp8(q, k, v, seed=11), quantize_fp8(q, k, v, seed=11)
    for x, y in ((a.q, b.q), (a.k, b.k), (a.v, b.v), (a.q_scale, b.q_scale), (a.k_scale, b.k_scale)):
        assert torch.equal(as_bytes(x), as_bytes(y))
    other = quantize_fp8(q, k, v, seed=12)
    assert not torch.equal(as_bytes(a.q), as_bytes(other.q))
    assert torch.equal(as_bytes(a.v), as_bytes(other.v))


def _outlier_inputs(boost: float = 20.0):
    """randn q, k with 4 loud head-dim channels, as LLM activations have."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=gen) for _ in range(3))
    channels = torch.tensor([3, 17, 40, 61])
    q[..., channels] *= boost
    k[..., channels] *= boost
    return q, k, v


def _attention_error(q, k, v, **options) -> float:
    ref, _ = reference_attention(q, k, v, causal=False)
    out, _ = reference_attention(*quantize_fp8(q, k, v, **options).dequantize(), causal=False)
    return compare(out, ref).rel


def test_hadamard_and_block_scaling_tame_outliers():
    q, k, v = _outlier_inputs()
    baseline = _attention_error(q, k, v, scaling="per_tensor", hadamard=False)
    best = _attention_error(q, k, v, scaling="per_block", hadamard=True)
    assert best <= 0.5 * baseline, f"per_block+hadamard {best:.4f} vs per_tensor {baseline:.4f}"


def test_dequantized_attention_is_close_without_outliers():
    # e4m3 keeps 3 mantissa bits; plain randn lands near 0.047, so 0.08 leaves headroom.
    q, k, v = make_qkv(1, 4, 2, 128, 128, 64, dtype=torch.float32)
    assert _attention_error(q, k, v) < 0.08


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda q, k, v: (q[0], k, v), "q must have 4 dims"),
        (lambda q, k, v: (q, k, v[0]), "v must have 4 dims"),
        (lambda q, k, v: (q.numpy(), k, v), "must be a torch.Tensor"),
        (lambda q, k, v: (q, k[..., :16], v[..., :16]), "head_dim differs"),
        (lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])), "batch differs"),
        (lambda q, k, v: (q, k[..., :16], v), "same shape"),
        (lambda q, k, v: (q, k[:, [0, 1, 0]], v[:, [0, 1, 0]]), "multiple of heads_kv"),
        (lambda q, k, v: (q.to(torch.int32), k, v), "dtype torch.int32"),
        (lambda q, k, v: (q.double(), k, v), "dtype torch.float64"),
        (lambda q, k, v: (q.to(torch.float8_e4m3fn), k, v), "dtype torch.float8_e4m3fn"),
        (lambda q, k, v: (q, k, v.to(torch.float8_e5m2)), "v has dtype torch.float8_e5m2"),
        (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]), "k is empty"),
        (lambda q, k, v: (q.to("meta"), k, v), "one device"),
        (lambda q, k, v: (q.index_fill(2, torch.tensor([3]), float("nan")), k, v), "q contains NaN or inf"),
        (lambda q, k, v: (q, k, v.index_fill(3, torch.tensor([0]), float("inf"))), "v contains NaN or inf"),
        (lambda q, k, v: (q.float(), k.float().index_fill(2, torch.tensor([0]), 3e38), v.float()), "k overflows float32"),
    ],
)
def test_bad_tensors(mutate, message):
    q, k, v = make_qkv(1, 4, 2, 16, 16, 32)
    with pytest.raises(InputError, match=message):
        quantize_fp8(*mutate(q, k, v))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"scaling": "per_row"}, "scaling must be one of per_tensor, per_head, per_block; got 'per_row'"),
        ({"fmt": "e3m4"}, "fmt must be one of e4m3, e5m2; got 'e3m4'"),
        ({"block_q": 48}, "block_q must be a power of two >= 16, got 48"),
        ({"block_q": 8}, "block_q must be a power of two >= 16"),
        ({"block_k": 0}, "block_k must be a power of two"),
        ({"block_k": -64}, "block_k must be a power of two"),
        ({"block_k": 64.0}, "block_k must be a power of two"),
        ({"block_q": True}, "block_q must be a power of two"),
        ({"hadamard": "yes"}, "hadamard must be True or False"),
        ({"seed": 1.5}, "seed must be an int"),
    ],
)
def test_bad_options(options, message):
    q, k, v = make_qkv(1, 4, 2, 16, 16, 32)
    with pytest.raises(InputError, match=message):
        quantize_fp8(q, k, v, **options)


def test_fp8_dtype():
    assert fp8_dtype("e4m3") == torch.float8_e4m3fn
    assert fp8_dtype("e5m2") == torch.float8_e5m2
    with pytest.raises(InputError, match="e4m3, e5m2"):
        fp8_dtype("int8")


def test_result_is_frozen_and_exported_lazily():
    q, k, v = make_qkv(1, 1, 1, 16, 16, 16)
    fp8 = quantize_fp8(q, k, v)
    assert isinstance(fp8, Fp8Inputs)
    with pytest.raises(AttributeError):
        fp8.seed = 1
    assert fa_autotune.quantize_fp8 is quantize_fp8
    assert "quantize_fp8" in fa_autotune.__all__


def _same_quantization(a: Fp8Inputs, b: Fp8Inputs) -> None:
    """Equal scales; FP8 codes equal but for rare one-step differences from float32 summation
    order (a value on a rounding boundary)."""
    for name in ("q_scale", "k_scale", "v_scale"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=0)
    for name in ("q", "k", "v"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride(), name
        diff = (x.float() - y.float()).abs()
        step = x.float().abs().clamp_min(2 ** -6) * 2 ** -2  # one e5m2 step bounds one e4m3 step
        assert bool((diff <= step).all()), name
        assert float((diff > 0).float().mean()) < 0.01, name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scaling", SCALINGS)
def test_fused_kernels_match_the_eager_path(scaling, fmt, hadamard, dtype):
    """The Triton passes (run here by the interpreter) against the float32 reference path:
    GQA, ragged blocks, a (B, N, H, D) layout, a V whose head dim is not contiguous, and
    an outlier channel."""
    q, k, _ = make_qkv(2, 4, 2, 100, 70, 64, dtype=dtype, layout="bnhd")
    v = torch.randn(2, 2, 64, 70, dtype=dtype).transpose(2, 3)
    q[..., 5] *= 20
    args = dict(scaling=scaling, fmt=fmt, hadamard=hadamard, block_q=64, block_k=32)
    _same_quantization(quantize_fp8(q, k, v, backend="triton", **args), quantize_fp8(q, k, v, backend="torch", **args))


@pytest.mark.parametrize("d, block", [(80, 16), (96, 128), (32, 256), (200, 256), (256, 128), (192, 32), (264, 64)])
def test_fused_kernels_odd_head_dims_and_block_sizes(d, block):
    q, k, v = make_qkv(1, 2, 2, 300, 300, d)
    args = dict(block_q=block, block_k=block)
    _same_quantization(quantize_fp8(q, k, v, backend="triton", **args), quantize_fp8(q, k, v, backend="torch", **args))


def test_fused_kernels_reject_nan_and_float32():
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32)
    k[0, 1, 7, 3] = float("nan")
    with pytest.raises(InputError, match="k contains NaN or inf"):
        quantize_fp8(q, k, v, backend="triton")
    with pytest.raises(InputError, match="float16 or bfloat16"):
        quantize_fp8(q.float(), k.float(), v.float(), backend="triton")
    with pytest.raises(InputError, match="backend must be one of"):
        quantize_fp8(q, q, q, backend="cuda")


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_finite_check_can_be_skipped(backend):
    """attention_fp8 quantizes without the host-device sync the NaN scan costs."""
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32)
    v[0, 0, 3, 1] = float("inf")
    with pytest.raises(InputError, match="v contains NaN or inf"):
        quantize_fp8(q, k, v, backend=backend)
    x = quantize_fp8(q, k, v, backend=backend, check_finite=False)
    assert not bool(torch.isfinite(x.v_scale).all())


def test_fused_backend_names_what_it_needs_without_a_gpu(tmp_path):
    """Outside the interpreter, CPU tensors cannot take the Triton passes: say so."""
    import os
    import subprocess
    import sys

    code = ("import torch, fa_autotune\n"
            "x = torch.randn(1, 1, 16, 16, dtype=torch.float16)\n"
            "try:\n    fa_autotune.quantize_fp8(x, x, x, backend='triton')\n"
            "except fa_autotune.InputError as exc:\n    print(exc)\n"
            "print(fa_autotune.quantize_fp8(x, x, x).q.dtype)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "backend='triton' needs CUDA tensors" in result.stdout
    assert result.stdout.strip().endswith("torch.float8_e4m3fn")  # "auto" takes the torch path on the CPU


def test_per_block_scaling_is_one_launch_per_tensor(monkeypatch):
    """Per-block scaling (the default recipe) runs one kernel per tensor that takes each
    block's maximum and then casts it; per-tensor and per-head still take the maxima pass."""
    from fa_autotune.fp8 import kernels

    launches = []
    for name in ("chunk_amax", "scale_cast", "quantize_blocks"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _real=real, _name=name, **kw: launches.append(_name)
                            or _real(*a, **kw))
    q, k, v = make_qkv(1, 2, 2, 100, 100, 64)
    quantize_fp8(q, k, v, backend="triton", block_q=64, block_k=32)
    assert launches == ["quantize_blocks"] * 3
    launches.clear()
    quantize_fp8(q, k, v, backend="triton", scaling="per_head")
    assert launches == ["chunk_amax", "scale_cast"] * 3


@pytest.mark.parametrize("block", [128, 256])
@pytest.mark.parametrize("v_order", ["natural", "wgmma"])
def test_transposed_v_at_d128_goes_in_64_row_pieces(v_order, block, monkeypatch):
    """V's sequence-contiguous output at D=128 is written from 64-row pieces (the transpose
    of a whole 128- or 256-row tile was the slow part on an H100), each block's maximum
    taken over its pieces before any is cast: the same codes and descales as the eager
    path, ragged last block included."""
    from fa_autotune.fp8 import kernels

    assert kernels.block_launch(block, 128, rotate=False, transposed=True)[:2] == (64, 4)
    assert kernels.block_launch(block, 128, rotate=False).rows == block
    assert kernels.block_launch(64, 128, rotate=False, transposed=True).rows == 64
    q, k, v = make_qkv(1, 2, 2, 64, 400, 128)
    v[:, :, 3] *= 30  # one loud key: its block's descale differs from the others'
    args = dict(block_q=64, block_k=block, v_order=v_order)
    launches, block_launch = [], kernels.block_launch

    def spy(*a, **kw):
        launches.append(block_launch(*a, **kw))
        return launches[-1]

    monkeypatch.setattr(kernels, "block_launch", spy)
    fused = quantize_fp8(q, k, v, backend="triton", **args)
    assert [launch.rows for launch in launches] == [64, block, 64]  # q, k whole; v in pieces
    _same_quantization(fused, quantize_fp8(q, k, v, backend="torch", **args))


@pytest.mark.parametrize("scaling", ["per_head", "per_block"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_v_in_the_wgmma_order(backend, scaling):
    """v_order='wgmma': each key of v sits at its wgmma position (within each 16, key
    8a + 2c + b at 4c + 2a + b), written so by the fused passes and the eager path alike;
    the descales, q, k and the dequantized v are those of the natural order, and the order
    reaches the kernels through scales."""
    from fa_autotune.fp8.quantize import wgmma_positions

    q, k, v = make_qkv(1, 2, 2, 48, 64, 32)
    args = dict(scaling=scaling, block_q=16, block_k=32, backend=backend)
    natural, wgmma = quantize_fp8(q, k, v, v_order="natural", **args), quantize_fp8(q, k, v, v_order="wgmma", **args)
    positions = wgmma_positions(64)
    assert positions[:16].tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
    assert sorted(positions.tolist()) == list(range(64)) and positions[16:32].tolist() == (positions[:16] + 16).tolist()
    assert wgmma.v.stride(2) == 1 and wgmma.v.shape == natural.v.shape
    assert torch.equal(wgmma.v[:, :, positions].float(), natural.v.float())
    assert not torch.equal(wgmma.v.float(), natural.v.float())
    for a, b in zip(wgmma.dequantize(), natural.dequantize()):
        assert torch.equal(a, b)
    assert (wgmma.v_order, wgmma.scales[5], natural.scales[5]) == ("wgmma", True, False)


def test_v_order_errors():
    q, k, v = make_qkv(1, 2, 2, 40, 40, 32)
    with pytest.raises(InputError, match="multiple of 16"):
        quantize_fp8(q, k, v, v_order="wgmma")
    with pytest.raises(InputError, match="v_order must be one of natural, wgmma"):
        quantize_fp8(q, k, v, v_order="sorted")
    x = quantize_fp8(q, k, v)
    assert x.v_order == "natural"
    with pytest.raises(InputError, match="multiple of 16"):
        dataclasses.replace(x, v_order="wgmma")


def test_kernel_entry_points_refuse_the_wgmma_order_on_ragged_keys():
    """The kernels mask the wgmma order by position (the key's group of 16): called directly
    with keys that are not a multiple of 16 they refuse instead of reading past the end."""
    from fa_autotune.fp8 import kernels
    from fa_autotune.fp8.quantize import _fp8_like

    v = torch.randn(1, 2, 100, 32, dtype=torch.float16)
    out = _fp8_like(v.shape, v.device, torch.float8_e4m3fn, True)
    with pytest.raises(InputError, match="multiple of 16"):
        kernels.quantize_blocks(v, None, 64, 448.0, out, wgmma_order=True)
    with pytest.raises(InputError, match="multiple of 16"):
        kernels.scale_cast(v, None, torch.ones(1, 2, 2), 64, 448.0, out, wgmma_order=True)

"""The tensor-core kernel for 2..64 activation rows times an MXFP8, MXFP6, MXFP4 or MXINT8 weight
in the standard layout (torchmx/kernels/linear/mma_linear.py) and its dispatch from fused_linear.

On CPU it runs under Triton's interpreter (conftest sets it): tl.loads, the exact fp32 decode
times the kernel's own multipliers (so the same pieces are poisoned and the same programs take
the exact recomputation), and an fp32 dot in the kernel's permuted column order. On an H100 the
same tests run the inline-PTX loads, the bf16 decode and wgmma, plus real sizes. Exact checks
use operands whose every fp32 sum is exact, or outputs that are one product alone, so any
accumulation order must give the reference's bits.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from torchmx import MXTensor, dtypes
from torchmx.kernels.linear import mma_linear, dispatch as km
from torchmx.kernels.layouts import mma_layout
from torchmx.mx_ops import weight_matmul

from covering import all_pairs
from matmul_operands import (DEVICE, assert_graph_replay_matches_eager,
                             assert_within_fp32_accumulation, integer_operands,
                             one_product_per_row, reference)

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)
FP8 = ["float8_e4m3", "float8_e5m2"]
FP6 = ["float6_e2m3", "float6_e3m2"]
FORMATS = FP8 + FP6 + ["float4_e2m1", "int8"]
MmaConfig = mma_linear.MmaConfig
# Tiles of 64 / 128 rows and 64-256 bytes of a row, one and two steps ahead, K in 1-3 parts.
CONFIGS = [MmaConfig(1, 1, 1, 1), MmaConfig(1, 2, 3, 2), MmaConfig(2, 1, 2, 1),
           MmaConfig(1, 4, 1, 2)]

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(CUDA and not HOPPER, reason="the kernel needs sm_90")]


def _mma(x, w, bias=None, config=None, out_dtype=None):
    return mma_linear.mma_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, bias,
                                 out_dtype or x.dtype, config)


def _unit(fmt):
    """The codes of a row in a unit: a step of u units spans u times as many columns."""
    return mma_linear.UNITS[dtypes.from_name(fmt).codes_per_group][0]


@pytest.mark.parametrize("fmt,config,M,N,units", all_pairs(
    FORMATS, CONFIGS, [(16, 128, 4), (2, 128, 8), (33, 256, 4), (64, 128, 12)]), ids=str)
def test_exact_on_exact_sums(fmt, config, M, N, units):
    """Whole and partial activation tiles (M of 16, 32, 64 rows), K in 1-12 steps, split or
    not, odd and even step counts (the unrolled one-ahead loop's extra step)."""
    x, w = integer_operands(fmt, M, N, units * _unit(fmt))
    bias = torch.randint(-8, 9, (N,)).to(torch.bfloat16).to(DEVICE)
    out = _mma(x, w, bias, config)
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=0, atol=0)
    torch.testing.assert_close(_mma(x, w, None, config), reference(x, w), rtol=0, atol=0)


@pytest.mark.parametrize("fmt,block_size", [("float8_e4m3", b) for b in (16, 32, 64, 128, 256)]
                         + [("float4_e2m1", b) for b in (32, 64, 128, 256)]
                         + [(f, b) for f in FP6 for b in (32, 64, 256)]
                         + [("int8", b) for b in (32, 256)])
def test_block_sizes_and_fp32_output(fmt, block_size):
    unit = _unit(fmt)
    K = max(2 * block_size, 4 * unit)
    x, w = integer_operands(fmt, 5, 64, K, block_size=block_size)
    out = _mma(x, w, None, MmaConfig(1, max(1, block_size // unit), 2), torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x.float() @ w.dequantize(torch.float32).t(), rtol=0, atol=0)


# Random tiles beside the fixed ones above: 20 on a GPU, 8 under the interpreter (where the fixed
# cases already run every format, config and partial tile, at a second a case).
@settings(max_examples=20 if CUDA else 8, deadline=None)
@given(fmt=st.sampled_from(FORMATS), M=st.integers(2, 64), tiles_n=st.integers(1, 3),
       steps=st.integers(1, 5), v=st.sampled_from([1, 2]), u=st.sampled_from([1, 2]),
       split=st.integers(1, 4), ahead=st.sampled_from([1, 2]), seed=st.integers(0, 99),
       pieces=st.booleans())
def test_any_tile_is_exact(fmt, M, tiles_n, steps, v, u, split, ahead, seed, pieces):
    """On the standard layout, or on the MMA layout (mma_layout.py; not MXFP4) with the
    split-K sum in the kernel."""
    N, K = 64 * v * tiles_n, u * steps * _unit(fmt)
    x, w = integer_operands(fmt, M, N, K, seed=seed)
    parts = None
    if pieces and w.elem_dtype in mma_layout.FORMATS:
        parts = (*mma_layout.pack(w._scale_e8m0, w._data, w.elem_dtype),
                 torch.zeros(N // 64, dtype=torch.int32, device=DEVICE))
    out = mma_linear.mma_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, None,
                                x.dtype, MmaConfig(v, u, split, ahead), parts)
    torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_within_fp32_accumulation(fmt):
    torch.manual_seed(3)
    x = torch.randn(7, 512, dtype=torch.bfloat16, device=DEVICE)
    w = MXTensor.to_mx(torch.randn(128, 512, device=DEVICE) * 4, fmt, 32)
    bias = torch.randn(128, dtype=torch.bfloat16, device=DEVICE)
    assert_within_fp32_accumulation(_mma(x, w, bias, MmaConfig(1, 2, 2)), x, w, bias)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code(fmt):
    """Every code decodes exactly (NaN codes to NaN, e5m2's Inf codes to Inf, and Inf * 0 to
    NaN), at every byte (and nibble) of a word and every piece of a step; the programs that
    meet a NaN or Inf code recompute their tiles exactly."""
    codes = torch.arange(256) % (1 << dtypes.from_name(fmt).bits)
    x, w = one_product_per_row(fmt, codes, torch.full((256,), 127))
    out = _mma(x, w, None, MmaConfig(1, 2, 2), torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    assert expected.isnan().any() == (fmt in FP8) and expected.isinf().any() == (fmt == FP8[1])
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fmt,code", [("float8_e4m3", 0x01), ("float8_e4m3", 0x3A),
                                      ("float8_e4m3", 0x7E), ("float8_e5m2", 0x01),
                                      ("float8_e5m2", 0x3B), ("float8_e5m2", 0x7B),
                                      ("float6_e2m3", 0x01), ("float6_e2m3", 0x2A),
                                      ("float6_e2m3", 0x1F), ("float6_e3m2", 0x01),
                                      ("float6_e3m2", 0x2D), ("float6_e3m2", 0x1F),
                                      ("float4_e2m1", 0x1), ("float4_e2m1", 0xB),
                                      ("float4_e2m1", 0x7), ("int8", 0x01), ("int8", 0x7F),
                                      ("int8", 0x80)])
def test_every_scale(fmt, code):
    """Every scale byte, in and outside FAST_SCALES, for the smallest subnormal code (the lower
    end of FAST_SCALES: below it its product leaves bf16's range), a middle one and the
    largest (the upper end: the multiplier leaves bf16's normal range): 0 (2**-127), 254 and
    255 (NaN)."""
    x, w = one_product_per_row(fmt, torch.full((256,), code), torch.arange(256))
    out = _mma(x, w, None, MmaConfig(2, 2, 1), torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    assert out[0, 255].isnan() and out[0, 0] != 0


_POISONS = ["nan code", "inf code", "tiny scale", "huge scale", "nan scale", "nan x"]


@pytest.mark.parametrize("fmt,poison", [(f, p) for f in FP8 for p in _POISONS]
                         + [(f, p) for f in FP6 + ["float4_e2m1"]
                            for p in ("huge scale", "nan scale", "nan x")]
                         + [("int8", p) for p in ("tiny scale", "nan scale", "nan x")])
def test_poisoned_pieces_recompute_exactly(fmt, poison):
    """One piece off the fast path among ordinary ones (fp6, e2m1 and MXINT8 have no NaN or Inf
    code; the fast path of fp6 and e2m1 holds every scale up to 2**1 / 2**3 (e3m2), MXINT8's
    every one from 2**-120):
    its program recomputes its whole tile exactly, the other outputs of that tile included, and
    the other programs are untouched."""
    x, w = integer_operands(fmt, 16, 256, 512)
    scale, data = w._scale_e8m0.clone(), w._data.clone()
    fmt_ = dtypes.from_name(fmt)

    def byte(code):  # the byte of W's row that holds the code (fp4 two a byte, fp6 4 in 3)
        return code * fmt_.bytes_per_group // fmt_.codes_per_group

    if poison == "nan code":
        data[70, 100] = 0x7F
    elif poison == "inf code":
        data[70, 100] = 0x7C if fmt == "float8_e5m2" else 0x7F
        x[3, 100] = 0  # Inf * 0 (or NaN * 0): NaN in that output only for Inf
    elif poison.endswith("scale"):
        # row 70 keeps only block 3 (multiples of 64 codes' units), so its sums stay exact
        data[70, :byte(96)] = 0
        data[70, byte(128):] = 0
        scale[70, 3] = {"tiny scale": 1, "huge scale": 150, "nan scale": 255}[poison]
    else:
        x[5, 300] = float("nan")
    w = w._replace(scale, data)
    out = _mma(x, w, None, MmaConfig(1, 2, 2), torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


def test_empty_and_ineligible_shapes_take_the_other_kernels(monkeypatch):
    """N or K of 0, N or K off the 64-grid (K off the 128-grid for fp4 and fp6), one row (but
    fp6), fp16 or strided x: `eligible` refuses them and fused_linear (for fp6, whose few rows
    the fused kernel does not take, the dispatch) gives the same result through the other
    kernels."""
    monkeypatch.setattr(mma_linear.MmaPlan, "__call__", None)  # not called
    bf16, fp16 = torch.bfloat16, torch.float16
    for fmt, M, N, K, dtype in [
            ("float8_e4m3", 4, 0, 64, bf16), ("float8_e4m3", 4, 64, 0, bf16),
            ("float8_e4m3", 4, 96, 128, bf16), ("float8_e4m3", 4, 64, 96, bf16),
            ("float8_e4m3", 1, 64, 128, bf16), ("float8_e4m3", 4, 64, 128, fp16),
            ("float4_e2m1", 4, 64, 64, bf16), ("float4_e2m1", 4, 64, 192, bf16),
            ("float4_e2m1", 4, 96, 256, bf16), ("float4_e2m1", 1, 64, 256, bf16),
            ("float6_e2m3", 4, 64, 64, bf16), ("float6_e3m2", 4, 64, 192, bf16),
            ("float6_e2m3", 4, 96, 256, bf16), ("float6_e3m2", 4, 64, 256, fp16)]:
        x, w = integer_operands(fmt, M, N, K, dtype)
        assert not mma_linear.eligible(x, w._data, w.elem_dtype, w.block_size)
        if fmt.startswith("float6"):
            out = km.linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, K, None,
                            x.dtype)
        else:
            out = km.fused_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, None,
                                  x.dtype)
        torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0)
    x, w = integer_operands("float8_e4m3", 4, 64, 128)
    strided = torch.zeros(4, 256, dtype=x.dtype, device=DEVICE)[:, ::2].copy_(x)
    assert not mma_linear.eligible(strided, w._data, w.elem_dtype, w.block_size)
    assert not mma_linear.eligible(x, w._data, dtypes.float6_e2m3, w.block_size)  # [N, 3 K / 4]
    assert not mma_linear.eligible(x, w._data[:, :64], w.elem_dtype, w.block_size)
    assert not mma_linear.eligible(x, w._data, dtypes.float4_e2m1, w.block_size)  # [N, K / 2]


@pytest.mark.parametrize("fmt", FP6)
def test_one_row_of_fp6_runs_here(fmt, monkeypatch):
    """fp6's one-row kernel is slower than this one (docs/performance.md, twelfth session): one
    activation row of fp6 takes it, other formats keep their one-row kernels."""
    x, w = integer_operands(fmt, 1, 128, 384)
    assert mma_linear.eligible(x, w._data, w.elem_dtype, w.block_size)
    calls = []
    real = mma_linear.MmaPlan.__call__  # the kernel's launches (also a plan's)
    monkeypatch.setattr(mma_linear.MmaPlan, "__call__",
                        lambda self, *args: calls.append(args) or real(self, *args))
    bias = torch.randint(-3, 4, (128,)).to(torch.bfloat16).to(DEVICE)
    out = km.fused_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, bias, x.dtype)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=0, atol=0)
    assert len(calls) == 1


def test_fused_linear_and_mx_linear_dispatch_here(monkeypatch):
    monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})
    calls = []
    real = mma_linear.MmaPlan.__call__  # the kernel's launches (also a plan's)
    monkeypatch.setattr(mma_linear.MmaPlan, "__call__",
                        lambda self, *args: calls.append(args) or real(self, *args))
    x, w = integer_operands("float8_e5m2", 8, 64, 128)
    bias = torch.randint(-3, 4, (64,)).to(torch.bfloat16).to(DEVICE)
    out = km.fused_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, bias, x.dtype)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=0, atol=0)
    assert len(calls) == 1
    torch.testing.assert_close(F.linear(x.view(2, 4, 128), w, bias),
                               reference(x, w, bias).view(2, 4, 64), rtol=0, atol=0)
    assert len(calls) == 2
    # an explicit Config runs the general kernel's variant
    km.fused_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, None, x.dtype,
                    config=km.Config(km.BLOCK_DOTS, 64, 1, 1))
    assert len(calls) == 2
    for n, fmt in enumerate(["float4_e2m1", "int8"] + FP6):
        x, w = integer_operands(fmt, 8, 64, 256)
        torch.testing.assert_close(F.linear(x, w, bias), reference(x, w, bias), rtol=0, atol=0)
        assert len(calls) == 3 + n


@pytest.mark.parametrize("fields,match", [
    (dict(v=3), "v must"), (dict(u=8), "u must"), (dict(split=0), "split"),
    (dict(split=1.5), "split"), (dict(ahead=3), "ahead"), (dict(maxnreg=8), "maxnreg"),
    (dict(maxnreg=128.0), "maxnreg"),
])
def test_config_rejects_impossible_launches(fields, match):
    with pytest.raises(ValueError, match=match):
        MmaConfig(**{**dict(v=1, u=1, split=1), **fields})


def test_bad_calls_name_the_problem():
    x, w = integer_operands("float8_e4m3", 4, 64, 256, block_size=128)
    with pytest.raises(ValueError, match="does not fit"):
        _mma(x, w, None, MmaConfig(1, 1, 1))  # 64 columns a step: less than a block
    with pytest.raises(ValueError, match="does not fit"):
        _mma(x, w, None, MmaConfig(2, 2, 1))  # 128-row tiles of 64 rows
    x1, w1 = integer_operands("float8_e4m3", 1, 64, 128)
    with pytest.raises(ValueError, match="eligible"):
        _mma(x1, w1)


def test_default_config():
    cpu = torch.device("cpu")  # _common.sm_count: 8 "SMs"
    e4m3, e2m1 = dtypes.float8_e4m3, dtypes.float4_e2m1

    def default(fmt, M, N, K, block_size=32):
        return mma_linear.default_config(fmt, M, N, K, block_size, cpu)

    # up to 16 rows: 4 programs an SM under a 128-register cap
    assert default(e4m3, 16, 8192, 8192) == MmaConfig(1, 2, 1, maxnreg=128)
    assert default(e4m3, 16, 128, 8192) == MmaConfig(1, 2, 16, maxnreg=128)
    assert default(e4m3, 16, 128, 192) == MmaConfig(1, 1, 3, maxnreg=128)
    assert default(e4m3, 16, 128, 1024, 256).u == 4  # a step holds a block
    # 32 rows: 3 programs an SM under a 168-register cap; 64 rows: 2 an SM
    assert default(e4m3, 32, 128, 8192) == MmaConfig(1, 2, 12, maxnreg=168)
    assert default(e4m3, 64, 128, 8192) == MmaConfig(1, 2, 8)
    assert default(e4m3, 64, 192, 8192) == MmaConfig(1, 2, 5)
    assert default(dtypes.int8, 32, 128, 8192) == MmaConfig(1, 2, 12, maxnreg=168)  # as fp8
    # fp4: 256 columns (128 bytes of a row) a step and 2 programs an SM up to 32 rows, 128 at
    # 64 rows; fewer where they do not divide K, at least a block
    assert default(e2m1, 16, 128, 8192) == MmaConfig(1, 2, 8)
    assert default(e2m1, 32, 128, 384) == MmaConfig(1, 1, 3)
    assert default(e2m1, 64, 128, 8192) == MmaConfig(1, 1, 8)
    assert default(e2m1, 64, 128, 1024, 256).u == 2
    e3m3 = dtypes.ExMy(3, 3)
    with pytest.raises(ValueError, match=e3m3.name):
        default(e3m3, 16, 128, 8192)
    with pytest.raises(ValueError, match="K must be a positive multiple of 128"):
        default(e2m1, 16, 128, 192)


# ---------------------------------------------------------------------------- GPU only

gpu = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU")


@gpu
@pytest.mark.parametrize("fmt,M,N,K", [
    (fmt, *shape) for fmt in FORMATS
    for shape in [(16, 8192, 8192), (2, 4096, 14336), (24, 8192, 8192), (64, 14336, 4096),
                  (33, 1024, 4096 + _unit(fmt))]])
def test_gpu_real_sizes(fmt, M, N, K):
    torch.manual_seed(N + M)
    w = MXTensor.to_mx(torch.randn(N, K, device="cuda"), fmt, 32)
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(N, dtype=torch.bfloat16, device="cuda")
    out = _mma(x, w, bias)
    assert_within_fp32_accumulation(out, x, w, bias)
    assert torch.equal(_mma(x, w, bias), out)  # the split-K sums are added in a fixed order
    xi, wi = integer_operands(fmt, M, N, K)
    torch.testing.assert_close(_mma(xi, wi), reference(xi, wi), rtol=0, atol=0)


@gpu
def test_gpu_cuda_graph_capture():
    w = MXTensor.to_mx(torch.randn(512, 1024, device="cuda"), "float8_e4m3", 32)
    x = torch.randn(16, 1024, dtype=torch.bfloat16, device="cuda")
    assert_graph_replay_matches_eager(lambda: _mma(x, w))

"""The one-row kernel of one-byte codes (MXFP8 e4m3 / e5m2, MXINT8; torchmx/kernels/
byte_gemv.py) and its dispatch from fused_linear.

On CPU it runs under Triton's interpreter (conftest sets it), which loads through tl.load and
decodes by bit arithmetic; on a CUDA machine the same tests run the inline-PTX loads, the
hardware fp8 conversions and the int8 decode, plus real sizes. Exact checks use operands whose
every fp32 sum is exact, so any accumulation order must give the reference's bits.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from torchmx import MXTensor
from torchmx.kernels.linear import byte_gemv, dispatch as km
from torchmx.mx_ops import weight_matmul

from covering import all_pairs
from matmul_operands import (DEVICE, assert_graph_replay_matches_eager,
                             assert_within_fp32_accumulation, integer_operands, reference)

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu  # the kernels run on the GPU where there is one
FP8 = ["float8_e4m3", "float8_e5m2"]
BYTE_FORMATS = FP8 + ["int8"]
GemvConfig = byte_gemv.GemvConfig
# Small tiles for small shapes: several steps, 1-4 warps, K split in 1-3 parts.
CONFIGS = [GemvConfig(4, 2, 1), GemvConfig(8, 4, 4, 3), GemvConfig(2, 8, 2, 2),
           GemvConfig(16, 2, 4)]


def _gemv(x, w, bias=None, config=None, out_dtype=None):
    return byte_gemv.byte_gemv(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, bias,
                               out_dtype or x.dtype, config)


@pytest.mark.parametrize("fmt,dtype,config,N,K", all_pairs(
    BYTE_FORMATS, [torch.bfloat16, torch.float16], CONFIGS,
    [(16, 256), (13, 96), (5, 304), (1, 32)]), ids=str)
def test_exact_on_exact_sums(fmt, dtype, config, N, K):
    """Whole and partial row tiles (N % block_n), whole and partial steps (K % 16 pieces)."""
    x, w = integer_operands(fmt, 1, N, K, dtype)
    bias = torch.randint(-8, 9, (N,)).to(dtype).to(DEVICE)
    out = _gemv(x, w, bias, config)
    assert out.dtype == dtype and out.shape == (1, N)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=0, atol=0)
    torch.testing.assert_close(_gemv(x, w, None, config), reference(x, w), rtol=0, atol=0)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
def test_block_sizes_and_fp32_output(block_size):
    x, w = integer_operands("float8_e4m3", 1, 12, 2 * block_size + 32, block_size=block_size)
    out = _gemv(x, w, None, GemvConfig(8, max(2, block_size // 16), 2, 2), torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# Random tiles beside the fixed ones above: 12 on a GPU, 6 under the interpreter (where the fixed
# cases already run every format, dtype and config, at a second a case).
@settings(max_examples=12 if CUDA else 6, deadline=None)
@given(fmt=st.sampled_from(BYTE_FORMATS), N=st.integers(1, 24), pieces_k=st.integers(1, 24),
       block_n=st.sampled_from([1, 2, 4, 8]), pieces=st.sampled_from([2, 4, 8]),
       warps=st.sampled_from([1, 2, 4]), split=st.integers(1, 4), seed=st.integers(0, 99))
def test_any_tile_is_exact(fmt, N, pieces_k, block_n, pieces, warps, split, seed):
    K = 16 * pieces_k + (16 if pieces_k % 2 else 0)  # whole blocks of 32
    x, w = integer_operands(fmt, 1, N, K, seed=seed)
    out = _gemv(x, w, None, GemvConfig(block_n, pieces, warps, split))
    torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_random_within_fp32_accumulation(fmt, dtype):
    torch.manual_seed(3)
    x = torch.randn(1, 288, dtype=dtype, device=DEVICE)
    w = MXTensor.to_mx(torch.randn(37, 288, device=DEVICE) * 4, fmt, 32)
    bias = torch.randn(37, dtype=dtype, device=DEVICE)
    assert_within_fp32_accumulation(_gemv(x, w, bias, GemvConfig(8, 4, 4, 2)), x, w, bias)


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
def test_special_values(fmt):
    """A NaN scale byte or an fp8 NaN code makes its row NaN, e5m2's Inf codes give Inf, the
    largest scale overflows the sum to Inf, and the smallest (2**-127) is exact (for MXINT8
    the codes' 2**-6 joins it: 2**-133, still exact in fp32)."""
    N, K = 6, 64
    x = torch.ones(1, K, dtype=torch.bfloat16, device=DEVICE)
    w = MXTensor.to_mx(torch.ones(N, K, device=DEVICE), fmt, 32)
    scale, data = w._scale_e8m0.clone(), w._data.clone()
    scale[0, 1] = 255
    data[1, 5] = 0x7F  # NaN in both fp8 formats, 127 / 64 in MXINT8
    scale[2, :] = 254
    scale[3, :] = 0
    if fmt == "float8_e5m2":
        data[4, 7] = 0x7C  # +Inf
        data[5, 9] = 0xFC  # -Inf
    w = w._replace(scale, data)
    out = _gemv(x, w, None, GemvConfig(2, 2, 1)).float()[0]
    ref = reference(x, w).float()[0]
    assert out[0].isnan() and out[2] == float("inf")
    assert out[1].isnan() if fmt != "int8" else out[1] == ref[1]
    torch.testing.assert_close(out[3], ref[3], rtol=0, atol=0)
    if fmt == "float8_e5m2":
        assert out[4] == float("inf") and out[5] == float("-inf")


@pytest.mark.parametrize("fmt", BYTE_FORMATS)
def test_every_code(fmt):
    """Row n holds code n (of 256) at column n, zeros elsewhere, and x is all ones: out[n] is
    code n's value alone, so every byte value, at every byte of a word and every piece of a
    step, must decode exactly (fp8 NaN codes to NaN)."""
    w = MXTensor.to_mx(torch.zeros(256, 256, device=DEVICE), fmt, 32)
    scale = torch.full_like(w._scale_e8m0, 127)
    codes = torch.arange(256, device=DEVICE)
    data = torch.zeros_like(w._data)
    data[codes, codes] = codes.to(torch.uint8).view(data.dtype)  # MXINT8 codes are int8
    w = w._replace(scale, data)
    x = torch.ones(1, 256, dtype=torch.bfloat16, device=DEVICE)
    out = _gemv(x, w, None, GemvConfig(16, 16, 4), torch.float32)
    expected = torch.diagonal(w.dequantize(torch.float32))[None]
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


def test_empty():
    x, w = integer_operands("float8_e4m3", 1, 0, 64)
    assert _gemv(x, w).shape == (1, 0)
    x, w = integer_operands("float8_e4m3", 1, 5, 0)
    bias = torch.arange(5, dtype=torch.bfloat16, device=DEVICE)
    torch.testing.assert_close(_gemv(x, w, bias), bias[None], rtol=0, atol=0)


def _unaligned_copy(data: torch.Tensor, offset: int) -> torch.Tensor:
    buffer = torch.empty(data.numel() + 16, dtype=data.dtype, device=data.device)
    view = buffer[offset:offset + data.numel()].view(data.shape)
    return view.copy_(data)


@pytest.mark.parametrize("case", ["K % 16", "row stride", "unaligned weight", "unaligned x",
                                  "two rows", "fp32 x", "fp4", "fp6", "strided x"])
def test_ineligible_products_take_the_other_kernel(case, monkeypatch):
    """What the kernel cannot read is refused by `eligible`, and fused_linear then runs the
    general kernel: the result is the same."""
    fmt = {"fp4": "float4_e2m1", "fp6": "float6_e3m2"}.get(case, "float8_e4m3")
    M = 2 if case == "two rows" else 1
    K = 40 if case == "K % 16" else 64
    x, w = integer_operands(fmt, M, 8, K, torch.float32 if case == "fp32 x" else torch.bfloat16)
    data = w._data
    if case == "row stride":
        data = torch.zeros(8, K + 8, dtype=data.dtype, device=DEVICE)[:, :K].copy_(data)
    elif case == "unaligned weight":
        data = _unaligned_copy(data, 1)
    elif case == "unaligned x":
        x = _unaligned_copy(x, 1)
    elif case == "strided x":
        x = torch.zeros(1, 2 * K, dtype=x.dtype, device=DEVICE)[:, ::2].copy_(x)
    assert not byte_gemv.eligible(x, data, w.elem_dtype, w.block_size)
    if case == "fp32 x":
        return  # the fused kernels take bf16 / fp16 activations only
    monkeypatch.setattr(byte_gemv.GemvPlan, "__call__", None)  # not called
    out = km.fused_linear(x, w._scale_e8m0, data, w.elem_dtype, w.block_size, None, x.dtype)
    torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0)


def test_fused_linear_dispatches_one_row_fp8_here(monkeypatch):
    calls = []
    real = byte_gemv.GemvPlan.__call__  # the kernel's launches (also a plan's)
    monkeypatch.setattr(byte_gemv.GemvPlan, "__call__",
                        lambda self, *args: calls.append(args) or real(self, *args))
    x, w = integer_operands("float8_e5m2", 1, 24, 96)
    out = km.fused_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, None, x.dtype)
    torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0)
    assert len(calls) == 1
    # an explicit Config runs the general kernel's variant
    km.fused_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, None, x.dtype,
                    config=km.Config(km.ROWS, 8, 1, 2))
    assert len(calls) == 1


def test_mx_linear_of_one_row(monkeypatch):
    """F.linear of one activation row (a decode step) and an MXFP8 weight reaches the kernel."""
    monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})
    calls = []
    real = byte_gemv.GemvPlan.__call__  # the kernel's launches (also a plan's)
    monkeypatch.setattr(byte_gemv.GemvPlan, "__call__",
                        lambda self, *args: calls.append(args) or real(self, *args))
    x, w = integer_operands("float8_e4m3", 1, 24, 96)
    bias = torch.randint(-3, 4, (24,)).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(F.linear(x[0], w, bias), reference(x, w, bias)[0], rtol=0, atol=0)
    assert len(calls) == 1


@pytest.mark.parametrize("fields,match", [
    (dict(block_n=3), "block_n"), (dict(pieces=0), "pieces"), (dict(num_warps=6), "num_warps"),
    (dict(split_k=0), "split_k"), (dict(split_k=1.5), "split_k"),
])
def test_config_rejects_impossible_launches(fields, match):
    with pytest.raises(ValueError, match=match):
        GemvConfig(**{**dict(block_n=8, pieces=4, num_warps=4), **fields})


def test_bad_calls_name_the_problem():
    x, w = integer_operands("float8_e4m3", 1, 8, 128, block_size=64)
    with pytest.raises(ValueError, match="whole blocks of 64"):
        _gemv(x, w, None, GemvConfig(8, 2, 1))  # a step of 32 columns
    x2, w2 = integer_operands("float8_e4m3", 2, 8, 128)
    with pytest.raises(ValueError, match="eligible"):
        _gemv(x2, w2)


def test_default_config_splits_k_only_for_few_rows():
    cpu = torch.device("cpu")  # _common.sm_count: 8 "SMs", so 24 programs are enough
    step = 16 * byte_gemv.TILE.pieces
    assert byte_gemv.default_config(8192, 8192, cpu).split_k == 1
    assert byte_gemv.default_config(16, 4 * step, cpu).split_k == 4  # 8 row tiles
    assert byte_gemv.default_config(16, step, cpu).split_k == 1  # one step: nothing to split


# ---------------------------------------------------------------------------- GPU only

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@gpu
@pytest.mark.parametrize("fmt", BYTE_FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,K", [(8192, 8192), (1000, 4096 + 48), (4096, 14336)])
def test_gpu_real_sizes(fmt, dtype, N, K):
    torch.manual_seed(N)
    w = MXTensor.to_mx(torch.randn(N, K, device="cuda", dtype=dtype), fmt, 32)
    x = torch.randn(1, K, dtype=dtype, device="cuda")
    bias = torch.randn(N, dtype=dtype, device="cuda")
    assert_within_fp32_accumulation(_gemv(x, w, bias), x, w, bias)
    xi, wi = integer_operands(fmt, 1, N, K, dtype)
    torch.testing.assert_close(_gemv(xi, wi), reference(xi, wi), rtol=0, atol=0)


@gpu
def test_gpu_cuda_graph_capture():
    w = MXTensor.to_mx(torch.randn(512, 1024, device="cuda"), "float8_e4m3", 32)
    x = torch.randn(1, 1024, dtype=torch.bfloat16, device="cuda")
    assert_graph_replay_matches_eager(lambda: _gemv(x, w))

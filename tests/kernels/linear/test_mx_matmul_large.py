"""The large-M path of the MX-weight matmul (torchmx/kernels/linear/dispatch.py, `dequantized_linear`):
for large bf16 products without bias (the PIPELINE_* thresholds) the weight is dequantized in
chunks of output columns on a side stream, one GEMM per chunk over all of K.

On CPU the chunking itself runs (no streams), with the thresholds lowered, and must give the
unchunked path's bits; on a CUDA machine the pipeline with its side stream at the default
thresholds, also under CUDA-graph capture and torch.compile, against the exact product.
"""

import pytest
import torch
import torch.nn.functional as F

from torchmx import MXTensor
from torchmx.kernels.linear import dispatch as km

from matmul_operands import (DEVICE, assert_within_fp32_accumulation, integer_operands,
                             reference)

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu  # the kernels run on the GPU where there is one
FORMATS = ["float8_e4m3", "float8_e5m2", "float6_e3m2", "float6_e2m3", "float4_e2m1", "int8"]
# The smallest shape the defaults pipeline: 4 chunks of 1024 columns.
M_GPU, N_GPU, K_GPU = km.PIPELINE_MIN_M, km.PIPELINE_N[0], km.PIPELINE_MIN_K


def _large(x, w, bias=None, out_dtype=torch.bfloat16):
    """The large-M path on the weight's parts, as `linear` calls it."""
    return km.dequantized_linear(x, w._scale_e8m0, w._data, w._elem_dtype, w._block_size,
                                 x.shape[-1], bias, out_dtype)


@pytest.fixture
def spy():
    """Records the chunk bounds of every call that took the pipeline."""
    seen = []
    original = km._pipelined_linear

    def record(*args):
        seen.append(args[-1])
        return original(*args)

    km._pipelined_linear = record
    yield seen
    km._pipelined_linear = original


@pytest.fixture
def small_thresholds(monkeypatch, spy):
    """The pipeline from 65 rows, any K, N up to 10000, in chunks of 128 columns."""
    monkeypatch.setattr(km, "PIPELINE_MIN_M", 65)
    monkeypatch.setattr(km, "PIPELINE_MIN_K", 1)
    monkeypatch.setattr(km, "PIPELINE_N", (1, 10000))
    monkeypatch.setattr(km, "PIPELINE_COLUMNS", 128)
    return spy


@pytest.mark.parametrize("M,N,K,expected", [
    (8192, 8192, 8192, [0, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192]),
    (4096, 4096, 8192, [0, 1024, 2048, 3072, 4096]),
    (4096, 5000, 16384, [0, 1024, 2048, 3072, 4096, 5000]),
    (2048, 8192, 8192, None),   # too few rows
    (8192, 8192, 4096, None),   # K too short
    (8192, 14336, 8192, None),  # N outside the measured range
    (8192, 2048, 8192, None),
])
def test_pipeline_bounds_default(M, N, K, expected):
    assert km._pipeline_bounds(M, N, K) == expected


def test_chunk_bounds():
    assert km._chunk_bounds(300, 128) == [0, 128, 256, 300]
    assert km._chunk_bounds(256, 128) == [0, 128, 256]
    assert km._chunk_bounds(100, 128) == [0, 100]


@pytest.mark.parametrize("fmt", FORMATS)
def test_chunked_equals_unchunked(monkeypatch, small_thresholds, fmt):
    M, N, K = 70, 300, 96
    x, w = integer_operands(fmt, M, N, K)
    chunked = _large(x, w)
    assert small_thresholds == [[0, 128, 256, 300]]
    monkeypatch.setattr(km, "PIPELINE_COLUMNS", N)  # one chunk: the unchunked path
    whole = _large(x, w)
    assert len(small_thresholds) == 1
    assert chunked.dtype == torch.bfloat16 and chunked.shape == (M, N)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)
    torch.testing.assert_close(chunked, reference(x, w), rtol=0, atol=0)


def test_chunked_random_within_fp32_accumulation(small_thresholds):
    torch.manual_seed(0)
    w = MXTensor.to_mx(torch.randn(260, 128, device=DEVICE, dtype=torch.bfloat16),
                       "float4_e2m1", 32)
    x = torch.randn(80, 128, device=DEVICE, dtype=torch.bfloat16)
    assert_within_fp32_accumulation(_large(x, w), x, w)
    assert small_thresholds == [[0, 128, 256, 260]]


def test_unchunked_with_bias_other_dtypes_or_few_rows(small_thresholds):
    x, w = integer_operands("float8_e4m3", 70, 300, 64)
    bias = torch.randint(-8, 9, (300,)).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(_large(x, w, bias), reference(x, w, bias), rtol=0, atol=0)
    out = _large(x, w, out_dtype=torch.float32)  # fp32 output: one rounding of the fp32 sums
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x.float() @ w.dequantize(torch.float32).t(), rtol=0, atol=0)
    w16 = MXTensor.to_mx(w.dequantize(torch.float16), "float8_e4m3", 32)
    _large(x.to(torch.float16), w16, out_dtype=torch.float16)
    _large(x[:64], w)  # below PIPELINE_MIN_M
    assert small_thresholds == []


# ---------------------------------------------------------------------------- GPU only

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_pipeline_exact_and_random(spy, fmt):
    """Through F.linear at the default thresholds: integer operands give the exact bits;
    random ones stay within fp32 accumulation of the exact product."""
    x, w = integer_operands(fmt, M_GPU, N_GPU, K_GPU)
    torch.testing.assert_close(F.linear(x, w), reference(x, w), rtol=0, atol=0)
    assert spy == [[0, 1024, 2048, 3072, 4096]]
    torch.manual_seed(1)
    w = MXTensor.to_mx(torch.randn(N_GPU, K_GPU, device="cuda", dtype=torch.bfloat16), fmt, 32)
    x = torch.randn(M_GPU, K_GPU, device="cuda", dtype=torch.bfloat16)
    assert_within_fp32_accumulation(F.linear(x, w), x, w)


@gpu
def test_gpu_pipeline_mx_activations(spy):
    """MX activations of a format the MX x MX GEMM does not take (kernels/linear/mx_gemm.py;
    test_mx_gemm covers the ones it does) are dequantized and take the pipeline."""
    x, w = integer_operands("float4_e2m1", M_GPU, N_GPU, K_GPU)
    x_mx = MXTensor.to_mx(x, "float6_e2m3", 32)
    expected = (x_mx.dequantize(torch.float32) @ w.dequantize(torch.float32).t()).to(torch.bfloat16)
    torch.testing.assert_close(F.linear(x_mx, w), expected, rtol=0, atol=0)
    assert len(spy) == 1


@gpu
def test_gpu_pipeline_cuda_graph_capture(spy):
    """Captured with its side stream, replayed on new inputs copied into the captured one."""
    x, w = integer_operands("float8_e4m3", M_GPU, N_GPU, K_GPU)
    static_x = x.clone()
    F.linear(static_x, w)  # warm up (compiles the kernels) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = F.linear(static_x, w)
    assert len(spy) == 2
    for seed in range(3):
        new_x, _ = integer_operands("float8_e4m3", M_GPU, N_GPU, K_GPU, seed=seed + 1)
        static_x.copy_(new_x)
        graph.replay()
        torch.testing.assert_close(out, reference(new_x, w), rtol=0, atol=0)


@gpu
def test_gpu_pipeline_under_compile(spy):
    x, w = integer_operands("float6_e2m3", M_GPU, N_GPU, K_GPU)

    def f(x):
        return F.linear(x, w) * 2

    expected = reference(x, w) * 2
    torch.testing.assert_close(torch.compile(f)(x), expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.compile(f, mode="reduce-overhead")(x), expected,
                               rtol=0, atol=0)
    assert spy


@gpu
def test_gpu_pipeline_repeated_calls_do_not_race(spy):
    """Back-to-back calls on fresh operands, results kept: a chunk freed too early would be
    overwritten by the next call's dequantize before its GEMM read it."""
    outs, expected = [], []
    for seed in range(4):
        x, w = integer_operands("float4_e2m1", M_GPU, N_GPU, K_GPU, seed=seed)
        outs.append(F.linear(x, w))
        expected.append(reference(x, w))
        del x, w
    torch.cuda.synchronize()
    assert len(spy) == 4
    for out, exp in zip(outs, expected):
        torch.testing.assert_close(out, exp, rtol=0, atol=0)

"""On a CUDA GPU: the eager short path (_eager.short_path) of every hot entry point gives the
bits of the full path through autograd and the operators, and never synchronizes the host
(torch.cuda.set_sync_debug_mode("error") turns a synchronization into an error)."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

import torchmx
from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

FORMATS = ("float4_e2m1", "float8_e4m3", "float8_e5m2", "float6_e2m3", "int8")


@contextlib.contextmanager
def no_host_sync():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def full_path_linear(x, w_mx, bias=None):
    """F.linear through the mx_linear operator (what torch.compile and export run)."""
    return torch.ops.torchmx.mx_linear(x, w_mx, bias, out_dtype=x.dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 128])
def test_linear_short_path_is_the_operator(fmt, rows):
    torch.manual_seed(rows)
    w_mx = MXTensor.to_mx(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), fmt)
    x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    expected = full_path_linear(x, w_mx, bias)
    with torch.no_grad(), no_host_sync():
        got = F.linear(x, w_mx, bias)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_and_dequantize_short_paths(fmt):
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    with no_host_sync():
        scale, data = torch.ops.torchmx.quantize_mx(x, fmt, 32)
        x_mx = MXTensor.to_mx(x, fmt)
        values = x_mx.dequantize()
        direct = torch.ops.torchmx.dequantize_mx(data, scale, fmt, 32, torch.bfloat16)
    assert torch.equal(x_mx._scale_e8m0, scale) and torch.equal(x_mx._data.view(torch.uint8),
                                                              data.view(torch.uint8))
    assert torch.equal(values, direct)
    with_grad = MXTensor.to_mx(x.clone().requires_grad_(), fmt)  # the autograd.Function
    assert torch.equal(with_grad.dequantize(), values)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("prepack", [False, True])
@pytest.mark.parametrize("rows", [1, 16])
def test_inference_linear_short_path(fmt, prepack, rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16)
    layer = torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt), None))
    if prepack:
        layer.prepack()
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    expected = layer(x)  # the bias requires grad: the autograd.Function path
    with torch.no_grad(), no_host_sync():
        got = layer(x)
    assert torch.equal(got, expected)

"""On a CUDA GPU: MXInferenceLinear's eager calls through the product bound to its weight
(`_bound_call`: the linear plan's compiled kernels called directly) give the operator's bits,
call after call, never synchronize, and step aside wherever the full forward must run (the
weight written or replaced, prepack(), a gradient asked, an unaligned or strided input)."""

import pytest
import torch

import torchmx
from torchmx.config import MXConfig, QLinearConfig
from torchmx.mx_ops import weight_matmul
from torchmx.nn import inference_linear

from matmul_operands import no_host_sync

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORMATS = ("float4_e2m1", "float8_e4m3", "float6_e2m3", "int8")
K, N = 4096, 256  # few output columns: the kernels split K (a reduce launch) at 1 and 16 rows


def make_layer(fmt, bias, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(K, N, bias=bias, device="cuda", dtype=dtype)
    return torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt), None))


def operator(layer, x):
    """What forward computes without a bound product: the mx_weight_linear operator, its
    own bound products forgotten."""
    weight_matmul._BOUND.clear()
    bias = None if layer.bias is None else layer.bias.detach()
    return torch.ops.torchmx.mx_weight_linear(
        x, layer.weight_scale, layer._weight_mx(x.dtype)._data,
        layer.qconfig.weights_config.elem_dtype_name, 32, K, bias, x.dtype)


def bound(layer, x):
    entry = inference_linear._BOUND.get(layer)
    return None if entry is None else entry[1].get((x.shape, x.dtype, layer.bias is None))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 65])
@pytest.mark.parametrize("bias", [False, True])
def test_bound_calls_are_the_operator(fmt, rows, bias, monkeypatch):
    layer = make_layer(fmt, bias)
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(1, rows, K, device="cuda", dtype=torch.bfloat16)
            expected = operator(layer, x)
            with no_host_sync():
                got = layer(x)
            assert torch.equal(got, expected), step
            assert got.shape == (1, rows, N) and got.is_contiguous()
            if step == 0 and rows <= 64:  # from now on the full forward must not run
                assert bound(layer, x) is not None
                monkeypatch.setattr(layer, "_weight_view", None)
    if rows > 64:  # dequantize + cuBLAS: nothing to bind
        assert bound(layer, x) is None


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3"])
def test_bound_calls_in_fp16_and_under_inference_mode(fmt):
    layer = make_layer(fmt, True, dtype=torch.float16)
    with torch.inference_mode():
        for rows in (1, 16, 1):
            x = torch.randn(rows, K, device="cuda", dtype=torch.float16)
            assert torch.equal(layer(x), operator(layer, x)), rows
        assert bound(layer, x) is not None


def test_bound_calls_follow_the_weight():
    """A write into the weight buffers, a new buffer and prepack() each end the bound
    products: the next call runs the full forward on the weight as it is now."""
    layer = make_layer("float8_e4m3", False)
    other = make_layer("float8_e4m3", False, seed=1)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        first = layer(x)
        assert torch.equal(layer(x), first) and bound(layer, x) is not None
        layer.weight_data.copy_(other.weight_data)
        layer.weight_scale.copy_(other.weight_scale)
        assert torch.equal(layer(x), operator(other, x))
        layer.weight_data = make_layer("float8_e4m3", False, seed=2).weight_data
        assert torch.equal(layer(x), operator(layer, x))
        layer.weight_data = other.weight_data.clone()
        rows16 = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(layer(rows16), operator(other, rows16))
        layer.prepack()
        assert inference_linear._BOUND.get(layer) is None
        got = layer(rows16)
    with torch.enable_grad():  # the full forward, through the prepacked copy's operator
        expected = layer(rows16.clone().requires_grad_()).detach()
    assert torch.equal(got, expected)
    assert bound(layer, rows16) is None


def test_bound_calls_step_aside_and_keep_gradients():
    """Inputs the bound product does not take (unaligned, strided) run the full forward, with
    its bits; where a gradient is asked (of the bias, of x) the product runs below the layer's
    autograd.Function: the same bits, the straight-through gradients."""
    layer = make_layer("float4_e2m1", True)
    base = torch.randn(2 * K + 8, device="cuda", dtype=torch.bfloat16)
    aligned = base[:K].view(1, K)
    with torch.no_grad():
        layer(aligned)
        assert bound(layer, aligned) is not None
        unaligned = base[1:K + 1].view(1, K)
        assert torch.equal(layer(unaligned), operator(layer, unaligned))
        strided = base[:2 * K].view(K, 2).t()[:1]
        assert torch.equal(layer(strided), operator(layer, strided.contiguous()))
    y = layer(aligned)  # grad mode, the bias requires grad
    assert y.requires_grad and torch.equal(y.detach(), operator(layer, aligned))
    y.sum().backward()
    assert torch.equal(layer.bias.grad, torch.ones_like(layer.bias))
    x = aligned.clone().requires_grad_()
    y = layer(x)
    assert torch.equal(y.detach(), operator(layer, aligned))
    y.float().sum().backward()
    ones = torch.ones_like(y)
    assert torch.equal(x.grad, (ones @ layer.weight.dequantize(ones.dtype)).to(x.dtype))


def test_bound_calls_in_a_cuda_graph():
    layer = make_layer("float4_e2m1", False)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x)
        graph = torch.cuda.graph
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(x)
        torch.cuda.current_stream().wait_stream(stream)
        with graph(g):
            y = layer(x)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, operator(layer, x))

"""On a CUDA GPU: products whose operands lie on different devices raise an error, as torch's
own do, on every path, and never reach a kernel. The bound paths launch with raw addresses,
which Triton would not check: a CPU bias there would be read as a device address."""

import pytest
import torch
import torch.nn.functional as F

import torchmx
from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import prepack_weights

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORMATS = ("float4_e2m1", "float8_e4m3")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 128])
def test_f_linear_with_a_cpu_bias_after_bound_calls(fmt, rows):
    w_mx = MXTensor.to_mx(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), fmt)
    x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(3):  # bound after the first call
            expected = F.linear(x, w_mx, bias)
        with pytest.raises(RuntimeError, match="device"):
            F.linear(x, w_mx, bias.cpu())
        with pytest.raises(RuntimeError, match="device"):
            F.linear(x.cpu(), w_mx, bias.cpu())
        assert torch.equal(F.linear(x, w_mx, bias), expected)  # the bound call unharmed
    torch.cuda.synchronize()


@pytest.mark.parametrize("fmt", FORMATS)
def test_operator_names_the_part_on_another_device(fmt):
    w_mx = MXTensor.to_mx(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), fmt)
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    parts = (w_mx._scale_e8m0, w_mx._data, fmt, 32, 512)
    op = torch.ops.torchmx.mx_weight_linear
    for _ in range(2):  # bound after the first call
        op(x, *parts, bias, torch.bfloat16)
    with pytest.raises(ValueError, match="bias and input must be on one device"):
        op(x, *parts, bias.cpu(), torch.bfloat16)
    scale, data = w_mx._scale_e8m0.cpu(), w_mx._data.cpu()
    with pytest.raises(ValueError, match="weight_scale and input must be on one device"):
        op(x, scale, data, fmt, 32, 512, None, torch.bfloat16)
    x_scale, x_data = torch.ops.torchmx.quantize_mx(x, "float8_e4m3", 32)
    with pytest.raises(ValueError, match="weight_scale and input_scale must be on one device"):
        torch.ops.torchmx.mx_mx_linear(x_scale, x_data, scale, data, "float8_e4m3", fmt, 512)
    torch.cuda.synchronize()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("prepack", [False, True])
def test_inference_linear_whose_bias_moved_to_the_cpu(fmt, rows, grad, prepack):
    linear = torch.nn.Linear(512, 256, device="cuda", dtype=torch.bfloat16)
    layer = torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt), None))
    if prepack:
        prepack_weights(layer)
    x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
    with torch.set_grad_enabled(grad):
        for _ in range(3):  # bound after the first call
            expected = layer(x)
        layer.bias.data = layer.bias.data.cpu()  # same Parameter, another device
        # torch's own device error (the exact path) or the prepacked operator's check
        with pytest.raises((RuntimeError, ValueError), match="device"):
            layer(x)
        layer.bias.data = layer.bias.data.cuda()
        assert torch.equal(layer(x), expected)
    torch.cuda.synchronize()

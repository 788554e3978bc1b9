"""MXInferenceLinear: packed weight bits, forward = F.linear on MX operands, size, meta
device, inference_mode, gradients to the input, compile, swapping back, config checks."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import MXInferenceLinear, MXLinear

FP4, FP8, FP6 = MXConfig("float4_e2m1"), MXConfig("float8_e4m3"), MXConfig("float6_e3m2")
W4A8 = QLinearConfig(FP4, FP8)


def float_linear(k=96, n=40, bias=True, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias, dtype=dtype)


def assert_bits(a, b):
    assert type(a) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max()}"


@pytest.mark.parametrize("fmt", ["float8_e4m3", "float8_e5m2", "float6_e2m3", "float6_e3m2",
                                 "float4_e2m1", "int8"])
def test_packed_weight_is_the_quantize_op_output(fmt):
    linear = float_linear(k=80)  # 80: a partial last block of 32
    cfg = MXConfig(fmt, scale_mode="rceil")
    layer = MXInferenceLinear.from_float(linear, QLinearConfig(cfg))
    scale, data = torch.ops.torchmx.quantize_mx(linear.weight.detach(), fmt, 32, scale_mode="rceil")
    assert layer.weight_scale.dtype == layer.weight_data.dtype == torch.uint8
    assert_bits(layer.weight_scale, scale)
    assert_bits(layer.weight_data, data.view(torch.uint8))
    weight = layer.weight
    assert isinstance(weight, MXTensor) and weight.shape == (40, 80) and weight.dtype == torch.bfloat16
    expected = MXTensor.to_mx(linear.weight.detach(), fmt, 32, scale_mode="rceil").dequantize()
    assert_bits(weight.dequantize(), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_forward_is_mx_linear_with_bias(dtype):
    linear = float_linear(dtype=dtype)
    layer = MXInferenceLinear.from_float(linear, W4A8)
    x = torch.randn(2, 7, 96, dtype=dtype)  # 3-D
    x_mx = MXTensor.to_mx(x, "float8_e4m3", 32)
    w_mx = MXTensor.to_mx(linear.weight.detach(), "float4_e2m1", 32)
    with torch.no_grad():
        assert_bits(layer(x), F.linear(x_mx, w_mx, linear.bias))
        # the same exact product, written out: fp32 operands, fp32 accumulation, one rounding
        exact = F.linear(x_mx.dequantize(torch.float32), w_mx.dequantize(torch.float32),
                         linear.bias.float()).to(dtype)
        assert_bits(layer(x), exact)


def test_weight_only_and_input_dtype_follows():
    linear = float_linear(dtype=torch.bfloat16)
    layer = MXInferenceLinear.from_float(linear, QLinearConfig(FP6)).float()  # bias -> fp32
    x = torch.randn(5, 96)
    w = MXTensor.to_mx(linear.weight.detach(), "float6_e3m2", 32).dequantize(torch.float32)
    with torch.no_grad():
        assert_bits(layer(x), F.linear(x, w, layer.bias))


def test_fp4_parameter_bytes_at_most_0_28_of_bf16():
    linear = float_linear(k=1024, n=512)
    layer = MXInferenceLinear.from_float(linear, W4A8)

    def nbytes(m):
        return sum(t.numel() * t.element_size() for t in (*m.parameters(), *m.buffers()))

    ratio = nbytes(layer) / nbytes(linear)
    assert ratio <= 0.28, ratio
    assert nbytes(layer) == 512 * 1024 // 2 + 512 * 1024 // 32 + 512 * 2


def test_from_meta_device_then_load():
    real = MXInferenceLinear.from_float(float_linear(), W4A8)
    with torch.device("meta"):
        meta_linear = nn.Linear(96, 40, dtype=torch.bfloat16)
    layer = MXInferenceLinear.from_float(meta_linear, W4A8)
    assert layer.weight_data.is_meta and layer.weight_data.shape == real.weight_data.shape
    assert layer.weight_scale.shape == real.weight_scale.shape
    layer.load_state_dict(real.state_dict(), assign=True)
    x = torch.randn(3, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        assert_bits(layer(x), real(x))


def test_inference_mode_and_gradients_to_the_input():
    layer = MXInferenceLinear.from_float(float_linear(dtype=torch.float32), W4A8)
    x = torch.randn(4, 96)
    with torch.inference_mode():
        y_inf = layer(x)
    x_ = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no MXLayoutWarning from the backward
        y = layer(x_)
        y.sum().backward()
    assert_bits(y.detach(), y_inf.clone())
    w = layer.weight.dequantize()
    assert torch.allclose(x_.grad, w.sum(0).expand(4, 96), rtol=1e-6, atol=1e-6)  # straight-through
    assert torch.equal(layer.bias.grad, torch.full((40,), 4.0))
    assert not any(p.requires_grad for p in layer.buffers())


def test_from_mx_linear_uses_its_config_and_matches_its_forward():
    qat = MXLinear.from_float(float_linear(dtype=torch.float32), W4A8)
    layer = MXInferenceLinear.from_float(qat)
    assert layer.qconfig == W4A8
    x = torch.randn(6, 96)
    with torch.no_grad():
        assert_bits(layer(x), qat(x))  # fake quantization during QAT == packed inference


def test_to_float_restores_plain_linear():
    linear = float_linear()
    layer = MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig("float8_e4m3")))
    back = layer.to_float()
    assert type(back) is nn.Linear and back.weight.dtype == torch.bfloat16
    assert back.bias is layer.bias
    assert_bits(back.weight.detach(), layer.weight.dequantize())
    assert (back.weight - linear.weight).abs().max() <= linear.weight.abs().max() / 8


def test_torch_compile_fullgraph():
    layer = MXInferenceLinear.from_float(float_linear(), W4A8)
    x = torch.randn(2, 5, 96, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        assert_bits(torch.compile(layer, backend="aot_eager", fullgraph=True)(x), layer(x))


def test_load_state_dict_refuses_a_different_config():
    e5m2 = MXInferenceLinear.from_float(float_linear(), QLinearConfig(MXConfig("float8_e5m2")))
    fp8 = MXInferenceLinear.from_float(float_linear(), QLinearConfig(MXConfig("float8_e4m3")))
    with pytest.raises(ValueError, match="the checkpoint was quantized with \\[weights=float8_e5m2/32"):
        fp8.load_state_dict(e5m2.state_dict())  # same shapes, different format


def test_repr_and_errors():
    layer = MXInferenceLinear.from_float(float_linear(), W4A8)
    assert "in_features=96, out_features=40, bias=True, weights=float4_e2m1/32" in repr(layer)
    with pytest.raises(TypeError, match="qconfig must be a torchmx.config.QLinearConfig"):
        MXInferenceLinear.from_float(float_linear())
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear"):
        MXInferenceLinear.from_float(nn.Identity(), W4A8)
    with pytest.raises(TypeError, match="input must have dtype"):
        layer(torch.randn(2, 96, dtype=torch.float64))


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layer_dtype", DTYPES)
@pytest.mark.parametrize("input_dtype", DTYPES)
def test_every_input_dtype_with_every_layer_dtype(layer_dtype, input_dtype, bias):
    """One packed weight serves fp32, bf16 and fp16 inputs whatever the layer's dtype; the
    output has the input's dtype and the bias is cast to it."""
    linear = float_linear(bias=bias, dtype=layer_dtype)
    layer = MXInferenceLinear.from_float(linear, W4A8)
    x = torch.randn(3, 96, dtype=input_dtype)
    x_mx = MXTensor.to_mx(x, "float8_e4m3", 32)
    w_mx = MXTensor.to_mx(linear.weight.detach(), "float4_e2m1", 32).to(input_dtype)
    b = None if linear.bias is None else linear.bias.detach().to(input_dtype)
    with torch.no_grad():
        assert_bits(layer(x), F.linear(x_mx, w_mx, b))
    x_ = x.clone().requires_grad_()
    layer(x_).float().sum().backward()  # the gradient path too
    assert x_.grad.dtype == input_dtype
    if bias:
        assert layer.bias.grad.dtype == layer_dtype


@pytest.mark.parametrize("bias", [True, False])
def test_weight_dtype_follows_module_conversions_and_loading(bias):
    layer = MXInferenceLinear.from_float(float_linear(bias=bias, dtype=torch.float32), W4A8)
    assert layer.weight_dtype == torch.float32
    layer.to(torch.bfloat16)
    assert layer.weight_dtype == layer.weight.dtype == torch.bfloat16
    layer.half()
    assert layer.weight_dtype == torch.float16
    back = layer.to_float()
    assert back.weight.dtype == torch.float16 and (not bias or back.bias.dtype == torch.float16)
    assert back(torch.randn(2, 96, dtype=torch.float16)).dtype == torch.float16
    if bias:  # the bias from a bf16 checkpoint, assigned: the weight dtype follows it
        source = MXInferenceLinear.from_float(float_linear(dtype=torch.bfloat16), W4A8)
        with torch.device("meta"):
            meta = MXInferenceLinear.from_float(nn.Linear(96, 40), W4A8)
        meta.load_state_dict(source.state_dict(), assign=True)
        assert meta.weight_dtype == torch.bfloat16
        assert meta.to_float().weight.dtype == meta.to_float().bias.dtype == torch.bfloat16
    # to_float in another dtype: weight and bias agree
    other = layer.to_float(torch.float32)
    assert other.weight.dtype == torch.float32 and (not bias or other.bias.dtype == torch.float32)


def test_extra_state_errors_name_the_layer():
    layer = MXInferenceLinear.from_float(float_linear(), W4A8)
    state = layer.state_dict()
    state["_extra_state"] = {"version": 1}
    with pytest.raises(ValueError, match=r"MXInferenceLinear\(in_features=96.*no 'qconfig'"):
        layer.load_state_dict(state)
    state["_extra_state"] = {"version": 1, "qconfig": {"activations_config": None}}
    with pytest.raises(ValueError, match=r"MXInferenceLinear\(in_features=96.*weights_config"):
        layer.load_state_dict(state)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3"])
def test_gradient_calls_run_the_layers_plan_below_autograd(fmt, monkeypatch):
    """With a gradient asked, forward runs the layer's own linear plan (later: the product
    bound to its weight, on a GPU) below its autograd.Function: the exact product's bits, the
    straight-through gradients. Integer operands: every summation order gives the same bits."""
    from matmul_operands import DEVICE, integer_operands, reference
    from torchmx.kernels.linear import dispatch
    from torchmx.mx_ops import weight_matmul
    monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})
    plans_run = []
    real = dispatch.linear
    monkeypatch.setattr(dispatch, "linear", lambda *a: plans_run.append(a[-1]) or real(*a))
    x, w = integer_operands(fmt, 3, 64, 64)
    layer = MXInferenceLinear.from_float(nn.Linear(64, 64, dtype=torch.bfloat16), QLinearConfig(
        MXConfig(fmt))).to(DEVICE)
    layer.weight_scale.copy_(w._scale_e8m0)
    layer.weight_data.copy_(w._data)
    with torch.no_grad():
        layer.bias.copy_(torch.arange(64) / 4)
    for step in range(2):
        layer.bias.grad = None
        xg = x.clone().requires_grad_()
        y = layer(xg)
        assert_bits(y.detach(), reference(x, w, layer.bias.detach()))
        y.float().sum().backward()
        ones = torch.ones_like(y)
        assert_bits(xg.grad, (ones @ w.dequantize(ones.dtype)).to(x.dtype))
        assert_bits(layer.bias.grad, ones.sum(0))
    # the layer's own plans (a dict) on the first call; on a GPU the second is its bound product
    assert plans_run and isinstance(plans_run[0], dict) and len(plans_run) == (
        1 if DEVICE == "cuda" else 2)

"""On CPU, eager calls take the short ways (no operator, no autograd layer, checks looked up
per kind of arguments): MXTensor.to_mx, .dequantize(), F.linear with an MX weight and
MXInferenceLinear give the operators' / the reference's bits, gradients included; a bad
argument is still a ValueError / TypeError naming it, on the first call of its kind and
after."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchmx
from formats import bit_view
from torchmx import MXTensor, mx_tensor
from torchmx.config import MXConfig, QLinearConfig
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference

FORMATS = ("float4_e2m1", "float8_e4m3", "float6_e2m3", "int8")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def reference_weight(w_mx: MXTensor) -> torch.Tensor:
    """The weight's exact values (fp32), by the reference numerics."""
    return dequantize_mx_reference(w_mx._data, w_mx._scale_e8m0, w_mx.elem_dtype,
                                   w_mx.block_size, torch.float32, w_mx.block_dim,
                                   block_dim_size=w_mx.shape[w_mx.block_dim])


def reference_linear(x, w_mx, bias):
    """The CPU linear of docs/matmul.md: fp32 product of the exact operands, plus the bias,
    one rounding to x's dtype."""
    out = torch.matmul(x.float(), reference_weight(w_mx).t())
    return (out if bias is None else out + bias.float()).to(x.dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_to_mx_and_dequantize_give_the_reference_bits(fmt, dtype):
    x = torch.randn(3, 5, 40, dtype=dtype)
    for block_dim, scale_mode in ((-1, "floor"), (1, "rceil"), (-1, "floor")):
        t = MXTensor.to_mx(x, fmt, 16, scale_mode=scale_mode, block_dim=block_dim)
        scale, data = quantize_mx_reference(x, t.elem_dtype, 16, scale_mode=scale_mode,
                                            block_dim=block_dim)
        assert torch.equal(t._scale_e8m0, scale) and torch.equal(t._data, data)
        assert t.block_dim == block_dim % 3 and t.shape == x.shape and t.dtype == dtype
        assert t.stride() == MXTensor(scale, data, fmt, 16, dtype, block_dim=block_dim,
                                      shape=x.shape).stride()
        for target in (None, torch.float32):
            want = torch.ops.torchmx.dequantize_mx(data, scale, fmt, 16, target or dtype,
                                                   block_dim, block_dim_size=x.shape[block_dim])
            assert torch.equal(bit_view(t.dequantize(target)), bit_view(want))
    transposed = t.t() if t.dim() == 2 else t.transpose(0, 2)
    assert torch.equal(bit_view(transposed.dequantize()), bit_view(t.dequantize().transpose(0, 2)))


def test_to_mx_checks_a_kind_once_and_rejects_every_time():
    mx_tensor._TO_MX_CHECKED.clear()
    x = torch.randn(2, 64)
    MXTensor.to_mx(x, "float4_e2m1", 32)
    MXTensor.to_mx(x.clone(), "float4_e2m1", 32)
    assert len(mx_tensor._TO_MX_CHECKED) == 1
    for _ in range(2):
        with pytest.raises(TypeError, match="block_size"):
            MXTensor.to_mx(x, "float4_e2m1", 32.0)
        with pytest.raises(TypeError, match="block_size"):  # True == 1: a key of its own
            MXTensor.to_mx(x, "float4_e2m1", True)
        with pytest.raises(ValueError, match="scale_mode"):
            MXTensor.to_mx(x, "float4_e2m1", 32, scale_mode="nearest")
        with pytest.raises(ValueError, match="scale_mode"):  # unhashable: checked, not looked up
            MXTensor.to_mx(x, "float4_e2m1", 32, scale_mode=["floor"])
        with pytest.raises(ValueError, match="ste"):
            MXTensor.to_mx(x, "float4_e2m1", 32, ste="none")
        with pytest.raises(ValueError, match="block_dim"):
            MXTensor.to_mx(x, "float4_e2m1", 32, block_dim=2)
        with pytest.raises(TypeError, match="seed"):
            MXTensor.to_mx(x, "float4_e2m1", 32, seed="7")
        with pytest.raises(TypeError, match="data_hp"):
            MXTensor.to_mx(x.int(), "float4_e2m1", 32)
    assert len(mx_tensor._TO_MX_CHECKED) == 1
    MXTensor.to_mx(x, "float4_e2m1", 1)
    assert len(mx_tensor._TO_MX_CHECKED) == 2
    a, b = (MXTensor.to_mx(x, "float4_e2m1", rounding="stochastic", seed=s)._data for s in (3, 4))
    assert torch.equal(a, quantize_mx_reference(x, torchmx.dtypes.float4_e2m1, 32,
                                                rounding="stochastic", seed=3)[1])
    assert not torch.equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_gives_the_exact_product(fmt, dtype):
    w_mx = MXTensor.to_mx(torch.randn(24, 64, dtype=dtype), fmt)
    bias = torch.randn(24, dtype=dtype)
    for x in (torch.randn(3, 64, dtype=dtype), torch.randn(2, 3, 64, dtype=dtype)[:, 1:]):
        for b in (None, bias):
            want = reference_linear(x, w_mx, b)
            got = F.linear(x, w_mx, b)
            assert got.dtype == dtype and got.is_contiguous()
            assert torch.equal(bit_view(got), bit_view(want))
            assert torch.equal(bit_view(got), bit_view(
                torch.ops.torchmx.mx_linear(x, w_mx, b, out_dtype=dtype)))  # the operator
    with pytest.raises(RuntimeError):  # torch's own error for the mismatch
        F.linear(torch.randn(2, 63, dtype=dtype), w_mx)


@pytest.mark.parametrize("fmt", FORMATS[:2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inference_linear_output_and_gradients(fmt, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(64, 24, dtype=dtype)
    layer = torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt), None))
    w_mx = layer.weight
    x = torch.randn(2, 3, 64, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(bit_view(layer(x)), bit_view(reference_linear(x, w_mx, layer.bias)))
    for x_grad in (False, True):
        xr = x.clone().requires_grad_(x_grad)
        out = layer(xr)
        assert type(out.grad_fn).__name__ == "_PackedLinearFunctionBackward"
        assert torch.equal(bit_view(out), bit_view(reference_linear(x, w_mx, layer.bias)))
        grad = torch.randn_like(out)
        out.backward(grad)
        assert torch.equal(bit_view(layer.bias.grad),
                           bit_view(grad.reshape(-1, 24).sum(0).to(dtype)))
        if x_grad:  # straight-through: the gradient times the dequantized weight
            want = (grad @ w_mx.dequantize(dtype)).to(dtype)
            assert torch.equal(bit_view(xr.grad), bit_view(want))
        layer.bias.grad = None
    fp16_layer = torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt), None))
    if dtype != torch.float32:  # an fp32 input: the weight viewed and the bias cast to fp32
        x32 = x.float()
        with torch.no_grad():
            assert torch.equal(fp16_layer(x32), reference_linear(
                x32, fp16_layer._weight_mx(torch.float32), fp16_layer.bias.float()))

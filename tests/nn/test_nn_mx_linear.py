"""MXLinear (QAT): forward = F.linear of the MX operands, straight-through and per-role MX
backward, bias, 3-D inputs, autocast, torch.compile, DDP, swapping back."""

import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig, QLinearGradConfig
from torchmx.nn import MXLinear

FP4, FP8, E5M2, FP6 = (MXConfig("float4_e2m1"), MXConfig("float8_e4m3"), MXConfig("float8_e5m2"),
                       MXConfig("float6_e2m3", 16))
QAT = QLinearConfig(FP4, FP8)


def mx_values(t, cfg, dim=-1):
    """Independent reference: quantize along `dim` by moving it last and quantizing there."""
    moved = t.movedim(dim, -1).contiguous()
    q = MXTensor.to_mx(moved, cfg.elem_dtype, cfg.block_size, scale_mode=cfg.scale_mode,
                       rounding=cfg.rounding)
    return q.dequantize().movedim(-1, dim)


def make_layer(qconfig=QAT, k=96, n=40, bias=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return MXLinear.from_float(nn.Linear(k, n, bias=bias, dtype=dtype), qconfig)


def run(module, x, grad_seed=1):
    """Forward and backward with a fixed random output gradient: (y, dx, dw, db)."""
    x = x.detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    y = module(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed)).to(y.dtype)
    y.backward(g)
    return y, x.grad, module.weight.grad, module.bias.grad if module.bias is not None else None


def assert_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_is_linear_of_mx_operands(dtype):
    layer = make_layer(dtype=dtype)
    x = torch.randn(8, 96, dtype=dtype)
    expected = F.linear(mx_values(x, FP8), mx_values(layer.weight.detach(), FP4), layer.bias)
    assert_bits(layer(x), expected)


def test_weight_only_keeps_activations():
    layer = make_layer(QLinearConfig(FP6))
    x = torch.randn(4, 96)
    assert_bits(layer(x), F.linear(x, mx_values(layer.weight.detach(), FP6), layer.bias))


def test_straight_through_backward_and_bias():
    layer = make_layer()
    x = torch.randn(2, 5, 96)  # 3-D input
    y, dx, dw, db = run(layer, x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    x_q, w_q = mx_values(x, FP8), mx_values(layer.weight.detach(), FP4)
    assert y.shape == (2, 5, 40)
    assert_bits(dx, g @ w_q)
    assert torch.allclose(dw, g.reshape(-1, 40).t() @ x_q.reshape(-1, 96), rtol=1e-5, atol=1e-5)
    assert torch.allclose(db, g.sum((0, 1)), rtol=1e-6, atol=1e-6)
    assert torch.allclose(y, F.linear(x_q, w_q) + layer.bias, rtol=1e-6, atol=1e-6)


def test_backward_gemms_quantized_per_role():
    """dgrad: grad_output and W blocked along out_features; wgrad: grad_output and input
    blocked along the tokens; each role with its own format."""
    roles = QLinearGradConfig(dgrad_grad_output_config=E5M2, dgrad_weight_config=FP6,
                              wgrad_grad_output_config=MXConfig("float8_e5m2", 8),
                              wgrad_input_config=MXConfig("int8", 8))
    layer = make_layer(QLinearConfig(FP4, FP8, grad_config=roles))
    x = torch.randn(3, 8, 96)
    _, dx, dw, db = run(layer, x)
    g = torch.randn(3, 8, 40, generator=torch.Generator().manual_seed(1)).reshape(24, 40)
    w = layer.weight.detach()
    dx_ref = mx_values(g, E5M2, -1) @ mx_values(w, FP6, 0)
    dw_ref = mx_values(g, roles.wgrad_grad_output_config, 0).t() @ mx_values(
        x.reshape(24, 96), roles.wgrad_input_config, 0)
    assert_bits(dx, dx_ref.reshape(3, 8, 96))
    assert_bits(dw, dw_ref)
    assert torch.allclose(db, g.sum(0), rtol=1e-6, atol=1e-6)
    # a role left None keeps the straight-through operand
    only_dgrad = make_layer(QLinearConfig(FP4, FP8, grad_config=QLinearGradConfig(
        dgrad_grad_output_config=E5M2)))
    _, dx2, dw2, _ = run(only_dgrad, x)
    assert_bits(dx2, (mx_values(g, E5M2, -1) @ mx_values(w, FP4)).reshape(3, 8, 96))
    assert_bits(dw2, g.t() @ mx_values(x.reshape(24, 96), FP8))


def test_gradients_reach_every_parameter_without_bias_too():
    for bias in (True, False):
        layer = make_layer(QLinearConfig(FP4, FP8, grad_config=E5M2), bias=bias)
        _, dx, dw, db = run(layer, torch.randn(4, 96))
        assert dx is not None and dw is not None and (db is not None) == bias
        assert dw.abs().sum() > 0 and (not bias or db.abs().sum() > 0)


def test_autocast_bf16():
    layer = make_layer()
    x = torch.randn(2, 6, 96)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, dx, dw, db = run(layer, x)
    assert y.dtype == torch.bfloat16 and dx.dtype == dw.dtype == db.dtype == torch.float32
    # MX values are exact in bf16: the forward is the bf16 linear of the MX operands
    expected = F.linear(mx_values(x, FP8).bfloat16(), mx_values(layer.weight.detach(), FP4).bfloat16(),
                        layer.bias.bfloat16())
    assert_bits(y, expected)


def test_torch_compile_matches_eager_bitwise():
    layer = make_layer(QLinearConfig(FP4, FP8, grad_config=E5M2))
    x = torch.randn(2, 6, 96)
    eager = run(layer, x)
    torch._dynamo.reset()
    compiled = run(torch.compile(layer, backend="aot_eager", fullgraph=True), x)
    for a, b in zip(eager, compiled):
        assert_bits(a, b)


def test_ddp_single_process_gloo(tmp_path):
    layer = make_layer(QLinearConfig(FP4, FP8, grad_config=E5M2))
    twin = make_layer(QLinearConfig(FP4, FP8, grad_config=E5M2))
    x = torch.randn(4, 96)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(layer)
        x_ = x.clone().requires_grad_()
        y = ddp(x_)
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(1)))
        # The DDP reducer must not drop the last reference to the process group: its
        # destructor would then join gloo's threads while holding the GIL, which one of them
        # may need to free a finished work item (a PyTorch deadlock, about 1 run in 7 here).
        del ddp
        gc.collect()
    finally:
        dist.destroy_process_group()
    reference = run(twin, x)
    for a, b in zip((y, x_.grad, layer.weight.grad, layer.bias.grad), reference):
        assert_bits(a.detach(), b.detach())


def test_from_float_shares_parameters_and_to_float_restores():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)
    layer = MXLinear.from_float(linear, QAT)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    run(layer, torch.randn(3, 64))
    before = linear.weight.detach().clone()
    optimizer.step()  # the optimizer built before the swap updates the shared parameters
    assert not torch.equal(layer.weight, before)
    back = layer.to_float()
    assert type(back) is nn.Linear and back.weight is layer.weight and back.bias is layer.bias
    assert "weights=float4_e2m1/32, activations=float8_e4m3/32" in repr(layer)


def test_constructor_like_nn_linear():
    layer = MXLinear(64, 16, bias=False, dtype=torch.bfloat16, qconfig=QAT)
    assert layer.weight.dtype == torch.bfloat16 and layer.bias is None
    assert layer(torch.randn(2, 64, dtype=torch.bfloat16)).shape == (2, 16)


@pytest.mark.parametrize("make, error, words", [
    (lambda: MXLinear(4, 4, qconfig=MXConfig("int8")), TypeError,
     "qconfig must be a torchmx.config.QLinearConfig"),
    (lambda: MXLinear.from_float(nn.Conv1d(2, 2, 1), QAT), TypeError, "linear must be a torch.nn.Linear"),
])
def test_errors(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["float8_e4m3", "float4_e2m1", "float6_e3m2", "int8"])
def test_gathered_mx_weight_dequantizes_like_the_operator_on_cuda(fmt):
    """An MXTensor weight (FSDP2's MX all-gather) takes the Triton backend's planned dequantize
    in MXLinear's forward: the operator's bits, also on later calls (the plan kept on the
    weight, then bound to its kernel) and once FSDP2 has gathered new bytes into the same
    tensors, whose storage it freed and allocated again."""
    from torchmx.nn.mx_linear import _dequantized
    w = torch.randn(96, 160, device="cuda").bfloat16()
    w[3, 7] = float("nan")
    mx = MXTensor.to_mx(w, fmt)
    expected = mx.dequantize().view(torch.int16)
    for _ in range(3):  # the plan made, called again and bound, the bound call
        assert torch.equal(_dequantized(mx).view(torch.int16), expected)
    assert callable(mx.__dict__["_torchmx_dequantize"][2])
    other = MXTensor.to_mx(w * -5, fmt)
    for tensor, new in ((mx._data, other._data), (mx._scale_e8m0, other._scale_e8m0)):
        storage = tensor.untyped_storage()
        size = storage.nbytes()
        storage.resize_(0)
        storage.resize_(size)
        tensor.copy_(new)
    assert torch.equal(_dequantized(mx).view(torch.int16), other.dequantize().view(torch.int16))

"""Straight-through autograd: ToMXConstrFunc, FromMXConstrFunc, NoopFwToMXBw, and backward
through every MX matmul."""

import pytest
import torch
import torch.nn.functional as F

from formats import FORMAT_IDS, FORMATS, HP_DTYPES, bit_view, wide_range_input
from torchmx import MXTensor, dtypes
from torchmx.mx_tensor import FromMXConstrFunc, NoopFwToMXBw, ToMXConstrFunc


# autograd's matmul backward multiplies by transposed MX operands (see docs/mx_tensor.md)
pytestmark = pytest.mark.filterwarnings("ignore::torchmx.mx_tensor.MXLayoutWarning")


def assert_bits_equal(actual, expected):
    assert type(actual) is torch.Tensor and actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert torch.equal(bit_view(actual), bit_view(expected))


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_straight_through_identity(fmt, dtype):
    x = wide_range_input((5, 45), dtype, seed=1).requires_grad_()
    grad = torch.randn(5, 45, dtype=dtype)
    (MXTensor.to_mx(x, fmt, 16).dequantize() * grad).sum().backward()
    assert_bits_equal(x.grad, grad)
    x.grad = None
    out = ToMXConstrFunc.apply(x, fmt, 16)  # torchmx 0.1.0's call
    (FromMXConstrFunc.apply(out, torch.float32) * grad.float()).sum().backward()
    assert_bits_equal(x.grad, grad)


@pytest.mark.parametrize("scale_mode", ["floor", "rceil"])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_clipped_straight_through(fmt, scale_mode):
    x = (torch.randn(8, 64, generator=torch.Generator().manual_seed(2)) * 100).requires_grad_()
    mx = MXTensor.to_mx(x, fmt, 8, scale_mode=scale_mode, block_dim=0, ste="clipped")
    mx.dequantize().sum().backward()
    # saturated: |x| above its block's largest value, elem max * 2**(scale - 127)
    largest = fmt.max * torch.exp2(mx._scale_e8m0.double() - 127).repeat_interleave(8, 0)
    saturated = x.detach().double().abs() > largest
    assert torch.equal(x.grad, (~saturated).float())
    if scale_mode == "floor" and fmt.is_float:  # floor scales clamp some block maxima
        assert saturated.any() and not saturated.all()


def test_from_mx_gradient_takes_the_logical_dtype():
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(4, 64)
    (MXTensor.to_mx(x, "float6_e2m3").dequantize(torch.float32) * grad).sum().backward()
    assert_bits_equal(x.grad, grad.to(torch.bfloat16))


@pytest.mark.parametrize("fmt", [dtypes.float8_e4m3, dtypes.float4_e2m1, dtypes.float6_e3m2], ids=str)
def test_noop_forward_quantizes_gradient(fmt):
    x = torch.randn(64, 24, dtype=torch.bfloat16, requires_grad=True)
    y = NoopFwToMXBw.apply(x, fmt, 32, 0)
    assert_bits_equal(y.detach(), x.detach())
    weight = wide_range_input((24, 64), torch.bfloat16, seed=3)
    (y.t() * weight).sum().backward()  # the incoming gradient is weight.t(): not contiguous
    assert isinstance(x.grad, MXTensor) and x.grad.block_dim == 0
    scale, data = torch.ops.torchmx.quantize_mx(weight.t().contiguous(), fmt.name, 32, block_dim=0)
    assert torch.equal(x.grad._scale_e8m0, scale) and torch.equal(x.grad._data, data)


def test_noop_forward_gradient_flows_through_upstream_ops():
    x = torch.randn(8, 64, requires_grad=True)
    w = torch.randn(16, 64, requires_grad=True)
    h = NoopFwToMXBw.apply(F.linear(x, w), "float8_e5m2", 16)
    F.relu(h).sum().backward()
    assert type(x.grad) is torch.Tensor and type(w.grad) is torch.Tensor
    g_mx = MXTensor.to_mx((F.linear(x, w) > 0).float(), "float8_e5m2", 16).dequantize()
    assert_bits_equal(x.grad, g_mx @ w.detach())


def integer_input(shape, seed):
    """Small integers: every format holds them exactly and fp32 sums of products are exact, so
    gradients compare bit for bit whatever the accumulation order."""
    return torch.randint(-3, 4, shape, generator=torch.Generator().manual_seed(seed)).float()


MATMULS = {
    "mm": ((6, 32), (32, 5), torch.mm),
    "matmul_3d_2d": ((2, 6, 32), (32, 5), torch.matmul),
    "bmm": ((3, 6, 32), (3, 32, 5), torch.bmm),
    "addmm": ((6, 32), (32, 5), lambda a, b: torch.addmm(torch.ones(5), a, b, alpha=2)),
    "baddbmm": ((3, 6, 32), (3, 32, 5), lambda a, b: torch.baddbmm(torch.ones(3, 6, 5), a, b)),
    "linear": ((6, 32), (5, 32), lambda a, b: F.linear(a, b, torch.ones(5))),
    "linear_3d": ((2, 6, 32), (5, 32), lambda a, b: F.linear(a, b, torch.ones(5))),
    "attention_qk": ((2, 3, 4, 32), (2, 3, 7, 32), lambda q, k: q @ k.transpose(-2, -1)),
    "mv": ((6, 32), (32,), torch.mv),
}


@pytest.mark.parametrize("which", ["both", "left", "right"])
@pytest.mark.parametrize("case", MATMULS)
@pytest.mark.parametrize("fmt", [dtypes.float8_e4m3, dtypes.float4_e2m1, dtypes.float6_e2m3,
                                 dtypes.int8], ids=str)
def test_backward_through_matmuls(fmt, case, which):
    shape_a, shape_b, op = MATMULS[case]
    a, b = integer_input(shape_a, 4).requires_grad_(), integer_input(shape_b, 5).requires_grad_()
    a_in = MXTensor.to_mx(a, fmt, 16) if which != "right" else a
    b_in = MXTensor.to_mx(b, fmt, 16, block_dim=0 if case in ("mm", "addmm", "matmul_3d_2d", "mv")
                          else -2 if case in ("bmm", "baddbmm") else -1) if which != "left" else b
    out = op(a_in, b_in)
    grad = integer_input(out.shape, 6)
    out.backward(grad)
    a_ref = (a_in.dequantize() if isinstance(a_in, MXTensor) else a).detach().requires_grad_()
    b_ref = (b_in.dequantize() if isinstance(b_in, MXTensor) else b).detach().requires_grad_()
    expected = op(a_ref, b_ref)
    expected.backward(grad)
    assert_bits_equal(out.detach(), expected.detach())
    assert_bits_equal(a.grad, a_ref.grad)
    assert_bits_equal(b.grad, b_ref.grad)


def test_linear_mx_mx_bias_backward_as_in_torchmx_010():
    """F.linear(mx, mx, b).backward() raises in torchmx 0.1.0."""
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(8, dtype=torch.bfloat16, requires_grad=True)
    F.linear(MXTensor.to_mx(x, "float8_e4m3"), MXTensor.to_mx(w, "float4_e2m1"), b).sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape
    assert all(g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in (x.grad, w.grad, b.grad))


def test_backward_through_views_and_fallback_ops():
    x = torch.randn(4, 6, 64, requires_grad=True)
    mx = MXTensor.to_mx(x, "float4_e2m1", 16)
    parts = [mx.transpose(0, 1)[1:3, :, 16:48], mx[:, :, 3:7], torch.cat([mx, mx], 0), mx.sum(-1)]
    sum(p.dequantize().sum() if isinstance(p, MXTensor) else p.sum() for p in parts).backward()
    expected = torch.zeros(4, 6, 64)
    expected.transpose(0, 1)[1:3, :, 16:48] += 1
    expected[:, :, 3:7] += 1
    expected += 3
    assert torch.equal(x.grad, expected)


@pytest.mark.parametrize("call, error, match", [
    (lambda x: NoopFwToMXBw.apply(x, "float8_e4m3", 0), ValueError, "block_size"),
    (lambda x: NoopFwToMXBw.apply(x, "float8_e4m3", 32, 5), ValueError, "block_dim"),
    (lambda x: NoopFwToMXBw.apply(x, "float8_e4m3", 32, -1, "bogus"), ValueError, "scale_mode"),
    (lambda x: NoopFwToMXBw.apply(x, "float8_e4m3", 32, -1, "floor", "nearest"), ValueError,
     "rounding"),
    (lambda x: NoopFwToMXBw.apply(x, "fp8"), ValueError, "elem_dtype"),
    (lambda x: NoopFwToMXBw.apply(x.double(), "float8_e4m3"), TypeError, "data_hp"),
    (lambda x: ToMXConstrFunc.apply(x, "int8", 32, "floor", "even", -1, None, "bad"), ValueError,
     "ste"),
    (lambda x: ToMXConstrFunc.apply(x, "int8", True), TypeError, "block_size"),
    (lambda x: ToMXConstrFunc.apply(x, "int8", 32, "floor", "stochastic", -1, "a"), TypeError,
     "seed"),
    (lambda x: FromMXConstrFunc.apply(MXTensor.to_mx(x, "int8"), torch.int8), ValueError,
     "target_dtype"),
    (lambda x: FromMXConstrFunc.apply(MXTensor.to_mx(x, "int8"), "float32"), TypeError,
     "target_dtype"),
    (lambda x: FromMXConstrFunc.apply(x, torch.float32), TypeError, "tensor_mx"),
])
def test_autograd_functions_validate_in_forward(call, error, match):
    """A bad argument fails at the call, not later in backward."""
    x = torch.randn(8, 64, requires_grad=True)
    with pytest.raises(error, match=match):
        call(x)


def test_to_mx_constr_func_takes_a_generator_seed_like_to_mx():
    x = torch.randn(8, 64, requires_grad=True)
    out = ToMXConstrFunc.apply(x, "float4_e2m1", 32, "floor", "stochastic", -1,
                               torch.Generator().manual_seed(1))
    same = MXTensor.to_mx(x, "float4_e2m1", rounding="stochastic",
                          seed=torch.Generator().manual_seed(1))
    assert torch.equal(out._data, same._data)
    out.dequantize().sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_mx_grad_of_a_leaf_accumulation_and_the_documented_recipe():
    """A leaf's .grad is the MXTensor NoopFwToMXBw made (torchmx 0.1.0). Accumulating into it,
    clipping or zeroing it in place raise a ValueError that says what to do; the recipe of
    docs/mx_tensor.md (a post-accumulate-grad hook that dequantizes it) makes all of them work."""
    x = torch.randn(4, 64, requires_grad=True)

    def backward():
        (NoopFwToMXBw.apply(x, "float8_e4m3") * 2).sum().backward()

    backward()
    assert isinstance(x.grad, MXTensor)
    for step in (backward, lambda: torch.nn.utils.clip_grad_norm_([x], 0.1),
                 lambda: torch.optim.SGD([x], lr=0.1).zero_grad(set_to_none=False)):
        with pytest.raises(ValueError, match=r"x\.grad = x\.grad\.dequantize\(\)"):
            step()
    x.grad = None
    x.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", p.grad.dequantize()))
    backward()
    backward()
    assert type(x.grad) is torch.Tensor and torch.equal(x.grad, torch.full_like(x, 4))
    torch.nn.utils.clip_grad_norm_([x], 0.1)
    torch.optim.SGD([x], lr=0.1).zero_grad(set_to_none=False)
    assert not x.grad.any()


@pytest.mark.parametrize("layout", ["2d", "3d", "3d_transposed"])
def test_linear_backward_matches_plain_linear(layout):
    """F.linear with MX operands (the torchmx::mx_linear op): gradients equal plain F.linear's
    on the dequantized operands (exact sums: small integers), for any input layout."""
    x = integer_input((8, 6, 64), 1)
    x = {"2d": x[0], "3d": x, "3d_transposed": x.transpose(0, 1)}[layout].requires_grad_()
    w = integer_input((5, 64), 2).requires_grad_()
    b = integer_input((5,), 3).requires_grad_()
    x_mx, w_mx = MXTensor.to_mx(x, "int8"), MXTensor.to_mx(w, "float8_e4m3")
    out = F.linear(x_mx, w_mx, b)
    grad = integer_input(out.shape, 4)
    out.backward(grad)
    refs = [t.dequantize().detach().requires_grad_() for t in (x_mx, w_mx)]
    refs.append(b.detach().clone().requires_grad_())
    expected = F.linear(*refs)
    expected.backward(grad)
    assert_bits_equal(out.detach(), expected.detach())
    for got, ref in zip((x.grad, w.grad, b.grad), refs):
        assert_bits_equal(got, ref.grad)

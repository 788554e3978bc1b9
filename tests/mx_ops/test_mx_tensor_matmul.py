"""MX matmuls: the exact dequantized operands in fp32, fp32 accumulation, then alpha and the
bias in fp32, one rounding to the logical dtype (torch.ops.torchmx.mx_matmul); the reduction-dim
layout warning and its strict switch."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from formats import FORMAT_IDS, FORMATS, HP_DTYPES, bit_view, wide_range_input
from torchmx import MXTensor
from torchmx.mx_tensor import (MXLayoutWarning, reset_layout_warning, set_strict_matmul,
                               strict_matmul)


@pytest.fixture(autouse=True)
def fresh_warning_state():
    reset_layout_warning()
    with strict_matmul(False):
        yield


def exact(t):
    return t.dequantize(torch.float32) if isinstance(t, MXTensor) else t.float()


def assert_exact(op, *operands, reference=None):
    """op on MX operands == `reference` (default: op) on their fp32 dequantization, rounded once
    to the logical dtype.

    On CUDA the two fp32 sums may be accumulated in different orders (our kernels vs cuBLAS's
    fp32 GEMM). Where the exact (fp64) result lies within fp32 accumulation error of a rounding
    boundary of the logical dtype, the two single roundings can land on the two neighbours of
    that boundary; only there, and only for plain products (no `reference`: no alpha, beta or
    bias), an output may be the reference's neighbour."""
    out = op(*operands)
    exact_operands = [exact(t) if isinstance(t, torch.Tensor) else t for t in operands]
    expected = (reference or op)(*exact_operands)
    dtype = next(t.dtype for t in operands if isinstance(t, torch.Tensor))
    assert type(out) is torch.Tensor and out.dtype == dtype
    expected = expected.to(dtype)
    same = bit_view(out) == bit_view(expected)
    if out.is_cuda and reference is None and not same.all():
        exact64 = op(*[t.double() for t in exact_operands])
        magnitude = op(*[t.double().abs() for t in exact_operands])
        k = exact_operands[0].shape[-1]
        neighbours = (bit_view(out).long() - bit_view(expected).long()).abs() == 1
        boundary = (out.double() + expected.double()) / 2
        near = (exact64 - boundary).abs() <= 2 * k * 2.0 ** -24 * magnitude
        same |= neighbours & near
    assert same.all(), f"{int((~same).sum())} of {same.numel()} outputs differ"


# With a bias, the product is accumulated first and the bias added to it in fp32 (as a fused
# bias epilogue does); torch's own fp32 addmm may start its accumulator from the bias instead.
def addmm_reference(c, x, y, beta=1, alpha=1):
    return (x @ y) * alpha + c * beta


def linear_reference(x, w, b=None):
    return F.linear(x, w) if b is None else F.linear(x, w) + b


def mx(shape, fmt, dtype, block_dim=-1, seed=0, block_size=32, device="cpu"):
    x = wide_range_input(shape, dtype, seed=seed) if min(shape) > 0 else torch.zeros(shape, dtype=dtype)
    x = torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0)  # NaN blocks tested separately
    return MXTensor.to_mx(x.to(device), fmt, block_size, block_dim=block_dim)


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_matmuls_are_exact(fmt, dtype):
    check_matmuls(fmt, dtype, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_matmuls_are_exact_on_cuda(fmt):
    for dtype in HP_DTYPES:
        check_matmuls(fmt, dtype, "cuda")


def check_matmuls(fmt, dtype, device):
    def q(*args, **kwargs):
        return mx(*args, device=device, **kwargs)

    a, b = q((7, 45), fmt, dtype, seed=1), q((45, 11), fmt, dtype, block_dim=0, seed=2)
    bias = torch.randn(11, dtype=dtype, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MXLayoutWarning)  # every layout here is hardware-friendly
        assert_exact(torch.mm, a, b)
        assert_exact(torch.matmul, a, b)
        assert_exact(lambda x, y: x @ y, a, b)
        assert_exact(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2), bias, a, b,
                     reference=lambda c, x, y: addmm_reference(c, x, y, 0.5, 2))
        assert_exact(F.linear, a, b.t())
        assert_exact(F.linear, a, b.t(), bias, reference=linear_reference)
        a3d = q((2, 7, 45), fmt, dtype, seed=11)
        assert_exact(F.linear, a3d, b.t(), bias, reference=linear_reference)
        assert_exact(F.linear, a3d.transpose(0, 1), b.t(), bias, reference=linear_reference)
        assert_exact(F.linear, a.view(1, 7, 45).expand(2, 7, 45), b.t())
        assert_exact(torch.mv, a, b[:, 0])
        assert_exact(torch.dot, a[0], b[:, 0])
        assert_exact(torch.vdot, a[0], b[:, 0])
        assert_exact(torch.addmv, bias[:7], a, b[:, 0], reference=lambda c, x, v: x @ v + c)
        assert_exact(torch.matmul, a[1], b)
        assert_exact(torch.matmul, a, b[:, 3])
        a3, b3 = q((3, 5, 40), fmt, dtype, seed=3), q((3, 40, 6), fmt, dtype, block_dim=1, seed=4)
        assert_exact(torch.bmm, a3, b3)
        assert_exact(torch.matmul, a3, b3)
        assert_exact(lambda c, x, y: torch.baddbmm(c, x, y, alpha=-1),
                     torch.randn(3, 5, 6, dtype=dtype, device=device), a3, b3,
                     reference=lambda c, x, y: addmm_reference(c, x, y, alpha=-1))
        assert_exact(torch.matmul, a3, b3[0])
        # one accumulation over the batch and K: (M, B*K) @ (B*K, N)
        assert_exact(lambda c, x, y: torch.addbmm(c, x, y, beta=2), bias[:6], a3, b3,
                     reference=lambda c, x, y: x.transpose(0, 1).reshape(5, -1) @ y.reshape(-1, 6)
                     + 2 * c)
        assert_exact(lambda c, u, v: torch.addr(c, u, v, alpha=0.5), bias[:7].outer(bias),
                     a[:, 0], b[0],
                     reference=lambda c, u, v: 0.5 * torch.outer(u, v) + c)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_attention_matmuls(fmt):
    q, k = mx((2, 3, 5, 64), fmt, torch.bfloat16, seed=5), mx((2, 3, 7, 64), fmt, torch.bfloat16, seed=6)
    v = mx((2, 3, 7, 16), fmt, torch.bfloat16, block_dim=-2, seed=7, block_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MXLayoutWarning)
        assert_exact(lambda q, k: q @ k.transpose(-2, -1), q, k)
        assert_exact(lambda q, k: torch.matmul(q, k.mT), q, k)
        scores = torch.softmax((q @ k.transpose(-2, -1)).float(), -1).to(torch.bfloat16)
        p = MXTensor.to_mx(scores, fmt, 4)
        assert_exact(torch.matmul, p, v)
        assert_exact(lambda q, k: q @ k[:1].transpose(-2, -1), q, k)  # broadcast batch


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_mx_times_plain_in_either_order(fmt):
    torch.manual_seed(8)  # the plain operands: the same whatever ran before on this worker
    a = mx((6, 70), fmt, torch.float16, seed=8)
    w = torch.randn(70, 9, dtype=torch.float16)
    assert_exact(torch.mm, a, w)
    assert_exact(torch.matmul, w.t(), a.t())
    assert_exact(F.linear, torch.randn(4, 70, dtype=torch.float16), a)
    assert_exact(F.linear, a, w.t(), torch.randn(9, dtype=torch.float16))


@pytest.mark.parametrize("shape_a, shape_b", [((0, 32), (32, 5)), ((4, 0), (0, 5)), ((4, 32), (32, 0))])
def test_empty_matmuls(shape_a, shape_b):
    a = mx(shape_a, "float4_e2m1", torch.bfloat16)
    b = mx(shape_b, "float4_e2m1", torch.bfloat16, block_dim=0)
    assert_exact(torch.mm, a, b)


def test_nan_blocks_propagate():
    x = torch.randn(2, 64)
    x[0, 3] = float("nan")
    a = MXTensor.to_mx(x, "float8_e4m3")
    out = a @ MXTensor.to_mx(torch.randn(64, 3), "float8_e4m3", block_dim=0)
    assert out[0].isnan().all() and not out[1].isnan().any()


def test_readme_layout_warns_once_and_stays_exact():
    x = mx((16, 64), "float8_e4m3", torch.bfloat16, seed=9)
    y = mx((64, 32), "float6_e3m2", torch.bfloat16, seed=10)  # blocks along N, as 0.1.0's README
    with pytest.warns(MXLayoutWarning, match=r"'other'.*reduction dim 0.*block_dim=-2"):
        assert_exact(torch.matmul, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MXLayoutWarning)
        assert_exact(torch.matmul, x, y)  # once per process


def test_strict_switch_raises():
    x = mx((16, 64), "float8_e4m3", torch.bfloat16)
    y = mx((64, 32), "float8_e4m3", torch.bfloat16)
    with strict_matmul():
        with pytest.raises(ValueError, match="strict_matmul"):
            x @ y
        with pytest.raises(ValueError, match=r"'weight'.*block_dim=-1"):
            F.linear(x, y.t())  # the weight (32, 64) has its blocks along N
        with pytest.raises(ValueError, match="'mat2'"):
            torch.mm(x, y)
        assert_exact(torch.matmul, x, mx((64, 32), "float8_e4m3", torch.bfloat16, block_dim=0))
    assert set_strict_matmul(True) is False and set_strict_matmul(False) is True
    with pytest.raises(TypeError, match="enabled"):
        set_strict_matmul("yes")


def test_mixed_dtypes_raise():
    a = mx((4, 32), "int8", torch.bfloat16)
    b = mx((32, 4), "int8", torch.float32, block_dim=0)
    with pytest.raises(ValueError, match="one logical dtype"):
        a @ b
    with pytest.raises(ValueError, match="one logical dtype"):
        torch.mm(a, torch.randn(32, 4))


def test_addbmm_addr_vdot_keep_the_layout_rules():
    a3 = mx((3, 5, 40), "float8_e4m3", torch.bfloat16, seed=1)
    b3 = mx((3, 40, 6), "float8_e4m3", torch.bfloat16, block_dim=1, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MXLayoutWarning)
        torch.addbmm(torch.zeros(5, 6, dtype=torch.bfloat16), a3, b3)
        torch.vdot(a3[0, 0], b3[0, :, 0])
    b3_along_n = mx((3, 40, 6), "float8_e4m3", torch.bfloat16, block_dim=2, block_size=2, seed=2)
    with strict_matmul(), pytest.raises(ValueError, match="'batch2'"):
        torch.addbmm(torch.zeros(5, 6, dtype=torch.bfloat16), a3, b3_along_n)


def test_out_arguments_give_a_clear_error():
    a = mx((4, 32), "float8_e4m3", torch.float32)
    b = mx((32, 4), "float8_e4m3", torch.float32, block_dim=0)
    out = torch.empty(4, 4)
    for call in (lambda: torch.mm(a, b, out=out), lambda: torch.matmul(a, b, out=out),
                 lambda: torch.bmm(a[None], b[None], out=out[None]),
                 lambda: torch.cat([a, a], out=torch.empty(8, 32))):
        with pytest.raises(TypeError, match="out= is not supported with MXTensor"):
            call()
    torch.add(a, 1, out=torch.empty(4, 32))  # allow-listed ops still write into plain tensors


def integer_operand(shape, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=generator).to(dtype)


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
def test_result_does_not_depend_on_the_operands_layout(dtype):
    """Exact sums (small integers): every layout of the same logical operands gives the same
    bits. (With general fp32 data the summation order of the fp32 GEMM may depend on strides,
    as for plain tensors: docs/mx_tensor.md.)"""
    x, w = integer_operand((6, 64), 1, dtype), integer_operand((64, 5), 2, dtype)
    x_mx, w_mx = MXTensor.to_mx(x, "int8"), MXTensor.to_mx(w, "int8", block_dim=0)
    w_t = MXTensor.to_mx(w.t().contiguous(), "int8").t()  # same values, transposed storage
    expected = (x_mx.dequantize(torch.float32) @ w_mx.dequantize(torch.float32)).to(dtype)
    for out in (x_mx @ w_mx, x_mx @ w_t, torch.mm(x_mx, w_t), F.linear(x_mx, w_t.t()),
                F.linear(x_mx, w_mx.t()), (w_t.t() @ x_mx.t()).t(),
                torch.matmul(x_mx.view(2, 3, 64), w_t).view(6, 5)):
        assert torch.equal(bit_view(out), bit_view(expected))


OPCHECK_CASES = {
    "mm": ((torch.randn(4, 8), torch.randn(8, 3)), dict(out_dtype=torch.float32)),
    "bias_bf16": ((torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 3, dtype=torch.bfloat16),
                   torch.randn(3, dtype=torch.bfloat16)), dict(out_dtype=torch.bfloat16)),
    "addmm_scalars": ((torch.randn(4, 8), torch.randn(8, 3), torch.randn(4, 3)),
                      dict(out_dtype=torch.float16, alpha=2.0, beta=0.5)),
    "batched_broadcast": ((torch.randn(2, 1, 4, 8), torch.randn(3, 8, 5)),
                          dict(out_dtype=torch.float32)),
    "vector_left": ((torch.randn(8), torch.randn(2, 8, 3)), dict(out_dtype=torch.float32)),
    "vector_right": ((torch.randn(2, 4, 8), torch.randn(8)), dict(out_dtype=torch.bfloat16)),
    "dot": ((torch.randn(8), torch.randn(8)), dict(out_dtype=torch.float32)),
}


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_mx_matmul_opcheck(case):
    args, kwargs = OPCHECK_CASES[case]
    args = tuple(t.requires_grad_() for t in args)
    torch.library.opcheck(torch.ops.torchmx.mx_matmul.default, args, kwargs)


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 8), (8,)])
def test_mx_linear_opcheck(shape):
    for bias in (None, torch.randn(5, requires_grad=True)):
        args = (torch.randn(shape, requires_grad=True), torch.randn(5, 8, requires_grad=True), bias)
        torch.library.opcheck(torch.ops.torchmx.mx_linear.default, args,
                              dict(out_dtype=torch.float32))

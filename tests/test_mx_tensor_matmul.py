"""MX matmuls: the exact dequantized operands in fp32, fp32 accumulation, one rounding to the
logical dtype; the reduction-dim layout warning and its strict switch."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import torchmx.aten_ops as aten_ops
from formats import FORMAT_IDS, FORMATS, HP_DTYPES, bit_view, wide_range_input
from torchmx import MXTensor
from torchmx.mx_tensor import MXLayoutWarning, set_strict_matmul, strict_matmul


@pytest.fixture(autouse=True)
def fresh_warning_state(monkeypatch):
    monkeypatch.setattr(aten_ops, "_warned", False)
    monkeypatch.setattr(aten_ops, "_strict", False)


def exact(t):
    return t.dequantize(torch.float32) if isinstance(t, MXTensor) else t.float()


def assert_exact(op, *operands):
    """op on MX operands == op on their fp32 dequantization, rounded once to the logical dtype."""
    out = op(*operands)
    expected = op(*[exact(t) if isinstance(t, torch.Tensor) else t for t in operands])
    dtype = next(t.dtype for t in operands if isinstance(t, torch.Tensor))
    assert type(out) is torch.Tensor and out.dtype == dtype
    assert torch.equal(bit_view(out), bit_view(expected.to(dtype)))


def mx(shape, fmt, dtype, block_dim=-1, seed=0, block_size=32, device="cpu"):
    x = wide_range_input(shape, dtype, seed=seed) if min(shape) > 0 else torch.zeros(shape, dtype=dtype)
    x = torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0)  # NaN blocks tested separately
    return MXTensor.to_mx(x.to(device), fmt, block_size, block_dim=block_dim)


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_matmuls_are_exact(fmt, dtype):
    check_matmuls(fmt, dtype, "cpu")


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
        assert_exact(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2), bias, a, b)
        assert_exact(F.linear, a, b.t())
        assert_exact(F.linear, a, b.t(), bias)
        assert_exact(F.linear, q((2, 7, 45), fmt, dtype, seed=11), b.t(), bias)
        assert_exact(F.linear, a.view(1, 7, 45).expand(2, 7, 45), b.t())
        assert_exact(torch.mv, a, b[:, 0])
        assert_exact(torch.dot, a[0], b[:, 0])
        assert_exact(torch.addmv, bias[:7], a, b[:, 0])
        assert_exact(torch.matmul, a[1], b)
        assert_exact(torch.matmul, a, b[:, 3])
        a3, b3 = q((3, 5, 40), fmt, dtype, seed=3), q((3, 40, 6), fmt, dtype, block_dim=1, seed=4)
        assert_exact(torch.bmm, a3, b3)
        assert_exact(torch.matmul, a3, b3)
        assert_exact(lambda c, x, y: torch.baddbmm(c, x, y, alpha=-1),
                     torch.randn(3, 5, 6, dtype=dtype, device=device), a3, b3)
        assert_exact(torch.matmul, a3, b3[0])


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
    with pytest.warns(MXLayoutWarning, match=r"'mat2'.*reduction dim 0.*block_dim=-2"):
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
        with pytest.raises(ValueError, match="'mat2'"):
            F.linear(x, y.t())  # the weight (32, 64) has its blocks along N
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

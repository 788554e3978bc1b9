"""The op bodies check a kind of arguments once (torchmx.ops._ACCEPTED for quantize_mx /
dequantize_mx, mx_ops.weight_matmul._CHECKED for mx_weight_linear): an accepted kind is looked
up after, any change of what the checks read (values, dtypes, shapes) is checked afresh, a
rejected kind is never remembered, and the results are the same bits either way."""

import pytest
import torch

from torchmx import ops
from torchmx.mx_ops import weight_matmul

FMT = "float4_e2m1"


@pytest.fixture(autouse=True)
def _empty_memos():
    ops._ACCEPTED.clear()
    weight_matmul._CHECKED.clear()
    yield


def test_quantize_and_dequantize_check_a_kind_once():
    x = torch.randn(2, 64)
    first = torch.ops.torchmx.quantize_mx(x, FMT, 32)
    assert len(ops._ACCEPTED) == 1
    again = torch.ops.torchmx.quantize_mx(x.clone(), FMT, 32)
    assert len(ops._ACCEPTED) == 1 and all(map(torch.equal, first, again))
    torch.ops.torchmx.quantize_mx(x.bfloat16(), FMT, 32)  # dtype
    torch.ops.torchmx.quantize_mx(x, FMT, 16)  # block size
    torch.ops.torchmx.quantize_mx(x, FMT, 32, block_dim=0)  # axis
    assert len(ops._ACCEPTED) == 4
    scale, data = first
    out = torch.ops.torchmx.dequantize_mx(data, scale, FMT, 32, torch.bfloat16)
    assert torch.equal(out.view(torch.int16),
                       torch.ops.torchmx.dequantize_mx(data, scale, FMT, 32, torch.bfloat16)
                       .view(torch.int16))
    assert len(ops._ACCEPTED) == 5


def test_a_rejected_kind_is_checked_every_time():
    x = torch.randn(2, 64)
    torch.ops.torchmx.quantize_mx(x, FMT, 32)
    for _ in range(2):
        with pytest.raises(ValueError, match="scale_mode"):
            torch.ops.torchmx.quantize_mx(x, FMT, 32, scale_mode="nearest")
        with pytest.raises(ValueError, match="block_dim"):
            torch.ops.torchmx.quantize_mx(x, FMT, 32, block_dim=2)
    scale, data = torch.ops.torchmx.quantize_mx(x, FMT, 32)
    torch.ops.torchmx.dequantize_mx(data, scale, FMT, 32)
    for _ in range(2):  # the same dtypes, a scale of the wrong shape
        with pytest.raises(ValueError, match="shapes do not match"):
            torch.ops.torchmx.dequantize_mx(data, scale[:, :1], FMT, 32)
    assert len(ops._ACCEPTED) == 2


def test_mx_weight_linear_checks_its_parts_once():
    w = torch.randn(8, 64)
    scale, data = torch.ops.torchmx.quantize_mx(w, FMT, 32)
    x = torch.randn(3, 64)
    call = torch.ops.torchmx.mx_weight_linear
    first = call(x, scale, data, FMT, 32, 64, None, torch.float32)
    assert len(weight_matmul._CHECKED) == 1
    assert torch.equal(first, call(x.clone(), scale, data, FMT, 32, 64, None, torch.float32))
    assert len(weight_matmul._CHECKED) == 1
    call(x, scale, data, FMT, 32, 64, torch.zeros(8), torch.float32)  # a bias
    call(x[:, None], scale, data, FMT, 32, 64, None, torch.float32)  # more dims: same checks
    assert len(weight_matmul._CHECKED) == 2
    for _ in range(2):
        with pytest.raises(ValueError, match="bias"):
            call(x, scale, data, FMT, 32, 64, torch.zeros(7), torch.float32)
        with pytest.raises(ValueError, match="weight parts"):
            call(x, scale[:4], data, FMT, 32, 64, None, torch.float32)
        with pytest.raises((TypeError, ValueError), match="out_dtype"):
            call(x, scale, data, FMT, 32, 64, None, torch.int32)
    assert len(weight_matmul._CHECKED) == 2


def test_the_memos_start_over_when_full(monkeypatch):
    monkeypatch.setattr(ops, "_MAX_ACCEPTED", 2)
    for block_size in (16, 32, 64):  # three kinds
        torch.ops.torchmx.quantize_mx(torch.randn(1, 64), FMT, block_size)
    assert len(ops._ACCEPTED) == 1  # the third, after a start over

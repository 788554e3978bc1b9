"""The C kernels' host path decides a kind of call once (cpu_kernels._QuantizeCall /
_DequantizeCall: output shapes, row split, ctypes arguments) and looks it up after: a plan is
made per kind only, later calls of the kind give the reference's bits, and the plan tables
start over when full (torchmx/_memo.py)."""

import pytest
import torch

from formats import FORMATS, bit_view, wide_range_input
from torchmx import _memo, cpu_kernels
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler on this machine")
FP4 = FORMATS[4]


@pytest.fixture(autouse=True)
def _empty_plans():
    cpu_kernels._QUANTIZE_CALLS.clear()
    cpu_kernels._DEQUANTIZE_CALLS.clear()


def test_one_plan_per_kind_and_the_reference_bits_on_every_call():
    x = wide_range_input((5, 96), torch.bfloat16, seed=1)
    expected = quantize_mx_reference(x, FP4, 32, scale_mode="floor", rounding="even", block_dim=1)
    for y in (x, x.clone(), x.t().contiguous().t()):  # a non-contiguous input of the same kind
        got = cpu_kernels.quantize(y, FP4, 32, "floor", "even", 1, None)
        assert all(torch.equal(e, g) for e, g in zip(expected, got))
    assert len(cpu_kernels._QUANTIZE_CALLS) == 1
    scale, data = expected
    for target in (torch.float32, torch.bfloat16):
        want = dequantize_mx_reference(data, scale, FP4, 32, target, 1, block_dim_size=96)
        for _ in range(2):
            out = cpu_kernels.dequantize(data, scale, FP4, 32, target, 1, 96)
            assert torch.equal(bit_view(out), bit_view(want))
    assert len(cpu_kernels._DEQUANTIZE_CALLS) == 2  # one per target dtype


@pytest.mark.parametrize("shape, axis", [((3, 40, 2), 1), ((), 0), ((0, 64), 1), ((7,), 0)])
def test_every_kind_its_own_plan(shape, axis):
    x = wide_range_input(shape, torch.float32, seed=2)
    n = 1 if x.dim() == 0 else x.shape[axis]
    for block_size, rounding, seed in ((32, "even", None), (3, "stochastic", 5)):
        expected = quantize_mx_reference(x, FP4, block_size, scale_mode="even",
                                         rounding=rounding, block_dim=axis, seed=seed)
        got = cpu_kernels.quantize(x, FP4, block_size, "even", rounding, axis, seed)
        assert all(torch.equal(e, g) for e, g in zip(expected, got))
        out = cpu_kernels.dequantize(got[1], got[0], FP4, block_size, torch.float16, axis, n)
        want = dequantize_mx_reference(got[1], got[0], FP4, block_size, torch.float16, axis,
                                       block_dim_size=n)
        assert torch.equal(bit_view(out), bit_view(want))
    assert len(cpu_kernels._QUANTIZE_CALLS) == 2


def test_stochastic_seeds_are_per_call_not_per_plan():
    x = wide_range_input((4, 64), torch.float32, seed=3)
    a, b = (cpu_kernels.quantize(x, FP4, 32, "floor", "stochastic", 1, s)[1] for s in (1, 2))
    assert not torch.equal(a, b) and len(cpu_kernels._QUANTIZE_CALLS) == 1
    assert torch.equal(a, quantize_mx_reference(x, FP4, 32, rounding="stochastic", seed=1)[1])


def test_rows_split_across_threads_by_the_plan():
    x = wide_range_input((64, 4096), torch.float32, seed=4)  # 2 x 2**17 elements: 4 chunks
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        scale, data = cpu_kernels.quantize(x, FP4, 32, "floor", "even", 1, None)
        out = cpu_kernels.dequantize(data, scale, FP4, 32, torch.float32, 1, 4096)
    finally:
        torch.set_num_threads(threads)
    plan = next(iter(cpu_kernels._QUANTIZE_CALLS.values()))
    assert plan.chunks > 1
    expected = quantize_mx_reference(x, FP4, 32)
    assert torch.equal(scale, expected[0]) and torch.equal(data, expected[1])
    want = dequantize_mx_reference(data, scale, FP4, 32, torch.float32)
    assert torch.equal(bit_view(out), bit_view(want))


def test_plan_tables_start_over_when_full(monkeypatch):
    monkeypatch.setattr(_memo, "MEMO_LIMIT", 2)
    for n in (32, 64, 96):  # three kinds
        cpu_kernels.quantize(torch.ones(1, n), FP4, 32, "floor", "even", 1, None)
    assert len(cpu_kernels._QUANTIZE_CALLS) == 1  # the third, after a start over
    table = {}
    assert [_memo.memo(table, k, lambda k=k: k * 10) for k in (1, 1, 2, 3)] == [10, 10, 20, 30]
    assert table == {3: 30}

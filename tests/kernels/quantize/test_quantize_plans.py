"""The Triton quantize / dequantize plans (kernels/quantize/triton_backend.QuantizePlan,
DequantizePlan): one plan per key (shape, strides, dtype, alignment, device, options), reused
by later calls, a new one when any part of the key changes, dropped when TUNING or KNOBS is
written; and a planned call gives the same bits as a fresh plan and as the reference.

Without a GPU the kernels run under Triton's interpreter (tests/conftest.py), on tiny shapes."""

import pytest
import torch

pytest.importorskip("triton")

from formats import wide_range_input  # noqa: E402
from torchmx import dtypes  # noqa: E402
from torchmx import _memo  # noqa: E402
from torchmx.kernels.quantize import triton_backend as tb  # noqa: E402
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP4, FP6, FP8 = dtypes.float4_e2m1, dtypes.float6_e3m2, dtypes.float8_e4m3


@pytest.fixture(autouse=True)
def _no_plans():
    tb._PLANS.clear()
    yield
    tb._PLANS.clear()


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def _same(a, b):
    """Bit for bit, every NaN taken as one NaN (the reference's NaN bits depend on the
    platform; the contract says NaN)."""
    a, b = a.cpu(), b.cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.is_floating_point():
        nan = torch.isnan(a)
        assert torch.equal(nan, torch.isnan(b))
        a, b = a.masked_fill(nan, 0), b.masked_fill(nan, 0)
    assert torch.equal(_bits(a), _bits(b))


def _quantize(x, fmt=FP4, block_size=32, axis=-1, rounding="even"):
    return tb.quantize(x, fmt, block_size, "floor", rounding, axis % x.dim(), None)


def _plans(kind):
    return [plan for key, plan in tb._PLANS.items() if key[0] == kind]


# (shape, dtype, format, block size, axis): the rows kernels, the pair kernel, the cols kernel,
# a second packing pass (block 5 of fp4, 6 of fp6) and a strided copy.
CASES = [((4, 64), torch.bfloat16, FP4, 32, -1), ((3, 64), torch.float32, FP8, 32, -1),
         ((64, 6), torch.float16, FP6, 16, 0), ((3, 40), torch.bfloat16, FP4, 5, -1),
         ((2, 48), torch.float32, FP6, 6, -1)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2].name}-{c[3]}-{c[1]}-{c[4]}")
def test_planned_calls_equal_the_first_and_the_reference(case):
    shape, dtype, fmt, block_size, axis = case
    x = wide_range_input(shape, dtype, seed=len(shape) + block_size).to(DEVICE)
    ax = axis % x.dim()
    n = shape[ax]
    expected = quantize_mx_reference(x.cpu(), fmt, block_size, block_dim=ax)
    expected_out = dequantize_mx_reference(expected[1], expected[0], fmt, block_size,
                                           torch.bfloat16, ax, block_dim_size=n)
    for call in range(3):  # builds the plans, then reuses them with new tensors
        y = x.clone()
        scale, data = _quantize(y, fmt, block_size, ax)
        _same(scale, expected[0])
        _same(data, expected[1])
        _same(tb.dequantize(data, scale, fmt, block_size, torch.bfloat16, ax, n), expected_out)
        assert len(_plans("quantize")) == len(_plans("dequantize")) == 1


def test_a_plan_is_reused_and_a_new_key_makes_a_new_one():
    x = wide_range_input((4, 64), torch.bfloat16, seed=1).to(DEVICE)
    _quantize(x)
    (plan,) = _plans("quantize")
    _quantize(x.clone())  # another tensor of the same kind
    assert _plans("quantize") == [plan]
    buffer = torch.empty(x.numel() + 1, dtype=x.dtype, device=DEVICE)
    buffer[1:] = x.flatten()
    others = {"dtype": x.float(), "shape": x[:3].clone(), "stride": x.t().contiguous().t(),
              "alignment": buffer[1:].view(4, 64)}
    count = 1
    for name, other in others.items():
        assert tb._PLANS.get(("quantize", other.shape, other.stride(), other.dtype,
                              other.data_ptr() & 15, other.device, FP4, 32, "floor", "even",
                              other.dim() - 1)) is None, name
        scale, data = _quantize(other)
        count += 1
        assert len(_plans("quantize")) == count, name
        expected = quantize_mx_reference(other.cpu(), FP4, 32, block_dim=other.dim() - 1)
        _same(scale, expected[0])
        _same(data, expected[1])
    _quantize(x, FP8)  # another format
    _quantize(x, block_size=16)
    _quantize(x, axis=0)
    assert len(_plans("quantize")) == count + 3
    assert _plans("quantize")[0] is plan


def test_the_device_is_part_of_the_key():
    x = torch.zeros(4, 64, dtype=torch.bfloat16, device=DEVICE)
    meta = torch.empty(4, 64, dtype=torch.bfloat16, device="meta")
    scale = torch.zeros(4, 2, dtype=torch.uint8, device=DEVICE)
    data = torch.zeros(4, 32, dtype=torch.uint8, device=DEVICE)
    tb.quantize(x, FP4, 32, "floor", "even", 1, None)
    tb.dequantize(data, scale, FP4, 32, torch.bfloat16, 1, 64)
    keys = list(tb._PLANS)
    assert {key[5] for key in keys if key[0] == "quantize"} == {x.device}
    assert {key[8] for key in keys if key[0] == "dequantize"} == {x.device}
    assert meta.device not in {key[5] for key in keys}


def test_dequantize_plans_key_both_operands():
    x = wide_range_input((4, 64), torch.bfloat16, seed=2).to(DEVICE)
    scale, data = _quantize(x)
    tb.dequantize(data, scale, FP4, 32, torch.bfloat16, 1, 64)
    tb.dequantize(data.clone(), scale.clone(), FP4, 32, torch.bfloat16, 1, 64)
    assert len(_plans("dequantize")) == 1
    tb.dequantize(data, scale, FP4, 32, torch.float32, 1, 64)  # target dtype
    strided = scale.t().contiguous().t()  # the scales' strides
    _same(tb.dequantize(data, strided, FP4, 32, torch.bfloat16, 1, 64),
          tb.dequantize(data, scale, FP4, 32, torch.bfloat16, 1, 64))
    assert len(_plans("dequantize")) == 3


@pytest.mark.parametrize("table, entry, value", [
    ("TUNING", "quantize_rows", {"elements": 2048, "columns": 64, "num_warps": 4}),
    ("KNOBS", "thread_rows", False)])
def test_writing_a_setting_drops_the_plans(monkeypatch, table, entry, value):
    x = wide_range_input((4, 64), torch.float32, seed=3).to(DEVICE)
    _quantize(x)
    assert tb._PLANS
    monkeypatch.setitem(getattr(tb, table), entry, value)
    assert not tb._PLANS
    scale, data = _quantize(x)
    expected = quantize_mx_reference(x.cpu(), FP4, 32, block_dim=1)
    _same(scale, expected[0])
    _same(data, expected[1])


def test_stochastic_rounding_is_planned_at_each_call():
    x = wide_range_input((4, 64), torch.bfloat16, seed=4).to(DEVICE)
    for seed in (1, 16, 12345):
        got = tb.quantize(x, FP4, 32, "floor", "stochastic", 1, seed)
        expected = quantize_mx_reference(x.cpu(), FP4, 32, rounding="stochastic", block_dim=1,
                                         seed=seed)
        _same(got[0], expected[0])
        _same(got[1], expected[1])
    assert not tb._PLANS


def test_empty_inputs_and_the_plan_limit(monkeypatch):
    monkeypatch.setattr(_memo, "MEMO_LIMIT", 2)
    empty = torch.empty(0, 64, dtype=torch.bfloat16, device=DEVICE)
    scale, data = _quantize(empty)
    assert scale.shape == (0, 2) and data.shape == (0, 32)
    assert tb.dequantize(data, scale, FP4, 32, torch.bfloat16, 1, 64).shape == (0, 64)
    assert len(tb._PLANS) == 2
    _quantize(torch.zeros(1, 64, dtype=torch.bfloat16, device=DEVICE))  # over the limit
    assert len(tb._PLANS) == 1


ON_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# and an input whose rows are strided (a transposed matrix)
BOUND_CASES = CASES + [((64, 4), torch.bfloat16, FP8, 32, "transposed")]


@pytest.mark.gpu
@ON_CUDA
@pytest.mark.parametrize("case", BOUND_CASES, ids=lambda c: f"{c[2].name}-{c[3]}-{c[1]}-{c[4]}")
def test_calls_bound_to_the_device_give_the_plans_bits(case):
    """A plan of one launch on the call's tensors binds, after its first call on a device, a
    call that passes the new tensors' addresses to that device's compiled kernel: the same
    bits as the first call, into fresh outputs every time."""
    shape, dtype, fmt, block_size, axis = case
    x = wide_range_input(shape, dtype, seed=5).to("cuda")
    if axis == "transposed":
        x, axis = x.t(), -1
    ax = axis % x.dim()
    n = x.shape[ax]
    first = _quantize(x, fmt, block_size, ax)
    first_out = tb.dequantize(first[1], first[0], fmt, block_size, torch.bfloat16, ax, n)
    [qplan], [dplan] = _plans("quantize"), _plans("dequantize")
    index = torch.cuda.current_device()
    one_launch = block_size % fmt.codes_per_group == 0  # no packing pass
    assert (qplan.device_calls is not None) == (one_launch and not qplan.copy)
    assert (dplan.device_calls is not None) == one_launch
    for plan in (qplan, dplan):
        assert plan.device_calls is None or callable(plan.device_calls[index])
    expected = quantize_mx_reference(x.cpu(), fmt, block_size, block_dim=ax)
    _same(first[0], expected[0])
    _same(first[1], expected[1])
    for _ in range(2):
        scale, data = _quantize(x.clone() if x.is_contiguous() else x.t().clone().t(), fmt,
                                block_size, ax)
        _same(scale, first[0])
        _same(data, first[1])
        assert data.data_ptr() != first[1].data_ptr()
        out = tb.dequantize(data.clone(), scale.clone(), fmt, block_size, torch.bfloat16, ax, n)
        _same(out, first_out)
        assert out.data_ptr() != first_out.data_ptr()
    assert len(_plans("quantize")) == len(_plans("dequantize")) == 1


@pytest.mark.gpu
@ON_CUDA
@pytest.mark.parametrize("kind", ["quantize", "dequantize"])
def test_a_launch_hook_takes_the_launches_through_triton(monkeypatch, kind):
    x = wide_range_input((4, 64), torch.bfloat16, seed=6).to("cuda")
    scale, data = _quantize(x)
    call = (lambda: _quantize(x)) if kind == "quantize" else (
        lambda: tb.dequantize(data, scale, FP4, 32, torch.bfloat16, 1, 64))
    want = call()  # (the dequantize plan's first call)
    [plan] = _plans(kind)
    index = torch.cuda.current_device()
    bound, taken = plan.device_calls[index], []
    plan.device_calls[index] = lambda *tensors: taken.append(1) or bound(*tensors)
    got = call()
    assert taken == [1]
    monkeypatch.setattr(tb, "hooks_installed", lambda: True)  # a profiler's hook
    again = call()
    assert taken == [1]
    for a, b in ((got, want), (again, want)):
        for t, u in zip(a, b) if kind == "quantize" else ((a, b),):
            _same(t, u)

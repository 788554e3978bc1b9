"""Calling a torchmx operator's Python object (`torchmx.ops.quantize_mx(...)`) goes straight to
its function where nothing could tell (torchmx/_library.py): the same bits as the operator
`torch.ops.torchmx...`; and every call that something could tell apart (tracing, modes,
subclasses, a gradient asked, an argument the schema would convert or refuse) still goes
through the operator."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from formats import FORMAT_IDS, FORMATS, bit_view, wide_range_input
from torchmx import ops
from torchmx._library import _plain_types

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")])]


class OperatorCalls:
    """Stands in for an op's `default` (the dispatcher call) and counts the calls it gets."""

    def __init__(self, op):
        self.real, self.calls = op.default, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def counted(monkeypatch):
    """(quantize_mx's counter, dequantize_mx's counter)."""
    counters = OperatorCalls(ops.quantize_mx), OperatorCalls(ops.dequantize_mx)
    monkeypatch.setattr(ops.quantize_mx, "default", counters[0])
    monkeypatch.setattr(ops.dequantize_mx, "default", counters[1])
    return counters


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_direct_calls_give_the_operators_bits(counted, device, fmt, dtype):
    x = wide_range_input((7, 96), dtype, seed=3).to(device)
    for kwargs in ({}, dict(scale_mode="rceil", block_dim=0), dict(rounding="stochastic", seed=9)):
        scale, data = ops.quantize_mx(x, fmt.name, 32, **kwargs)
        want = torch.ops.torchmx.quantize_mx(x, fmt.name, 32, **kwargs)
        assert torch.equal(scale, want[0]) and torch.equal(data, want[1])
        axis = kwargs.get("block_dim", -1)
        back = ops.dequantize_mx(data, scale, fmt.name, 32, dtype, axis,
                                 block_dim_size=x.shape[axis])
        want = torch.ops.torchmx.dequantize_mx(data, scale, fmt.name, 32, dtype, axis,
                                               block_dim_size=x.shape[axis])
        assert torch.equal(bit_view(back), bit_view(want))
    # keywords for positional parameters, and a 0-d input
    scale, data = ops.quantize_mx(data_hp=x[0, 0], elem_dtype_name=fmt.name, block_size=32)
    assert torch.equal(data, torch.ops.torchmx.quantize_mx(x[0, 0], fmt.name, 32)[1])
    assert counted[0].calls == counted[1].calls == 0


def test_a_parameter_is_a_plain_tensor(counted):
    x = torch.nn.Parameter(torch.randn(2, 64), requires_grad=False)
    ops.quantize_mx(x, "float8_e4m3", 32)
    assert counted[0].calls == 0


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
@pytest.mark.parametrize("case", ["grad asked", "grad asked by keyword", "dispatch mode",
                                  "function mode", "jit trace", "subclass"])
def test_what_could_tell_the_difference_takes_the_operator(counted, case):
    x = torch.randn(2, 64)
    scale, data = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32)
    if case == "grad asked":
        ops.quantize_mx(x.requires_grad_(), "float4_e2m1", 32)
        with torch.no_grad():  # no gradient asked: direct again
            ops.quantize_mx(x, "float4_e2m1", 32)
    elif case == "grad asked by keyword":
        ops.quantize_mx(data_hp=x.requires_grad_(), elem_dtype_name="float4_e2m1", block_size=32)
    elif case == "dispatch mode":
        class Names(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.seen.append(str(func))
                return func(*args, **(kwargs or {}))
        with Names() as names:
            names.seen = []
            ops.quantize_mx(x, "float4_e2m1", 32)
        assert "torchmx.quantize_mx.default" in names.seen
    elif case == "function mode":
        with torch.device("cpu"):  # a TorchFunctionMode
            ops.quantize_mx(x, "float4_e2m1", 32)
    elif case == "jit trace":
        traced = torch.jit.trace(lambda t: ops.quantize_mx(t, "float4_e2m1", 32)[1], x,
                                 check_trace=False)
        assert "torchmx::quantize_mx" in str(traced.graph)
        assert torch.equal(traced(x), data)
    elif case == "subclass":
        class Logged(torch.Tensor):
            seen = []

            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                cls.seen.append(func)
                return super().__torch_function__(func, types, args, kwargs or {})
        ops.quantize_mx(x.as_subclass(Logged), "float4_e2m1", 32)
        assert torch.ops.torchmx.quantize_mx.default in Logged.seen
    assert counted[0].calls == 1


@pytest.mark.parametrize("args,kwargs", [
    ((True,), {}),                                   # a bool for an int: the schema converts it
    ((32,), dict(block_dim=True)),
    ((32.0,), {}),                                   # the schema refuses these
    (("32",), {}),
    ((32,), dict(scale_mode=["floor"])),
    ((32,), dict(seed=1.5)),
    ((32, "floor"), {}),                             # one positional argument too many
    ((32,), dict(unknown=1)),
])
def test_arguments_the_schema_converts_or_refuses_take_the_operator(counted, args, kwargs):
    x = torch.randn(2, 64)
    try:
        got = ops.quantize_mx(x, "float8_e4m3", *args, **kwargs)
    except (RuntimeError, TypeError, ValueError) as error:
        with pytest.raises(type(error)):  # the operator's own error, as before
            torch.ops.torchmx.quantize_mx(x, "float8_e4m3", *args, **kwargs)
    else:
        want = torch.ops.torchmx.quantize_mx(x, "float8_e4m3", *args, **kwargs)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert counted[0].calls == 1


def test_a_call_of_a_new_kind_is_checked_again(counted):
    x = torch.randn(2, 64)
    ops.quantize_mx(x, "float8_e4m3", 32)
    ops.quantize_mx(x, "float8_e4m3", 32, block_dim=0)
    ops.quantize_mx(x, "float8_e4m3", 32, block_dim=False)
    assert counted[0].calls == 1
    assert ops.quantize_mx._kinds[(torch.Tensor, str, int)] == ((0,), ())


@pytest.mark.parametrize("device", DEVICES)
def test_a_profile_names_direct_calls_as_the_operators(counted, device):
    x = torch.randn(2, 64, device=device)
    with torch.profiler.profile() as profile:
        scale, data = ops.quantize_mx(x, "float4_e2m1", 32)
        ops.dequantize_mx(data, scale, "float4_e2m1", 32, torch.float32)
    # (on CUDA the profile also shows the range on the GPU's timeline: its CPU events here)
    names = [event.name for event in profile.events()
             if event.device_type == torch.autograd.DeviceType.CPU]
    assert names.count("torchmx::quantize_mx") == names.count("torchmx::dequantize_mx") == 1
    assert counted[0].calls == counted[1].calls == 0  # still direct: no dispatcher
    ops.quantize_mx(x, "float4_e2m1", 32)  # and unprofiled again
    assert counted[0].calls == 0


def test_plain_types_of_annotations():
    from typing import List, Optional
    assert _plain_types(torch.Tensor) == (torch.Tensor, torch.nn.Parameter)
    assert _plain_types(Optional[int]) == (int, type(None))
    assert _plain_types(Optional[torch.Tensor]) == (torch.Tensor, torch.nn.Parameter,
                                                    type(None))
    assert _plain_types(torch.dtype) == (torch.dtype,)
    assert _plain_types(List[int]) is None and _plain_types(Optional[List[int]]) is None


def test_compiled_graphs_keep_the_operators():
    def roundtrip(x):
        scale, data = ops.quantize_mx(x, "float6_e2m3", 32)
        return ops.dequantize_mx(data, scale, "float6_e2m3", 32, torch.float32)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    x = torch.randn(4, 64)
    ops.quantize_mx._kinds.clear()
    out = torch.compile(roundtrip, backend=backend, fullgraph=True)(x)
    assert not ops.quantize_mx._kinds  # tracing saw only the operator call
    assert torch.equal(out, roundtrip(x))
    assert "torchmx.quantize_mx" in graphs[0] and "torchmx.dequantize_mx" in graphs[0]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_cuda_calls_bound_after_their_first_give_its_bits(monkeypatch, fmt):
    """After a first CUDA call of a kind, a quantize / dequantize op call of that kind is one
    lookup (kernels/quantize/triton_backend.BOUND_CALLS) and its plan's launch: the first
    call's bits, fresh outputs; a tuning setting written drops the bound calls with the
    plans."""
    from torchmx.kernels.quantize import backends, triton_backend
    triton_backend.BOUND_CALLS.clear()
    x = wide_range_input((16, 96), torch.bfloat16, seed=7).to("cuda")
    first = torch.ops.torchmx.quantize_mx(x, fmt.name, 32)
    back = torch.ops.torchmx.dequantize_mx(first[1], first[0], fmt.name, 32, torch.bfloat16)
    bound = [call for call in triton_backend.BOUND_CALLS.values() if call]
    assert len(bound) == 2  # one launch each for every format at block 32
    for op in (torch.ops.torchmx, ops):
        scale, data = op.quantize_mx(x.clone(), fmt.name, 32)
        assert torch.equal(scale, first[0]) and torch.equal(data, first[1])
        assert data.data_ptr() != first[1].data_ptr()
        again = op.dequantize_mx(data, scale, fmt.name, 32, torch.bfloat16)
        assert torch.equal(bit_view(again), bit_view(back))
    monkeypatch.setitem(triton_backend.KNOBS, "thread_rows", triton_backend.KNOBS["thread_rows"])
    assert not triton_backend.BOUND_CALLS
    monkeypatch.setattr(backends, "FORCE_REFERENCE", True)  # read at every call
    scale, data = ops.quantize_mx(x, fmt.name, 32)
    assert torch.equal(scale, first[0]) and torch.equal(data, first[1])
    ref = ops.dequantize_mx(first[1], first[0], fmt.name, 32, torch.bfloat16)
    nan = torch.isnan(ref)  # (the reference's NaN bits are the platform's)
    assert torch.equal(nan, torch.isnan(back))
    assert torch.equal(bit_view(ref.masked_fill(nan, 0)), bit_view(back.masked_fill(nan, 0)))
    assert not triton_backend.BOUND_CALLS

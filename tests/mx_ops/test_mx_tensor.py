"""MXTensor: construction, to_mx / dequantize, validation, repr, flatten, serialization."""

import copy
import io

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchmx
from formats import FORMAT_IDS, FORMATS, HP_DTYPES, SCALE_MODES, bit_view, wide_range_input
from torchmx import MXTensor, dtypes

SHAPES = [(), (0,), (5, 0), (1,), (7,), (3, 37), (2, 3, 64), (13, 97)]
SHAPE_IDS = ["x".join(map(str, s)) or "0d" for s in SHAPES]


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor):
    assert type(actual) is torch.Tensor and type(expected) is torch.Tensor
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.equal(bit_view(actual), bit_view(expected))


def op_dequantize(mx: MXTensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.ops.torchmx.dequantize_mx(mx._data, mx._scale_e8m0, mx.elem_dtype.name,
                                          mx.block_size, dtype, mx.block_dim,
                                          block_dim_size=1 if mx.dim() == 0 else mx.shape[mx.block_dim])
    return out.reshape(mx.shape)


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_to_mx_wraps_the_custom_op(fmt, scale_mode, dtype):
    x = wide_range_input((6, 45), dtype, seed=3)
    mx = MXTensor.to_mx(x, fmt, 16, scale_mode=scale_mode)
    scale, data = torch.ops.torchmx.quantize_mx(x, fmt.name, 16, scale_mode=scale_mode)
    assert type(mx) is MXTensor and mx.shape == x.shape and mx.dtype == dtype
    assert torch.equal(mx._scale_e8m0, scale) and torch.equal(mx._data, data)
    assert mx._data.dtype == fmt.storage_dtype
    assert (mx.elem_dtype, mx.block_size, mx.block_dim, mx.scale_mode) == (fmt, 16, 1, scale_mode)
    expected = torch.ops.torchmx.dequantize_mx(data, scale, fmt.name, 16, dtype,
                                               block_dim_size=45)
    assert_bits_equal(mx.dequantize(), expected)
    assert_bits_equal(mx.to_dtype(dtype), expected)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_shapes_and_block_dims(fmt, shape):
    x = wide_range_input(shape, torch.bfloat16, seed=4)
    for block_dim in range(-max(len(shape), 1), max(len(shape), 1)):
        mx = MXTensor.to_mx(x, fmt.name, 4, block_dim=block_dim)
        assert mx.shape == x.shape and mx.block_dim == block_dim % max(len(shape), 1)
        assert_bits_equal(mx.dequantize(), op_dequantize(mx, torch.bfloat16))
        for dtype in HP_DTYPES:
            assert_bits_equal(mx.dequantize(dtype), op_dequantize(mx, dtype))


def test_zero_dim_and_padding_bookkeeping():
    mx = MXTensor.to_mx(torch.tensor(-3.0), "float6_e2m3")
    assert mx.shape == () and mx._data.shape == (3,) and mx._scale_e8m0.shape == (1,)
    assert mx._padding == 31 and mx.dequantize().item() == -3.0
    mx = MXTensor.to_mx(torch.randn(4, 70), "float4_e2m1", 32)
    assert mx._data.shape == (4, 35) and mx._scale_e8m0.shape == (4, 3) and mx._padding == 26


def test_rounding_and_seed_are_passed_through():
    x = torch.randn(8, 64)
    a = MXTensor.to_mx(x, "float4_e2m1", rounding="stochastic", seed=7)
    b = MXTensor.to_mx(x, "float4_e2m1", rounding="stochastic", seed=torch.Generator().manual_seed(3))
    _, data = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32, rounding="stochastic", seed=7)
    assert torch.equal(a._data, data) and b.shape == x.shape
    away = MXTensor.to_mx(x, "float4_e2m1", rounding="away")
    assert torch.equal(away._data, torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32,
                                                                 rounding="away")[1])


def test_format_given_by_object_or_name_including_custom():
    x = torch.randn(3, 40)
    for fmt in (dtypes.float8_e5m2, "float8_e5m2", dtypes.ExMy(1, 2), "e1m2"):
        mx = MXTensor.to_mx(x, fmt, 8)
        assert mx.elem_dtype == dtypes.resolve(fmt)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_torchmx_010_constructor_arguments(fmt):
    x = wide_range_input((3, 5, 45), torch.bfloat16, seed=5)
    scale, data = torch.ops.torchmx.quantize_mx(x, fmt.name, 32, block_dim=1)
    # 0.1.0 order: scale_e8m0_bits, data_bits, elem_dtype, block_size, orig_dtype, padding, block_dim
    mx = MXTensor(scale, data, fmt, 32, torch.bfloat16, 27, 1)
    assert mx.shape == (3, 5, 45) and mx._padding == 27 and mx.block_dim == 1
    assert_bits_equal(mx.dequantize(), MXTensor.to_mx(x, fmt, 32, block_dim=1).dequantize())
    scale, data = torch.ops.torchmx.quantize_mx(x, fmt.name, 32)
    mx = MXTensor(scale_e8m0_bits=scale, data_bits=data, elem_dtype=fmt.name, block_size=32,
                  orig_dtype=torch.bfloat16, padding=19)
    assert mx.shape == x.shape and mx.block_dim == 2
    mx = MXTensor(scale, data, fmt, 32, torch.float32, shape=x.shape, scale_mode="ceil")
    assert mx.dtype == torch.float32 and mx.scale_mode == "ceil"


def _parts():
    scale, data = torch.ops.torchmx.quantize_mx(torch.randn(4, 64), "float4_e2m1", 32)
    return dict(scale_e8m0_bits=scale, data_bits=data, elem_dtype="float4_e2m1", block_size=32,
                orig_dtype=torch.float32)


@pytest.mark.parametrize("change, error, match", [
    (dict(elem_dtype="float4"), ValueError, "float4_e2m1"),
    (dict(elem_dtype=torch.float16), ValueError, "elem_dtype"),  # torch.float8_e4m3fn is a format
    (dict(elem_dtype=3.0), TypeError, "elem_dtype"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=16), ValueError, "shapes do not match"),
    (dict(block_size=2.0), TypeError, "block_size"),
    (dict(orig_dtype=torch.float64), ValueError, "orig_dtype"),
    (dict(padding=32), ValueError, "padding"),
    (dict(padding=-1), ValueError, "padding"),
    (dict(block_dim=2), ValueError, "block_dim"),
    (dict(block_dim=0), ValueError, "shapes do not match"),
    (dict(scale_mode="round"), ValueError, "scale_mode"),
    (dict(shape=(4, 70)), ValueError, "shapes do not match"),
    (dict(shape=(4, 64, 1)), ValueError, "shape"),
    (dict(data_bits="bytes"), TypeError, "data_bits"),
    (dict(scale_e8m0_bits=torch.zeros(4, 2)), TypeError, "scale_e8m0_bits"),
    (dict(data_bits=torch.zeros(4, 32, dtype=torch.int8)), TypeError, "data_bits"),
    (dict(scale_e8m0_bits=torch.zeros(4, 2, 1, dtype=torch.uint8)), ValueError, "same number"),
    (dict(shape=(4, 64), padding=5), ValueError, "padding=5 disagrees with shape"),
    (dict(shape=(4, -64)), ValueError, "non-negative"),
    (dict(padding=True), ValueError, "padding"),
    (dict(block_size=True), TypeError, "block_size"),
])
def test_constructor_rejects_bad_arguments(change, error, match):
    with pytest.raises(error, match=match):
        MXTensor(**{**_parts(), **change})


@pytest.mark.parametrize("call, error, match", [
    (lambda x: MXTensor.to_mx(x, "fp8"), ValueError, "float8_e4m3"),
    (lambda x: MXTensor.to_mx(x, 8), TypeError, "elem_dtype"),
    (lambda x: MXTensor.to_mx(x.double(), "int8"), TypeError, "data_hp"),
    (lambda x: MXTensor.to_mx(x.numpy(), "int8"), TypeError, "data_hp"),
    (lambda x: MXTensor.to_mx(x, "int8", 0), ValueError, "block_size"),
    (lambda x: MXTensor.to_mx(x, "int8", block_dim=3), ValueError, "block_dim"),
    (lambda x: MXTensor.to_mx(x, "int8", scale_mode="max"), ValueError, "scale_mode"),
    (lambda x: MXTensor.to_mx(x, "int8", rounding="nearest"), ValueError, "rounding"),
    (lambda x: MXTensor.to_mx(x, "int8", ste="none"), ValueError, "ste"),
    (lambda x: MXTensor.to_mx(MXTensor.to_mx(x, "int8"), "int8"), TypeError, "already"),
    (lambda x: MXTensor.to_mx(x, "int8").dequantize(torch.int32), ValueError, "target_dtype"),
    (lambda x: MXTensor.to_mx(x, "int8").to_dtype("bfloat16"), TypeError,
     r"target_dtype must be a torch.dtype, one of torch.float32, torch.bfloat16"),
    (lambda x: MXTensor.to_mx(x, "int8").dequantize("fp16"), TypeError, "target_dtype"),
    (lambda x: MXTensor.to_mx(x, "int8", block_size=True), TypeError, "block_size"),
    (lambda x: MXTensor.to_mx(x, "int8", block_size=2.0), TypeError, "block_size"),
    (lambda x: MXTensor.to_mx(x, "int8", rounding="stochastic", seed="a"), TypeError, "seed"),
    (lambda x: MXTensor.to_mx(x, "int8", seed=1.5), TypeError, "seed"),
    (lambda x: MXTensor.to_mx(x, "int8", seed=True), TypeError, "seed"),
    (lambda x: MXTensor.to_mx(x, "int8", rounding="stochastic", seed=-1), ValueError, "seed"),
    (lambda x: MXTensor.to_mx(x, "int8", block_dim=1.0), TypeError, "block_dim"),
])
def test_to_mx_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(4, 64))


def test_to_mx_block_dim_none_is_the_last_dim():
    x = torch.randn(3, 5, 40)
    mx = MXTensor.to_mx(x, "float4_e2m1", 8, block_dim=None)
    assert mx.block_dim == 2
    assert_bits_equal(mx.dequantize(), MXTensor.to_mx(x, "float4_e2m1", 8).dequantize())


def test_constructor_accepts_padding_and_shape_that_agree():
    scale, data = torch.ops.torchmx.quantize_mx(torch.randn(4, 70), "float4_e2m1", 32)
    mx = MXTensor(scale, data, "float4_e2m1", 32, torch.float32, 26, shape=(4, 70))
    assert mx.shape == (4, 70) and mx._padding == 26


class _RecordDequantize(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.torchmx.dequantize_mx.default:
            self.sizes.append(args[0].numel())
        return func(*args, **(kwargs or {}))


def test_repr_shows_format_and_a_few_values_only():
    x = torch.tensor([[0.5, -1.0, 2.0] + [0.0] * 61] * 512)
    mx = MXTensor.to_mx(x, "float6_e3m2", 32, scale_mode="ceil")
    with _RecordDequantize() as record:
        text = repr(mx)
    assert record.sizes and max(record.sizes) <= 8  # never the whole tensor
    for piece in ("float6_e3m2", "block_size=32", "block_dim=1", "'ceil'", "(512, 64)",
                  "torch.float32", "[0.5, -1, 2, 0, 0, 0, 0, 0, ...]"):
        assert piece in text, (piece, text)
    assert "values=[]" in repr(MXTensor.to_mx(torch.zeros(0, 4), "int8"))
    assert "values=[3]" in repr(MXTensor.to_mx(torch.tensor(3.0), "int8"))
    assert "grad_fn=<ToMXConstrFuncBackward>" in repr(
        MXTensor.to_mx(torch.ones(2, requires_grad=True), "int8"))


def test_flatten_unflatten_round_trip():
    mx = MXTensor.to_mx(torch.randn(3, 70), "float4_e2m1", 32, scale_mode="even", block_dim=-1).t()
    names, meta = mx.__tensor_flatten__()
    inner = {name: getattr(mx, name) for name in names}
    back = MXTensor.__tensor_unflatten__(inner, meta, mx.shape, mx.stride())
    assert type(back) is MXTensor and back.shape == mx.shape and back.stride() == mx.stride()
    assert (back.elem_dtype, back.block_dim, back.scale_mode) == (mx.elem_dtype, 0, "even")
    assert_bits_equal(back.dequantize(), mx.dequantize())


def _save_load(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_torch_load_weights_only(fmt):
    x = wide_range_input((5, 45), torch.float16, seed=6)
    tensors = {
        "plain": MXTensor.to_mx(x, fmt, 32, scale_mode="rceil"),
        "transposed": MXTensor.to_mx(x, fmt, 8, block_dim=0).t(),
        "zero_dim": MXTensor.to_mx(torch.tensor(1.5), fmt),
        "empty": MXTensor.to_mx(torch.zeros(0, 3), fmt),
        "weight": torch.nn.Parameter(MXTensor.to_mx(x, fmt), requires_grad=False),
        "mixed": torch.cat([MXTensor.to_mx(x, fmt), MXTensor.to_mx(x, fmt, scale_mode="ceil")]),
    }
    assert tensors["mixed"].scale_mode == "mixed"
    loaded = _save_load(tensors)
    for key, mx in tensors.items():
        back = loaded[key]
        assert type(back) is MXTensor and back.shape == mx.shape and back.dtype == mx.dtype
        assert (back.elem_dtype, back.block_size, back.block_dim, back.scale_mode) == (
            mx.elem_dtype, mx.block_size, mx.block_dim, mx.scale_mode)
        assert_bits_equal(back.dequantize(), mx.dequantize())
        # a parameter loads back as one (torch.export.load checks it), the rest as tensors
        assert isinstance(back, torch.nn.Parameter) == (key == "weight")


def test_state_dict_round_trip_through_weights_only_load():
    model = torch.nn.Linear(64, 8)
    model.weight = torch.nn.Parameter(MXTensor.to_mx(model.weight.detach(), "float8_e4m3"),
                                      requires_grad=False)
    other = torch.nn.Linear(64, 8)
    other.weight = torch.nn.Parameter(MXTensor.to_mx(torch.zeros(8, 64), "float8_e4m3"),
                                      requires_grad=False)
    other.load_state_dict(_save_load(model.state_dict()))
    assert torch.equal(other.weight._data, model.weight._data)
    x = torch.randn(2, 64)
    assert_bits_equal(other(x), model(x))


def test_loading_inconsistent_parts_raises():
    mx = MXTensor.to_mx(torch.randn(4, 64), "float4_e2m1")
    mx._data = mx._data[:, :16]  # a tampered checkpoint
    buffer = io.BytesIO()
    torch.save(mx, buffer)
    buffer.seek(0)
    with pytest.raises(ValueError, match="shapes do not match"):
        torch.load(buffer, weights_only=True)


def test_deepcopy():
    mx = MXTensor.to_mx(torch.randn(4, 64), "float6_e2m3")
    twin = copy.deepcopy(mx)
    assert type(twin) is MXTensor and twin._data.data_ptr() != mx._data.data_ptr()
    assert_bits_equal(twin.dequantize(), mx.dequantize())
    model = torch.nn.Linear(64, 4)
    model.weight = torch.nn.Parameter(mx, requires_grad=False)
    clone = copy.deepcopy(model)
    assert type(clone.weight) is MXTensor and isinstance(clone.weight, torch.nn.Parameter)
    x = torch.randn(3, 64)
    assert_bits_equal(clone(x), model(x))


def test_public_names():
    from torchmx import MXTensor as top
    from torchmx.mx_tensor import FromMXConstrFunc, MXTensor as inner, NoopFwToMXBw, ToMXConstrFunc

    assert top is inner is torchmx.MXTensor
    assert all(issubclass(f, torch.autograd.Function)
               for f in (ToMXConstrFunc, FromMXConstrFunc, NoopFwToMXBw))

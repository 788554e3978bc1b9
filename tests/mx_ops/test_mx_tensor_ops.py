"""MXTensor's op table: storage ops, views and indexing, cat/stack, the dequantize policy.

Every op must equal the same op on the dequantized tensor, bit for bit, for every format."""

import io

import pytest
import torch

from formats import FORMAT_IDS, FORMATS, wide_range_input
from torchmx import MXTensor, dtypes
from torchmx.mx_tensor import allow_dequantize_fallback
from torchmx.aten_ops import DEQUANTIZE_FALLBACK_OPS

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view, so that comparisons are bitwise (NaN == NaN, -0 != 0)."""
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def logical(t):
    return t.dequantize() if isinstance(t, MXTensor) else t


def assert_same_values(actual, expected):
    """actual (MXTensor or plain) holds exactly the values of the plain tensor expected."""
    actual = logical(actual)
    assert type(actual) is torch.Tensor and actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    assert torch.equal(bits(actual), bits(expected))


def shares_storage(a: MXTensor, b: MXTensor) -> bool:
    return a._data.untyped_storage().data_ptr() == b._data.untyped_storage().data_ptr()


def check(op, mx, kind):
    """op(mx) equals op(mx.dequantize()); kind: "view" (MX sharing mx's storage), "mx" (MX, any
    storage) or "plain" (dequantized result)."""
    out, expected = op(mx), op(mx.dequantize())
    outs, expecteds = (out, expected) if isinstance(out, (list, tuple)) else ([out], [expected])
    assert len(outs) == len(expecteds)
    for o, e in zip(outs, expecteds):
        assert_same_values(o, e)
        assert isinstance(o, MXTensor) == (kind != "plain"), (kind, type(o))
        if kind == "view":
            assert shares_storage(o, mx)


# Base: (4, 6, 64) in blocks of 16 along the last dim.
LAST_DIM_CASES = {
    "view": (lambda t: t.view(24, 64), "view"),
    "view_merge_block_dim": (lambda t: t.view(4, 384), "view"),
    "view_split_block_dim": (lambda t: t.view(4, 6, 4, 16), "view"),
    "reshape_infer": (lambda t: t.reshape(-1, 32), "view"),
    "flatten": (lambda t: t.flatten(), "view"),
    "flatten_outer": (lambda t: t.flatten(0, 1), "view"),
    "unflatten": (lambda t: t.unflatten(1, (2, 3)), "view"),
    "view_mixes_blocks": (lambda t: t.view(4, 64, 6), "plain"),
    "view_splits_block": (lambda t: t.view(4, 6, 8, 8), "plain"),
    "transpose": (lambda t: t.transpose(0, 2), "view"),
    "permute": (lambda t: t.permute(2, 0, 1), "view"),
    "mT": (lambda t: t.mT, "view"),
    "transposed_then_reshape": (lambda t: t.transpose(1, 2).reshape(4, 384), "plain"),
    "transposed_then_flatten_outer": (lambda t: t.transpose(0, 1).flatten(0, 1), "mx"),
    "contiguous_after_transpose": (lambda t: t.transpose(1, 2).contiguous(), "mx"),
    "expand": (lambda t: t[:, :1].expand(4, 5, 64), "view"),
    "expand_new_dims": (lambda t: t.expand(2, 4, 6, 64), "view"),
    "expand_then_reshape": (lambda t: t[:, :1].expand(4, 5, 64).reshape(20, 64), "mx"),
    "unsqueeze": (lambda t: t.unsqueeze(1), "view"),
    "unsqueeze_last": (lambda t: t.unsqueeze(-1), "view"),
    "squeeze": (lambda t: t[:1].squeeze(), "view"),
    "squeeze_dims": (lambda t: t[:, :1].squeeze((0, 1)), "view"),
    "index_none_ellipsis": (lambda t: t[None, ..., None], "view"),
    "slice_outer": (lambda t: t[1:3], "view"),
    "slice_step": (lambda t: t[:, ::2], "view"),
    "slice_negative": (lambda t: t[-3:, -5:-1], "view"),
    "slice_block_aligned": (lambda t: t[..., 16:48], "view"),
    "slice_block_tail": (lambda t: t[..., 32:], "view"),
    "slice_empty": (lambda t: t[..., 64:], "view"),
    "slice_misaligned": (lambda t: t[..., 3:20], "plain"),
    "slice_block_step": (lambda t: t[..., ::2], "plain"),
    "narrow": (lambda t: t.narrow(2, 16, 32), "view"),
    "select": (lambda t: t[1], "view"),
    "select_middle": (lambda t: t[:, -2], "view"),
    "select_block_dim": (lambda t: t[..., 5], "plain"),
    "index_select": (lambda t: t.index_select(1, torch.tensor([0, 5, 2])), "mx"),
    "index_select_block_dim": (lambda t: t.index_select(2, torch.tensor([1, 2])), "plain"),
    "tensor_index": (lambda t: t[torch.tensor([3, 0])], "plain"),
    "split": (lambda t: t.split(16, dim=2), "view"),
    "split_sizes": (lambda t: t.split([1, 3], dim=0), "view"),
    "chunk": (lambda t: t.chunk(3, dim=1), "view"),
    "split_misaligned": (lambda t: t.split(10, dim=2), "plain"),
    "unbind": (lambda t: t.unbind(0), "view"),
    "unbind_block_dim": (lambda t: t[..., :3].unbind(2), "plain"),
    "cat": (lambda t: torch.cat([t, t[:2]], 0), "mx"),
    "cat_block_dim": (lambda t: torch.cat([t[..., 32:], t[..., :16], t], -1), "mx"),
    "cat_block_dim_misaligned": (lambda t: torch.cat([t[..., :16], t[..., 3:9]], -1), "plain"),
    "stack": (lambda t: torch.stack([t, t], 1), "mx"),
    "stack_last": (lambda t: torch.stack([t[0], t[1]], -1), "mx"),
    "clone": (lambda t: t.clone(), "mx"),
    "detach": (lambda t: t.detach(), "view"),
}


@pytest.mark.parametrize("case", LAST_DIM_CASES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_views_and_indexing_blocks_last(fmt, case):
    op, kind = LAST_DIM_CASES[case]
    mx = MXTensor.to_mx(wide_range_input((4, 6, 64), torch.bfloat16, seed=1), fmt, 16)
    check(op, mx, kind)


# Base: (5, 45, 3) in blocks of 16 along dim 1 (45 = 2 blocks + 13: padded, odd for fp4/fp6).
MIDDLE_DIM_CASES = {
    "t_of_slice": (lambda t: t[..., 0].t(), "view"),
    "view_outer": (lambda t: t.view(5, 45, 3, 1), "view"),
    "flatten_padded_block_dim": (lambda t: t.flatten(0, 1), "plain"),
    "flatten_inner": (lambda t: t.flatten(1), "plain"),
    "slice_to_end": (lambda t: t[:, 32:], "view"),
    "slice_whole_blocks": (lambda t: t[:, :32], "view"),
    "slice_inner": (lambda t: t[..., 1:], "view"),
    "split_block_dim": (lambda t: t.split(16, dim=1), "view"),
    "select_inner": (lambda t: t[..., 2], "view"),
    "cat_after_padded": (lambda t: torch.cat([t, t], 1), "plain"),
    "cat_padded_last": (lambda t: torch.cat([t[:, :16], t], 1), "mx"),
    "expand_inner": (lambda t: t[..., :1].expand(5, 45, 4), "view"),
    "permute": (lambda t: t.permute(1, 2, 0), "view"),
    "squeeze_block_dim_away": (lambda t: t[:, :1].squeeze(1), "plain"),
}


@pytest.mark.parametrize("case", MIDDLE_DIM_CASES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_views_and_indexing_padded_middle_block_dim(fmt, case):
    op, kind = MIDDLE_DIM_CASES[case]
    mx = MXTensor.to_mx(wide_range_input((5, 45, 3), torch.float16, seed=2), fmt, 16, block_dim=1)
    check(op, mx, kind)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_zero_dim_and_empty(fmt):
    scalar = MXTensor.to_mx(torch.tensor(-2.5), fmt)
    for op in (lambda t: t.unsqueeze(0), lambda t: t.view(1, 1), lambda t: t.reshape(()),
               lambda t: t.t(), lambda t: t.clone(), lambda t: t.detach(), lambda t: t.squeeze(),
               lambda t: t.permute(()), lambda t: t.expand(()), lambda t: t.view(1, 1)[0]):
        check(op, scalar, "mx")
    one_byte = fmt.codes_per_group == 1
    check(lambda t: t.expand(3, 2), scalar, "mx" if one_byte else "plain")
    check(lambda t: torch.stack([t, t]), scalar, "plain")  # blocks of 1 element cannot stack
    check(lambda t: t.view(1, 1)[0, 0], scalar, "plain")  # a select along the block axis
    empty = MXTensor.to_mx(torch.zeros(0, 32), fmt, 8)
    for op in (lambda t: t.view(0, 4, 8), lambda t: t.t(), lambda t: t.reshape(-1), lambda t: t[:, 8:],
               lambda t: torch.cat([t, t]), lambda t: t.unsqueeze(0)):
        check(op, empty, "mx")


def test_expand_block_dim_of_one_byte_format_shares_the_code():
    mx = MXTensor.to_mx(torch.randn(4, 1), "float8_e4m3", 3, block_dim=1)
    out = mx.expand(4, 10)
    assert isinstance(out, MXTensor) and out._scale_e8m0.shape == (4, 4)
    assert_same_values(out, mx.dequantize().expand(4, 10))


STRIDE_CASES = {
    "base": lambda t: t,
    "transpose": lambda t: t.transpose(1, 2),
    "permute": lambda t: t.permute(2, 0, 1),
    "step_slice": lambda t: t[:, ::2],
    "block_slice": lambda t: t[..., 16:48],
    "select": lambda t: t[:, 2],
    "expand": lambda t: t[:, :1].expand(4, 5, 64),
    "transposed_slice": lambda t: t.transpose(0, 2)[:, ::2],
    "permuted_slice": lambda t: t.permute(2, 0, 1)[:, 1:3],
    "contiguous": lambda t: t.permute(2, 0, 1)[:, 1:3].contiguous(),
}


@pytest.mark.parametrize("case", STRIDE_CASES)
@pytest.mark.parametrize("fmt", [dtypes.float8_e4m3, dtypes.float4_e2m1, dtypes.float6_e3m2,
                                 dtypes.int8], ids=str)
def test_strides_and_contiguity_are_those_of_a_plain_tensor(fmt, case):
    """MXTensor reports the strides the same view of a plain tensor has (storage order, stride
    0 for broadcast dims, gaps for strided slices), so is_contiguous() is false after t() and
    after a slice with gaps, and .contiguous() compacts the packed bytes."""
    x = torch.randn(4, 6, 64)
    mx, plain = STRIDE_CASES[case](MXTensor.to_mx(x, fmt, 16)), STRIDE_CASES[case](x)
    assert isinstance(mx, MXTensor)
    assert mx.stride() == plain.stride() and mx.is_contiguous() == plain.is_contiguous()
    compact = mx.contiguous()
    assert compact.is_contiguous() and compact._data.is_contiguous()
    assert compact._scale_e8m0.is_contiguous()
    assert compact._data.untyped_storage().nbytes() == compact._data.numel()
    assert_same_values(compact, plain.contiguous().to(torch.float32).mul(0).add(mx.dequantize()))


def test_contiguous_of_a_gapped_slice_saves_only_its_bytes():
    mx = MXTensor.to_mx(torch.randn(512, 64), "float8_e4m3")
    for view in (mx[::2], mx[:, :32]):
        assert not view.is_contiguous()
        buffer = io.BytesIO()
        torch.save(view.contiguous(), buffer)
        assert buffer.tell() < 512 * 64 * 3 // 4  # not the whole (512, 64) base


# ------------------------------------------------------------------------------ storage ops

@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_to_dtype_relabels_exactly(fmt):
    """mx.to(d) (d fp32/bf16/fp16) is an MXTensor with the same bytes whose values are
    mx.dequantize(d): the exact values rounded once (every NaN the canonical NaN of d, as
    dequantize writes it). Other dtypes convert the exact values once (plain result)."""
    mx = MXTensor.to_mx(wide_range_input((6, 50), torch.float16, seed=3), fmt, 16)
    exact = mx.dequantize(torch.float32)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = mx.to(dtype)
        assert isinstance(out, MXTensor) and out.dtype == dtype
        assert torch.equal(out._data, mx._data)
        assert_same_values(out, mx.dequantize(dtype))
        assert out.isnan().any() and torch.equal(out.isnan(), exact.isnan())
    for dtype in (torch.float64, torch.float8_e4m3fn, torch.int32):
        out = mx.to(dtype)
        assert type(out) is torch.Tensor
        assert torch.equal(out.view(torch.uint8), exact.to(dtype).view(torch.uint8))
    assert_same_values(mx.double(), exact.double())


def test_conversions_read_the_exact_values():
    """A fp16 MXTensor can hold 65536 (ceil scale, 65504 rounded up): its logical value is inf,
    but conversions (.to(dtype), .float(), .double(), copy_ into a plain tensor) read the exact
    value (docs/mx_tensor.md, Conversions)."""
    x = torch.tensor([65504.0] + [1.0] * 31, dtype=torch.float16)
    mx = MXTensor.to_mx(x, "float8_e4m3", 32, scale_mode="ceil")
    assert mx.dequantize()[0].item() == float("inf") and (mx + 0)[0].item() == float("inf")
    assert mx.dequantize(torch.float32)[0].item() == 65536.0
    assert mx.float().dequantize()[0].item() == 65536.0 and mx.double()[0].item() == 65536.0
    assert torch.empty(32).copy_(mx)[0].item() == 65536.0


def test_device_moves_keep_mx():
    mx = MXTensor.to_mx(torch.randn(3, 40), "float6_e3m2", 8)
    for moved in (mx.to("cpu"), mx.cpu(), mx.to(torch.device("cpu"), copy=True)):
        assert isinstance(moved, MXTensor) and moved.device.type == "cpu"
        assert_same_values(moved, mx.dequantize())


def assert_same_across_devices(actual, expected):
    """Bitwise, except that NaN bit patterns may differ between devices (same NaN positions)."""
    actual = logical(actual).cpu()
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert_same_values(actual.masked_fill(nan, 0), expected.masked_fill(nan, 0))


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_cuda_round_trip_and_pin_memory(fmt):
    x = wide_range_input((6, 70), torch.bfloat16, seed=4)
    mx = MXTensor.to_mx(x, fmt, 32)
    on_gpu = mx.cuda()
    assert isinstance(on_gpu, MXTensor) and on_gpu._data.is_cuda and on_gpu._scale_e8m0.is_cuda
    assert torch.equal(on_gpu._data.cpu(), mx._data)
    assert_same_across_devices(on_gpu, mx.dequantize())
    assert_same_values(on_gpu.to("cpu"), mx.dequantize())
    from_gpu = MXTensor.to_mx(x.cuda(), fmt, 32).cpu()
    assert torch.equal(from_gpu._data, mx._data) and torch.equal(from_gpu._scale_e8m0, mx._scale_e8m0)
    pinned = mx.pin_memory()
    assert isinstance(pinned, MXTensor) and pinned.is_pinned() and pinned._data.is_pinned()


def test_like_ops_return_plain_tensors_of_the_logical_shape():
    mx = MXTensor.to_mx(torch.randn(3, 40, dtype=torch.bfloat16), "float4_e2m1").t()
    for op, value in ((torch.zeros_like, 0), (torch.ones_like, 1), (lambda t: torch.full_like(t, 7), 7),
                      (lambda t: t.new_zeros(2, 3), 0), (lambda t: t.new_ones(5), 1)):
        out = op(mx)
        assert type(out) is torch.Tensor and out.dtype == torch.bfloat16 and bool((out == value).all())
    empty = torch.empty_like(mx)
    assert type(empty) is torch.Tensor and empty.shape == (40, 3) and empty.stride() == mx.stride()
    assert torch.empty_like(mx, dtype=torch.float32).dtype == torch.float32


def test_copy_rules():
    src = MXTensor.to_mx(torch.randn(4, 64), "float4_e2m1", 32, scale_mode="ceil")
    dst = MXTensor.to_mx(torch.zeros(4, 64), "float4_e2m1", 32)
    dst.copy_(src)
    assert_same_values(dst, src.dequantize()) and dst.scale_mode == "ceil"
    plain = torch.empty(4, 64, dtype=torch.bfloat16)
    plain.copy_(src)
    assert_same_values(plain, src.dequantize(torch.bfloat16))
    for bad in (torch.randn(4, 64), MXTensor.to_mx(torch.randn(4, 64), "float8_e4m3"),
                MXTensor.to_mx(torch.randn(4, 64), "float4_e2m1", 16)):
        with pytest.raises(ValueError, match="copy_ into an MXTensor"):
            dst.copy_(bad)
    with pytest.raises(ValueError, match="copy_ into an MXTensor"):  # like every other write
        dst[0] = torch.zeros(64)
    with pytest.raises(ValueError, match="cannot write into an MXTensor"):
        dst[0] = 1.0
    dst[1:3] = src[1:3]  # same layout: a byte copy
    assert_same_values(dst[1:3], src[1:3].dequantize())


# ------------------------------------------------------------------------------ fallback policy

FALLBACK_CASES = {
    "add_scalar": lambda t: t + 1,
    "mul_plain": lambda t: t * torch.linspace(-2, 2, 64),
    "add_mx": lambda t: t + t.t().t(),
    "neg_abs": lambda t: (-t).abs(),
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "softmax": lambda t: torch.softmax(t, -1),
    "layer_norm": lambda t: torch.nn.functional.layer_norm(t, (64,)),
    "sum": lambda t: t.sum(-1),
    "mean": lambda t: t.mean(),
    "amax": lambda t: t.amax(0),
    "max_dim": lambda t: t.max(-1).values,
    "where": lambda t: torch.where(t > 0, t, torch.zeros_like(t)),
    "eq": lambda t: (t == t).float(),
    "isnan": lambda t: torch.isnan(t).float(),
    "scalar_item": lambda t: torch.tensor(t[0, 0].item()),
    "gather": lambda t: t.gather(1, torch.tensor([[0, 3], [1, 1], [2, 0], [0, 0]])),
}


@pytest.mark.parametrize("case", FALLBACK_CASES)
@pytest.mark.parametrize("fmt", [dtypes.float8_e4m3, dtypes.float4_e2m1, dtypes.float6_e2m3,
                                 dtypes.int8], ids=str)
def test_allowed_ops_run_on_the_dequantized_tensor(fmt, case):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5), dtype=torch.bfloat16)
    check(FALLBACK_CASES[case], MXTensor.to_mx(x, fmt), "plain")


def test_other_ops_raise_and_can_be_allowed():
    mx = MXTensor.to_mx(torch.rand(4, 64) - 0.5, "float8_e4m3")
    with pytest.raises(TypeError, match=r"aten\.erfinv.*allow_dequantize_fallback"):
        torch.erfinv(mx)
    allow_dequantize_fallback(torch.ops.aten.erfinv)
    try:
        check(torch.erfinv, mx, "plain")
    finally:
        DEQUANTIZE_FALLBACK_OPS.discard(torch.ops.aten.erfinv)
    with pytest.raises(TypeError, match="aten ops"):
        allow_dequantize_fallback(torch.erfinv)
    with pytest.raises(TypeError, match="as_strided"):
        mx.as_strided((2, 2), (1, 1))


def test_writes_into_mx_raise():
    mx = MXTensor.to_mx(torch.randn(4, 64), "float8_e4m3")
    def augmented():
        x = mx
        x += 1  # must not silently become x = x + 1

    for write in (lambda: mx.add_(1), lambda: mx.zero_(), lambda: mx.fill_(2.0), augmented,
                  lambda: torch.add(torch.ones(4, 64), 1, out=mx), lambda: mx[0].mul_(2)):
        with pytest.raises(ValueError, match="cannot write into an MXTensor"):
            write()
    plain = torch.ones(4, 64)
    plain.add_(mx)  # writing into a plain tensor is fine
    assert_same_values(plain, torch.ones(4, 64) + mx.dequantize())


# ------------------------------------------------------------------------------ bad arguments

BAD_ARGUMENT_CASES = {
    "transpose": lambda t: t.transpose(0, 5),
    "transpose_negative": lambda t: t.transpose(-4, 0),
    "unsqueeze": lambda t: t.unsqueeze(5),
    "squeeze": lambda t: t.squeeze(5),
    "squeeze_dims": lambda t: t.squeeze((0, 3)),
    "index_select": lambda t: t.index_select(2, torch.tensor([0])),
    "select_dim": lambda t: t.select(2, 0),
    "select_index": lambda t: t.select(0, 9),
    "select_block_index": lambda t: t.select(1, 64),
    "split_dim": lambda t: t.split(2, dim=4),
    "split_sizes_sum": lambda t: t.split([1, 1], 0),
    "split_sizes_block_dim": lambda t: t.split([32, 16], 1),
    "split_negative": lambda t: t.split(-1, 0),
    "split_sizes_negative": lambda t: t.split([-1, 5], 0),
    "chunk_dim": lambda t: t.chunk(2, 3),
    "unbind": lambda t: t.unbind(2),
    "narrow": lambda t: t.narrow(0, 3, 5),
    "slice_step_zero": lambda t: torch.ops.aten.slice.Tensor(t, 0, 0, 4, 0),
    "slice_step_negative": lambda t: torch.ops.aten.slice.Tensor(t, 1, 0, 64, -1),
    "python_step_zero": lambda t: t[::0],
    "stack": lambda t: torch.stack([t, t], 7),
    "stack_shapes": lambda t: torch.stack([t, t[:2]]),
    "cat": lambda t: torch.cat([t, t], 5),
    "cat_shapes": lambda t: torch.cat([t, t[:, :32]], 0),
    "view_numel": lambda t: t.view(8, 64),
    "view_two_inferred": lambda t: t.view(-1, -1),
    "reshape_numel": lambda t: t.reshape(3, -1),
    "flatten": lambda t: t.flatten(0, 5),
    "movedim": lambda t: t.movedim(0, 5),
    "permute_length": lambda t: t.permute(0),
    "permute_duplicate": lambda t: t.permute(0, 0),
    "t_3d": lambda t: t[None].t(),
    "expand_fewer": lambda t: t.expand(64),
    "expand_mismatch": lambda t: t.expand(3, 64),
    "expand_leading_infer": lambda t: t.expand(-1, 4, 64),
}


@pytest.mark.parametrize("case", BAD_ARGUMENT_CASES)
@pytest.mark.parametrize("fmt", [dtypes.float8_e4m3, dtypes.float4_e2m1], ids=str)
def test_bad_arguments_raise_torchs_own_error(fmt, case):
    """Out-of-range dims, sizes that do not add up, bad steps: the error torch raises for the
    plain tensor (same type, same message, the logical shape in it), never a silent result."""
    op = BAD_ARGUMENT_CASES[case]
    x = torch.randn(4, 64)
    with pytest.raises(Exception) as plain:
        op(x)
    with pytest.raises(type(plain.value)) as mx:
        op(MXTensor.to_mx(x, fmt, 16))
    expected = str(plain.value).replace("torch.FloatTensor", "MXTensor")
    assert str(mx.value) == expected


def test_zero_dim_dims_follow_torch():
    scalar = MXTensor.to_mx(torch.tensor(2.0), "float8_e4m3")
    for op in (lambda t: t.unsqueeze(-1), lambda t: t.transpose(0, -1), lambda t: t.squeeze(0),
               lambda t: t.unsqueeze(0)):
        check(op, scalar, "mx")
    for op in (lambda t: t.unsqueeze(1), lambda t: t.transpose(0, 1), lambda t: t.squeeze(1)):
        with pytest.raises(IndexError, match="Dimension out of range"):
            op(scalar)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_split_of_an_empty_dim_returns_the_tensor(fmt):
    mx = MXTensor.to_mx(torch.zeros(0, 64), fmt, 16)
    for op in (lambda t: t.split(16, 0), lambda t: t.chunk(2, 0), lambda t: t.split([0], 0),
               lambda t: t.tensor_split(3, 0)):
        check(op, mx, "mx")
    assert len(mx.split(16, 0)) == 1


def test_int8_storage_is_int8_whatever_the_constructor_got():
    """MXINT8 codes may arrive as uint8 bit patterns (e.g. from a uint8 checkpoint buffer); the
    MXTensor stores int8, so cat/stack with int8-backed tensors stay MX and exact."""
    a = MXTensor.to_mx(torch.randn(4, 64), "int8")
    b = MXTensor(a._scale_e8m0, a._data.view(torch.uint8), "int8", 32, torch.float32)
    assert b._data.dtype == torch.int8 and b._data.data_ptr() == a._data.data_ptr()
    for op in (lambda p, q: torch.cat([p, q]), lambda p, q: torch.stack([q, p], 1)):
        out = op(a, b)
        assert isinstance(out, MXTensor) and out._data.dtype == torch.int8
        assert_same_values(out, op(a.dequantize(), b.dequantize()))
    b.copy_(a)

"""Regressions of issue #45 (reliability), each on every backend reachable on CPU: the C kernels,
the reference, the Triton kernels (under Triton's interpreter, see conftest.py) and the fake
kernels (meta tensors, FakeTensorMode, torch.compile).

- codes of one-byte narrow formats with bits above the format's width (masked everywhere);
- block sizes up to 2**63 - 1 (no int64 overflow, no memory in proportion to block_size);
- dequantize's data and scale on different devices;
- argument types at the custom ops' schema and at torchmx's Python entry points;
- stochastic rounding's 32-bit seed key.
"""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchmx import MXTensor, analysis, cpu_kernels, dtypes
from torchmx.config import MXConfig
from torchmx.kernels.quantize import backends
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference
from torchmx.numerics.rounding import _mix32, seed_key

# One byte per code, fewer than 8 bits: widths 2, 3, 5 and 7.
NARROW = [dtypes.ExMy(1, 0), dtypes.ExMy(1, 1), dtypes.ExMy(2, 0), dtypes.ExMy(2, 2),
          dtypes.ExMy(1, 3), dtypes.ExMy(4, 0), dtypes.ExMy(3, 3), dtypes.ExMy(2, 4)]
NARROW_IDS = [f.name for f in NARROW]
HP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# 2**24 cost the reference 200 MB per call, the larger ones more memory than exists.
HUGE_BLOCKS = [2**24, 2**40 + 1, 2**62, 2**63 - 1]


def _bits(t):
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


@pytest.fixture(params=["cpu", "reference"])
def backend(request, monkeypatch):
    """Which backend torch.ops.torchmx.* run on CPU tensors."""
    if request.param == "cpu":
        if not cpu_kernels.available():
            pytest.skip("the C kernels did not build here (no C compiler)")
        monkeypatch.setattr(backends, "FORCE_REFERENCE", False)
    else:
        monkeypatch.setattr(backends, "FORCE_REFERENCE", True)
    return request.param


def _triton_backend():
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and Triton's interpreter is off (TRITON_INTERPRET)")
    from torchmx.kernels.quantize import triton_backend
    return triton_backend, "cuda" if torch.cuda.is_available() else "cpu"


# ---------------------------------------------------------------- 1. codes above the width


def _every_byte(fmt):
    """Every byte value as a code, in blocks of 32, under scale bytes 127 (1.0) and 255 (NaN)
    and 254 (the table's last row): data [3, 256], scale [3, 8]."""
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8).expand(3, 256).contiguous()
    scale = torch.tensor([127, 254, 255], dtype=torch.uint8)[:, None].expand(3, 8).contiguous()
    return data, scale


def test_issue_example_is_minus_seven(backend):
    """0xFF read as e2m2 (5 bits) is 0x1F: -(1 + 3/4) * 2**(3 - 1) = -7; 0x10 is 0x10: -0."""
    data = torch.tensor([[0x10, 0xFF]], dtype=torch.uint8)
    out = torch.ops.torchmx.dequantize_mx(data, torch.tensor([[127]], dtype=torch.uint8), "e2m2", 32)
    assert _bits(out).tolist() == _bits(torch.tensor([[-0.0, -7.0]])).tolist()


@pytest.mark.parametrize("fmt", NARROW, ids=NARROW_IDS)
@pytest.mark.parametrize("target", HP_DTYPES, ids=str)
def test_bits_above_the_width_are_ignored(backend, fmt, target):
    data, scale = _every_byte(fmt)
    out = torch.ops.torchmx.dequantize_mx(data, scale, fmt.name, 32, target)
    masked = torch.ops.torchmx.dequantize_mx(data & ((1 << fmt.bits) - 1), scale, fmt.name, 32,
                                             target)
    assert torch.equal(_bits(out), _bits(masked))
    expected = dequantize_mx_reference(data, scale, fmt, 32, target)  # the definition
    assert torch.equal(_bits(out), _bits(expected))


def test_reference_unpack_masks_one_byte_codes():
    from torchmx.numerics import unpack_codes

    fmt = dtypes.ExMy(2, 2)
    bytes_ = torch.tensor([0x00, 0x1F, 0x20, 0xFF], dtype=torch.uint8)
    assert unpack_codes(bytes_, fmt, 4).tolist() == [0x00, 0x1F, 0x00, 0x1F]
    # MXINT8 uses all 8 bits, two's complement: nothing to mask.
    assert unpack_codes(torch.tensor([-127, 127], dtype=torch.int8), dtypes.int8, 2).tolist() == [-127, 127]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes
@pytest.mark.parametrize("fmt", [dtypes.ExMy(2, 2), dtypes.ExMy(1, 1), dtypes.ExMy(3, 3)],
                         ids=lambda f: f.name)
@pytest.mark.gpu  # the Triton kernels: on the GPU where there is one
def test_triton_dequantize_ignores_bits_above_the_width(fmt):
    tb, device = _triton_backend()
    data, scale = _every_byte(fmt)
    for axis, (d, s) in {1: (data, scale), 0: (data.T.contiguous(), scale.T.contiguous())}.items():
        got = tb.dequantize(d.to(device), s.to(device), fmt, 32, torch.float32, axis, 256).cpu()
        expected = dequantize_mx_reference(d, s, fmt, 32, torch.float32, axis)
        assert torch.equal(got.isnan(), expected.isnan())  # NaN payloads: see test_triton_quantize
        assert torch.equal(got.nan_to_num(), expected.nan_to_num()), axis


# ---------------------------------------------------------------- 2. huge block sizes


@pytest.mark.parametrize("block_size", [1, 2, 3, 49, 50, 51, 64] + HUGE_BLOCKS)
@pytest.mark.parametrize("fmt", [dtypes.float8_e4m3, dtypes.float4_e2m1, dtypes.float6_e2m3,
                                 dtypes.int8, dtypes.ExMy(2, 2)], ids=lambda f: f.name)
def test_any_block_size_up_to_int64_max(backend, fmt, block_size):
    """A block longer than its axis is one block of the whole axis, on every backend."""
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(block_size % 1000))
    scale, data = torch.ops.torchmx.quantize_mx(x, fmt.name, block_size)
    ref_scale, ref_data = quantize_mx_reference(x, fmt, min(block_size, 50))
    assert torch.equal(scale, ref_scale) and torch.equal(data, ref_data)
    out = torch.ops.torchmx.dequantize_mx(data, scale, fmt.name, block_size, block_dim_size=50)
    assert torch.equal(out, dequantize_mx_reference(ref_data, ref_scale, fmt, min(block_size, 50),
                                                    block_dim_size=50))


@settings(max_examples=30, deadline=None)
@given(block_size=st.integers(1, 2**63 - 1), n=st.integers(0, 40), axis=st.sampled_from([0, 1]),
       fmt=st.sampled_from([dtypes.float4_e2m1, dtypes.float6_e3m2, dtypes.ExMy(1, 1)]))
def test_c_kernels_equal_the_reference_at_any_block_size(block_size, n, axis, fmt):
    if not cpu_kernels.available():
        pytest.skip("the C kernels did not build here (no C compiler)")
    x = torch.randn(2, n, generator=torch.Generator().manual_seed(n)).movedim(1, axis)
    scale, data = cpu_kernels.quantize(x, fmt, block_size, "floor", "even", axis, None)
    ref_scale, ref_data = quantize_mx_reference(x, fmt, block_size, block_dim=axis)
    assert torch.equal(scale, ref_scale) and torch.equal(data, ref_data)
    out = cpu_kernels.dequantize(data, scale, fmt, block_size, torch.float32, axis, n)
    assert torch.equal(out, dequantize_mx_reference(ref_data, ref_scale, fmt, block_size,
                                                    block_dim=axis, block_dim_size=n))


@pytest.mark.parametrize("block_size", HUGE_BLOCKS)
def test_huge_blocks_through_mx_tensor(backend, block_size):
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    for axis in (0, 1):
        huge = MXTensor.to_mx(x, "float8_e4m3", block_size, block_dim=axis, ste="clipped")
        exact = MXTensor.to_mx(x, "float8_e4m3", x.shape[axis], block_dim=axis)
        assert huge._scale_e8m0.shape[axis] == 1
        assert torch.equal(huge.dequantize(), exact.dequantize())


def test_huge_blocks_on_an_empty_axis_and_in_analysis(backend):
    scale, data = torch.ops.torchmx.quantize_mx(torch.ones(2, 0), "float4_e2m1", 2**63 - 1)
    assert scale.shape == (2, 0) and data.shape == (2, 0)
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    huge = analysis.quantization_error(x, "float8_e4m3", 2**63 - 1)
    exact = analysis.quantization_error(x, "float8_e4m3", 50)
    assert (huge.mse, huge.saturated_fraction) == (exact.mse, exact.saturated_fraction)


@pytest.mark.parametrize("block_size", [3, 50, 2**62, 2**63 - 1])
def test_fake_kernels_with_huge_blocks(block_size):
    from torch._subclasses.fake_tensor import FakeTensorMode

    expected_blocks = -(-50 // block_size)
    x = torch.empty(3, 50, device="meta")
    scale, data = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", block_size)
    assert scale.shape == (3, expected_blocks) and data.shape == (3, 25)
    out = torch.ops.torchmx.dequantize_mx(data, scale, "float4_e2m1", block_size)
    assert out.shape == (3, 50) and out.device.type == "meta"
    with FakeTensorMode():
        scale, data = torch.ops.torchmx.quantize_mx(torch.empty(50, 3), "float8_e4m3", block_size,
                                                    block_dim=0)
        assert scale.shape == (expected_blocks, 3)


def test_torch_compile_with_the_largest_block_size(backend):
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(3))

    def round_trip(t):
        scale, data = torch.ops.torchmx.quantize_mx(t, "float8_e4m3", 2**63 - 1)
        return torch.ops.torchmx.dequantize_mx(data, scale, "float8_e4m3", 2**63 - 1)

    compiled = torch.compile(round_trip, backend="eager", fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x), round_trip(x))
    assert torch.equal(round_trip(x), MXTensor.to_mx(x, "float8_e4m3", 50).dequantize())
    y = torch.randn(5, 77, generator=torch.Generator().manual_seed(3))  # symbolic n
    assert torch.equal(compiled(y), MXTensor.to_mx(y, "float8_e4m3", 77).dequantize())


@pytest.mark.gpu  # the Triton kernels: on the GPU where there is one
@pytest.mark.parametrize("block_size", [2**20, 2**62, 2**63 - 1])
def test_triton_backend_with_huge_blocks(block_size):
    tb, device = _triton_backend()
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    fmt = dtypes.float8_e4m3
    scale, data = tb.quantize(x.to(device), fmt, block_size, "floor", "even", 1, None)
    ref_scale, ref_data = quantize_mx_reference(x, fmt, 50)
    assert torch.equal(scale.cpu(), ref_scale) and torch.equal(data.cpu(), ref_data)
    out = tb.dequantize(data, scale, fmt, block_size, torch.float32, 1, 50).cpu()
    assert torch.equal(out, dequantize_mx_reference(ref_data, ref_scale, fmt, 50))


@pytest.mark.parametrize("bad", [0, -1, 2**63, 2**64])
def test_block_size_out_of_int64_is_a_value_error(bad):
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"block_size must be an int >= 1 and <= 2\*\*63 - 1"):
        MXTensor.to_mx(x, "float8_e4m3", bad)
    with pytest.raises(ValueError, match="block_size"):
        quantize_mx_reference(x, "float8_e4m3", bad)
    with pytest.raises(ValueError, match="block_size"):
        MXConfig("float8_e4m3", block_size=bad)


# ---------------------------------------------------------------- 3. devices


@pytest.mark.parametrize("meta_arg", ["data_lp", "shared_exp_e8m0"])
def test_dequantize_parts_on_different_devices(backend, meta_arg):
    scale, data = torch.ops.torchmx.quantize_mx(torch.randn(2, 64), "float8_e4m3", 32)
    if meta_arg == "data_lp":
        data = data.to("meta")
    else:
        scale = scale.to("meta")
    message = (r"data_lp and shared_exp_e8m0 must be on one device, got data_lp on "
               f"{data.device} and shared_exp_e8m0 on {scale.device}")
    with pytest.raises(ValueError, match=message):
        torch.ops.torchmx.dequantize_mx(data, scale, "float8_e4m3", 32)
    with pytest.raises(ValueError, match=message):
        dequantize_mx_reference(data, scale, "float8_e4m3", 32)


def test_mx_tensor_parts_on_different_devices():
    scale, data = torch.ops.torchmx.quantize_mx(torch.randn(2, 64), "float8_e4m3", 32)
    with pytest.raises(ValueError, match="data_bits and scale_e8m0_bits must be on one device"):
        MXTensor(scale.to("meta"), data, "float8_e4m3", 32, torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA generator")
def test_a_cuda_generator_seeds_cpu_and_cuda_data():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6))
    for data in (x, x.cuda()):
        draws = [MXTensor.to_mx(data, "float4_e2m1", rounding="stochastic",
                                seed=torch.Generator("cuda").manual_seed(7))._data.cpu()
                 for _ in range(2)]
        assert torch.equal(draws[0], draws[1])


# ---------------------------------------------------------------- 7. argument types


@pytest.mark.parametrize("bad", [32.0, "32", None, 2**64])
def test_op_schema_refuses_non_int64_block_size_before_torchmx(bad):
    """PyTorch parses the custom ops' arguments against their schema before torchmx's code
    runs: a non-int, or an int outside int64, is its RuntimeError (docs/api.md)."""
    with pytest.raises(RuntimeError, match="Expected a value of type 'int' for argument 'block_size'"):
        torch.ops.torchmx.quantize_mx(torch.randn(2, 4), "float8_e4m3", bad)


def test_op_schema_reads_bool_as_int():
    """The schema converts True to 1 before the op sees it (documented in docs/api.md);
    torchmx's Python entry points refuse bools."""
    x = torch.randn(2, 4)
    as_bool = torch.ops.torchmx.quantize_mx(x, "float8_e4m3", True, block_dim=True)
    as_int = torch.ops.torchmx.quantize_mx(x, "float8_e4m3", 1, block_dim=1)
    assert all(torch.equal(a, b) for a, b in zip(as_bool, as_int))


@pytest.mark.parametrize("bad", [True, 32.0, "32", None])
def test_python_entry_points_refuse_non_int_block_size(bad):
    x = torch.randn(2, 32)
    scale, data = torch.ops.torchmx.quantize_mx(x, "float8_e4m3", 32)
    calls = [
        lambda: MXTensor.to_mx(x, "float8_e4m3", bad),
        lambda: MXTensor(scale, data, "float8_e4m3", bad, torch.float32),
        lambda: MXConfig("float8_e4m3", block_size=bad),
        lambda: quantize_mx_reference(x, "float8_e4m3", bad),
        lambda: dequantize_mx_reference(data, scale, "float8_e4m3", bad),
        lambda: analysis.quantization_error(x, "float8_e4m3", bad),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="block_size must be an int"):
            call()


@pytest.mark.parametrize("bad", [True, 1.0])
def test_python_entry_points_refuse_non_int_block_dim_and_seed(bad):
    x = torch.randn(2, 32)
    with pytest.raises(TypeError, match="block_dim must be an int"):
        MXTensor.to_mx(x, "float8_e4m3", 32, block_dim=bad)
    with pytest.raises(TypeError, match="block_dim must be an int"):
        MXConfig("float8_e4m3").quantize(x, block_dim=bad)
    with pytest.raises(TypeError, match="seed must be an int"):
        MXTensor.to_mx(x, "float8_e4m3", 32, rounding="stochastic", seed=bad)
    with pytest.raises(TypeError, match="seed must be an int"):
        analysis.quantization_error(x, "float8_e4m3", rounding="stochastic", seed=bad)


@pytest.mark.parametrize("bad", [-1, 2**63, 2**64])
def test_seed_out_of_range_is_a_value_error(bad):
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63\)"):
        MXTensor.to_mx(torch.randn(2, 32), "float8_e4m3", 32, rounding="stochastic", seed=bad)


# ---------------------------------------------------------------- 10. the seed's 32-bit key


def _colliding_seed(seed: int, high: int) -> int:
    """Another seed with seed_key equal to `seed`'s: seed_key(s) = mix32(low ^ mix32(high)), so
    a new high half is compensated in the low half."""
    low = (seed & 0xFFFFFFFF) ^ _mix32(seed >> 32) ^ _mix32(high)
    return (high << 32) | low


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), high=st.integers(0, 2**31 - 1))
def test_seed_key_is_a_32_bit_fold_of_the_seed(seed, high):
    other = _colliding_seed(seed, high)
    assert 0 <= seed_key(seed) < 2**32
    assert seed_key(other) == seed_key(seed)


@settings(max_examples=50, deadline=None)
@given(a=st.integers(0, 2**32 - 1), b=st.integers(0, 2**32 - 1))
def test_seeds_below_2_32_have_distinct_keys(a, b):
    assert (seed_key(a) == seed_key(b)) == (a == b)


def test_seeds_with_one_key_round_identically_on_every_backend(monkeypatch):
    """Documented (docs/numerics.md): the draws depend on the seed through its 32-bit key only."""
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(5))
    a, b = 12345, _colliding_seed(12345, 0x5EED)
    c = a + 1  # another key
    assert a != b and seed_key(a) == seed_key(b) != seed_key(c)
    results = {}
    for name in ("cpu", "reference"):
        if name == "cpu":
            monkeypatch.setattr(backends, "FORCE_REFERENCE", False)
        else:
            monkeypatch.setattr(backends, "FORCE_REFERENCE", True)
        results[name] = [torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32, rounding="stochastic",
                                                       seed=s)[1] for s in (a, b, c)]
    for name, (da, db, dc) in results.items():
        assert torch.equal(da, db), name
        assert not torch.equal(da, dc), name
        assert torch.equal(da, results["reference"][0]), name


@pytest.mark.gpu  # the Triton kernels: on the GPU where there is one
def test_seeds_with_one_key_round_identically_in_triton():
    tb, device = _triton_backend()
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(5))
    a, b = 12345, _colliding_seed(12345, 0x5EED)
    got = [tb.quantize(x.to(device), dtypes.float4_e2m1, 32, "floor", "stochastic", 1, s)[1].cpu()
           for s in (a, b)]
    expected = quantize_mx_reference(x, dtypes.float4_e2m1, 32, rounding="stochastic", seed=a)[1]
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], expected)

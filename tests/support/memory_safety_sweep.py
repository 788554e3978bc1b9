"""The sweep of tests/kernels/quantize/test_memory_safety.py, run in a child process whose C kernels are built
with AddressSanitizer and UndefinedBehaviorSanitizer (the parent sets TORCHMX_CPU_CFLAGS,
TORCHMX_CACHE_DIR and LD_PRELOAD of the sanitizer runtimes).

Hypothesis draws formats (built-in and every custom ExMy width), shapes with odd lengths, block
axes, block sizes up to 2**63 - 1, input dtypes and raw input bits (NaN, Inf, subnormals), and
runs quantize and dequantize (of its own output and of arbitrary code and scale bytes) through
the C kernels, each result held bit for bit to the reference, then a few inputs large enough
to be split across threads. A sanitizer report aborts the process. Then the canary: one
deliberate out-of-bounds read through the kernels, which must be reported, so a sweep that
passes is known to have been watched.

TORCHMX_SANITIZER_EXAMPLES sets hypothesis' examples per property (default 150).
"""

import os
import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchmx import cpu_kernels, dtypes
from torchmx.ops import backend_for
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference
from torchmx.numerics.packing import packed_length

from formats import every_custom_format

EXAMPLES = int(os.environ.get("TORCHMX_SANITIZER_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


FORMATS = list(dtypes.SUPPORTED_ELEM_DTYPES) + every_custom_format()
HP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BITS_DTYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
BLOCK_SIZES = st.one_of(st.integers(1, 80), st.sampled_from([2**k for k in range(5, 63)]),
                        st.just(2**63 - 1), st.integers(1, 2**63 - 1))


def _bits(t):
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def _raw_tensor(shape, dtype, seed):
    """Arbitrary bit patterns of `dtype` (NaN, Inf, subnormals, signed zeros included)."""
    g = torch.Generator().manual_seed(seed)
    bits = BITS_DTYPES[dtype]
    info = torch.iinfo(bits)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(bits).view(dtype)


@st.composite
def _layouts(draw):
    ndim = draw(st.integers(0, 3))
    shape = [draw(st.integers(0, 5)) for _ in range(ndim)]
    axis = draw(st.integers(-max(ndim, 1), max(ndim, 1) - 1))
    if ndim:
        shape[axis] = draw(st.integers(0, 70))  # odd lengths, partial groups and blocks
    return shape, axis


@SETTINGS
@given(layout=_layouts(), fmt=st.sampled_from(FORMATS), block_size=BLOCK_SIZES,
       dtype=st.sampled_from(HP_DTYPES), seed=st.integers(0, 2**63 - 1),
       scale_mode=st.sampled_from(("floor", "ceil", "even", "rceil")),
       rounding=st.sampled_from(("even", "away", "toward_zero", "trunc", "stochastic")),
       transposed=st.booleans(), target=st.sampled_from(HP_DTYPES))
def quantize_round_trip(layout, fmt, block_size, dtype, seed, scale_mode, rounding, transposed,
                        target):
    shape, axis = layout
    x = _raw_tensor(shape, dtype, seed % 2**32)
    if transposed and x.dim() >= 2:
        x = x.transpose(0, -1)  # non-contiguous input
    options = dict(scale_mode=scale_mode, rounding=rounding, block_dim=axis, seed=seed)
    scale, data = torch.ops.torchmx.quantize_mx(x, fmt.name, block_size, **options)
    ref_scale, ref_data = quantize_mx_reference(x, fmt, block_size, **options)
    assert torch.equal(scale, ref_scale) and torch.equal(data, ref_data), (fmt, block_size)
    n = 1 if x.dim() == 0 else x.shape[axis]
    out = torch.ops.torchmx.dequantize_mx(data, scale, fmt.name, block_size, target, axis,
                                          block_dim_size=n)
    ref = dequantize_mx_reference(ref_data, ref_scale, fmt, block_size, target, axis,
                                  block_dim_size=n)
    assert torch.equal(_bits(out), _bits(ref)), (fmt, block_size)


@SETTINGS
@given(layout=_layouts(), fmt=st.sampled_from(FORMATS), block_size=BLOCK_SIZES,
       seed=st.integers(0, 2**32 - 1), target=st.sampled_from(HP_DTYPES),
       high_scales=st.booleans())
def dequantize_any_bytes(layout, fmt, block_size, seed, target, high_scales):
    """Every byte value as code and as scale: codes with bits above the format's width too."""
    shape, axis = layout
    shape = shape or [1]
    axis = axis % len(shape)
    n = shape[axis]
    data_shape, scale_shape = list(shape), list(shape)
    data_shape[axis] = packed_length(n, fmt)
    scale_shape[axis] = -(-n // block_size)
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, data_shape, generator=g, dtype=torch.int32).to(torch.uint8)
    low = 200 if high_scales else 0  # the table's last rows: a stray code reads past its end
    scale = torch.randint(low, 256, scale_shape, generator=g, dtype=torch.int32).to(torch.uint8)
    if fmt.kind == "int":
        data = data.view(torch.int8)
    out = torch.ops.torchmx.dequantize_mx(data, scale, fmt.name, block_size, target, axis,
                                          block_dim_size=n)
    ref = dequantize_mx_reference(data, scale, fmt, block_size, target, axis, block_dim_size=n)
    assert torch.equal(_bits(out), _bits(ref)), (fmt, block_size)


def threaded_rows():
    """Inputs large enough for the kernels to split rows across threads (their row bounds)."""
    torch.set_num_threads(2)
    for fmt, shape, axis, block_size in ((dtypes.float4_e2m1, (3, 70001), 1, 32),
                                         (dtypes.float6_e3m2, (70001, 3), 0, 2**63 - 1),
                                         (dtypes.ExMy(2, 2), (5, 33333, 2), 1, 7)):
        x = _raw_tensor(shape, torch.bfloat16, block_size % 1000)
        scale, data = torch.ops.torchmx.quantize_mx(x, fmt.name, block_size, block_dim=axis)
        ref_scale, ref_data = quantize_mx_reference(x, fmt, block_size, block_dim=axis)
        assert torch.equal(scale, ref_scale) and torch.equal(data, ref_data), fmt
        out = torch.ops.torchmx.dequantize_mx(data, scale, fmt.name, block_size, torch.float32,
                                              axis, block_dim_size=shape[axis])
        ref = dequantize_mx_reference(data, scale, fmt, block_size, torch.float32, axis,
                                      block_dim_size=shape[axis])
        assert torch.equal(_bits(out), _bits(ref)), fmt
    torch.set_num_threads(1)


def canary():
    """Read one byte past a 1-byte scale tensor through mx_dequantize_rows (two blocks of one
    element): the sanitizer must report it."""
    fmt = dtypes.float8_e4m3
    data = torch.zeros(2, dtype=torch.uint8)
    scale = torch.zeros(1, dtype=torch.uint8)  # holds one of the two blocks' bytes
    table = cpu_kernels._dequantize_table(fmt, torch.float32)
    out = torch.empty(2, dtype=torch.float32)
    codes = torch.empty(2, dtype=torch.uint8)
    cpu_kernels._library().mx_dequantize_rows(
        data.data_ptr(), scale.data_ptr(), 2, 1, 0, 1, cpu_kernels._format(fmt), 1,
        table.data_ptr(), table.shape[1], table.element_size(), out.data_ptr(), codes.data_ptr())


def main():
    flags = cpu_kernels._flags()
    if (not any(f.startswith("-fsanitize=") for f in flags)
            or backend_for(torch.device("cpu")) != "cpu"):
        sys.exit(f"the ops do not run C kernels built with sanitizers (flags {flags})")
    quantize_round_trip()
    dequantize_any_bytes()
    threaded_rows()
    print("sweep passed", flush=True)
    canary()
    print("canary not reported", flush=True)


if __name__ == "__main__":
    main()

"""The Triton kernels (torchmx/kernels) equal the reference numerics bit for bit.

On a machine with a CUDA GPU the kernels run on it. Without one they run on CPU tensors through
Triton's interpreter (TRITON_INTERPRET=1, set when this module is imported, before Triton is,
and restored after it), on small shapes: that is how CI, which has no GPU, covers every option.

Reference results are computed on CPU and compared bit for bit, NaNs included: every backend
writes the target dtype's one canonical NaN (docs/numerics.md).
"""

import itertools
import os
import subprocess
import sys
import zlib

import pytest
import torch

_SAVED_INTERPRET = os.environ.get("TRITON_INTERPRET")
# Triton decides interpreter or GPU when a function is decorated, its own library functions too
# (triton.language): the variable must be set before Triton is first imported. When another
# test module imported it first (in one pytest session), this module re-runs in a fresh process.
_LATE = "triton.language" in sys.modules and _SAVED_INTERPRET != "1"
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from covering import pairs_when_interpreted  # noqa: E402
from repo import ROOT  # noqa: E402
from formats import FORMAT_IDS, FORMATS, HP_DTYPES, ROUNDINGS, SCALE_MODES, bit_view, every_code_every_scale, wide_range_input  # noqa: E402
from torchmx import dtypes  # noqa: E402
from torchmx.kernels.quantize import triton_backend as tb  # noqa: E402
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference  # noqa: E402

GPU = torch.cuda.is_available()
INTERPRET = not GPU and os.environ.get("TRITON_INTERPRET") == "1"


RERUN = INTERPRET and _LATE


@pytest.fixture(scope="module", autouse=True)
def _restore_triton_interpret():
    """Leave TRITON_INTERPRET as it was for the test modules that run after this one."""
    yield
    if _SAVED_INTERPRET is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _SAVED_INTERPRET


@pytest.fixture(autouse=True)
def _only_in_a_fresh_process_when_late(request):
    if RERUN and request.node.name != "test_this_module_in_a_fresh_interpreter_process":
        pytest.skip("Triton was imported before TRITON_INTERPRET was set: these tests run in "
                    "test_this_module_in_a_fresh_interpreter_process")


@pytest.mark.skipif(not RERUN, reason="this process runs the tests itself")
def test_this_module_in_a_fresh_interpreter_process():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"],
                         env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]


# The full matrix: TORCHMX_TEST_FULL=1. Without it a test takes a rotating subset of its cases,
# on the GPU too: there each case that changes a constexpr (format, scale mode, rounding, block
# size, block axis, input dtype) is one more kernel compile, which costs far more than the run.
# Every (format, scale mode, rounding) triple, and every 16-bit value through every format and
# scale mode (GPU), still runs.
FULL = os.environ.get("TORCHMX_TEST_FULL") == "1"
# The interpreter computes masked-off lanes too, where integer casts may overflow harmlessly.
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]
DEVICE = "cuda" if GPU else "cpu"
if not GPU and not INTERPRET:
    pytest.skip("no GPU and the Triton interpreter is off (TRITON_INTERPRET)", allow_module_level=True)

# Formats beyond the shared list: a negative emax (max < 1) and emax = 127 (steps below 2**-126).
EXTRA_FORMATS = (dtypes.ExMy(3, 2, bias=10), dtypes.ExMy(6, 1, bias=0))
ALL_FORMATS = FORMATS + EXTRA_FORMATS
ALL_IDS = FORMAT_IDS + [f.name for f in EXTRA_FORMATS]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor, NaN payloads included (bytes pass through)."""
    t = t.cpu()
    return bit_view(t) if t.is_floating_point() else t


def assert_same(expected, got, what=""):
    assert expected.dtype == got.dtype, (what, expected.dtype, got.dtype)
    assert tuple(expected.shape) == tuple(got.shape), (what, expected.shape, got.shape)
    assert got.is_contiguous()
    e, g = bits(expected), bits(got)
    if not torch.equal(e, g):
        bad = (e != g).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: {(e != g).sum()} of {e.numel()} differ, first at {bad}")


def check_quantize(x, fmt, block_size, scale_mode="floor", rounding="even", axis=-1, seed=1234):
    """Kernel vs reference on the same input; returns the reference (scale, data)."""
    x_cpu = x.cpu()
    expected = quantize_mx_reference(x_cpu, fmt, block_size, scale_mode=scale_mode,
                                     rounding=rounding, block_dim=axis, seed=seed)
    got = tb.quantize(x.to(DEVICE) if x.device.type != DEVICE else x, fmt, block_size,
                      scale_mode, rounding, axis % max(x.dim(), 1), seed)
    what = f"{fmt.name} B={block_size} {scale_mode}/{rounding} axis={axis} {x.dtype} {tuple(x.shape)}"
    assert_same(expected[0], got[0], "scale " + what)
    assert_same(expected[1], got[1], "data " + what)
    return expected


def check_dequantize(scale, data, fmt, block_size, target, axis, n):
    expected = dequantize_mx_reference(data.cpu(), scale.cpu(), fmt, block_size, target, axis,
                                       block_dim_size=n)
    got = tb.dequantize(data.to(DEVICE), scale.to(DEVICE), fmt, block_size, target,
                        axis % data.dim(), n)
    assert_same(expected, got, f"dequantize {fmt.name} B={block_size} axis={axis} -> {target}")


# Every (format, scale mode, rounding) triple on a GPU; under the interpreter every pair of them
# (each is a constexpr of its own step: the scale byte, then the rounding of the codes).
OPTIONS = pairs_when_interpreted(ALL_FORMATS, SCALE_MODES, ROUNDINGS)


@pytest.mark.parametrize("fmt,scale_mode,rounding", OPTIONS,
                         ids=[f"{r}-{m}-{f.name}" for f, m, r in OPTIONS])
def test_quantize_every_option(fmt, scale_mode, rounding):
    # Rows kernel (last dim), cols kernel (dim 0), odd block sizes (padded tiles, packing pass).
    cases = [(torch.float32, 32, -1), (torch.bfloat16, 8, 0), (torch.float16, 7, -1),
             (torch.float32, 6, 0)]
    shape = (96, 160) if GPU else (37, 67)
    if not FULL:  # two of the four cases, rotating
        start = zlib.crc32(f"{fmt.name}{scale_mode}{rounding}".encode()) % 2
        cases = cases[start::2]
    for dtype, block_size, axis in cases:
        x = wide_range_input(shape, dtype, seed=zlib.crc32(f"{fmt.name}{scale_mode}{rounding}".encode()))
        check_quantize(x, fmt, block_size, scale_mode, rounding, axis)


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=ALL_IDS)
@pytest.mark.parametrize("target", HP_DTYPES)
def test_dequantize_every_code_and_scale(fmt, target):
    scale, data, n = every_code_every_scale(fmt)  # both axes below
    check_dequantize(scale, data, fmt, n, target, 1, n)
    check_dequantize(scale.t().contiguous(), data.t().contiguous(), fmt, n, target, 0, n)
    # Small blocks: the scale changes inside a row.
    for block_size in (2, 4, 32) if FULL else (4,):
        if n % block_size == 0 or fmt.bits == 8:
            s = torch.arange(256 * -(-n // block_size), dtype=torch.int64).remainder(256)
            s = s.to(torch.uint8).view(256, -1)
            check_dequantize(s, data, fmt, block_size, target, 1, n)


def _every_value(dtype):
    """Every bit pattern of a 16-bit float (NaN and Inf included), shuffled into rows of 32."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    perm = torch.randperm(bits.numel(), generator=torch.Generator().manual_seed(0))
    return bits[perm].view(dtype).view(-1, 32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=ALL_IDS)
def test_every_16_bit_value(dtype, fmt):
    x = _every_value(dtype)
    # Single-element blocks give every value its own scale; 32-blocks mix magnitudes.
    layouts = [(1, -1), (32, -1), (32, 0)]
    cases = list(itertools.product(SCALE_MODES, layouts))
    turn = zlib.crc32(f"{fmt.name}{dtype}".encode())
    if GPU and not FULL:  # every scale mode, each with one of the layouts, rotating
        cases = [(mode, layouts[(turn + i) % len(layouts)]) for i, mode in enumerate(SCALE_MODES)]
    elif not FULL:  # the interpreter is slow: one case per format and dtype, rotating
        cases = [cases[turn % len(cases)]]
    for scale_mode, (block_size, axis) in cases:
        rounding = "even" if GPU or FULL or block_size == 1 else "stochastic"
        scale, data = check_quantize(x, fmt, block_size, scale_mode, rounding, axis)
        n = x.shape[axis]
        check_dequantize(scale, data, fmt, block_size, dtype, axis, n)
    if (GPU or FULL) and dtype == torch.bfloat16:
        for rounding in ROUNDINGS:
            check_quantize(x, fmt, 32, "floor", rounding, -1)


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=ALL_IDS)
def test_rceil_next_to_every_power_of_two(fmt):
    """rceil's division-free scale byte (see triton_backend._rceil_constants): amax within a
    few ulps of max_normal * 2**k for every k, where the rounding of amax / max_normal (to
    subnormals too) decides the byte; single-element blocks, fp32 input."""
    k = torch.arange(-160, 130, dtype=torch.float64)
    centre = (fmt.max * torch.exp2(k)).clamp(max=3.4e38).to(torch.float32).view(torch.int32)
    bits = (centre[:, None] + torch.arange(-3, 4, dtype=torch.int32)).clamp(0, 0x7F7FFFFF)
    check_quantize(bits.view(torch.float32), fmt, 1, "rceil", "even", -1)


SHAPES = [(), (0,), (5, 0), (0, 64), (1,), (31,), (97,), (3, 5, 7), (2, 129, 3),
          (4096,) if GPU else (700,)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS[:6] if FULL else (FORMATS[1], FORMATS[3], FORMATS[4]), ids=str)
def test_shapes_and_axes(shape, fmt):
    x = wide_range_input(shape, torch.bfloat16, seed=3)
    dims = max(len(shape), 1)
    # A negative axis is the kernel call of its positive one (check_quantize passes axis % dim);
    # only the reference sees the difference: under the interpreter, positive axes only.
    axes = range(dims) if INTERPRET else range(-dims, dims)
    for axis, block_size in itertools.product(axes, (1, 3, 32)):
        scale, data = check_quantize(x, fmt, block_size, "floor", "even", axis)
        if x.dim() == 0:
            continue
        n = x.shape[axis]
        check_dequantize(scale, data, fmt, block_size, torch.float32, axis, n)


def test_non_contiguous_input():
    base = wide_range_input((64, 96) if GPU else (32, 48), torch.float32, seed=5).to(DEVICE)
    rows, cols = base.shape
    views = (base.t(), base[:, ::3], base[::2].unsqueeze(0).expand(3, -1, -1),
             base.view(4, rows // 4, cols).permute(2, 0, 1),
             base.view(8, rows // 8, cols)[:, ::2, 1::2])
    formats = (FORMATS[0], FORMATS[2], FORMATS[4])
    for i, x in enumerate(views):
        for axis in range(x.dim()):
            for fmt in formats if FULL else formats[(i + axis) % 3:][:1]:
                check_quantize(x, fmt, 32, "rceil", "stochastic", axis, seed=99)


@pytest.mark.parametrize("fmt", [FORMATS[0], FORMATS[2], FORMATS[4], FORMATS[5]], ids=str)
def test_stochastic_rounding_same_for_every_grid(fmt, monkeypatch):
    """The random number of an element comes from its logical index: tile shapes, block axis
    strides and launch grids do not change the result."""
    x = wide_range_input((64, 256), torch.float32, seed=9)
    first = check_quantize(x, fmt, 32, "floor", "stochastic", -1, seed=77)
    monkeypatch.setitem(tb.TUNING, "quantize_rows", {"elements": 1024, "columns": 64, "num_warps": 4})
    monkeypatch.setitem(tb.TUNING, "quantize_cols", {"elements_per_thread": 16, "num_warps": 2})
    again = tb.quantize(x.to(DEVICE), fmt, 32, "floor", "stochastic", 1, 77)
    assert torch.equal(first[1], again[1].cpu())
    other_seed = tb.quantize(x.to(DEVICE), fmt, 32, "floor", "stochastic", 1, 78)
    assert not torch.equal(first[1], other_seed[1].cpu())
    check_quantize(x.t().contiguous().t(), fmt, 32, "floor", "stochastic", -1, seed=77)
    check_quantize(x, fmt, 32, "floor", "stochastic", 0, seed=2**63 - 1)
    fused = tb.quantize_rowwise_colwise(x.to(DEVICE), fmt, 32, "floor", "stochastic", 77)
    assert torch.equal(first[1], fused[0][1].cpu())
    # A 1-d launch grid (used past 65535 tile rows) gives the same bytes.
    monkeypatch.setattr(tb, "_grid", lambda b, tiles_r, tiles_c: ((b * tiles_r * tiles_c,), 1))
    tb._PLANS.clear()  # launches decided again, with the patched grid
    check_quantize(x, fmt, 32, "floor", "stochastic", -1, seed=77)
    check_quantize(x, fmt, 32, "rceil", "stochastic", 0, seed=77)
    scale, data = check_quantize(x, fmt, 8, "even", "even", 0)
    check_dequantize(scale, data, fmt, 8, torch.bfloat16, 0, x.shape[0])
    fused = tb.quantize_rowwise_colwise(x.to(DEVICE), fmt, 32, "floor", "stochastic", 77)
    assert torch.equal(first[1], fused[0][1].cpu())


@pytest.mark.parametrize("fmt", [dtypes.float6_e3m2, dtypes.float6_e2m3], ids=str)
def test_fp6_rows_word_and_byte_paths(fmt):
    """fp6 along the last dim moves as 32-bit words when blocks and rows hold whole 16-code
    chunks and the data is 4-byte aligned, else byte by byte: both equal the reference.
    Dequantize takes 8 codes per thread where blocks and rows hold whole 8-code chunks and the
    data is 2-byte aligned."""
    for shape, block_size in (((4, 64), 16), ((5, 96), 32), ((3, 72), 8), ((4, 72), 24),
                              ((1, 4096), 32), ((2, 40), 16)):
        x = wide_range_input(shape, torch.bfloat16, seed=shape[1])
        scale, data = check_quantize(x, fmt, block_size, "floor", "even", -1)
        check_dequantize(scale, data, fmt, block_size, torch.float32, -1, shape[1])
        got = tb.quantize_rowwise_colwise(x.to(DEVICE), fmt, block_size, "floor", "even", None)
        assert torch.equal(got[0][0].cpu(), scale) and torch.equal(got[0][1].cpu(), data)
    # Rows of whole 8-code chunks take the 8-codes-per-thread kernel (2-byte aligned data, here
    # not 4-byte aligned); the 32-bit word path stays for other callers: both equal the reference.
    x = wide_range_input((3, 80), torch.float16, seed=7)
    scale, data = check_quantize(x, fmt, 16, "floor", "even", -1)
    buffer = torch.zeros(data.numel() + 2, dtype=torch.uint8, device=DEVICE)
    buffer[2:] = data.to(DEVICE).flatten()
    shifted = buffer[2:].view(data.shape)
    assert shifted.data_ptr() % 4 == 2 and tb._fp6_chunks(4, 16, 80, shifted)
    for target in HP_DTYPES:
        expected = dequantize_mx_reference(data, scale, fmt, 16, target, -1)
        assert_same(expected, tb.dequantize(shifted, scale.to(DEVICE), fmt, 16, target, 1, 80))
    with pytest.MonkeyPatch.context() as m:
        m.setitem(tb.KNOBS, "fp6_chunks", False)
        check_dequantize(scale, data, fmt, 16, torch.bfloat16, -1, 80)
    # Data at an odd address takes the byte path.
    x = wide_range_input((2, 40), torch.bfloat16, seed=40)
    scale, data = check_quantize(x, fmt, 16, "floor", "even", -1)
    buffer = torch.zeros(data.numel() + 1, dtype=torch.uint8, device=DEVICE)
    buffer[1:] = data.to(DEVICE).flatten()
    shifted = buffer[1:].view(data.shape)
    assert shifted.data_ptr() % 4 != 0
    expected = dequantize_mx_reference(data, scale, fmt, 16, torch.float32, -1)
    assert_same(expected, tb.dequantize(shifted, scale.to(DEVICE), fmt, 16, torch.float32, 1, 40))


THREAD_ROW_INPUTS = {"fp32": (torch.float32, 1), "fp16": (torch.float16, 1),
                     "fp16 elements": (torch.float16, 0), "bf16": (torch.bfloat16, 1),
                     "bf16 elements": (torch.bfloat16, 0)}


@pytest.mark.parametrize("inputs", THREAD_ROW_INPUTS)
def test_one_block_per_thread_rows_for_every_input(inputs, monkeypatch):
    """Blocks of 8-64 (fp6: 32, 64) along a unit-stride last dim are quantized one block per
    thread from 16-bit inputs, and from fp32 for fp6 (two 16-byte chunks per 8 codes; other
    formats take quantize_rows_kernel there). bf16 / fp16 inputs of fp4 / fp6 take the pair
    kernel (test_quantize_pairs.py) unless it is disabled, as in "... elements"."""
    dtype, pairs = THREAD_ROW_INPUTS[inputs]
    monkeypatch.setitem(tb.TUNING, "quantize_rows_pairs",
                        {**tb.TUNING["quantize_rows_pairs"], "enabled": pairs})
    x = wide_range_input((5, 192), dtype, seed=len(inputs))
    for i, fmt in enumerate(ALL_FORMATS):
        for block_size in (32, 64) if fmt.bits == 6 else (8, 32):
            cw = tb._thread_rows(x.element_size(), block_size, 192, fmt.codes_per_group, True)
            one_per_thread = dtype != torch.float32 or fmt.bits == 6
            assert cw == (16 // x.element_size() if one_per_thread else None), fmt.name
            check_quantize(x, fmt, block_size, SCALE_MODES[(i + block_size) % 4], "even", -1)


FUSED_SHAPES = [(64, 96), (37, 67), (2, 3, 33, 65), (1, 1), (128, 32)]


FUSED_FORMATS = ALL_FORMATS if FULL else (FORMATS[0], FORMATS[2], FORMATS[4], FORMATS[5], FORMATS[6])


@pytest.mark.parametrize("fmt", FUSED_FORMATS, ids=str)
def test_fused_rowwise_colwise_equals_two_reference_calls(fmt):
    for i, shape in enumerate(FUSED_SHAPES):
        dtype = HP_DTYPES[i % 3]
        x = wide_range_input(shape, dtype, seed=i)
        for block_size, scale_mode, rounding in [(32, "floor", "even"), (16, "rceil", "stochastic"),
                                                 (3, "even", "away")]:
            got = tb.quantize_rowwise_colwise(x.to(DEVICE), fmt, block_size, scale_mode, rounding, 5)
            for axis, (scale, data) in zip((-1, -2), got):
                expected = quantize_mx_reference(x, fmt, block_size, scale_mode=scale_mode,
                                                 rounding=rounding, block_dim=axis, seed=5)
                what = f"fused axis={axis} {fmt.name} {shape} B={block_size}"
                assert_same(expected[0], scale, "scale " + what)
                assert_same(expected[1], data, "data " + what)


def test_fused_public_function_and_non_contiguous():
    from torchmx.kernels import quantize_mx_rowwise_colwise
    x = wide_range_input((96, 64), torch.bfloat16, seed=4).to(DEVICE).t()  # non-contiguous
    for fmt in (FORMATS[0], FORMATS[2], FORMATS[4]):
        got = tb.quantize_rowwise_colwise(x, fmt, 32, "floor", "even", None)
        for axis, (scale, data) in zip((-1, -2), got):
            expected = quantize_mx_reference(x.cpu(), fmt, 32, block_dim=axis)
            assert_same(expected[0], scale)
            assert_same(expected[1], data)
        if GPU:  # the public function dispatches to the fused kernel on CUDA
            public = quantize_mx_rowwise_colwise(x, fmt.name, 32)
            for (s1, d1), (s2, d2) in zip(public, got):
                assert torch.equal(s1, s2) and torch.equal(d1, d2)
    with pytest.raises(ValueError, match="at least 2 dims"):
        quantize_mx_rowwise_colwise(torch.zeros(4), "float8_e4m3")


FAKE_QUANTIZE_CASES = [  # (shape, dtype, block size, scale mode, rounding): odd and partial blocks
    ((37, 67), torch.float32, 32, "floor", "even"), ((5, 64), torch.bfloat16, 32, "rceil", "even"),
    ((2, 3, 40), torch.float16, 8, "even", "away"), ((9, 30), torch.bfloat16, 7, "ceil", "trunc"),
    ((1, 1), torch.float32, 32, "floor", "toward_zero"), ((0, 32), torch.bfloat16, 32, "floor", "even"),
]


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=ALL_IDS)
def test_fake_quantize_equals_dequantized_reference_quantize(fmt):
    """One fused pass (QAT's fake quantize) gives dequantize(quantize(x)) bit for bit."""
    cases = FAKE_QUANTIZE_CASES if FULL else FAKE_QUANTIZE_CASES[zlib.crc32(fmt.name.encode()) % 2::2]
    for i, (shape, dtype, block_size, scale_mode, rounding) in enumerate(cases):
        x = wide_range_input(shape, dtype, seed=i)
        assert tb.fake_quantize_supported(x, block_size, rounding)
        scale, data = quantize_mx_reference(x, fmt, block_size, scale_mode=scale_mode,
                                            rounding=rounding)
        expected = dequantize_mx_reference(data, scale, fmt, block_size, dtype, -1,
                                           block_dim_size=shape[-1])
        what = f"{fmt.name} {shape} {dtype} B={block_size} {scale_mode}/{rounding}"
        for _ in range(2):  # the first call plans the launch, the second reuses it
            got = tb.fake_quantize_rows(x.to(DEVICE), fmt, block_size, scale_mode, rounding)
            assert got.shape == x.shape and got.dtype == dtype
            assert_same(expected, got, "fake quantize " + what)


def test_fake_quantize_takes_contiguous_rows_and_no_stochastic_rounding():
    x = torch.zeros(4, 64)
    assert not tb.fake_quantize_supported(x.t(), 32, "even")
    assert not tb.fake_quantize_supported(x, 32, "stochastic")
    assert not tb.fake_quantize_supported(torch.zeros(()), 32, "even")


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_qat_fake_quantize_takes_the_fused_pass_on_cuda():
    from torchmx.config import MXConfig
    from torchmx.nn.functional import fake_quantize
    x = wide_range_input((64, 96), torch.bfloat16, seed=9).cuda()
    for config in (MXConfig("float8_e4m3"), MXConfig("float4_e2m1", scale_mode="rceil")):
        scale, data = config.quantize(x, -1)
        expected = torch.ops.torchmx.dequantize_mx(data, scale, config.elem_dtype_name, 32,
                                                   x.dtype, -1)
        assert_same(expected, fake_quantize(x, config))
        assert_same(expected, fake_quantize(x.t().contiguous().t(), config))  # strided: ops


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_ops_dispatch_to_triton_on_cuda():
    from torchmx.ops import backend_for
    assert backend_for(torch.device("cuda")) == "triton"
    x = wide_range_input((128, 96), torch.bfloat16, seed=8).cuda()
    scale, data = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32, scale_mode="rceil")
    expected = quantize_mx_reference(x.cpu(), "float4_e2m1", 32, scale_mode="rceil")
    assert_same(expected[0], scale)
    assert_same(expected[1], data)
    out = torch.ops.torchmx.dequantize_mx(data, scale, "float4_e2m1", 32, torch.bfloat16)
    assert_same(dequantize_mx_reference(expected[1], expected[0], "float4_e2m1", 32, torch.bfloat16), out)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_bit_arithmetic_path_equals_hardware_fp8(monkeypatch):
    """The fp8 kernels use the hardware conversion for rounding="even"; the bit arithmetic
    they replace must give the same bytes (both against the reference)."""
    x = _every_value(torch.bfloat16)
    for fmt in (dtypes.float8_e4m3, dtypes.float8_e5m2):
        for scale_mode in SCALE_MODES:
            monkeypatch.setitem(tb.KNOBS, "hw_fp8", False)
            scale, data = check_quantize(x, fmt, 32, scale_mode, "even", -1)
            check_dequantize(scale, data, fmt, 32, torch.float32, -1, 32)
            monkeypatch.setitem(tb.KNOBS, "hw_fp8", True)
            check_quantize(x, fmt, 32, scale_mode, "even", 0)


def _free_gpu_bytes():
    return torch.cuda.mem_get_info()[0] if GPU else 0


@pytest.mark.skipif(_free_gpu_bytes() < 24 * 2**30, reason="needs a CUDA GPU with 24 GiB free")
def test_more_than_2_pow_31_elements():
    """64-bit offsets: a tensor of 2**31 + 2**20 elements, checked on slices at its far end."""
    rows, cols = 2**16 + 32, 2**15
    x = torch.empty(rows, cols, dtype=torch.bfloat16, device="cuda")
    x.view(-1)[:] = 1.0
    tail = wide_range_input((64, cols), torch.bfloat16, seed=12)
    x[-64:] = tail.cuda()
    assert x.numel() > 2**31
    for fmt, axis in ((FORMATS[0], -1), (FORMATS[4], -1), (FORMATS[2], 0)):
        scale, data = tb.quantize(x, fmt, 32, "floor", "even", axis % 2, None)
        expected = quantize_mx_reference(tail, fmt, 32, block_dim=axis)
        assert_same(expected[0], scale[-expected[0].shape[0]:].contiguous())
        assert_same(expected[1], data[-expected[1].shape[0]:].contiguous())
        out = tb.dequantize(data, scale, fmt, 32, torch.bfloat16, axis % 2, x.shape[axis])
        assert_same(dequantize_mx_reference(expected[1], expected[0], fmt, 32, torch.bfloat16, axis,
                                            block_dim_size=tail.shape[axis]),
                    out[-64:].contiguous())
        del scale, data, out
    # A 1-d tensor whose single dim exceeds 2**31.
    flat = x.view(-1)
    scale, data = tb.quantize(flat, FORMATS[4], 32, "floor", "even", 0, None)
    tail_flat = tail.view(-1)
    expected = quantize_mx_reference(tail_flat, FORMATS[4], 32)
    assert_same(expected[0], scale[-expected[0].numel():].contiguous())
    assert_same(expected[1], data[-expected[1].numel():].contiguous())

"""The quantize kernels on bf16 pairs (kernels/quantize/_tl_quantize_pairs.py): blocks along the last
dim, and the fused row + column pass.

Their encode runs as inline PTX, which Triton's interpreter cannot run: on CPU the kernels
encode with _tl_quantize.codes_rne instead, and the PTX text is checked here by an emulator
(tests/support/ptx_emulator.py) against the reference for every bf16 value and every scale byte. On a
GPU the same tests run the real kernels. The bf16 tests of test_triton_quantize.py and
test_fused_quantize_extra.py reach these kernels too.
"""

import pytest
import torch
import triton
import triton.language as tl

from formats import SCALE_MODES, wide_range_input
from ptx_emulator import run_ptx
from torchmx import dtypes
from torchmx.kernels.quantize import _tl_quantize_pairs as qp
from torchmx.kernels.quantize import triton_backend as tb
from torchmx.numerics import quantize_mx_reference
from torchmx.numerics.elements import encode

GPU = torch.cuda.is_available()  # else tests/conftest.py runs Triton's interpreter
DEVICE = "cuda" if GPU else "cpu"
PAIRS_RUN = not GPU or torch.cuda.get_device_capability() >= (9, 0)  # its PTX needs sm_90
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

PAIR_FORMATS = (dtypes.float4_e2m1, dtypes.float6_e2m3, dtypes.float6_e3m2,
                dtypes.ExMy(3, 2, bias=10), dtypes.ExMy(2, 3, bias=3), dtypes.ExMy(1, 2))
FP16_REJECTED = (dtypes.ExMy(3, 2, bias=1), dtypes.ExMy(3, 2, bias=14))
# The formats the kernels are run on. Under Triton's interpreter they encode with codes_rne, one
# Triton code for every format of a width (the format's numbers are constexprs): the standard
# formats cover it there. On a GPU each format has its own PTX: all of them (on CPU that PTX of
# every format runs through the emulator below, on every 16-bit value and every scale).
KERNEL_FORMATS = PAIR_FORMATS if GPU else PAIR_FORMATS[:3]


@pytest.mark.parametrize("half", [qp.BF16, qp.F16], ids=lambda h: h.name)
def test_which_formats_take_the_pair_encode(half):
    taken = [f.name for f in dtypes.SUPPORTED_ELEM_DTYPES if qp.pairs_supported(f, half)]
    assert taken == ["float6_e3m2", "float6_e2m3", "float4_e2m1"]
    assert all(qp.pairs_supported(f, half) for f in PAIR_FORMATS)
    # emin > 0; 3 and 7 bits (no pair packing here); 8 bits (fp8 has hardware conversions)
    for f in (dtypes.ExMy(6, 1, bias=0), dtypes.ExMy(2, 0), dtypes.ExMy(3, 3),
              dtypes.float8_e4m3, dtypes.int8):
        assert not qp.pairs_supported(f, half)
    # fp16 only: emax 6 (scales beyond two fp16 factors), emin - m = -15 (products that
    # round below 2**-14 could reach a code)
    for f in FP16_REJECTED:
        assert qp.pairs_supported(f, half) == (half == qp.BF16)


@triton.jit
def _operands_kernel(lo_ptr, hi_ptr, inv_ptr, cap_ptr, sign_ptr, inv2_ptr, N: tl.constexpr,
                     F16: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                     CAP: tl.constexpr):
    i = tl.arange(0, N)
    inverse, cap, sign, inverse2 = qp._block_operands(tl.load(lo_ptr + i), tl.load(hi_ptr + i),
                                                      True, F16, BITS, MBITS, CAP)
    tl.store(inv_ptr + i, inverse)
    tl.store(cap_ptr + i, cap)
    tl.store(sign_ptr + i, sign)
    tl.store(inv2_ptr + i, inverse2)


HALVES = {"bf16": (qp.BF16, torch.bfloat16), "fp16": (qp.F16, torch.float16)}


def _operands(fmt, byte_lo, byte_hi, dtype):
    """The kernel's (inverse, cap, sign, inverse2) words for the halves' scale bytes (its
    Triton code, run on the device or under the interpreter)."""
    out = [torch.empty(256, dtype=torch.int32, device=DEVICE) for _ in range(4)]
    _operands_kernel[(1,)](byte_lo.to(DEVICE), byte_hi.to(DEVICE), *out, N=256,
                           F16=dtype == torch.float16, BITS=fmt.bits, MBITS=fmt.mantissa_bits,
                           CAP=tb._half_float_bits(float(fmt.max), dtype))
    return [o.cpu().long() & 0xFFFFFFFF for o in out]


def _scale_exponent_window(fmt):
    """127 - byte over the scale bytes of fp16 blocks (amax in [2**-24, 65504]), as
    pairs_supported(fmt, F16) assumes: [emax - 16, emax + 25]."""
    return fmt.emax - 16, fmt.emax + 25


def _expected_codes(x: torch.Tensor, byte: torch.Tensor, fmt) -> torch.Tensor:
    """The reference code of bf16 x in a block of scale byte `byte` (0 for byte 255)."""
    y = x.double() * torch.exp2(127.0 - byte.double())
    y = torch.where(y.abs() > 2 * float(fmt.max), torch.sign(y) * 2 * float(fmt.max), y)
    code = encode(y.float(), fmt, "even").long()
    return torch.where(byte == 255, 0, code)


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("fmt", PAIR_FORMATS, ids=lambda f: f.name)
def test_the_ptx_encode_gives_the_code_of_every_16_bit_value_under_every_scale(fmt, half):
    """Every bf16 (fp16) bit pattern in the low half and (in another order) in the high half,
    against every scale byte in the low half and another in the high half. Finite x only where
    the byte is finite (a block with a NaN or Inf has byte 255, whose codes are all 0). fp16:
    the bytes and x that fp16 blocks can have (the scale window of _scale_exponent_window,
    y = |x| * 2**(127 - byte) < 2**(emax + 2), and byte 0 of an all-zero block)."""
    half_type, dtype = HALVES[half]
    assert qp.pairs_supported(fmt, half_type)
    bits = torch.arange(65536, dtype=torch.int64)
    program = qp.encode_pairs_ptx(fmt, half_type)
    bytes_lo = torch.arange(256, dtype=torch.int32)
    bytes_hi = (bytes_lo * 77 + 13) % 256
    inverse, cap, sign, inverse2 = _operands(fmt, bytes_lo, bytes_hi, dtype)
    hi_bits = bits.flip(0)
    word = bits | (hi_bits << 16)
    low_e, high_e = _scale_exponent_window(fmt)
    checked = 0
    for s in range(256):
        halves = ((0, bits, bytes_lo[s]), (1, hi_bits, bytes_hi[s]))
        keeps = []
        for index, half_bits, byte in halves:
            xs = half_bits.to(torch.int16).view(dtype)
            keep = xs.isfinite() | (byte == 255)
            if dtype == torch.float16 and byte != 255:
                e = 127 - int(byte)
                y = xs.double().abs() * 2.0 ** e
                keep &= (y < 2.0 ** (fmt.emax + 2)) & (low_e <= e <= high_e) | (xs == 0)
            keeps.append(keep)
        # Only the lanes either half checks go through the emulator (fp16 bytes outside the
        # scale window keep just the zeros).
        lanes = (keeps[0] | keeps[1]).nonzero()[:, 0]
        n = lanes.numel()
        inputs = {"$1": word[lanes], "$2": inverse[s].expand(n), "$3": cap[s].expand(n),
                  "$4": sign[s].expand(n), "$5": inverse2[s].expand(n)}
        out = run_ptx(program, inputs)["$0"]
        for (index, half_bits, byte), keep in zip(halves, keeps):
            got = (out >> (16 * index)) & 0xFFFF
            xs = half_bits[lanes].to(torch.int16).view(dtype)
            keep = keep[lanes]
            expected = _expected_codes(xs.float(), torch.full_like(xs, int(byte), dtype=torch.int64),
                                       fmt)
            expected &= (1 << fmt.bits) - 1
            bad = (got != expected) & keep
            checked += int(keep.sum())
            assert not bad.any(), (f"byte {int(byte)} half {index}: {int(bad.sum())} wrong, "
                                   f"e.g. x={xs[bad][:3].tolist()} got {got[bad][:3].tolist()} "
                                   f"expected {expected[bad][:3].tolist()}")
    assert checked >= (2 * 256 * (65536 - 256) if dtype == torch.bfloat16 else 2 * 10**6)


def test_the_fp16_scale_window():
    """The scale bytes of fp16 blocks, for every positive fp16 amax under every scale mode,
    lie in the window pairs_supported(fmt, F16) assumes, for every format it takes."""
    from torchmx.numerics.scale import shared_scale_byte
    amax = torch.arange(1, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16)
    for fmt in PAIR_FORMATS:
        low_e, high_e = _scale_exponent_window(fmt)
        for mode in SCALE_MODES:
            e = 127 - shared_scale_byte(amax.float(), fmt, mode).long()
            assert low_e <= int(e.min()) and int(e.max()) <= high_e, (fmt.name, mode)


def test_the_ptx_pair_max_is_a_per_half_max():
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randint(0, 2**31, (4096,), generator=g) for _ in range(2))
    out = run_ptx("max.u16x2 $0, $1, $2;", {"$1": a, "$2": b})["$0"]
    assert torch.equal(out & 0xFFFF, torch.maximum(a & 0xFFFF, b & 0xFFFF))
    assert torch.equal(out >> 16, torch.maximum(a >> 16, b >> 16))


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Each test decides its quantize launches itself (the launch plans are kept across calls),
    so that the spies below see every decision and patched helpers take part in it."""
    tb._PLANS.clear()


def _count_calls(monkeypatch, name):
    calls = []
    original = getattr(tb, name)
    monkeypatch.setattr(tb, name, lambda *a: calls.append(1) or original(*a))
    return calls


def _check(x, fmt, block_size, scale_mode):
    got = tb.quantize_rowwise_colwise(x.to(DEVICE), fmt, block_size, scale_mode, "even", None)
    for axis, (scale, data) in zip((-1, -2), got):
        es, ed = quantize_mx_reference(x.cpu(), fmt, block_size, scale_mode=scale_mode,
                                       block_dim=axis)
        what = f"{fmt.name} {tuple(x.shape)} B={block_size} {scale_mode} axis={axis}"
        assert torch.equal(es, scale.cpu()), "scale " + what
        assert torch.equal(ed.view(torch.uint8), data.cpu().view(torch.uint8)), "data " + what


CASES = [((64, 64), (32, 16, 64, 4)), ((37, 66), (32, 16)), ((2, 1, 33, 68), (32,)),
         ((128, 32), (32,)), ((1, 2), (32,)), ((40, 130), (32,))]


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("fmt", KERNEL_FORMATS, ids=lambda f: f.name)
def test_pair_kernel_equals_the_reference(fmt, half, monkeypatch):
    calls = _count_calls(monkeypatch, "_quantize_fused_pairs")
    expected_calls = 0
    for i, (shape, block_sizes) in enumerate(CASES):
        x = wide_range_input(shape, HALVES[half][1], seed=i)
        for block_size in block_sizes:
            if block_size % fmt.codes_per_group == 0:
                _check(x, fmt, block_size, SCALE_MODES[(i + block_size) % 4])
                expected_calls += 1
    assert len(calls) == (expected_calls if PAIRS_RUN else 0)


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("fmt", [dtypes.float4_e2m1, dtypes.float6_e3m2], ids=lambda f: f.name)
def test_pair_kernel_on_strided_views_and_other_tiles(fmt, half, monkeypatch):
    calls = _count_calls(monkeypatch, "_quantize_fused_pairs")
    base = wide_range_input((80, 140), HALVES[half][1], seed=3).to(DEVICE)  # views stay views
    views = {
        "row slice": base[5:69, :128],  # even strides, 4-byte aligned start
        "column slice from 2": base[:, 2:130],
        "transposed": base[:64, :64].t(),  # columns not at unit stride: the element kernel
    }
    for name, x in views.items():
        _check(x, fmt, 32, "floor")
    monkeypatch.setitem(tb.TUNING, "quantize_fused_pairs",
                        {"row_blocks": 2, "col_blocks": 1, "vec": 2, "num_warps": 2, "enabled": 1})
    _check(views["row slice"], fmt, 32, "ceil")
    assert len(calls) == (len(views) if PAIRS_RUN else 0)  # all but the transpose, and ceil


def test_other_inputs_take_the_element_kernel(monkeypatch):
    """fp32 inputs, fp16 inputs of formats the fp16 encode does not take, other roundings, odd
    widths and misaligned starts go to quantize_fused_kernel (and stay exact); so does
    everything with the pair kernel disabled."""
    monkeypatch.setattr(tb, "_quantize_fused_pairs", None)  # would fail if called
    fmt = dtypes.float4_e2m1
    x = wide_range_input((64, 66), torch.bfloat16, seed=8).to(DEVICE)
    _check(x.float(), fmt, 32, "floor")
    for other in FP16_REJECTED:
        _check(x.half(), other, 32, "floor")
    _check(x[:, :65], fmt, 32, "floor")  # odd width
    assert x[:, 1:65].data_ptr() % 4 == 2
    _check(x[:, 1:65], fmt, 32, "floor")  # starts 2 bytes into a word
    got = tb.quantize_rowwise_colwise(x, fmt, 32, "floor", "stochastic", 3)
    assert torch.equal(got[0][1].cpu(), quantize_mx_reference(x.cpu(), fmt, 32,
                                                              rounding="stochastic", seed=3)[1])
    monkeypatch.setitem(tb.TUNING, "quantize_fused_pairs", {**tb.TUNING["quantize_fused_pairs"],
                                                            "enabled": 0})
    _check(x, fmt, 32, "floor")


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("kind", ["quantize_rows_pairs", "quantize_fused_pairs"])
def test_gpus_before_sm90_take_the_element_kernel(kind, half, monkeypatch):
    x = torch.zeros(4, 64, dtype=HALVES[half][1], device=DEVICE)
    view = tb._view_cols(x, 0)
    fmt = dtypes.float4_e2m1
    assert tb._pairs_apply(*view, fmt, "even", kind) == (not GPU or PAIRS_RUN)
    monkeypatch.setattr(tb, "interpreting", lambda: False)
    monkeypatch.setattr(tb, "device_capability", lambda device: (8, 0))
    assert not tb._pairs_apply(*view, fmt, "even", kind)
    monkeypatch.setattr(tb, "device_capability", lambda device: (9, 0))
    assert tb._pairs_apply(*view, fmt, "even", kind)


# Blocks along the last dim (quantize_rows_pairs_kernel).

def _check_rows(x, fmt, block_size, scale_mode):
    scale, data = tb.quantize(x.to(DEVICE), fmt, block_size, scale_mode, "even", x.dim() - 1,
                              None)
    es, ed = quantize_mx_reference(x.cpu(), fmt, block_size, scale_mode=scale_mode)
    what = f"{fmt.name} {tuple(x.shape)} B={block_size} {scale_mode}"
    assert torch.equal(es, scale.cpu()), "scale " + what
    assert torch.equal(ed.view(torch.uint8), data.cpu().view(torch.uint8)), "data " + what


ROW_CASES = [((64, 64), (8, 16, 32, 64)), ((3, 5, 128), (32, 64)), ((7, 192), (64, 32, 8)),
             ((1, 8), (8,)), ((300, 32), (32,)), ((2, 1, 96), (32, 16))]


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("fmt", KERNEL_FORMATS, ids=lambda f: f.name)
def test_rows_pair_kernel_equals_the_reference(fmt, half, monkeypatch):
    """Every scale mode and the block sizes the kernel takes (8-64 for 4-bit formats; 6-bit
    ones are stored 32 codes at a time: 32 and 64)."""
    calls = _count_calls(monkeypatch, "_quantize_rows_pairs")
    expected_calls = 0
    for i, (shape, block_sizes) in enumerate(ROW_CASES):
        x = wide_range_input(shape, HALVES[half][1], seed=i)
        for j, block_size in enumerate(block_sizes):
            _check_rows(x, fmt, block_size, SCALE_MODES[(i + j) % 4])
            expected_calls += fmt.bits == 4 or block_size % 32 == 0
    assert len(calls) == (expected_calls if PAIRS_RUN else 0)


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("fmt", [dtypes.float4_e2m1, dtypes.float6_e2m3], ids=lambda f: f.name)
@pytest.mark.parametrize("block_size", [8, 32])
def test_rows_pair_kernel_on_every_16_bit_value(fmt, block_size, half, monkeypatch):
    """Every bf16 (fp16) bit pattern (NaN and Inf too), shuffled into rows of 64: blocks mixing
    magnitudes, NaN-scale blocks next to finite ones, every scale mode."""
    if fmt.bits == 6 and block_size == 8:
        block_size = 64
    calls = _count_calls(monkeypatch, "_quantize_rows_pairs")
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    perm = torch.randperm(bits.numel(), generator=torch.Generator().manual_seed(block_size))
    x = bits[perm].view(HALVES[half][1]).view(-1, 64)
    for scale_mode in SCALE_MODES:
        _check_rows(x, fmt, block_size, scale_mode)
    assert len(calls) == (4 if PAIRS_RUN else 0)


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("fmt", [dtypes.float4_e2m1, dtypes.float6_e3m2], ids=lambda f: f.name)
def test_rows_pair_kernel_on_strided_views_and_other_tiles(fmt, half, monkeypatch):
    calls = _count_calls(monkeypatch, "_quantize_rows_pairs")
    base = wide_range_input((80, 140), HALVES[half][1], seed=5).to(DEVICE)  # views stay views
    batched = wide_range_input((4, 20, 100), HALVES[half][1], seed=6).to(DEVICE)
    views = {
        "row slice": base[5:69, :128],  # even strides, 4-byte aligned start
        "column slice from 2": base[:, 2:130],
        "every other row": base[::2, 4:68],
        "batch and row slices": batched[1:, 3:17, 2:98],
        "expanded batch": base[:8, :64].expand(3, 8, 64),  # batch stride 0
    }
    for name, x in views.items():
        assert not x.is_contiguous() and x.data_ptr() % 4 == 0, name
        _check_rows(x, fmt, 32, "floor")
    monkeypatch.setitem(tb.TUNING, "quantize_rows_pairs",
                        {"blocks": 8, "row_blocks": 2, "num_warps": 1, "enabled": 1})
    _check_rows(views["row slice"], fmt, 32, "ceil")
    _check_rows(views["batch and row slices"], fmt, 32, "rceil")
    assert len(calls) == (len(views) + 2 if PAIRS_RUN else 0)


def test_other_rows_inputs_take_the_element_kernel(monkeypatch):
    """fp32 inputs, fp16 inputs of formats the fp16 encode does not take, other roundings and
    formats, misaligned starts and odd strides go to quantize_rows_thread_kernel (and stay
    exact); so does everything with the pair kernel disabled."""
    monkeypatch.setattr(tb, "_quantize_rows_pairs", None)  # would fail if called
    fmt = dtypes.float4_e2m1
    base = wide_range_input((33, 66), torch.bfloat16, seed=9).to(DEVICE)
    x = base[:32, :64]
    _check_rows(x.float(), fmt, 32, "floor")
    for other in FP16_REJECTED:
        _check_rows(x.half(), other, 32, "floor")
    _check_rows(x, dtypes.float8_e4m3, 32, "floor")
    _check_rows(x, dtypes.int8, 32, "floor")
    assert base[:, 1:65].data_ptr() % 4 == 2
    _check_rows(base[:, 1:65], fmt, 32, "floor")  # starts 2 bytes into a word
    assert base.as_strided((32, 64), (33, 1)).stride(0) % 2 == 1
    _check_rows(base.as_strided((32, 64), (33, 1)), fmt, 32, "floor")  # odd row stride
    scale, data = tb.quantize(x, fmt, 32, "floor", "stochastic", 1, 3)
    assert torch.equal(data.cpu(), quantize_mx_reference(x.cpu(), fmt, 32, rounding="stochastic",
                                                         seed=3)[1])
    monkeypatch.setitem(tb.TUNING, "quantize_rows_pairs", {**tb.TUNING["quantize_rows_pairs"],
                                                           "enabled": 0})
    _check_rows(x, fmt, 32, "floor")

"""The MMA layout (kernels/layouts/mma_layout.py), mma_linear reading it (with the split-K sum in the
kernel; exactness on any tile is test_mma_linear.py's property test, which draws both layouts)
and the op that dispatches to it (mx_ops/piece_linear.py).

On CPU the kernel runs under Triton's interpreter (conftest sets it); on an H100 the same tests
run the inline-PTX loads and wgmma, plus real sizes. The layout moves bytes and nothing else, so
with pieces mma_linear must give exactly the bits it gives on the standard layout at the same
config (the same sums in the same order), on any operands.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from torchmx import MXTensor, dtypes
from torchmx.kernels.linear import mma_linear
from torchmx.kernels.layouts import mma_layout as pl
from torchmx.mx_ops import piece_linear as pop
from torchmx.mx_ops import weight_matmul

from matmul_operands import (DEVICE, assert_graph_replay_matches_eager,
                             assert_within_fp32_accumulation, integer_operands, reference)

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)
ONE_BYTE = ["float8_e4m3", "float8_e5m2", "int8"]
FP6 = ["float6_e2m3", "float6_e3m2"]
FORMATS = ONE_BYTE + FP6
MmaConfig = mma_linear.MmaConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(CUDA and not HOPPER, reason="the kernel needs sm_90")]


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    """Without a GPU, let the ops dispatch CPU tensors to the kernels too (Triton's
    interpreter)."""
    if not CUDA:
        monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})


def _unit(fmt):
    return pl.unit(dtypes.from_name(fmt))[0]


def pieces(w):
    codes, scales = pl.pack(w._scale_e8m0, w._data, w.elem_dtype)
    return codes, scales, torch.zeros(w.shape[0] // 64, dtype=torch.int32, device=w.device)


def _mma(x, w, bias=None, config=None, p=None, out_dtype=torch.bfloat16):
    return mma_linear.mma_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, bias,
                                 out_dtype, config, p)


# ---------------------------------------------------------------------------------- layout

@pytest.mark.parametrize("fmt", FORMATS)
def test_every_byte_lands_where_the_layout_says(fmt):
    """Against the docstring's index formulas, written out here: the piece of row 64 nb + 16 w
    + 8 a + g at quarter t of unit kb lies at ((((nb K/unit + kb) 4 + w) 2 + a) 8 + g) 4 + t
    pieces; its scale bytes at (((nb K/unit + kb) 4 + w) 8 + g) B + blk) 2 + a."""
    f = dtypes.from_name(fmt)
    unit_codes, unit_bytes = pl.unit(f)
    N, K = 128, 3 * unit_codes
    w = MXTensor.to_mx(torch.randn(N, K), fmt, 32)
    codes, scales = pl.pack(w._scale_e8m0, w._data, f)
    data = w._data.view(torch.uint8)
    piece, blocks, units = unit_bytes // 4, unit_codes // 32, K // unit_codes
    row = torch.arange(N)[:, None]
    byte = torch.arange(data.shape[1])[None, :]
    nb, w_, a, g = row // 64, row % 64 // 16, row % 16 // 8, row % 8
    kb, t, i = byte // unit_bytes, byte % unit_bytes // piece, byte % piece
    at = ((((nb * units + kb) * 4 + w_) * 2 + a) * 8 + g) * 4 + t
    assert torch.equal(codes[at * piece + i], data)
    col = torch.arange(K // 32)[None, :]
    kb, blk = col // blocks, col % blocks
    at = (((nb * units + kb) * 4 + w_) * 8 + g) * blocks + blk
    assert torch.equal(scales[at * 2 + a], w._scale_e8m0)


@settings(max_examples=20, deadline=None)
@given(fmt=st.sampled_from(FORMATS), tiles=st.integers(1, 3), units=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_unpack_inverts_pack(fmt, tiles, units, seed):
    g = torch.Generator().manual_seed(seed)
    f = dtypes.from_name(fmt)
    N, K = 64 * tiles, units * _unit(fmt)
    data = torch.randint(0, 256, (N, K * f.bytes_per_group // f.codes_per_group), generator=g,
                         dtype=torch.uint8)
    scale = torch.randint(0, 256, (N, K // 32), generator=g, dtype=torch.uint8)
    codes, scales = pl.pack(scale, data, f)
    assert codes.shape == (data.numel(),) and scales.shape == (scale.numel(),)
    s, d = pl.unpack(codes, scales, f, N, K)
    assert torch.equal(s, scale) and torch.equal(d, data)


def test_fits_and_bad_parts():
    e4m3, e2m3 = dtypes.float8_e4m3, dtypes.float6_e2m3
    assert pl.fits(e4m3, 32, 64, 64) and pl.fits(e2m3, 32, 64, 128)
    assert not pl.fits(e4m3, 64, 64, 128)  # blocks of 32 only
    assert not pl.fits(e4m3, 32, 96, 64) and not pl.fits(e4m3, 32, 64, 96)
    assert not pl.fits(e2m3, 32, 64, 64)  # fp6 units are 128 codes
    # MXFP4 weights get the fp4 wgmma layout (test_prepack: it takes every one this would)
    assert not pl.fits(dtypes.float4_e2m1, 32, 64, 128)
    fp4 = MXTensor.to_mx(torch.randn(64, 128), "float4_e2m1", 32)
    with pytest.raises(ValueError, match="float8_e4m3, float8_e5m2, float6_e2m3, float6_e3m2, "
                                         "int8 in blocks of 32.*got float4_e2m1"):
        pl.pack(fp4._scale_e8m0, fp4._data, dtypes.float4_e2m1)
    assert not pl.fits(e4m3, 32, 0, 64) and not pl.fits(dtypes.ExMy(3, 3), 32, 64, 64)
    w = MXTensor.to_mx(torch.randn(64, 128), "float8_e4m3", 32)
    with pytest.raises(ValueError, match="blocks of 32.*got float8_e4m3 data torch.uint8 "
                                         "\\(64, 96\\)"):
        pl.pack(w._scale_e8m0, w._data[:, :96], e4m3)
    with pytest.raises(ValueError, match="scale torch.int32"):
        pl.pack(w._scale_e8m0.int(), w._data, e4m3)
    with pytest.raises(ValueError, match="data torch.float32"):
        pl.pack(w._scale_e8m0, w._data.float(), e4m3)
    codes, scales = pl.pack(w._scale_e8m0, w._data, e4m3)
    with pytest.raises(ValueError, match="pack's of a float8_e4m3 weight \\[64, 64\\]"):
        pl.unpack(codes, scales, e4m3, 64, 64)


# ---------------------------------------------------------------------------------- kernel

CONFIG_SHAPES = [(MmaConfig(1, 1, 1, 1), 16, 128, 3), (MmaConfig(1, 2, 3, 2), 16, 256, 6),
                 (MmaConfig(2, 1, 2, 1), 33, 256, 4), (MmaConfig(1, 1, 4, 2), 64, 128, 5)]
# On a GPU every format at every config. Under the interpreter the layout's bytes depend on the
# width alone (one byte or fp6; each format's decode is test_mma_linear's): each config with a
# one-byte and an fp6 format, taking the formats in turn.
PIECE_CASES = ([(f, *c) for c in CONFIG_SHAPES for f in FORMATS] if CUDA else
               [(f, *c) for i, c in enumerate(CONFIG_SHAPES) for f in (ONE_BYTE[i % 3], FP6[i % 2])])


@pytest.mark.parametrize("fmt,config,M,N,units", PIECE_CASES, ids=str)
def test_pieces_give_the_standard_layouts_bits(fmt, config, M, N, units):
    """Random operands (sums not exact): the same bits as the standard layout at the same
    config, the split-K sum (here in the kernel, there in reduce_splits_kernel) included; the
    counters are left at zero."""
    torch.manual_seed(M + units)
    K = units * _unit(fmt)
    w = MXTensor.to_mx(torch.randn(N, K, device=DEVICE), fmt, 32)
    x = torch.randn(M, K, dtype=torch.bfloat16, device=DEVICE)
    bias = torch.randn(N, dtype=torch.bfloat16, device=DEVICE)
    p = pieces(w)
    out = _mma(x, w, bias, config, p)
    assert not p[2].any(), "the split-K counters are left at zero"
    assert torch.equal(out, _mma(x, w, bias, config))
    assert_within_fp32_accumulation(out, x, w, bias)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")  # NaN, Inf in numpy
@pytest.mark.parametrize("fmt,poison", [("float8_e4m3", "nan code"), ("float8_e5m2", "inf code"),
                                        ("float8_e4m3", "tiny scale"), ("int8", "nan scale"),
                                        ("float6_e3m2", "huge scale")])
def test_poisoned_pieces_recompute_from_the_standard_layout(fmt, poison):
    """A piece off the fast path (NaN / Inf code, a scale outside FAST_SCALES): its program
    recomputes its tile exactly from the standard layout, then joins the in-kernel sum."""
    x, w = integer_operands(fmt, 16, 256, 512)
    scale, data = w._scale_e8m0.clone(), w._data.clone()
    f = dtypes.from_name(fmt)
    if poison == "nan code":
        data[70, 100] = 0x7F
    elif poison == "inf code":
        data[70, 100] = 0x7C
        x[3, 100] = 0
    else:  # row 70 keeps only block 3, so its sums stay exact
        data[70, :96 * f.bytes_per_group // f.codes_per_group] = 0
        data[70, 128 * f.bytes_per_group // f.codes_per_group:] = 0
        scale[70, 3] = {"tiny scale": 1, "huge scale": 150, "nan scale": 255}[poison]
    w = w._replace(scale, data)
    out = _mma(x, w, None, MmaConfig(1, 2, 2), pieces(w), torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


def test_bad_pieces_name_the_problem():
    x, w = integer_operands("float8_e4m3", 4, 128, 256)
    codes, scales, counters = pieces(w)
    for bad, match in [((codes[:-1], scales, counters), "codes must be .* 32768 elements"),
                       ((codes, scales.view(2, -1), counters), "scales must be a contiguous 1-d"),
                       ((codes, scales, counters.long()), "counters must be .* torch.int32"),
                       ((codes, scales, counters[:1]), "counters must be .* 2 elements"),
                       ((codes, scales), "counters\\), got a tuple of 2$"),
                       (codes, "must be \\(codes, scales, counters\\), got Tensor$")]:
        with pytest.raises(ValueError, match=match):
            _mma(x, w, None, None, bad)
    offset = torch.empty(codes.numel() + 1, dtype=torch.uint8, device=DEVICE)[1:]
    with pytest.raises(ValueError, match="codes must be 16-byte aligned"):
        _mma(x, w, None, None, (offset.copy_(codes), scales, counters))
    x, w = integer_operands("float8_e4m3", 4, 128, 256, block_size=64)
    with pytest.raises(ValueError, match="blocks of 32, .*got float8_e4m3 \\[128, 256\\] in "
                                         "blocks of 64"):
        _mma(x, w, None, None, (codes, scales, counters))


# ---------------------------------------------------------------------------------- the op

def _op(x, w, p, bias=None, out_dtype=None):
    return torch.ops.torchmx.mx_piece_linear(x, *p, w._scale_e8m0, w._data, w.elem_dtype.name,
                                             w.shape[1], bias, out_dtype or x.dtype)


@pytest.mark.parametrize("fmt,shape", [(f, s) for f in ("float8_e4m3", "float6_e2m3")
                                       for s in [(2, 256), (3, 7, 256), (33, 256), (65, 256),
                                                 (0, 256)]]
                         + [("float6_e2m3", (1, 256)), ("int8", (5, 256))], ids=str)
def test_op_equals_the_standard_path(fmt, shape):
    """Whatever it dispatches to, the op's result is F.linear on the MXTensor bit for bit
    (exact sums), with batch dims."""
    N = 128
    _, w = integer_operands(fmt, 1, N, 256)
    x = torch.randint(-4, 5, shape).to(torch.bfloat16).to(DEVICE)
    bias = torch.randint(-8, 9, (N,)).to(torch.bfloat16).to(DEVICE)
    out = _op(x, w, pieces(w), bias)
    assert out.shape == (*shape[:-1], N) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x, w, bias), rtol=0, atol=0)


def test_op_fp16_fp32_and_strided_inputs_take_the_standard_path_exactly():
    _, w = integer_operands("float8_e5m2", 1, 64, 128)
    big = torch.randint(-4, 5, (5, 3, 256)).to(torch.bfloat16).to(DEVICE)
    x = big[:, 1, ::2]  # strided rows: the op copies them
    bias = torch.randint(-8, 9, (128,)).to(torch.bfloat16).to(DEVICE)[::2]
    p = pieces(w)
    torch.testing.assert_close(_op(x, w, p, bias), reference(x, w, bias), rtol=0, atol=0)
    for dtype in (torch.float16, torch.float32):
        xd = x.to(dtype)
        assert not pop.uses_piece_kernel(xd, w._scale_e8m0, w._data, w.elem_dtype)
        out = _op(xd, w, p, bias.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out, reference(xd, w, bias.to(dtype)), rtol=0, atol=0)
    out = _op(x, w, p, bias, torch.float32)  # an fp32 output from bf16 rows: the kernel
    torch.testing.assert_close(out, x.float() @ w.dequantize(torch.float32).t() + bias.float(),
                               rtol=0, atol=0)


def test_op_dispatch_by_rows_format_and_dtype():
    on_kernel_device = not CUDA or HOPPER
    for fmt, rows in [("float8_e4m3", range(2, 65)), ("int8", range(2, 65)),
                      ("float6_e3m2", range(1, 33)), ("float4_e2m1", range(0))]:
        _, w = integer_operands(fmt, 1, 64, 256)
        parts = (w._scale_e8m0, w._data, w.elem_dtype)
        for M in (1, 2, 32, 33, 64, 65):
            x = torch.zeros(M, 256, dtype=torch.bfloat16, device=DEVICE)
            expected = on_kernel_device and M in rows
            assert pop.uses_piece_kernel(x, *parts) == expected, (fmt, M)
            assert pop.uses_piece_kernel(x.view(1, M, 256), *parts) == expected


def test_weights_past_32_bit_offsets_take_the_standard_path(monkeypatch):
    """The kernel indexes in 32 bits: a weight of 2 GiB or more (faked here) is not given to
    it, and the op still gives the product."""
    from torchmx.kernels.linear import dispatch as km
    x, w = integer_operands("float8_e4m3", 4, 64, 128)
    assert pop.uses_piece_kernel(x, w._scale_e8m0, w._data, w.elem_dtype) == (not CUDA or HOPPER)
    monkeypatch.setattr(km, "_int32_offsets", lambda *args: False)
    assert not pop.uses_piece_kernel(x, w._scale_e8m0, w._data, w.elem_dtype)
    torch.testing.assert_close(_op(x, w, pieces(w)), reference(x, w), rtol=0, atol=0)


def test_op_checks_its_parts():
    x, w = integer_operands("float8_e4m3", 2, 64, 128)
    codes, scales, counters = pieces(w)
    with pytest.raises(ValueError, match="mx_piece_linear: the pieces' codes"):
        _op(x, w, (codes[:-1], scales, counters))
    with pytest.raises(ValueError, match="mx_piece_linear: the pieces' counters"):
        _op(x, w, (codes, scales, counters.long()))
    with pytest.raises(ValueError, match="mx_piece_linear: input .* in_features=128"):
        _op(x[:, :96], w, (codes, scales, counters))
    with pytest.raises(ValueError, match="bias must have shape"):
        _op(x, w, (codes, scales, counters), torch.zeros(3, dtype=x.dtype, device=DEVICE))
    w96 = MXTensor.to_mx(torch.zeros(96, 128, device=DEVICE), "float8_e4m3", 32)
    with pytest.raises(ValueError, match="out_features a multiple of 64"):
        torch.ops.torchmx.mx_piece_linear(x, codes, scales, counters, w96._scale_e8m0,
                                          w96._data, "float8_e4m3", 128, None, x.dtype)


def test_op_compiles():
    _, w = integer_operands("float8_e4m3", 1, 64, 128)
    x = torch.randint(-4, 5, (2, 3, 128)).to(torch.bfloat16).to(DEVICE)
    p = pieces(w)
    compiled = torch.compile(lambda x: _op(x, w, p), fullgraph=True,
                             backend="aot_eager" if not CUDA else "inductor")
    torch.testing.assert_close(compiled(x), reference(x, w), rtol=0, atol=0)


# ---------------------------------------------------------------------------------- GPU only

gpu = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU")


@gpu
@pytest.mark.parametrize("fmt,M,N,K", [(fmt, *shape) for fmt in FORMATS
                                       for shape in [(16, 8192, 8192), (2, 4096, 14336),
                                                     (64, 14336, 4096), (1, 1024, 4096)]
                                       if shape[0] > 1 or fmt in FP6])
def test_gpu_real_sizes(fmt, M, N, K):
    torch.manual_seed(N + M)
    w = MXTensor.to_mx(torch.randn(N, K, device="cuda"), fmt, 32)
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(N, dtype=torch.bfloat16, device="cuda")
    p = pieces(w)
    out = _mma(x, w, bias, None, p)
    assert torch.equal(out, _mma(x, w, bias))  # the standard layout's bits
    assert_within_fp32_accumulation(out, x, w, bias)
    for _ in range(3):  # the in-kernel sum adds the partials in a fixed order
        assert torch.equal(_mma(x, w, bias, None, p), out)
    assert not p[2].any()


@gpu
def test_gpu_cuda_graph_capture():
    w = MXTensor.to_mx(torch.randn(512, 1024, device="cuda"), "float8_e4m3", 32)
    x = torch.randn(16, 1024, dtype=torch.bfloat16, device="cuda")
    p = pieces(w)
    assert_graph_replay_matches_eager(lambda: _op(x, w, p))

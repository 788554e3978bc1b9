"""The TMA stream layout (kernels/layouts/tma_stream_layout.py), the Gluon kernel that reads it
(kernels/linear/stream_matmul.py) and the op torch.ops.torchmx.mx_stream_linear.

Gluon kernels do not run under Triton's interpreter. On the CPU: the layout bit for bit, the
configs, the kernel compiled for sm_90 (ptxas keeps its wgmmas asynchronous and spills
nothing), and the op's usual path. On an H100 the kernel itself, bit for bit: exact checks use
operands whose every fp32 sum is exact, or outputs that are one product alone, so any
accumulation order must give the reference's bits.
"""

import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchmx import MXTensor, dtypes
from torchmx.kernels.layouts import tma_stream_layout as sl
from torchmx.kernels.linear import stream_matmul
from torchmx.kernels.linear.mma_linear import FAST_SCALES
from torchmx.mx_ops import stream_linear as op_module
from torchmx.numerics.packing import pack_codes, unpack_codes

from matmul_operands import (DEVICE, assert_graph_replay_matches_eager,
                             assert_within_fp32_accumulation, integer_operands,
                             one_product_per_row, reference)

FORMATS = ["float8_e4m3", "float8_e5m2", "int8", "float4_e2m1", "float6_e2m3", "float6_e3m2"]
FP8 = FORMATS[:2]
OTHER = dtypes.ExMy(3, 3)  # a custom minifloat: no TMA stream layout
ON_GPU = DEVICE == "cuda" and stream_matmul.usable_on(torch.device("cuda"))
pytestmark = pytest.mark.gpu  # the kernels run on the GPU where there is one
gpu_only = pytest.mark.skipif(not ON_GPU, reason="the Gluon kernel runs on sm_90 GPUs only")
needs_gluon = pytest.mark.skipif(not stream_matmul.available(), reason="this Triton has no Gluon")


@pytest.fixture(autouse=True)
def any_tile_count(monkeypatch):
    """The op runs the kernel for weights of any tile count here (small ones, fast to test);
    test_wave_policy checks the real policy."""
    monkeypatch.setattr(stream_matmul, "MIN_WAVE_FILL", {1: 0.0, 2: 0.0, 4: 0.0})
    monkeypatch.setattr(stream_matmul, "ONE_ROW_MIN_FILL", 0.0)


def _random_parts(fmt, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (N, K * fmt.bytes_per_group // fmt.codes_per_group),
                         generator=g, dtype=torch.uint8)
    scale = torch.randint(0, 256, (N, K // 32), generator=g, dtype=torch.uint8)
    return scale, data


# --- the layout ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("N,K", [(64, 256), (128, 384), (192, 1024)])
def test_pack_unpack_round_trip(fmt, N, K):
    fmt = dtypes.from_name(fmt)
    scale, data = _random_parts(fmt, N, K)
    codes, scales = sl.pack(scale, data, fmt)
    assert codes.shape == (data.numel(),) and scales.shape == (scale.numel(),)
    back_scale, back_data = sl.unpack(codes, scales, fmt, N, K)
    assert torch.equal(back_data, data)
    # random bytes: no block is all zeros, so every block the kernel decodes keeps its scale
    # byte and the others come back as 255
    kept = sl.multiplier_exponents(scale, data, fmt) != sl.RECOMPUTE
    assert 0 < kept.sum() < kept.numel() or fmt == dtypes.int8
    assert torch.equal(back_scale, torch.where(kept, scale, 255))


# A row of blocks of 32 codes, each (scale byte, code of its first element, code of the others),
# and what multiplier_exponents makes of them, for each format (its exponent offset: e4m3 120,
# e5m2 112, int8 -6, e2m1 and e2m3 126, e3m2 124).
_BLOCKS = [(127, 1, 1), (3, 1, 0), (2, 1, 0), (134, 1, 1), (135, 1, 1), (142, 1, 1), (143, 1, 1),
           (0, 0, 0), (2, 0, 0), (200, 0, 0), (254, 0, 0), (255, 0, 0), (255, 1, 1),
           (127, "nan", 1), (127, "-0", 0), (0, "-0", 0), (6, "max", 0), (7, "max", 0)]
_EXPONENTS = {
    "float8_e4m3": [247, 123, 255, 254, 255, 255, 255, 120, 122, 254, 254, 255, 255, 255, 247,
                    120, 126, 127],
    "float8_e5m2": [239, 255, 255, 246, 247, 254, 255, 112, 114, 254, 254, 255, 255, 255, 239,
                    112, 255, 255],
    "int8": [121, 255, 255, 128, 129, 136, 137, 1, 1, 194, 248, 255, 255, 121, 121, 255, 255, 1],
    "float4_e2m1": [253, 129, 128, 255, 255, 255, 255, 126, 128, 254, 254, 255, 255, 253, 253,
                    126, 132, 133],
    "float6_e2m3": [253, 129, 128, 255, 255, 255, 255, 126, 128, 254, 254, 255, 255, 253, 253,
                    126, 132, 133],
    "float6_e3m2": [251, 127, 126, 255, 255, 255, 255, 124, 126, 254, 254, 255, 255, 251, 251,
                    124, 130, 131],
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_multiplier_exponents(fmt):
    """Golden bytes: s + the format's offset inside FAST_SCALES; 255 (recompute) for a scale
    outside it with a nonzero code, a NaN scale, a NaN / Inf code (e4m3 0x7F, e5m2 0x7C); an
    all-zero block (+0 or -0; MXINT8's 0x80 is -128, not zero) at any scale but NaN keeps the
    fast path, its exponent clamped to 1..254."""
    fmt = dtypes.from_name(fmt)
    sign = 1 << (fmt.bits - 1)
    special = {"nan": (0x7F if fmt == dtypes.float8_e4m3 else 0x7C) if fmt in
               (dtypes.float8_e4m3, dtypes.float8_e5m2) else 1, "-0": sign, "max": fmt.max_code}
    codes = torch.tensor([[special.get(first, first)] + [rest] * 31 for _, first, rest in _BLOCKS])
    data = pack_codes(codes.reshape(1, -1), fmt)
    scale = torch.tensor([[s for s, _, _ in _BLOCKS]], dtype=torch.uint8)
    assert sl.multiplier_exponents(scale, data, fmt).tolist() == [_EXPONENTS[fmt.name]]


def test_multiplier_exponents_refuse_what_is_not_a_weight_of_its_formats():
    fmt = dtypes.float8_e4m3
    scale, data = _random_parts(fmt, 64, 256)
    for bad in [(scale[:, :-1], data, fmt), (scale, data[:, :-32], fmt),
                (scale.float(), data, fmt), (scale, data, OTHER)]:
        with pytest.raises(ValueError, match="tma_stream_layout.multiplier_exponents"):
            sl.multiplier_exponents(*bad)


def _fp4_register(words, r):
    """What the kernel's fp4 decode (tma_stream_layout's docstring) makes of words (int64, 32 bits)
    for register r, before scaling: bf16 pair bit patterns."""
    rotl = lambda w, k: ((w << k) | (w >> (32 - k))) & 0xFFFFFFFF  # noqa: E731
    spread = [words, rotl(words, 10), rotl(words, 13), ((words & 0x001B001B) * 0x1084)][r]
    return spread & 0x81C081C0


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_lands_where_the_kernel_reads_it(fmt):
    """Code (n, k) sits in word S t + s of its row's step, with (t, s) from the module
    docstring's formula, computed here element by element: one-byte codes as byte 2 h + b,
    fp4 codes where the kernel's decode of register 2 o + h finds them (sign at bit 15, the
    magnitude at bits 8..6, + 16 for b = 1), fp6 codes as code 2 h + b of lane t's group s
    (its bytes 0..15 in plane A, 16..23 in plane B). Runs are step-major: row n's step lies in
    run step * N / 64 + n // 64. Block (n, b)'s multiplier exponent is byte b % 4 of the row's
    step b // 4."""
    fmt = dtypes.from_name(fmt)
    N, K = 128, 512
    scale, data = _random_parts(fmt, N, K, seed=1)
    codes, scales = sl.pack(scale, data, fmt)
    fp4 = fmt == dtypes.float4_e2m1
    logical = unpack_codes(data, fmt, K).to(torch.int64)  # [N, K]
    n, k = torch.meshgrid(torch.arange(N), torch.arange(K), indexing="ij")
    step, c = k // 128, k % 128
    b, t, h = c % 2, (c // 2) % 4, (c // 8) % 2
    row_step = (step * (N // 64) + n // 64) * 64 + n % 64  # a row's step: its run's row
    if fmt in sl.FP6:  # code 16 s + 8 h + 2 t + b: lane t's group s, its code 2 h + b
        s = c // 16
        plane_a, plane_b = codes.split([codes.numel() * 2 // 3, codes.numel() // 3])
        assert all(torch.equal(p, q.reshape(-1)) for p, q in zip((plane_a, plane_b),
                                                                 sl.fp6_planes(codes)))
        lanes = torch.cat([plane_a.reshape(-1, 4, 16), plane_b.reshape(-1, 4, 8)], dim=-1)
        found = unpack_codes(lanes, fmt, 32).to(torch.int64)[row_step, t, 4 * s + 2 * h + b]
        assert torch.equal(found, logical)
    else:
        if fp4:  # code 32 s + 16 o + 8 h + 2 t + b
            o, s = (c // 16) % 2, c // 32
            words_a_row = 16
        else:  # code 16 s + 8 h + 2 t + b
            s = c // 16
            words_a_row = 32
        word = row_step * words_a_row + (words_a_row // 4) * t + s
        as_words = (codes.view(torch.int32).to(torch.int64) & 0xFFFFFFFF)[word]
        if fp4:
            found = torch.zeros_like(logical)
            for r in range(4):
                half = (_fp4_register(as_words, r) >> (16 * b)) & 0xFFFF
                code = (half >> 15) << 3 | (half >> 6) & 7
                found = torch.where(2 * o + h == r, code, found)
            assert torch.equal(found, logical & 0xF)
        else:
            assert torch.equal((as_words >> (8 * (2 * h + b))) & 0xFF, logical & 0xFF)
    nb, blk = torch.meshgrid(torch.arange(N), torch.arange(K // 32), indexing="ij")
    at = ((blk // 4 * (N // 64) + nb // 64) * 64 + nb % 64) * 4 + blk % 4
    assert torch.equal(scales[at], sl.multiplier_exponents(scale, data, fmt))


def test_unpack_takes_codes_at_any_storage_offset():
    fmt = dtypes.float4_e2m1
    scale, data = _random_parts(fmt, 64, 256, seed=2)
    codes, scales = sl.pack(scale, data, fmt)
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), codes])[1:]
    assert shifted.storage_offset() == 1
    assert torch.equal(sl.unpack(shifted, scales, fmt, 64, 256)[1], data)


def test_fp4_bits_cover_each_word_once():
    bits = sorted(bit for pair in sl.FP4_BITS for code in pair for bit in code)
    assert bits == list(range(32))


def test_golden_order_of_a_row():
    """The first step of row 0 for codes equal to their column: lane t = 0's words first."""
    N, K = 64, 256
    cols = torch.arange(K).repeat(N, 1)
    e4m3 = sl.pack(torch.zeros(N, K // 32, dtype=torch.uint8),
                   pack_codes(cols % 256, dtypes.float8_e4m3), dtypes.float8_e4m3)[0]
    assert e4m3[:40].tolist() == [0, 1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57,
                                  64, 65, 72, 73, 80, 81, 88, 89, 96, 97, 104, 105, 112, 113,
                                  120, 121, 2, 3, 10, 11, 18, 19, 26, 27]
    fp4 = sl.pack(torch.zeros(N, K // 32, dtype=torch.uint8),
                  pack_codes(cols % 16, dtypes.float4_e2m1), dtypes.float4_e2m1)[0]
    # word (t=0, s=0): codes (r, b) = 16 o + 8 h + b (mod 16), r = 2 o + h: 0, 1 | 8, 9 |
    # 0, 1 | 8, 9. Set bits: m of (0, 1) at 22; sign of (1, 0) at 5, sign and m of (1, 1) at
    # 21, 12; m of (2, 1) at 9; sign of (3, 0) at 3, sign and m of (3, 1) at 19, 20
    assert [hex(v) for v in fp4[:8].tolist()] == ["0x28", "0x12", "0x78", "0x0",
                                                   "0x28", "0x12", "0x78", "0x0"]
    e2m3 = sl.pack(torch.zeros(N, K // 32, dtype=torch.uint8),
                   pack_codes(cols % 64, dtypes.float6_e2m3), dtypes.float6_e2m3)[0]
    # lane 0's group s holds codes 16 s + (0, 1, 8, 9) (mod 64), little-endian: group 0 is
    # 0 | 1 << 6 | 8 << 12 | 9 << 18 = 0x248040, group 1 0x658450. Plane B (from 2/3 of the
    # bytes on) starts with lane 0's bytes 16..23: group 5's last two (as group 1's), then
    # groups 6 (codes 32, 33, 40, 41: 0xa68860) and 7 (48, 49, 56, 57: 0xe78c70)
    assert [hex(v) for v in e2m3[:6].tolist()] == ["0x40", "0x80", "0x24", "0x50", "0x84", "0x65"]
    assert [hex(v) for v in e2m3[e2m3.numel() * 2 // 3:][:8].tolist()] == [
        "0x84", "0x65", "0x60", "0x88", "0xa6", "0x70", "0x8c", "0xe7"]


@pytest.mark.parametrize("fmt,block,N,K,fits", [
    ("float8_e4m3", 32, 64, 256, True), ("float4_e2m1", 32, 8192, 8192, True),
    ("int8", 32, 64, 384, True), ("float8_e5m2", 32, 64, 128, False),  # one step
    ("float8_e4m3", 64, 64, 256, False), ("float6_e2m3", 32, 64, 256, True),
    ("float6_e3m2", 32, 128, 384, True), ("e3m3", 32, 64, 256, False),
    ("float8_e4m3", 32, 96, 256, False), ("float8_e4m3", 32, 64, 320, False),
    ("float8_e4m3", 32, 0, 256, False), ("float4_e2m1", 32, 2 ** 20, 2 ** 18, False)])
def test_fits(fmt, block, N, K, fits):
    assert sl.fits(dtypes.resolve(fmt), block, N, K) is fits


def test_pack_and_unpack_refuse_what_does_not_fit():
    fmt = dtypes.float8_e4m3
    scale, data = _random_parts(fmt, 64, 128)
    with pytest.raises(ValueError, match="tma_stream_layout.pack: .* at least 256"):
        sl.pack(scale, data, fmt)
    scale, data = _random_parts(fmt, 64, 256)
    with pytest.raises(ValueError, match="tma_stream_layout.pack"):
        sl.pack(scale[:, :4], data, fmt)
    with pytest.raises(ValueError, match="tma_stream_layout.pack"):
        sl.pack(scale, data.float(), fmt)
    codes, scales = sl.pack(scale, data, fmt)
    with pytest.raises(ValueError, match="tma_stream_layout.unpack"):
        sl.unpack(codes[:-1], scales, fmt, 64, 256)
    with pytest.raises(ValueError, match="tma_stream_layout.fp6_planes: .* got shape \\(6143,\\)"):
        sl.fp6_planes(torch.zeros(6143, dtype=torch.uint8))


# --- configs --------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,M,K,expected", [
    ("float4_e2m1", 16, 8192, (6, 2)), ("float4_e2m1", 1, 8192, (6, 2)),
    ("float4_e2m1", 64, 8192, (4, 2)), ("float4_e2m1", 33, 384, (8, 1)),
    ("float4_e2m1", 16, 256, (8, 1)), ("float4_e2m1", 16, 512, (6, 2)),
    ("float8_e4m3", 16, 8192, (4, 2)), ("float8_e4m3", 64, 8192, (4, 2)),
    ("int8", 33, 4096, (4, 2)), ("float8_e5m2", 1, 256, (8, 1)),
    ("float8_e5m2", 64, 384, (8, 1)), ("float6_e2m3", 16, 8192, (6, 2)),
    ("float6_e3m2", 64, 8192, (4, 2)), ("float6_e2m3", 1, 384, (8, 1)),
    ("float6_e2m3", 64, 384, (8, 1))])
def test_default_config(fmt, M, K, expected):
    cfg = stream_matmul.default_config(dtypes.from_name(fmt), M, K)
    assert (cfg.stages, cfg.sub, cfg.split, cfg.pdl, cfg.prefetch) == expected + (1, True, 4)
    assert stream_matmul.default_config(dtypes.from_name(fmt), M, K, 3).split == 3


def test_default_config_follows_use_pdl(monkeypatch):
    monkeypatch.setattr(stream_matmul, "USE_PDL", False)
    assert not stream_matmul.default_config(dtypes.float8_e4m3, 16, 8192).pdl


def test_config_errors():
    with pytest.raises(ValueError, match="stages must be an even number"):
        stream_matmul.StreamConfig(3, 1)
    with pytest.raises(ValueError, match="sub 1 or 2"):
        stream_matmul.StreamConfig(4, 4)
    for split in (0, stream_matmul.MAX_SPLIT + 1):
        with pytest.raises(ValueError, match=f"split 1..{stream_matmul.MAX_SPLIT}"):
            stream_matmul.StreamConfig(4, 1, split)
    for prefetch in (-1, stream_matmul.MAX_PREFETCH + 1):
        with pytest.raises(ValueError, match=f"prefetch 0..{stream_matmul.MAX_PREFETCH}"):
            stream_matmul.StreamConfig(4, 1, prefetch=prefetch)
    with pytest.raises(ValueError, match="1..64 rows"):
        stream_matmul.default_config(dtypes.float8_e4m3, 65, 1024)
    with pytest.raises(ValueError, match="got e3m3"):
        stream_matmul.default_config(OTHER, 16, 1024)


@needs_gluon
def test_kernel_arguments_refuse_configs_that_do_not_fit():
    """A split that leaves a part fewer than two ring slots, or a ring too big for shared
    memory, is a ValueError naming the config (before any launch)."""
    fmt, N, K = dtypes.float4_e2m1, 64, 1024  # 8 steps: 4 slots of 2 sub-steps
    x, out = torch.zeros(16, K, dtype=torch.bfloat16), torch.zeros(16, N, dtype=torch.bfloat16)
    codes = torch.zeros(N * K // sl.STEP_CODES * sl.step_bytes(fmt), dtype=torch.uint8)
    scales, w_scale = torch.zeros(N * K // 32, dtype=torch.uint8), torch.zeros(N, K // 32,
                                                                              dtype=torch.uint8)
    w_data = torch.zeros(N, K // 2, dtype=torch.uint8)
    parts = (x, codes, scales, w_scale, w_data, fmt, None, out)
    stream_matmul.kernel_arguments(*parts, stream_matmul.StreamConfig(6, 2, 2))
    with pytest.raises(ValueError, match="two slots' worth a part"):
        stream_matmul.kernel_arguments(*parts, stream_matmul.StreamConfig(6, 2, 3))
    with pytest.raises(ValueError, match="more shared memory"):
        stream_matmul.kernel_arguments(*parts, stream_matmul.StreamConfig(16, 2))


@pytest.mark.parametrize("tiles,K,sms,split", [
    (128, 8192, 132, 1), (224, 4096, 132, 1), (66, 8192, 132, 2), (64, 14336, 132, 2),
    (64, 4096, 132, 2), (16, 4096, 132, 8), (32, 4096, 132, 4), (48, 4096, 132, 2),
    (1, 8192, 132, 8), (16, 1024, 132, 2), (64, 512, 132, 1), (16, 256, 132, 1),
    (0, 8192, 132, 1), (4, 1024, 8, 2), (1, 4096, 8, 8)])
def test_split_k(tiles, K, sms, split, monkeypatch):
    """As many CTAs a tile as one wave holds, at most MAX_SPLIT, each with >= 4 steps of K."""
    monkeypatch.setattr(stream_matmul, "sm_count", lambda device: sms)
    assert stream_matmul.split_k(64 * tiles, K, torch.device("cpu")) == split


@pytest.mark.parametrize("fmt,rows,tiles,K,sms,fills", [
    ("float4_e2m1", None, 128, 8192, 132, True), ("float8_e4m3", 16, 128, 8192, 132, True),
    ("float4_e2m1", 1, 128, 8192, 132, True), ("int8", None, 132, 8192, 132, True),
    ("float4_e2m1", 16, 224, 4096, 132, True), ("float4_e2m1", None, 224, 4096, 132, True),
    ("float4_e2m1", 1, 224, 4096, 132, False), ("float8_e5m2", None, 224, 4096, 132, False),
    ("float4_e2m1", None, 256, 8192, 132, True), ("float4_e2m1", None, 0, 8192, 132, False),
    ("float4_e2m1", None, 13, 8192, 8, True), ("float4_e2m1", None, 12, 8192, 8, False),
    ("float8_e4m3", None, 15, 8192, 8, True), ("float8_e4m3", None, 14, 8192, 8, False),
    # split-K: 64 tiles x 2 and 16 tiles x 8 fill 128 of 132 SMs, but not for one row
    ("float4_e2m1", 16, 64, 14336, 132, True), ("float8_e4m3", 16, 64, 4096, 132, True),
    ("float4_e2m1", None, 16, 4096, 132, True), ("int8", 2, 16, 4096, 132, True),
    ("float4_e2m1", 1, 64, 14336, 132, False), ("float4_e2m1", 1, 16, 4096, 132, False),
    # too few steps to split: 64 tiles alone
    ("float4_e2m1", 16, 64, 512, 132, False), ("float8_e4m3", 2, 16, 256, 132, False),
    # 48 tiles x 2: 73%
    ("float4_e2m1", 16, 48, 4096, 132, False),
    # MXFP6: from 80%, one row as several
    ("float6_e2m3", 16, 224, 4096, 132, True), ("float6_e3m2", 1, 224, 4096, 132, True),
    ("float6_e2m3", 1, 64, 14336, 132, True), ("float6_e3m2", None, 48, 4096, 132, False)])
def test_wave_policy(fmt, rows, tiles, K, sms, fills, monkeypatch):
    """The kernel is chosen where its CTAs (tiles x split_k) fill >= 80% (MXFP4, MXFP6) or
    90% (one-byte codes) of their waves; one MXFP4 row only unsplit and from 90%."""
    monkeypatch.undo()
    monkeypatch.setattr(stream_matmul, "sm_count", lambda device: sms)
    assert stream_matmul.fills_waves(dtypes.from_name(fmt), 64 * tiles, K, torch.device("cpu"),
                                     rows) is fills


def test_wave_policy_refuses_other_formats():
    with pytest.raises(ValueError, match="fills_waves: .* got e3m3"):
        stream_matmul.fills_waves(OTHER, 8192, 8192, torch.device("cpu"))


def test_wave_fill(monkeypatch):
    monkeypatch.setattr(stream_matmul, "sm_count", lambda device: 132)
    fills = [stream_matmul.wave_fill(64 * t, K, torch.device("cpu"))
             for t, K in ((0, 8192), (66, 8192), (128, 8192), (224, 4096), (64, 4096),
                          (64, 512), (16, 4096))]
    assert fills == [0.0, 1.0, 128 / 132, 224 / 264, 128 / 132, 64 / 132, 128 / 132]


# --- the kernel compiled for sm_90 (no GPU needed) ------------------------------------------

# K split as on the CPU's 8 "SMs" (_common.sm_count): 256 rows 2 ways, 64 rows 8 ways, 512 rows
# and K = 384 not at all (test_the_compiled_cases_cover_each_split)
_COMPILED = [("float4_e2m1", 16, 256, 1024, True, "bfloat16"),
             ("float4_e2m1", 64, 256, 1024, False, "float32"),
             ("float4_e2m1", 16, 512, 1024, True, "bfloat16"),
             ("float4_e2m1", 8, 64, 4096, False, "bfloat16"),
             ("float8_e4m3", 1, 256, 1024, True, "bfloat16"),
             ("float8_e4m3", 64, 256, 1024, True, "bfloat16"),
             ("float8_e4m3", 16, 512, 1024, False, "bfloat16"),
             ("float8_e4m3", 32, 64, 4096, True, "float32"),
             ("float8_e5m2", 32, 256, 384, False, "bfloat16"),
             ("int8", 64, 256, 1024, True, "float32"),
             ("float6_e2m3", 16, 256, 1024, True, "bfloat16"),
             ("float6_e3m2", 64, 64, 4096, False, "float32"),
             ("float6_e3m2", 1, 512, 1024, True, "bfloat16")]


def test_the_compiled_cases_cover_each_split():
    splits = {(fmt, N, K): stream_matmul.split_k(N, K, torch.device("cpu"))
              for fmt, _, N, K, _, _ in _COMPILED}
    assert {s for (fmt, _, _), s in splits.items() if fmt == "float4_e2m1"} == {1, 2, 8}
    assert {s for (fmt, _, _), s in splits.items() if fmt == "float8_e4m3"} == {1, 2, 8}
    assert {s for (fmt, _, _), s in splits.items() if fmt.startswith("float6")} == {1, 2, 8}


_PDL_FORMATS = [("float8_e4m3", 1), ("float4_e2m1", 1), ("float6_e3m2", 2)]
_PDL_CASES = [("stream-pdl", fmt, 16, 512, 1024, pdl) for fmt, _ in _PDL_FORMATS for pdl in (True, False)]


@pytest.fixture(scope="module")
def ptxas_reports():
    """Every compiled case of this module (ptxas reports, PDL launch-control lines), in one
    child process: its start (torch, Triton, torchmx) costs seconds."""
    from gluon_compile import compile_reports
    cases = [("stream", *case) for case in _COMPILED] + _PDL_CASES
    reports = dict(zip(cases, compile_reports(cases)))
    return {**{case: reports[("stream", *case)] for case in _COMPILED},
            **{case: reports[case] for case in _PDL_CASES}}


@needs_gluon
@pytest.mark.parametrize("case", _COMPILED, ids=str)
def test_compiles_for_sm90_with_async_wgmmas_and_no_spills(case, ptxas_reports):
    """ptxas serializes wgmmas (and says so in a warning) when an accumulator is zero-initialised
    on a zero-trip path or registers run short; either would cost the kernel its overlap."""
    report = ptxas_reports[case]
    assert "stream_linear_kernel" in report, report
    assert "warning" not in report.lower(), report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report


@needs_gluon
def test_launch_options_follow_the_config():
    """PDL is a launch option (Triton's launch_pdl) and a constexpr; no prefetch without it."""
    fmt, N, K = dtypes.float8_e4m3, 64, 1024
    x, out = torch.zeros(16, K, dtype=torch.bfloat16), torch.zeros(16, N, dtype=torch.bfloat16)
    parts = (x, torch.zeros(N * K, dtype=torch.uint8), torch.zeros(N * K // 32, dtype=torch.uint8),
             torch.zeros(N, K // 32, dtype=torch.uint8), torch.zeros(N, K, dtype=torch.uint8),
             fmt, None, out)
    for cfg, expected in [(stream_matmul.StreamConfig(6, 1), (True, True, 4)),
                          (stream_matmul.StreamConfig(6, 1, prefetch=0), (True, True, 0)),
                          (stream_matmul.StreamConfig(6, 1, pdl=False), (False, False, 0))]:
        constants = stream_matmul.kernel_arguments(*parts, cfg)[2]
        assert (constants["launch_pdl"], constants["PDL"], constants["PREFETCH"]) == expected


@needs_gluon
@pytest.mark.parametrize("fmt,planes", _PDL_FORMATS)
def test_pdl_lets_the_next_call_start_and_prefetches_only_before_its_wait(fmt, planes, ptxas_reports):
    """The compiled kernel's launch control (PTX, sm_90): with PDL one launch_dependents, the
    loader's L2 prefetches of the first sub-steps (the default 4) of each plane of W and of the
    scales right before its wait, and the epilogue's wait; without PDL none of them."""
    with_pdl, without = (ptxas_reports[("stream-pdl", fmt, 16, 512, 1024, pdl)]
                         for pdl in (True, False))
    ops = [line.split(";")[0].split(" ")[0] for line in with_pdl]
    prefetches = stream_matmul.default_config(dtypes.from_name(fmt), 16, 1024).prefetch
    assert prefetches == 4
    # the epilogue's wait, then the loader's prefetches and its wait (which ptxas's input may
    # hold on more than one branch of the prefetches' conditions: one is executed)
    launch, epilogue, *loader = ops
    assert (launch, epilogue) == ("griddepcontrol.launch_dependents", "griddepcontrol.wait")
    assert loader[:prefetches * (planes + 1)] == (["cp.async.bulk.prefetch.L2.global"]
                                                  * prefetches * (planes + 1))
    assert set(loader[prefetches * (planes + 1):]) == {"griddepcontrol.wait"}
    assert without == []


# --- the op: its usual path wherever the kernel does not run ---------------------------------

def _stream_parts(w):
    """The prepacked copy: stream codes, scales and split-K counters (zeros)."""
    counters = torch.zeros(w.shape[0] // sl.CHUNK, dtype=torch.int32, device=w.device)
    return (*sl.pack(w._scale_e8m0, w._data, w.elem_dtype), counters)


def _op(x, w, parts, bias=None, out_dtype=None):
    return torch.ops.torchmx.mx_stream_linear(x, *parts, w._scale_e8m0, w._data,
                                              w.elem_dtype.name, w.shape[1], bias,
                                              out_dtype or x.dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_op_matches_the_usual_path(fmt):
    x, w = integer_operands(fmt, 5, 128, 512)
    x = x.reshape(5, 1, 512)
    bias = torch.randint(-8, 9, (128,)).to(torch.bfloat16).to(DEVICE)
    out = _op(x, w, _stream_parts(w), bias)
    expected = torch.ops.torchmx.mx_weight_linear(x, w._scale_e8m0, w._data, w.elem_dtype.name,
                                                  32, 512, bias, torch.bfloat16)
    assert out.shape == (5, 1, 128)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(out.reshape(5, 128), reference(x.reshape(5, 512), w, bias),
                               rtol=0, atol=0)


def test_op_checks_its_parts():
    x, w = integer_operands("float8_e4m3", 4, 64, 256)
    codes, scales, counters = _stream_parts(w)
    with pytest.raises(ValueError, match="mx_stream_linear: the stream codes"):
        _op(x, w, (codes[:-16], scales, counters))
    with pytest.raises(ValueError, match="mx_stream_linear: the stream scales"):
        _op(x, w, (codes, scales.to(torch.int32), counters))
    with pytest.raises(ValueError,
                       match="mx_stream_linear: the stream counters .* got torch.int64"):
        _op(x, w, (codes, scales, counters.long()))
    with pytest.raises(ValueError, match="mx_stream_linear: the stream counters .* 1 elements"):
        _op(x, w, (codes, scales, torch.zeros(2, dtype=torch.int32, device=DEVICE)))
    x128, w128 = integer_operands("float8_e4m3", 4, 64, 128)
    with pytest.raises(ValueError, match="mx_stream_linear: the TMA stream layout needs"):
        _op(x128, w128, (codes, scales, counters))


def test_op_under_compile_with_dynamic_rows():
    x, w = integer_operands("float4_e2m1", 3, 64, 256)
    parts = _stream_parts(w)
    compiled = torch.compile(lambda a: _op(a, w, parts), dynamic=True, fullgraph=True)
    for rows in (3, 7):
        xr = integer_operands("float4_e2m1", rows, 64, 256, seed=rows)[0]
        torch.testing.assert_close(compiled(xr), reference(xr, w), rtol=0, atol=0)


# --- the kernel on an H100 -------------------------------------------------------------------

def _stream(x, w, bias=None, out_dtype=None, config=None, counters=None):
    """The kernel (its default config: on an H100, K split where the weight's tiles are few),
    on fresh split-K counters unless given."""
    codes, scales, _ = _stream_parts(w)
    return stream_matmul.stream_linear(x, codes, scales, w._scale_e8m0, w._data, w.elem_dtype,
                                       bias, out_dtype or x.dtype, config, counters)


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M,N,K", [(1, 64, 256), (2, 128, 384), (16, 192, 1024),
                                   (17, 64, 1280), (33, 128, 512), (64, 64, 2048)])
def test_exact_on_exact_sums(fmt, M, N, K):
    """Whole and partial activation tiles (8, 16, 32, 64 padded rows), 2 to 16 steps, odd slot
    counts (one consumer warpgroup takes a slot more), with and without bias."""
    x, w = integer_operands(fmt, M, N, K)
    bias = torch.randint(-8, 9, (N,)).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(_stream(x, w, bias), reference(x, w, bias), rtol=0, atol=0)
    out = _stream(x, w, None, torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x.float() @ w.dequantize(torch.float32).t(), rtol=0, atol=0)


@gpu_only
@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(FORMATS), M=st.integers(1, 64), tiles=st.integers(1, 3),
       steps=st.integers(2, 12), stages=st.sampled_from([2, 4, 6]), sub=st.sampled_from([1, 2]),
       split=st.integers(1, 4), seed=st.integers(0, 99))
def test_any_config_is_exact(fmt, M, tiles, steps, stages, sub, split, seed):
    steps = max(steps - steps % sub, 2 * sub * split)
    x, w = integer_operands(fmt, M, 64 * tiles, 128 * steps, seed=seed)
    cfg = stream_matmul.StreamConfig(stages, sub, split)
    try:
        out = _stream(x, w, config=cfg)
    except ValueError as e:  # that ring does not fit in shared memory at these rows
        assert "shared memory" in str(e)
        return
    torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0)


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M,N,K,split", [(16, 128, 4096, 8), (3, 64, 2048, 3),
                                         (64, 192, 1024, 2), (1, 64, 2560, 5)])
def test_split_k_is_exact_and_leaves_its_counters_at_zero(fmt, M, N, K, split):
    """Each part of a tile's K in its own CTA (uneven shares where the slots do not divide),
    the last to arrive adding the partials: exact on exact sums, call after call on the
    weight's own counters (left at zero), and on fresh ones."""
    x, w = integer_operands(fmt, M, N, K)
    bias = torch.randint(-8, 9, (N,)).to(torch.bfloat16).to(DEVICE)
    codes, scales, counters = _stream_parts(w)
    cfg = stream_matmul.default_config(w.elem_dtype, M, K, split)
    expected = reference(x, w, bias)
    for _ in range(3):
        out = stream_matmul.stream_linear(x, codes, scales, w._scale_e8m0, w._data,
                                          w.elem_dtype, bias, torch.bfloat16, cfg, counters)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        assert not counters.any()
    torch.testing.assert_close(_stream(x, w, bias, config=cfg), expected, rtol=0, atol=0)


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("M,N,K,split", [(7, 128, 1024, 1), (7, 128, 1024, 2),
                                         (16, 256, 4096, 4)])
def test_random_within_fp32_accumulation_and_deterministic(fmt, M, N, K, split):
    torch.manual_seed(3)
    x = torch.randn(M, K, dtype=torch.bfloat16, device=DEVICE)
    w = MXTensor.to_mx(torch.randn(N, K, device=DEVICE) * 4, fmt, 32)
    bias = torch.randn(N, dtype=torch.bfloat16, device=DEVICE)
    cfg = stream_matmul.default_config(w.elem_dtype, M, K, split)
    outs = [_stream(x, w, bias, config=cfg) for _ in range(3)]
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert_within_fp32_accumulation(outs[0], x, w, bias)


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code(fmt):
    """Every code at every byte (nibble) of a word and every word of a step decodes exactly;
    NaN and Inf codes poison their words and their CTAs recompute exactly (Inf * 0 is NaN)."""
    codes = torch.arange(256) % (1 << dtypes.from_name(fmt).bits)
    x, w = one_product_per_row(fmt, codes, torch.full((256,), 127))
    out = _stream(x, w, None, torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    assert expected.isnan().any() == (fmt in FP8)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@gpu_only
@pytest.mark.parametrize("fmt,code", [("float8_e4m3", 0x01), ("float8_e4m3", 0x7E),
                                      ("float8_e5m2", 0x01), ("float8_e5m2", 0x7B),
                                      ("float4_e2m1", 0x1), ("float4_e2m1", 0x7),
                                      ("int8", 0x01), ("int8", 0x80),
                                      ("float6_e2m3", 0x01), ("float6_e2m3", 0x1F),
                                      ("float6_e3m2", 0x01), ("float6_e3m2", 0x3F)])
def test_every_scale(fmt, code):
    """Every scale byte, inside FAST_SCALES (the fast path) and outside (the exact
    recomputation), for the smallest and the largest codes: 0 (2**-127), 254 and 255 (NaN)."""
    x, w = one_product_per_row(fmt, torch.full((256,), code), torch.arange(256))
    out = _stream(x, w, None, torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    assert out[0, 255].isnan() and out[0, 0] != 0


@gpu_only
@pytest.mark.parametrize("fmt,poison", [(f, p) for f in FP8 for p in ("nan code", "tiny scale",
                                                                       "huge scale", "nan x")]
                         + [("float4_e2m1", "huge scale"), ("int8", "tiny scale"),
                            ("int8", "nan scale"), ("float6_e2m3", "huge scale"),
                            ("float6_e3m2", "nan scale")])
@pytest.mark.parametrize("split", [1, 2])
def test_poisoned_words_recompute_their_tile_exactly(fmt, poison, split):
    """One word off the fast path among ordinary ones: its CTA (with split-K, the last of the
    tile's, whichever part held the word) recomputes the whole tile exactly, the other outputs
    of that tile included; the other CTAs are untouched."""
    x, w = integer_operands(fmt, 16, 256, 512)
    scale, data = w._scale_e8m0.clone(), w._data.clone()
    fmt_ = dtypes.from_name(fmt)
    low, high = FAST_SCALES[fmt_]
    byte = lambda code: code * fmt_.bytes_per_group // fmt_.codes_per_group  # noqa: E731
    if poison == "nan code":
        data[70, 100] = 0x7F
    elif poison.endswith("scale"):  # row 70 keeps only block 3, so its sums stay exact
        data[70, :byte(96)] = 0
        data[70, byte(128):] = 0
        scale[70, 3] = {"tiny scale": low - 1, "huge scale": high + 1, "nan scale": 255}[poison]
    else:
        x[5, 300] = float("nan")
    w = w._replace(scale, data)
    out = _stream(x, w, None, torch.float32, stream_matmul.StreamConfig(4, 1, split))
    expected = x.float() @ w.dequantize(torch.float32).t()
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@gpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_blocks_at_any_scale_are_exact(fmt):
    """Blocks whose codes are all +-0 at scale bytes outside FAST_SCALES (0: what quantizing
    zeros gives; for e4m3 and MXINT8 below their range) take the fast path and add zeros; a
    NaN scale still makes its row NaN (MX: every value of the block is NaN)."""
    x, w = integer_operands(fmt, 16, 128, 1024)
    scale, data = w._scale_e8m0.clone(), w._data.clone()
    fmt_ = dtypes.from_name(fmt)
    per_block = 32 * fmt_.bytes_per_group // fmt_.codes_per_group
    for row, byte in enumerate([0, 1, 2, 135, 200, 254, 255]):
        data[9 * row, per_block:2 * per_block] = 0  # block 1 of the row: zeros
        scale[9 * row, 1] = byte
    w = w._replace(scale, data)
    assert (sl.multiplier_exponents(scale, data, fmt_) == sl.RECOMPUTE).sum() == 1  # NaN scale
    out = _stream(x, w, None, torch.float32)
    expected = x.float() @ w.dequantize(torch.float32).t()
    assert expected[:, 54].isnan().all() and not expected[:, :54].isnan().any()
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@gpu_only
@pytest.mark.parametrize("fmt", ["float8_e4m3", "float4_e2m1", "float6_e2m3"])
@pytest.mark.parametrize("prefetch", [0, 8])
def test_back_to_back_calls_wait_for_their_input(fmt, prefetch):
    """A decode step's pattern: the second call reads the first's output as x. Launched with
    programmatic dependent launch, the second starts while the first still runs (on the SMs
    the first's 128 CTAs leave free) and may read x only after its wait: its bits are those
    of the same call made after a synchronize, for new inputs call after call, eagerly and
    replayed in a CUDA graph."""
    fmt = dtypes.from_name(fmt)
    torch.manual_seed(0)
    first = MXTensor.to_mx(torch.randn(1024, 16384, device=DEVICE), fmt, 32)
    second = MXTensor.to_mx(torch.randn(256, 1024, device=DEVICE), fmt, 32)
    parts = {id(w): _stream_parts(w) for w in (first, second)}

    def call(x, w, pdl=True):
        codes, scales, counters = parts[id(w)]
        cfg = stream_matmul.default_config(w.elem_dtype, x.shape[0], w.shape[1],
                                           stream_matmul.split_k(*w.shape, x.device))
        cfg = dataclasses.replace(cfg, pdl=pdl, prefetch=prefetch if pdl else 0)
        return stream_matmul.stream_linear(x, codes, scales, w._scale_e8m0, w._data,
                                           w.elem_dtype, None, torch.bfloat16, cfg, counters)

    def check(out, hidden):
        torch.cuda.synchronize()
        torch.testing.assert_close(out, call(hidden.clone(), second, pdl=False), rtol=0,
                                   atol=0)

    for _ in range(4):
        hidden = call(torch.randn(16, 16384, dtype=torch.bfloat16, device=DEVICE), first)
        check(call(hidden, second), hidden)
    x = torch.zeros(16, 16384, dtype=torch.bfloat16, device=DEVICE)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hidden = call(x, first)
        out = call(hidden, second)
    for _ in range(4):
        x.copy_(torch.randn_like(x))
        graph.replay()
        check(out, hidden)


@gpu_only
@pytest.mark.parametrize("split", [1, 2])
def test_cuda_graph_replay_and_strided_input(split):
    """Replays of a captured call, with split-K on the weight's own counters (the kernel
    leaves them at zero for the next replay) or without."""
    x, w = integer_operands("float4_e2m1", 16, 256, 1024)
    counters = _stream_parts(w)[2]
    cfg = stream_matmul.StreamConfig(6, 2, split)
    assert_graph_replay_matches_eager(lambda: _stream(x, w, config=cfg, counters=counters))
    assert not counters.any()
    wide = torch.zeros(16, 2048, dtype=torch.bfloat16, device=DEVICE)
    wide[:, :1024] = x
    parts = _stream_parts(w)
    torch.testing.assert_close(_op(wide[:, :1024], w, parts), reference(x, w), rtol=0, atol=0)


@gpu_only
def test_op_runs_the_kernel_for_its_rows(monkeypatch):
    x, w = integer_operands("float8_e4m3", 8, 128, 512)
    calls = []
    real = stream_matmul.stream_linear
    monkeypatch.setattr(stream_matmul, "stream_linear",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    assert op_module.uses_stream_kernel(x, w._scale_e8m0, w.elem_dtype, torch.bfloat16)
    torch.testing.assert_close(_op(x, w, _stream_parts(w)), reference(x, w), rtol=0, atol=0)
    assert calls == [1]
    assert not op_module.uses_stream_kernel(x.half(), w._scale_e8m0, w.elem_dtype, torch.half)
    assert not op_module.uses_stream_kernel(x[:1], w._scale_e8m0, w.elem_dtype, torch.bfloat16)
    assert op_module.uses_stream_kernel(x[:1], w._scale_e8m0, dtypes.float4_e2m1,
                                        torch.bfloat16)  # MXFP4: one row too
    monkeypatch.setattr(stream_matmul, "MIN_WAVE_FILL", {1: 0.9, 2: 0.0})
    assert not op_module.uses_stream_kernel(x, w._scale_e8m0, w.elem_dtype, torch.bfloat16)
    assert op_module.uses_stream_kernel(x[:1], w._scale_e8m0, dtypes.float4_e2m1,
                                        torch.bfloat16)
    monkeypatch.setattr(stream_matmul, "ONE_ROW_MIN_FILL", 0.9)  # one MXFP4 row: its own bar
    assert not op_module.uses_stream_kernel(x[:1], w._scale_e8m0, dtypes.float4_e2m1,
                                            torch.bfloat16)
    assert op_module.uses_stream_kernel(x[:2], w._scale_e8m0, dtypes.float4_e2m1,
                                        torch.bfloat16)

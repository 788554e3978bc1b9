"""Exhaustive bit-exact sweep of the MX numerics against the independent oracle.

* Oracle self-tests (no torchmx needed): the oracle agrees with torch/numpy casts where those
  implement the same rounding, with an exact Fraction-based scalar model for every rounding
  mode, and with hand-computed values.
* Quantize: every finite bf16 and every finite fp16 value (both signs), arranged in blocks of
  32 three ways (shuffled; sorted by magnitude so block amaxes visit every binade; a large
  leader with tiny followers so elements land in subnormal / flush territory), plus a random
  fp32 sample with scale-mode threshold values, for every built-in format, e1m2 and e3m3, all
  four scale modes and all four deterministic roundings: zero mismatching scale bytes and
  data bytes, for ``quantize_mx_reference`` and ``torch.ops.torchmx.quantize_mx``.
* Dequantize: every code of every format under scale bytes 0, 1, 100, 127, 200, 254, 255, to
  fp32 / bf16 / fp16: bit patterns equal the oracle (exact value, one RNE rounding).
"""

import functools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import oracle

BLOCK = 32
FORMAT_NAMES = list(oracle.BUILTIN_NAMES) + ["e1m2", "e3m3"]
INPUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TARGETS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _lib():
    import torchmx  # noqa: F401  (registers torch.ops.torchmx.*)
    import torchmx.numerics as numerics

    return numerics


# ======================================================================================
# Oracle self-tests
# ======================================================================================


def _frac_encode(y: float, fmt: oracle.Fmt, rounding: str) -> int:
    """Slow scalar model using exponent/quantum arithmetic on Fractions (a different method
    from the oracle's table lookup)."""
    neg = math.copysign(1.0, y) < 0
    a = abs(Fraction(y))

    def rnd(t: Fraction) -> int:
        fl = t.numerator // t.denominator
        fr = t - fl
        half = Fraction(1, 2)
        if rounding == "trunc":
            return fl
        if fr > half:
            return fl + 1
        if fr < half:
            return fl
        return {"even": fl + (fl % 2), "away": fl + 1, "toward_zero": fl}[rounding]

    if fmt.kind == "int":
        mag = min(rnd(a * 64), 127)
        return -mag if neg else mag
    m, bias = fmt.mbits, fmt.bias
    if a == 0:
        ex = 1 - bias
    else:
        ex = a.numerator.bit_length() - a.denominator.bit_length()
        while Fraction(2) ** ex > a:
            ex -= 1
        while Fraction(2) ** (ex + 1) <= a:
            ex += 1
        ex = max(ex, 1 - bias)
    q = Fraction(2) ** (ex - m)
    v = rnd(a / q) * q
    if v > Fraction(fmt.max):
        v = Fraction(fmt.max)
    # encode v into exponent / mantissa fields
    if v < Fraction(2) ** (1 - bias):
        ef, mant = 0, v / Fraction(2) ** (1 - bias - m)
    else:
        e2 = v.numerator.bit_length() - v.denominator.bit_length()
        while Fraction(2) ** e2 > v:
            e2 -= 1
        while Fraction(2) ** (e2 + 1) <= v:
            e2 += 1
        ef, mant = e2 + bias, v / Fraction(2) ** (e2 - m) - 2**m
    assert mant.denominator == 1
    code = (ef << m) | int(mant)
    return code | (int(neg) << (fmt.bits - 1))


def _random_scaled_values(fmt, n, seed):
    """Values around the whole element range incl. exact grid points and midpoints."""
    rng = np.random.default_rng(seed)
    grid = fmt.grid
    mids = (grid[:-1] + grid[1:]) / 2
    span = np.concatenate([grid, mids, [fmt.max * 1.01, fmt.max * 1.5, fmt.max * 2, 1e30]])
    rand = np.ldexp(rng.uniform(1, 2, n), rng.integers(-14 - fmt.bias, fmt.emax + 2, n))
    # fp32-exact values
    rand = rand.astype(np.float32).astype(np.float64)
    vals = np.concatenate([span, rand, [0.0]])
    return np.concatenate([vals, -vals])


@pytest.mark.parametrize("rounding", oracle.DET_ROUNDINGS)
@pytest.mark.parametrize("fmt_name", FORMAT_NAMES + ["e3m2_bias2", "e2m2"])
def test_oracle_encode_matches_fraction_model(fmt_name, rounding):
    fmt = oracle.from_name(fmt_name)
    y = _random_scaled_values(fmt, 1500, seed=len(fmt_name))
    got = oracle.oracle_encode_array(y, np.signbit(y), fmt, rounding)
    want = np.array([_frac_encode(float(v), fmt, rounding) for v in y])
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(y[i], got[i], want[i]) for i in bad[:10]]


def _all_finite(dtype):
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    v = bits.view(dtype)
    return v[torch.isfinite(v)]


@pytest.mark.parametrize("torch_fp8,fmt_name", [(torch.float8_e4m3fn, "float8_e4m3"),
                                                (torch.float8_e5m2, "float8_e5m2")])
def test_oracle_encode_even_matches_torch_fp8_cast(torch_fp8, fmt_name):
    # torch's fp32 -> fp8 casts are RNE with subnormals; they only differ from MX in what
    # happens above max (NaN/Inf instead of saturation), so compare within range.
    fmt = oracle.FORMATS[fmt_name]
    rng = np.random.default_rng(0)
    r = rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([r, _all_finite(torch.bfloat16).float().numpy(),
                        _all_finite(torch.float16).float().numpy()])
    x = x[np.isfinite(x) & (np.abs(x) <= fmt.max)]
    want = torch.from_numpy(x).to(torch_fp8).view(torch.uint8).numpy().astype(np.int64)
    xd = x.astype(np.float64)
    got = oracle.oracle_encode_array(xd, np.signbit(xd), fmt, "even")
    assert np.array_equal(got, want)


def test_oracle_encode_generic_minifloats_match_ieee_casts():
    # ExMy(5,10) is fp16 without specials, ExMy(8,7) is bf16 without specials (same grids
    # below the top binade): the table-lookup rounding must agree with numpy/torch RNE.
    rng = np.random.default_rng(1)
    r = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    r = r[np.isfinite(r)].astype(np.float64)
    e5m10 = oracle.exmy(5, 10)
    x = r[np.abs(r) < 65504.0]
    got = oracle.oracle_encode_array(x, np.signbit(x), e5m10, "even")
    want = x.astype(np.float16).view(np.uint16).astype(np.int64)
    assert np.array_equal(got, want)
    e8m7 = oracle.exmy(8, 7)
    assert e8m7.bias == 127
    x = r[np.abs(r) < 2.0**127]
    got = oracle.oracle_encode_array(x, np.signbit(x), e8m7, "even")
    want = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).view(torch.int16)
    want = want.numpy().astype(np.int64) & 0xFFFF
    assert np.array_equal(got, want)


def test_oracle_round_to_target_matches_numpy_and_fractions():
    rng = np.random.default_rng(2)
    # random float64 values over the whole fp32 range incl. subnormal/overflow boundaries
    v = np.ldexp(rng.uniform(1, 2, 200_000), rng.integers(-160, 131, 200_000))
    v *= np.where(rng.integers(0, 2, v.size) == 1, -1, 1)
    # and exact ties of the fp16 grid (normal and subnormal)
    ties = np.ldexp(rng.integers(0, 4096, 20_000) * 2 + 1.0, rng.integers(-36, 6, 20_000))
    v = np.concatenate([v, ties, [0.0, -0.0, np.inf, -np.inf, 65520.0, 65519.99]])
    with np.errstate(over="ignore"):
        assert np.array_equal(oracle.round_to_target_bits(v, torch.float32),
                              v.astype(np.float32).view(np.uint32).astype(np.int64))
        assert np.array_equal(oracle.round_to_target_bits(v, torch.float16),
                              v.astype(np.float16).view(np.uint16).astype(np.int64))
    # bf16: values that are fp32-exact go through torch's (single-rounding) fp32->bf16
    with np.errstate(over="ignore"):
        f = v.astype(np.float32)
    f = f[np.isfinite(f)]
    want = torch.from_numpy(f).to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64)
    assert np.array_equal(oracle.round_to_target_bits(f.astype(np.float64), torch.bfloat16),
                          want & 0xFFFF)
    # bf16 from non-fp32-exact values: check against Fractions on a sample
    for val in v[:300]:
        bits = int(oracle.round_to_target_bits(np.array([val]), torch.bfloat16)[0])
        a = abs(Fraction(float(val)))
        if a == 0 or a >= Fraction(2) ** 128 - Fraction(2) ** 119:
            continue
        ex = max(a.numerator.bit_length() - a.denominator.bit_length() + 1, -125)
        while Fraction(2) ** (ex - 1) > a and ex > -125:
            ex -= 1
        q = Fraction(2) ** (ex - 1 - 7)  # bf16 quantum of the binade [2^(ex-1), 2^ex)
        t = a / q
        fl = t.numerator // t.denominator
        fr = t - fl
        r = fl + (1 if fr > Fraction(1, 2) or (fr == Fraction(1, 2) and fl % 2) else 0)
        want_val = float(r * q) * (1 if val > 0 else -1)
        got_val = oracle.bits_to_tensor(np.array([bits]), torch.bfloat16).double().item()
        assert got_val == want_val, (val, got_val, want_val)


def test_oracle_rceil_division_is_correctly_rounded():
    rng = np.random.default_rng(3)
    a = rng.integers(1, 2**31 - 2**23, 3000, dtype=np.uint64).astype(np.uint32)
    a = a.view(np.float32).astype(np.float64)
    for fname in ("float8_e4m3", "float8_e5m2", "float6_e2m3", "int8"):
        fmt = oracle.FORMATS[fname]
        d = a.astype(np.float32) / np.float32(fmt.max)
        for ai, di in zip(a[:600], d[:600]):
            q = Fraction(float(ai)) / Fraction(fmt.max)
            if q < Fraction(2) ** -149 / 2:
                assert di == 0
                continue
            assert float(di) == oracle.fraction_round_to_fp32(q), (ai, fname)


def test_oracle_hand_values():
    f = oracle.FORMATS
    e4m3, e2m1, i8 = f["float8_e4m3"], f["float4_e2m1"], f["int8"]
    # scales
    assert oracle.oracle_scale([1.0], e4m3, "floor") == 127 - 8
    assert oracle.oracle_scale([480.0], e4m3, "floor") == 127  # 2^8 -> e = 8 - 8
    assert oracle.oracle_scale([3.0], e4m3, "ceil") == 127 + 2 - 8
    assert oracle.oracle_scale([6.0], e2m1, "rceil") == 127  # 6/6 = 1 -> 0
    assert oracle.oracle_scale([6.5], e2m1, "rceil") == 128
    assert oracle.oracle_scale([7.0], e2m1, "floor") == 127 + 2 - 2
    assert oracle.oracle_scale([7.0], e2m1, "even") == 127 + 3 - 2  # 1.75 -> 2 with m=1
    assert oracle.oracle_scale([6.875], e2m1, "even") == 127 + 2 - 2  # 1.71875 stays below 2
    assert oracle.oracle_scale([0.0, -0.0], e4m3, "floor") == 0
    assert oracle.oracle_scale([1.0, float("nan")], e4m3, "floor") == 255
    assert oracle.oracle_scale([float("-inf")], e4m3, "ceil") == 255
    assert oracle.oracle_scale([2.0**-140], e4m3, "floor") == 0
    assert oracle.oracle_scale([2.0**127 * 1.5], i8, "ceil") == 254  # 128 clamped
    assert oracle.oracle_scale([2.0**127 * 1.9921875], i8, "even") == 254  # 2^128 -> 128 -> 127
    assert oracle.oracle_scale([2.0**127 * 1.9921875], e4m3, "even") == 127 + 128 - 8
    # elements
    assert oracle.oracle_encode(448.0, e4m3, "even") == 0x7E
    assert oracle.oracle_encode(1e9, e4m3, "even") == 0x7E
    assert oracle.oracle_encode(-1e9, e4m3, "away") == 0xFE
    assert oracle.oracle_encode(-0.0, e4m3, "even") == 0x80
    assert oracle.oracle_encode(2.0**-9, e4m3, "even") == 0x01  # min subnormal
    assert oracle.oracle_encode(2.0**-10, e4m3, "even") == 0x00  # tie -> even (0)
    assert oracle.oracle_encode(2.0**-10, e4m3, "away") == 0x01
    assert oracle.oracle_encode(2.5, e2m1, "even") == 0x4  # tie 2|3 -> 2 (code 4 even)
    assert oracle.oracle_encode(2.5, e2m1, "away") == 0x5
    assert oracle.oracle_encode(2.5, e2m1, "toward_zero") == 0x4
    assert oracle.oracle_encode(2.9, e2m1, "trunc") == 0x4
    assert oracle.oracle_encode(-1.25, e2m1, "even") == 0x8 | 0x2
    assert oracle.oracle_encode(1.75, e2m1, "even") == 0x4  # tie 1.5|2 -> 2 (even)
    assert oracle.oracle_encode(-127.5 / 64, i8, "even") == -127  # -128 clamped
    assert oracle.oracle_encode(0.5 / 64, i8, "even") == 0
    assert oracle.oracle_encode(1.5 / 64, i8, "even") == 2
    assert oracle.oracle_encode(1.5 / 64, i8, "toward_zero") == 1
    assert oracle.oracle_encode(-1.5 / 64, i8, "away") == -2
    # packing
    e3m2 = f["float6_e3m2"]
    assert oracle.pack_codes(np.array([0x1, 0x2, 0x3, 0x3F]), e3m2).tolist() == [
        0x81, 0x30, 0xFC]  # w = 1 | 2<<6 | 3<<12 | 63<<18 = 0xFC3081
    assert oracle.pack_codes(np.array([0x1, 0xF, 0x3]), e2m1).tolist() == [0xF1, 0x03]
    u = oracle.unpack_codes(oracle.pack_codes(np.arange(64).reshape(2, 32) % 64, e3m2),
                            e3m2, 32)
    assert np.array_equal(u, np.arange(64).reshape(2, 32) % 64)


def test_oracle_quantize_layout():
    x = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3) - 7
    s, d = oracle.oracle_quantize(x, "float4_e2m1", 2, "floor", "even", block_dim=1)
    assert s.shape == (2, 3, 3) and d.shape == (2, 3, 3)
    s, d = oracle.oracle_quantize(x, "float6_e2m3", 4, "floor", "even", block_dim=1)
    assert s.shape == (2, 2, 3) and d.shape == (2, 6, 3)
    s, d = oracle.oracle_quantize(x, "int8", 4, "floor", "even", block_dim=-1)
    assert s.shape == (2, 5, 1) and d.shape == (2, 5, 3) and d.dtype == np.int8
    back = oracle.oracle_dequantize(d, s, "int8", 4, torch.float32, -1, block_dim_size=3)
    assert back.shape == x.shape


# ======================================================================================
# Inputs
# ======================================================================================


def _shuffle(v, seed):
    g = torch.Generator().manual_seed(seed)
    return v[torch.randperm(v.numel(), generator=g)]


def _sorted_by_magnitude(v):
    return v[torch.argsort(v.float().abs(), stable=True)]


def _leader_blocks(v, seed, nfollow=BLOCK - 1, kmax=36):
    """Blocks of 31 magnitude-sorted followers plus one leader |f| * 2^k at a random slot."""
    dtype = v.dtype
    rng = np.random.default_rng(seed)
    fol = _sorted_by_magnitude(v)
    nb = fol.numel() // nfollow
    fol = fol[: nb * nfollow].reshape(nb, nfollow)
    pick = fol[torch.arange(nb), torch.from_numpy(rng.integers(0, nfollow, nb))]
    k = torch.from_numpy(np.arange(nb) % kmax).double()
    lead = pick.double().abs() * torch.exp2(k)
    lead = torch.where(lead == 0, torch.exp2(k - 20), lead)
    fmax = torch.finfo(dtype).max
    lead = torch.where(lead > fmax, torch.full_like(lead, fmax), lead).to(dtype)
    assert torch.isfinite(lead).all()
    sign = torch.from_numpy(rng.integers(0, 2, nb) * 2 - 1).to(dtype)
    lead = lead * sign
    blocks = torch.cat([fol, lead[:, None]], dim=1)
    # move the leader to a random slot
    perm = torch.from_numpy(np.argsort(rng.random((nb, BLOCK)), axis=1))
    return torch.gather(blocks, 1, perm).reshape(-1)


def _threshold_values_fp32():
    """fp32 block leaders that sit exactly on / next to the even and rceil thresholds."""
    vals = []
    for exp in list(range(-149, -120)) + list(range(-30, 31)) + list(range(118, 128)):
        if exp < -126:
            vals += [2.0**exp, 2.0**exp * 3]
            continue
        base = np.float32(2.0**exp).view(np.uint32).astype(np.int64)
        for mb in (1, 2, 3, 6):
            tie = base | (((1 << (mb + 1)) - 1) << (22 - mb))
            for b in (tie - 1, tie, tie + 1, base | 0x7FFFFF, base):
                vals.append(float(np.array(b, dtype=np.uint32).view(np.float32)))
        for fmt in oracle.FORMATS.values():
            with np.errstate(over="ignore"):
                m = np.float32(fmt.max * 2.0**exp)
            if np.isfinite(m):
                vals += [float(np.nextafter(m, np.float32(0))), float(m),
                         float(np.nextafter(m, np.float32(np.inf)))]
    # max_normal * 2^k next to the fp32-subnormal range of the rceil quotient
    for fmt in list(oracle.FORMATS.values()) + [oracle.exmy(1, 2), oracle.exmy(3, 3)]:
        for exp in range(-150, -105):
            m = np.float32(fmt.max * 2.0**exp)
            up, down = m, m
            vals.append(float(m))
            for _ in range(3):  # 1, 2, 3 ulps either side
                up = np.nextafter(up, np.float32(np.inf))
                down = np.nextafter(down, np.float32(0))
                vals += [float(up), float(down)]
    vals = np.array(vals, dtype=np.float32)
    vals = np.unique(vals[vals > 0])
    return torch.from_numpy(vals[np.isfinite(vals)])


@functools.lru_cache(maxsize=None)
def _inputs(dtype_name):
    dtype = INPUT_DTYPES[dtype_name]
    if dtype_name == "fp32":
        rng = np.random.default_rng(123)
        r = rng.integers(0, 2**32, 32 * 1500, dtype=np.uint64).astype(np.uint32)
        r = torch.from_numpy(r.view(np.float32).copy())
        v = r[torch.isfinite(r)]
        thr = _threshold_values_fp32()
        thr = thr * torch.from_numpy(rng.choice([-1.0, 1.0], thr.numel())).float()
        # threshold leaders with random followers underneath them (down to 2^-40 relative)
        n_f = thr.numel() * (BLOCK - 1)
        rel = rng.uniform(-1, 1, n_f) * np.exp2(-rng.integers(0, 41, n_f).astype(np.float64))
        fol = torch.from_numpy(rel).reshape(thr.numel(), BLOCK - 1)
        fol = (fol * (thr.double().abs()[:, None] * 0.999)).float()
        thr_blocks = torch.cat([thr[:, None], fol], dim=1).reshape(-1)
        parts = [_shuffle(v, 1), _sorted_by_magnitude(v), _leader_blocks(v, 2), thr_blocks]
    else:
        v = _all_finite(dtype)
        assert v.numel() == {"bf16": 65536 - 256, "fp16": 65536 - 2048}[dtype_name]
        parts = [_shuffle(v, 1), _sorted_by_magnitude(v), _leader_blocks(v, 2)]
    parts = [p[: p.numel() // BLOCK * BLOCK] for p in parts]
    x = torch.cat(parts).to(dtype).contiguous()
    assert torch.isfinite(x).all()
    # a couple of non-finite blocks and an all-zero block (incl. -0.0) at the end
    tail = torch.zeros(4, BLOCK, dtype=dtype)
    tail[0, 5] = float("nan")
    tail[1, 0] = float("inf")
    tail[1, 9] = 3.0
    tail[2, 31] = float("-inf")
    tail[3, ::2] = -0.0
    tail[0, 7] = 1.0
    x = torch.cat([x, tail.reshape(-1)])
    return x


@functools.lru_cache(maxsize=None)
def _oracle_q(dtype_name, fmt_name, scale_mode, rounding):
    x = _inputs(dtype_name)
    s, d = oracle.oracle_quantize(x, oracle.from_name(fmt_name), BLOCK, scale_mode, rounding)
    return s, d.view(np.uint8)


def _describe_mismatch(x, s_want, s_got, d_want, d_got, fmt):
    g, nb = fmt.storage
    xb = x.reshape(-1, BLOCK)
    bad_s = np.nonzero(s_want != s_got)[0]
    dw = d_want.reshape(xb.shape[0], -1)
    dg = d_got.reshape(xb.shape[0], -1)
    bad_d = np.nonzero((dw != dg).any(axis=1))[0]
    lines = [f"{bad_s.size} scale-byte mismatches, {bad_d.size} blocks with data mismatches"]
    for i in list(bad_s[:3]) + list(bad_d[:3]):
        cw = oracle.unpack_codes(dw[i], fmt, BLOCK)
        cg = oracle.unpack_codes(dg[i], fmt, BLOCK)
        j = np.nonzero(cw != cg)[0]
        lines.append(f"block {i}: x={xb[i].double().tolist()} scale want {s_want[i]} got "
                     f"{s_got[i]}; codes differ at {j[:6].tolist()}: x={xb[i][j[:6]].tolist()} "
                     f"want {[hex(c) for c in cw[j[:6]]]} got {[hex(c) for c in cg[j[:6]]]}")
    return "\n".join(lines)


@pytest.mark.parametrize("impl", ["reference", "op"])
@pytest.mark.parametrize("rounding", oracle.DET_ROUNDINGS)
@pytest.mark.parametrize("scale_mode", oracle.SCALE_MODES)
@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16", "fp32"])
def test_quantize_exhaustive(dtype_name, fmt_name, scale_mode, rounding, impl):
    numerics = _lib()
    x = _inputs(dtype_name)
    fmt = oracle.from_name(fmt_name)
    if impl == "reference":
        s, d = numerics.quantize_mx_reference(x, fmt_name, BLOCK, scale_mode=scale_mode,
                                              rounding=rounding)
    else:
        s, d = torch.ops.torchmx.quantize_mx(x, fmt_name, BLOCK, scale_mode=scale_mode,
                                             rounding=rounding)
    s_want, d_want = _oracle_q(dtype_name, fmt_name, scale_mode, rounding)
    assert s.dtype == torch.uint8 and tuple(s.shape) == s_want.shape, (s.dtype, s.shape)
    assert d.dtype == fmt.data_torch_dtype, d.dtype
    assert tuple(d.shape) == d_want.shape, (d.shape, d_want.shape)
    assert s.is_contiguous() and d.is_contiguous()
    s_got = s.numpy()
    d_got = d.view(torch.uint8).numpy()
    if not (np.array_equal(s_got, s_want) and np.array_equal(d_got, d_want)):
        pytest.fail(_describe_mismatch(x, s_want, s_got, d_want, d_got, fmt))


# ======================================================================================
# Dequantize: every code x a spread of scale bytes
# ======================================================================================

SCALE_BYTES = [0, 1, 100, 127, 200, 254, 255]


def _all_codes(fmt):
    if fmt.kind == "int":
        return np.arange(-127, 128)
    return np.arange(1 << fmt.bits)


def _dequant_case(fmt):
    codes = _all_codes(fmt)
    L = -(-codes.size // BLOCK) * BLOCK
    row = np.resize(codes, L)  # repeats codes to fill the last block
    rows = np.tile(row, (len(SCALE_BYTES), 1))
    data = oracle.pack_codes(rows, fmt)
    if fmt.kind == "int":
        data = data.view(np.int8)
    scale = np.repeat(np.array(SCALE_BYTES, dtype=np.uint8)[:, None], L // BLOCK, axis=1)
    return torch.from_numpy(data.copy()), torch.from_numpy(scale.copy()), rows


@pytest.mark.parametrize("impl", ["reference", "op"])
@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
def test_dequantize_all_codes(fmt_name, target, impl):
    numerics = _lib()
    fmt = oracle.from_name(fmt_name)
    tdt = TARGETS[target]
    data, scale, rows = _dequant_case(fmt)
    if impl == "reference":
        out = numerics.dequantize_mx_reference(data, scale, fmt_name, BLOCK, tdt, -1)
    else:
        out = torch.ops.torchmx.dequantize_mx(data, scale, fmt_name, BLOCK, tdt, -1)
    want = oracle.oracle_dequantize(data, scale, fmt, BLOCK, tdt, -1)
    assert out.dtype == tdt and out.shape == want.shape, (out.dtype, out.shape, want.shape)
    nan_w = torch.isnan(want).numpy()
    nan_g = torch.isnan(out).numpy()
    bw, bg = oracle.tensor_bits(want), oracle.tensor_bits(out)
    bad = np.argwhere((nan_w != nan_g) | (bw != bg))  # NaN bits too: one canonical NaN
    if bad.size:
        msgs = []
        for r, c in bad[:8]:
            msgs.append(f"scale byte {SCALE_BYTES[r]} code {hex(int(rows[r, c]) & 0xFF)}: "
                        f"want {want[r, c].item()!r} (0x{bw[r, c]:x}) got {out[r, c].item()!r} "
                        f"(0x{bg[r, c]:x})")
        pytest.fail(f"{len(bad)} mismatches:\n" + "\n".join(msgs))
    # scale 255 -> every element NaN
    assert nan_g[SCALE_BYTES.index(255)].all()

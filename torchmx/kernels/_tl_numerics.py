"""Per-element and per-block MX numerics as Triton device functions.

Bit for bit the reference of torchmx/numerics (scale.py, elements.py, rounding.py), written
with integer operations on fp32 bit patterns wherever the reference reads exponents, and with
no floating-point operation that could round differently: every multiplication below is by an
exact power of two built from its bits (never exp2), the one division (rceil) is the IEEE
round-to-nearest `div_rn` (Triton's `/` on fp32 is an approximate `div.full`), and no fused
multiply-add can change a result because every product that feeds an addition is exact.

Format facts come in as constexprs (see triton_backend._format_constants):
IS_INT, BITS, MBITS, EMIN (1 - bias), EMAX, MAX_CODE, MAX_NORMAL, BIAS, HAS_INF, HAS_NAN, and
LSB, the value of code 1 (2**-m for MXINT8, the smallest subnormal 2**(emin - m) otherwise).
SCALE_MODE and ROUNDING are the integers of numerics/modes.py, compared with the constexprs below.
"""

import triton
import triton.language as tl

from ..numerics.modes import Rounding, ScaleMode

SCALE_FLOOR = tl.constexpr(int(ScaleMode.FLOOR))
SCALE_CEIL = tl.constexpr(int(ScaleMode.CEIL))
SCALE_EVEN = tl.constexpr(int(ScaleMode.EVEN))
SCALE_RCEIL = tl.constexpr(int(ScaleMode.RCEIL))
ROUND_EVEN = tl.constexpr(int(Rounding.EVEN))
ROUND_AWAY = tl.constexpr(int(Rounding.AWAY))
ROUND_TOWARD_ZERO = tl.constexpr(int(Rounding.TOWARD_ZERO))
ROUND_TRUNC = tl.constexpr(int(Rounding.TRUNC))
ROUND_STOCHASTIC = tl.constexpr(int(Rounding.STOCHASTIC))

_HASH_MULTIPLIER = tl.constexpr(0x45D9F3B)


def ptx(source: str) -> tl.constexpr:
    """Inline PTX as a kernel global, on one line (PTX ends its statements with ';'): inductor
    (torch 2.11) pastes a kernel's source and globals into a string literal of the module it
    generates, where an escaped newline ends the literal."""
    return tl.constexpr(" ".join(source.split()))


@triton.jit
def program_coordinates(tiles_c, tiles_r, GRID: tl.constexpr, I64: tl.constexpr):
    """(b, tile row, tile column) of this program. GRID 3: launched on (tiles_c, tiles_r, B),
    no integer division; GRID 1: a 1-d launch (when tiles_r or B exceed 65535)."""
    if GRID == 3:
        tc = tl.program_id(0)
        tr = tl.program_id(1)
        b = tl.program_id(2)
        if I64:
            tc = tc.to(tl.int64)
            tr = tr.to(tl.int64)
            b = b.to(tl.int64)
    else:
        pid = tl.program_id(0)
        if I64:
            pid = pid.to(tl.int64)
        tc = pid % tiles_c
        tr = (pid // tiles_c) % tiles_r
        b = pid // (tiles_c * tiles_r)
    return b, tr, tc


@triton.jit
def exact_pow2(e):
    """2**e (int32 tensor, -149 <= e <= 127) as fp32 from its bits; 2**-127 etc. are exact."""
    normal = (tl.maximum(e + 127, 0)) << 23
    subnormal = 1 << tl.minimum(tl.maximum(e + 149, 0), 22)
    return tl.where(e >= -126, normal, subnormal).to(tl.float32, bitcast=True)


@triton.jit
def _floor_log2_bits(a):
    """floor(log2 x) of positive finite fp32 x given by its bits `a` (int32), subnormals too."""
    biased = a >> 23
    mantissa = a & 0x7FFFFF
    # A subnormal's leading bit, read from the exponent of its (exact) int -> fp32 conversion.
    msb = (mantissa.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
    return tl.where(biased > 0, biased - 127, msb - 149)


@triton.jit
def _ceil_log2_bits(a):
    biased = a >> 23
    mantissa = a & 0x7FFFFF
    power_of_two = tl.where(biased > 0, mantissa == 0, (mantissa & (mantissa - 1)) == 0)
    return _floor_log2_bits(a) + tl.where(power_of_two, 0, 1)


@triton.jit
def scale_byte(amax_bits, SCALE_MODE: tl.constexpr, MBITS: tl.constexpr, EMAX: tl.constexpr,
               MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr, RCEIL_ZERO: tl.constexpr):
    """E8M0 byte (int32 0..255) of blocks whose max |x| has fp32 bits `amax_bits` (int32;
    NaN and Inf have bits >= 0x7F800000, above every finite value).

    RCEIL_FRAC / RCEIL_ZERO (see triton_backend._rceil_constants): the mantissa field of
    MAX_NORMAL and the bits of the largest amax whose rceil byte is 0, or -1 when MAX_NORMAL < 1.
    """
    finite_bits = tl.minimum(amax_bits, 0x7F7FFFFF)  # keeps the unselected lanes in range
    biased = finite_bits >> 23
    if SCALE_MODE == SCALE_RCEIL and RCEIL_FRAC >= 0:
        # rceil without a division. With M = MAX_NORMAL >= 1, fp32(amax / M) <= 2**k exactly
        # when amax <= M * 2**k for every k >= -126 (M * 2**k is then a normal fp32 and the
        # rounding slack of the quotient, under half an ulp of 2**k, is below M * 2**k's ulp),
        # so e = ceil(log2(amax / M)): floor(log2 amax) - floor(log2 M), plus 1 when amax's
        # mantissa field is above M's. Bytes below 1 (e <= -127, where subnormal rounding of
        # the quotient matters) are exactly the amax <= RCEIL_ZERO. Subnormal amax: e <= -126.
        e = biased - EMAX + ((finite_bits & 0x7FFFFF) > RCEIL_FRAC).to(tl.int32)  # e + 127
        byte = tl.minimum(tl.maximum(e, 1), 254)
        byte = tl.where(finite_bits <= RCEIL_ZERO, 0, byte)
    elif SCALE_MODE == SCALE_FLOOR and EMAX >= 0:
        # byte = floor(log2 amax) - emax + 127, clamped: with emax >= 0 every subnormal (and
        # zero) amax clamps to byte 0, so the fp32 exponent field is all that matters.
        byte = tl.maximum(biased - EMAX, 0)
    elif SCALE_MODE == SCALE_CEIL and EMAX >= 1:
        # ceil adds 1 unless amax is a power of two; subnormals and zero clamp to 0 (emax >= 1).
        byte = tl.maximum(biased + ((finite_bits & 0x7FFFFF) != 0).to(tl.int32) - EMAX, 0)
    elif SCALE_MODE == SCALE_EVEN:
        # AMD: round amax's bits to MBITS mantissa bits (ties up); a carry to 2**128 counts as
        # exponent 128. Integer arithmetic only, subnormals included.
        rounded = (finite_bits + (1 << (22 - MBITS))) >> 23
        byte = tl.minimum(tl.maximum(rounded - EMAX, 0), 254)
        byte = tl.where(amax_bits == 0, 0, byte)
    else:
        if SCALE_MODE == SCALE_FLOOR:
            e = _floor_log2_bits(finite_bits) - EMAX
        elif SCALE_MODE == SCALE_CEIL:
            e = _ceil_log2_bits(finite_bits) - EMAX
        else:  # rceil: d = fp32(amax / max_normal) rounded to nearest even, e = ceil(log2 d)
            d = tl.math.div_rn(finite_bits.to(tl.float32, bitcast=True), MAX_NORMAL)
            d_bits = d.to(tl.int32, bitcast=True)
            e = tl.where(d_bits > 0, _ceil_log2_bits(tl.maximum(d_bits, 1)), -127)
        byte = tl.minimum(tl.maximum(e, -127), 127) + 127
        byte = tl.where(amax_bits == 0, 0, byte)
    return tl.where(amax_bits >= 0x7F800000, 255, byte)


@triton.jit
def scale_value(byte):
    """2**(byte - 127) as an exact fp32 from its bits (byte: int32 E8M0 scale byte; byte 0 is
    the subnormal 2**-127, byte 255 is NaN)."""
    value = tl.where(byte > 0, byte << 23, 1 << 22).to(tl.float32, bitcast=True)
    return tl.where(byte == 255, float("nan"), value)


@triton.jit
def inverse_scale(byte):
    """1 / 2**(byte - 127) as an exact fp32 (2**127 .. 2**-127); byte 255 gives 2**-128 (unused)."""
    return exact_pow2(127 - byte)


@triton.jit
def _mix32(h):
    h = ((h >> 16) ^ h) * _HASH_MULTIPLIER
    h = ((h >> 16) ^ h) * _HASH_MULTIPLIER
    return (h >> 16) ^ h


@triton.jit
def uniform_from_index(key, index):
    """rounding.uniform_from_index: a uniform fp32 in [0, 1) from the element's logical index
    (int64 tensor) and the 32-bit key of the seed (uint32)."""
    key = tl.cast(key, tl.uint32)
    low = index.to(tl.uint32)
    high = (index >> 32).to(tl.uint32)
    h = _mix32(_mix32(low ^ key) ^ high)
    return (h >> 8).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08  # 2**-24


@triton.jit
def _round(t, ROUNDING: tl.constexpr, uniform):
    """Round non-negative fp32 t (t < 2**22, exact) to an int32 by the rounding mode."""
    if ROUNDING == ROUND_EVEN:
        # t + 2**23 rounds to an integer, ties to even (IEEE RNE); its low bits are that integer.
        return (t + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
    elif ROUNDING == ROUND_TRUNC:
        return t.to(tl.int32)
    else:
        low = t.to(tl.int32)
        fraction = t - low.to(tl.float32)  # exact
        if ROUNDING == ROUND_AWAY:
            up = fraction >= 0.5
        elif ROUNDING == ROUND_TOWARD_ZERO:
            up = fraction > 0.5
        else:
            up = uniform < fraction
        return low + up.to(tl.int32)


@triton.jit
def encode(magnitude, x_bits, uniform, ROUNDING: tl.constexpr, IS_INT: tl.constexpr,
           BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr,
           BIG_EMAX: tl.constexpr):
    """Codes (int32: sign bit at BITS - 1, or two's complement for MXINT8) of the finite scaled
    values y = +-magnitude (fp32 >= 0), whose sign is the sign bit of `x_bits` (int32).

    Float formats: with p = max(floor(log2 |y|), emin) the grid spacing is 2**(p - m) and
    code = (p - emin) * 2**m + round(|y| / 2**(p - m)), then clamped to the largest code
    (elements.py). Round half to even adds the "magic" 2**(p + 23 - m), whose fp32 spacing is
    that grid, so the IEEE addition rounds |y| to the grid and the sum's low bits count the
    steps. BIG_EMAX formats (emax near 127) take the general path: steps = |y| * 2**(m - p),
    an exact product that may need a subnormal power of two.
    """
    m_bits = magnitude.to(tl.int32, bitcast=True)
    if IS_INT:
        steps = magnitude * (1 << MBITS)  # exact: a power-of-two scaling
        code = tl.minimum(_round(steps, ROUNDING, uniform), MAX_CODE)
        return tl.where(x_bits < 0, -code, code)
    else:
        biased = tl.maximum(m_bits >> 23, EMIN + 127)  # p + 127
        if ROUNDING == ROUND_EVEN and not BIG_EMAX:
            magic_bits = (biased + (23 - MBITS)) << 23
            total = magnitude + magic_bits.to(tl.float32, bitcast=True)  # rounds to the grid
            rounded = total.to(tl.int32, bitcast=True) - magic_bits
        else:
            if BIG_EMAX:
                step = exact_pow2(MBITS + 127 - biased)
            else:
                step = ((MBITS + 254 - biased) << 23).to(tl.float32, bitcast=True)
            rounded = _round(magnitude * step, ROUNDING, uniform)  # exact product
        code = tl.minimum(((biased - (EMIN + 127)) << MBITS) + rounded, MAX_CODE)
        return code | ((x_bits >> (32 - BITS)) & (1 << (BITS - 1)))


@triton.jit
def decode_value(code, IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                 HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr, LSB: tl.constexpr,
                 TO_VALUE: tl.constexpr):
    """decode(code) in fp32, exact (code: int32 raw bits).

    Float codes are placed in an fp32's sign / exponent / mantissa fields, which reads them as
    value * 2**(bias - 127) (codes with exponent 0 land on fp32 subnormals, with the same
    meaning); TO_VALUE = 2**(127 - bias) restores the value exactly. MXINT8: code * LSB, exact.
    """
    if IS_INT:
        signed = (code << 24) >> 24  # the int8 two's complement value
        value = signed.to(tl.float32) * LSB  # exact
    else:
        magnitude = code & ((1 << (BITS - 1)) - 1)
        placed = (magnitude << (23 - MBITS)) | ((code << (32 - BITS)) & -2147483648)
        value = placed.to(tl.float32, bitcast=True) * TO_VALUE  # exact
        if HAS_INF:  # e5m2-like: the all-ones exponent is Inf (mantissa 0) or NaN
            top = (magnitude >> MBITS) == (1 << (BITS - 1 - MBITS)) - 1
            special = tl.where((magnitude & ((1 << MBITS) - 1)) == 0, float("inf"), float("nan"))
            value = tl.where(top, tl.where(placed < 0, -special, special), value)
        elif HAS_NAN:  # e4m3-like: only the all-ones magnitude is NaN
            value = tl.where(magnitude == (1 << (BITS - 1)) - 1, float("nan"), value)
    return value


@triton.jit
def decode_scaled(code, byte, IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                  BIAS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
                  LSB: tl.constexpr, TO_VALUE: tl.constexpr):
    """decode(code) * 2**(byte - 127) in fp32, rounded once as in the reference (code: int32
    raw bits, byte: int32 scale byte broadcast to code's shape or a per-block tensor), NaN for
    byte 255."""
    return decode_value(code, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) \
        * scale_value(byte)


@triton.jit
def load_f32(ptrs, mask):
    """Load fp32/bf16/fp16 values as fp32 (bf16 by its bits: exact, and one shift)."""
    raw = tl.load(ptrs, mask=mask, other=0.0)
    if raw.dtype == tl.bfloat16:
        return (raw.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return raw.to(tl.float32)


@triton.jit
def to_output(value, out_dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """One rounding of fp32 to the output dtype, every NaN written as the positive quiet NaN
    of out_dtype (numerics/reference.CANONICAL_NAN_BITS: what a conversion makes of a NaN, and
    a NaN's sign and payload, depend on the device and on how the NaN arose). SOFT_BF16 rounds to bf16 in bit
    arithmetic (round half to even, subnormals kept), for Triton's interpreter, whose own
    fp32 -> bf16 conversion truncates; the GPU's cvt.rn.bf16.f32 gives the same bits."""
    if out_dtype == tl.float32:
        bits = value.to(tl.int32, bitcast=True)
        return tl.where(value != value, 0x7FC00000, bits).to(tl.float32, bitcast=True)
    elif SOFT_BF16 and out_dtype == tl.bfloat16:
        bits = value.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(value != value, 0x7FC0, rounded)
        return rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        bits = value.to(out_dtype).to(tl.int16, bitcast=True).to(tl.int32)
        if out_dtype == tl.bfloat16:
            bits = tl.where(value != value, 0x7FC0, bits)
        else:
            bits = tl.where(value != value, 0x7E00, bits)
        return bits.to(tl.int16).to(out_dtype, bitcast=True)

"""Quantize kernels for bf16 and fp16 inputs and fp4 / fp6-like formats (round half to even),
computed on pairs of 16-bit values: each int32 word holds two neighbouring columns, and every
step of the encode (scale, clamp, round, place) is one bf16x2 / f16x2 or 16x2 instruction for
both. Two kernels: blocks along the last dim (quantize_rows_pairs_kernel) and the fused row +
column pass (quantize_fused_pairs_kernel).

Why: the element-wise kernels (_tl_quantize) spend most of their time on integer and logic
instructions, which Hopper issues at half rate, and hold each element as an fp32 value plus its
|x| bits. Here a word carries two elements through the block maxima (max.u16x2 on |x| bits),
both encodes and the packing, and one register holds two inputs.

The encode of y = |x| * 2**(127 - byte) for a format with m mantissa bits, emin and bias, in
the input's own type (h mantissa bits, exponent bias B: bf16 7 and 127, fp16 10 and 15; see
encode_pairs_ptx). The arithmetic is exact here: y has at most h + 1 significant bits, the
scale is a power of two, and where a product underflows its code is 0 anyway. fp16 applies
the scale as two power-of-two factors on the same side of 1 (its exponent range is too narrow
for one), so a product rounds only below 2**-14, where every code is 0 (pairs_supported).
  y = min(y, max_normal)            (an integer min on the bits; NaN-scale blocks: cap 0)
  magic = 2**(p + h - m)            (p = max(floor(log2 y), emin): the value whose ulp is the
                                     format's grid step at y)
  s = y + magic                     (one add: rounds y to the grid, ties to even)
  placed = (s - magic) * 2**(bias - B)   (one exact fma: the code's magnitude in the input
                                     type's bits, format subnormals on its subnormals)
  code = (placed | sign) >> (h - m)
Under Triton's interpreter (CPU tests), which runs no inline PTX, the same kernel encodes each
half with _tl_quantize.codes_rne; tests/kernels/quantize/test_quantize_pairs.py checks the PTX text itself on CPU
with a PTX emulator, and the GPU tests check the kernel.
"""

import functools
from dataclasses import dataclass

import triton
import triton.language as tl

from .._tl_numerics import program_coordinates, scale_byte
from ._tl_quantize import (codes_rne, rne_block, chunk_tile, fused_tile, store_fp6_groups,
                           store_group_words)


@dataclass(frozen=True)
class HalfType:
    """A 16-bit input type of the pair kernels: its PTX name, mantissa bits and exponent bias."""
    name: str
    mantissa: int
    bias: int

    @property
    def exponent_mask(self) -> int:
        return 0x7FFF & ~((1 << self.mantissa) - 1)


BF16 = HalfType("bf16", 7, 127)
F16 = HalfType("f16", 10, 15)


def pairs_supported(fmt, half: HalfType = BF16) -> bool:
    """Formats the pair encode is exact for, from `half` inputs: floats of 4 or 6 bits (2 or 4
    codes per packed group), emin <= 0 (bias >= 1), at most 3 mantissa bits (the grid of y
    fits the half's mantissa), an emax well inside the half's range (no carry out of a 16-bit
    half). fp16 has 5 exponent bits: 2**(127 - byte) is applied as two fp16 factors, which
    cover the scales of every fp16 block when -12 <= emax <= 5 (127 - byte lies in
    [emax - 16, emax + 25] for amax in [2**-24, 2**16)); the magic and the placed code need
    emax + 10 - m + bias <= 30; and y below 2**-14, where fp16 products round, must have
    code 0 (emin - m >= -12)."""
    if fmt.kind == "int" or fmt.bits not in (4, 6) or fmt.mantissa_bits > 3:
        return False
    if fmt.min_exponent > 0 or fmt.emax > 100:
        return False
    if half == F16:
        m, emin, emax, bias = fmt.mantissa_bits, fmt.min_exponent, fmt.emax, fmt.exponent_bias
        return -12 <= emax <= 5 and emax + 10 - m + bias <= 30 and emin - m >= -12
    return True


def _pair(half: int) -> str:
    return f"0x{(half & 0xFFFF) * 0x10001:08X}"


@functools.lru_cache(maxsize=None)
def encode_pairs_ptx(fmt, half: HalfType = BF16) -> str:
    """The PTX of the pair encode for format `fmt` and `half` inputs: $0 (out) the two codes
    in bits 0.. and 16..; $1 x (half x2 bits); $2 2**(127 - byte) as half x2 (fp16: a first
    factor); $3 the cap (half bits of max_normal, or 0 in a NaN-scale half); $4 the sign bit's
    place in x >> shift (0 in a NaN-scale half); fp16: $5 the second factor of 2**(127 - byte).
    |x| is taken here, not passed in: a register fewer per word held across the two encodes.
    Constants in registers: the 16x2 / half x2 forms take no immediates."""
    m, emin, bias = fmt.mantissa_bits, fmt.min_exponent, fmt.exponent_bias
    h, t = half.mantissa, half.name
    lowest = (emin + half.bias) << h  # bits of 2**emin
    to_magic = (h - m) << h  # 2**p -> 2**(p + h - m)
    to_negative_placed = 0x8000 + ((h - m + bias - half.bias) << h)  # -(magic * 2**(bias - B))
    place = bias << h  # bits of 2**(bias - B)
    second_factor = f"mul.rn.{t}x2 ty, ty, $5;\n" if half == F16 else ""
    return (
        "{\n.reg .b32 ty, te, tm, tn, ts, tt, tk;\n"
        "and.b32 ty, $1, 0x7FFF7FFF;\n"
        f"mul.rn.{t}x2 ty, ty, $2;\n"
        + second_factor +
        "min.u16x2 ty, ty, $3;\n"
        f"and.b32 te, ty, {_pair(half.exponent_mask)};\n"
        f"mov.b32 tk, {_pair(lowest)};\n"
        "max.u16x2 te, te, tk;\n"
        f"add.u32 tm, te, {_pair(to_magic)};\n"
        f"add.u32 tn, te, {_pair(to_negative_placed)};\n"
        f"add.rn.{t}x2 ts, ty, tm;\n"
        f"mov.b32 tk, {_pair(place)};\n"
        f"fma.rn.{t}x2 ts, ts, tk, tn;\n"
        f"shr.u32 tt, $1, {sign_shift(fmt, half)};\n"
        "and.b32 tt, tt, $4;\n"
        "or.b32 ts, ts, tt;\n"
        f"shr.u32 $0, ts, {h - m};\n"
        "}"
    )


def sign_shift(fmt, half: HalfType = BF16) -> int:
    """x >> sign_shift puts x's sign bits (15, 31) on the code's sign bits before the final
    shift by h - m (bit bits - 1 + h - m of each half; h the half's mantissa bits)."""
    return 15 - (fmt.bits - 1) - (half.mantissa - fmt.mantissa_bits)


@triton.jit
def _max_pairs_ptx(a, b):
    return tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _max_pairs_emulated(a, b):
    """max.u16x2 of words whose halves are below 0x8000 (|x| bits)."""
    return tl.maximum(a & 0xFFFF, b & 0xFFFF) | (tl.maximum(a >> 16, b >> 16) << 16)


@triton.jit
def _max_pair_words(a, b, PTX: tl.constexpr):
    if PTX:
        return _max_pairs_ptx(a, b)
    else:
        return _max_pairs_emulated(a, b)


@triton.jit
def _pair_max(words, axis: tl.constexpr, PTX: tl.constexpr):
    """Per-half max of |x| words along `axis`. The interpreter runs a custom reduction one
    element at a time in Python, so it takes the two halves' maxima apart there."""
    if PTX:
        return tl.reduce(words, axis, _max_pairs_ptx)
    else:
        return tl.max(words & 0xFFFF, axis) | (tl.max(words >> 16, axis) << 16)


@triton.jit
def _half_f32_bits(halves, F16: tl.constexpr):
    """fp32 bits of the 16-bit values `halves` (int32, in bits 0..15)."""
    if F16:
        return halves.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) \
            .to(tl.int32, bitcast=True)
    else:
        return halves << 16


@triton.jit
def _half_bits(words, F16: tl.constexpr):
    """(fp32 bits of the low halves, of the high halves) of |x| words (halves below 0x8000)."""
    if F16:
        return _half_f32_bits(words & 0xFFFF, True), _half_f32_bits(words >> 16, True)
    else:
        return words << 16, words & -65536


@triton.jit
def _block_operands(byte_lo, byte_hi, PTX: tl.constexpr, F16: tl.constexpr,
                    BITS: tl.constexpr, MBITS: tl.constexpr, CAP: tl.constexpr):
    """The encode's per-block operands for the halves' scale bytes: PTX, (inverse, cap, sign,
    inverse2) as half x2 / 16x2 words, inverse2 the second fp16 factor of 2**(127 - byte)
    (bf16: unused); the interpreter's encode takes the bytes (lo | hi << 16)."""
    if PTX:
        if F16:  # 2**a * 2**b, a = floor(e / 2): normal fp16 factors, both >= 1 or both <= 1
            e_lo = tl.minimum(tl.maximum(127 - byte_lo, -28), 30)  # byte 0: a zero block
            e_hi = tl.minimum(tl.maximum(127 - byte_hi, -28), 30)
            a_lo = e_lo >> 1
            a_hi = e_hi >> 1
            inverse = ((a_lo + 15) << 10) | ((a_hi + 15) << 26)
            inverse2 = ((e_lo - a_lo + 15) << 10) | ((e_hi - a_hi + 15) << 26)
            SIGN: tl.constexpr = 1 << (BITS - 1 + 10 - MBITS)
        else:
            inv_lo = tl.where(byte_lo < 254, (254 - byte_lo) << 7, 0x40)  # 2**-127: subnormal
            inv_hi = tl.where(byte_hi < 254, (254 - byte_hi) << 7, 0x40)
            inverse = inv_lo | (inv_hi << 16)
            inverse2 = tl.zeros_like(byte_lo)
            SIGN: tl.constexpr = 1 << (BITS - 1 + 7 - MBITS)
        cap = tl.where(byte_lo == 255, 0, CAP) | (tl.where(byte_hi == 255, 0, CAP) << 16)
        sign = tl.where(byte_lo == 255, 0, SIGN) | (tl.where(byte_hi == 255, 0, SIGN) << 16)
        return inverse, cap, sign, inverse2
    else:
        unused = tl.zeros_like(byte_lo)
        return byte_lo | (byte_hi << 16), unused, unused, unused


@triton.jit
def _encode_pairs(x, inverse, cap, sign, inverse2, ENCODE: tl.constexpr, PTX: tl.constexpr,
                  F16: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                  EMIN: tl.constexpr, MAX_NORMAL: tl.constexpr):
    """Codes of the word pairs x as words (code of the low half in bits 0.., of the high half
    in bits 16..), with _block_operands' operands."""
    if PTX:
        if F16:
            return tl.inline_asm_elementwise(ENCODE, "=r,r,r,r,r,r",
                                             [x, inverse, cap, sign, inverse2],
                                             dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(ENCODE, "=r,r,r,r,r", [x, inverse, cap, sign],
                                             dtype=tl.int32, is_pure=True, pack=1)
    else:
        codes = tl.zeros_like(x)
        for half in tl.static_range(2):
            byte = (inverse >> (16 * half)) & 0xFFFF
            bits = _half_f32_bits((x >> (16 * half)) & 0xFFFF, F16)
            inv, cap_h, sign_h = rne_block(byte, BITS, MAX_NORMAL)
            code = codes_rne(bits.to(tl.float32, bitcast=True), bits & 0x7FFFFFFF, inv, cap_h,
                              sign_h, 1, BITS, MBITS, EMIN)
            codes = codes | (code << (16 * half))
        return codes


@triton.jit
def _fp4_byte(codes):
    """The byte of a code word's two fp4 codes (the low half's code in bits 0..3, the high
    half's in 16..19): low | high << 4."""
    return (codes | (codes >> 12)) & 0xFF


@triton.jit
def _fp6_group_words(first, second):
    """The 24-bit groups of the four codes in code words `first` and `second` (the next two
    columns)."""
    return ((first | (first >> 10)) & 0xFFF) | (((second | (second >> 10)) & 0xFFF) << 12)


@triton.jit
def quantize_rows_pairs_kernel(
    x_ptr, scale_ptr, data_ptr, R, stride_b, stride_r, tiles_r, tiles_c, blocks_c, row_bytes,
    ENCODE: tl.constexpr, PTX: tl.constexpr, F16: tl.constexpr, BLOCK: tl.constexpr,
    TILE_R: tl.constexpr, TILE_NB: tl.constexpr, I64: tl.constexpr, GRID: tl.constexpr,
    CPG: tl.constexpr, CAP: tl.constexpr, SCALE_MODE: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_NORMAL: tl.constexpr,
    RCEIL_FRAC: tl.constexpr, RCEIL_ZERO: tl.constexpr,
):
    """_tl_quantize.quantize_rows_thread_kernel's outputs from x as int32 words [B, R, C / 2]
    (unit stride, strides in words; C % BLOCK == 0, BLOCK in 8..64, fp6: 32 or 64): one whole
    block per thread, read as 16-byte chunks of 4 words. Scale [B*R, blocks_c]; data
    [B*R, row_bytes]. F16: fp16 input, else bf16; CAP: the input type's bits of max_normal."""
    b, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rows, blocks, ok2, first = chunk_tile(tr, tc, R, blocks_c, BLOCK // 2, 4, TILE_R, TILE_NB)
    ok = ok2[:, :, None, None]
    x = tl.load(x_ptr + b * stride_b + rows[None, :, None, None] * stride_r + first
                + tl.arange(0, 4)[None, None, None, :], mask=ok, other=0)  # [NB, TR, NCH, 4]
    lo, hi = _half_bits(_pair_max(_pair_max(x & 0x7FFF7FFF, 3, PTX), 2, PTX), F16)
    byte = scale_byte(tl.maximum(lo, hi), SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC,
                      RCEIL_ZERO)  # [NB, TR]
    line = b * R + rows  # [TR]
    tl.store(scale_ptr + line[None, :] * blocks_c + blocks[:, None], byte.to(tl.uint8), mask=ok2)
    inverse, cap, sign, inverse2 = _block_operands(byte, byte, PTX, F16, BITS, MBITS, CAP)
    codes = _encode_pairs(x, inverse[:, :, None, None], cap[:, :, None, None],
                          sign[:, :, None, None], inverse2[:, :, None, None], ENCODE, PTX, F16,
                          BITS, MBITS, EMIN, MAX_NORMAL)
    NB: tl.constexpr = TILE_NB
    NCH: tl.constexpr = BLOCK // 8
    row_ptr = data_ptr + line * row_bytes  # [TR]
    evens, odds = tl.split(tl.reshape(codes, [NB, TILE_R, NCH, 2, 2]))  # words (0, 2), (1, 3)
    if CPG == 2:  # a word's two codes are one byte; a chunk's four bytes one int32
        pairs = _fp4_byte(evens) | (_fp4_byte(odds) << 8)  # [NB, TR, NCH, 2]: bytes (0, 1), (2, 3)
        low, high = tl.split(pairs)
        ptr32 = row_ptr.to(tl.pointer_type(tl.int32))[None, :, None] \
            + blocks[:, None, None] * (BLOCK // 8) + tl.arange(0, NCH)[None, None, :]
        tl.store(ptr32, low | (high << 16), mask=ok2[:, :, None])
    else:
        store_fp6_groups(row_ptr[None, :, None, None], _fp6_group_words(evens, odds), blocks,
                         ok, BLOCK)


@triton.jit
def _rows_phase_pairs(x, rows, b, tc, R, cblocks, scale_ptr, data_ptr, blocks_c, row_bytes,
                      A: tl.constexpr, NBC: tl.constexpr, BLOCK: tl.constexpr, CPG: tl.constexpr,
                      WORDS: tl.constexpr, ENCODE: tl.constexpr, PTX: tl.constexpr,
                      F16: tl.constexpr, SCALE_MODE: tl.constexpr, BITS: tl.constexpr,
                      MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                      MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr,
                      RCEIL_ZERO: tl.constexpr, CAP: tl.constexpr):
    """Row-wise quantize of one phase: words x [A rows, NBC blocks, BLOCK / 2] of rows `rows`."""
    BW: tl.constexpr = BLOCK // 2
    lo, hi = _half_bits(_pair_max(x & 0x7FFF7FFF, 2, PTX), F16)  # [A, NBC]
    byte = scale_byte(tl.maximum(lo, hi), SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC,
                      RCEIL_ZERO)
    line = b * R + rows  # [A]
    row_ok = rows < R
    tl.store(scale_ptr + line[:, None] * blocks_c + cblocks[None, :], byte.to(tl.uint8),
             mask=row_ok[:, None] & (cblocks < blocks_c)[None, :])
    inverse, cap, sign, inverse2 = _block_operands(byte, byte, PTX, F16, BITS, MBITS, CAP)
    codes = _encode_pairs(x, inverse[:, :, None], cap[:, :, None], sign[:, :, None],
                          inverse2[:, :, None], ENCODE, PTX, F16, BITS, MBITS, EMIN, MAX_NORMAL)
    rows_ptr = data_ptr + line * row_bytes
    if CPG == 2:  # a word's two codes are one byte
        j = (cblocks * BW)[None, :, None] + tl.arange(0, BW)[None, None, :]
        tl.store(rows_ptr[:, None, None] + j, _fp4_byte(codes).to(tl.uint8),
                 mask=row_ok[:, None, None] & (j < row_bytes))
    else:  # two words' four codes are one 3-byte group
        G: tl.constexpr = BLOCK // 4
        first, second = tl.split(tl.reshape(codes, [A, NBC, G, 2]))
        word = _fp6_group_words(first, second)
        q = (cblocks * G)[None, :, None] + tl.arange(0, G)[None, None, :]
        limit = row_bytes // 3
        store_group_words(rows_ptr, word, q, tc * (NBC * G), limit, row_ok,
                          row_ok[:, None, None] & (q < limit), A, NBC, G, WORDS)


@triton.jit
def quantize_fused_pairs_kernel(
    x_ptr, scale_r_ptr, data_r_ptr, scale_c_ptr, data_c_ptr, R, W, stride_b, stride_r,
    tiles_r, tiles_c, blocks_r, blocks_c, groups_r, row_bytes,
    ENCODE: tl.constexpr, PTX: tl.constexpr, F16: tl.constexpr, BLOCK: tl.constexpr,
    TILE_NBR: tl.constexpr, TILE_NBC: tl.constexpr, VEC: tl.constexpr, I64: tl.constexpr,
    GRID: tl.constexpr, CPG: tl.constexpr, WORDS: tl.constexpr, CAP: tl.constexpr,
    SCALE_MODE: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
    EMAX: tl.constexpr, MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr,
    RCEIL_ZERO: tl.constexpr,
):
    """quantize_fused_kernel's two outputs from x as int32 words [B, R, W] (W = C / 2, unit
    stride; strides in words), with scale_c and data_c addressed as 16-bit pairs of columns
    ([B, blocks_r, W] and [B, groups_r * bytes_per_group, W]).

    Per phase p the tile is [TILE_NBR * BLOCK / CPG rows, TILE_NBC * BLOCK / 2 words], rows
    rb * BLOCK + g * CPG + p, as in quantize_fused_kernel. F16: fp16 input, else bf16; CAP:
    the input type's bits of max_normal.
    """
    G: tl.constexpr = BLOCK // CPG
    A: tl.constexpr = TILE_NBR * G  # rows per phase
    BW: tl.constexpr = BLOCK // 2
    TW: tl.constexpr = TILE_NBC * BW
    b, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rblocks, cblocks, i, first = fused_tile(tr, tc, TILE_NBR, TILE_NBC, BLOCK, CPG)
    w = tl.max_contiguous(tc * TW + tl.arange(0, TW), VEC)
    w_ok = (w < W)[None, :]
    ptr = x_ptr + b * stride_b + first[:, None] * stride_r + w[None, :]
    x0 = tl.load(ptr, mask=(first < R)[:, None] & w_ok, other=0)
    x1 = tl.load(ptr + stride_r, mask=(first + 1 < R)[:, None] & w_ok, other=0)
    x2 = x0
    x3 = x0
    if CPG == 4:
        x2 = tl.load(ptr + 2 * stride_r, mask=(first + 2 < R)[:, None] & w_ok, other=0)
        x3 = tl.load(ptr + 3 * stride_r, mask=(first + 3 < R)[:, None] & w_ok, other=0)
    xa0 = x0 & 0x7FFF7FFF
    xa1 = x1 & 0x7FFF7FFF
    xa2 = x2 & 0x7FFF7FFF
    xa3 = x3 & 0x7FFF7FFF
    # Column blocks: the per-half max over g, then over the phases ([NBR, TW] words).
    pairs = _max_pair_words(xa0, xa1, PTX)
    if CPG == 4:
        pairs = _max_pair_words(pairs, _max_pair_words(xa2, xa3, PTX), PTX)
    lo, hi = _half_bits(_pair_max(tl.reshape(pairs, [TILE_NBR, G, TW]), 1, PTX), F16)
    byte_lo = scale_byte(lo, SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO)
    byte_hi = scale_byte(hi, SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO)
    tl.store(scale_c_ptr + (b * blocks_r + rblocks)[:, None] * W + w[None, :],
             (byte_lo | (byte_hi << 8)).to(tl.int16), mask=(rblocks < blocks_r)[:, None] & w_ok)
    inverse, cap, sign, inverse2 = _block_operands(byte_lo, byte_hi, PTX, F16, BITS, MBITS, CAP)
    inverse = tl.reshape(tl.broadcast_to(inverse[:, None, :], [TILE_NBR, G, TW]), [A, TW])
    cap = tl.reshape(tl.broadcast_to(cap[:, None, :], [TILE_NBR, G, TW]), [A, TW])
    sign = tl.reshape(tl.broadcast_to(sign[:, None, :], [TILE_NBR, G, TW]), [A, TW])
    inverse2 = tl.reshape(tl.broadcast_to(inverse2[:, None, :], [TILE_NBR, G, TW]), [A, TW])
    c0 = _encode_pairs(x0, inverse, cap, sign, inverse2, ENCODE, PTX, F16, BITS, MBITS, EMIN,
                       MAX_NORMAL)
    c1 = _encode_pairs(x1, inverse, cap, sign, inverse2, ENCODE, PTX, F16, BITS, MBITS, EMIN,
                       MAX_NORMAL)
    q = tr * (TILE_NBR * G) + i  # packed group index along R
    out_c = data_c_ptr + b * (groups_r * (3 if CPG == 4 else 1)) * W + w[None, :]
    ok = (q < groups_r)[:, None] & w_ok
    if CPG == 2:  # bytes (c0 | c1 << 4) of the two columns, as one 16-bit store
        word = c0 | (c1 << 4)
        tl.store(out_c + q[:, None] * W, ((word | (word >> 8)) & 0xFFFF).to(tl.int16), mask=ok)
    else:  # per column the group c0 | c1 << 6 | c2 << 12 | c3 << 18: bytes k = 0, 1, 2
        c2 = _encode_pairs(x2, inverse, cap, sign, inverse2, ENCODE, PTX, F16, BITS, MBITS,
                           EMIN, MAX_NORMAL)
        c3 = _encode_pairs(x3, inverse, cap, sign, inverse2, ENCODE, PTX, F16, BITS, MBITS,
                           EMIN, MAX_NORMAL)
        low = c0 | (c1 << 6)  # 12 bits per half
        high = c2 | (c3 << 6)
        byte0 = low & 0x00FF00FF
        byte1 = ((low >> 8) & 0x000F000F) | ((high << 4) & 0x00F000F0)
        byte2 = (high >> 4) & 0x00FF00FF
        tl.store(out_c + (3 * q)[:, None] * W, ((byte0 | (byte0 >> 8)) & 0xFFFF).to(tl.int16),
                 mask=ok)
        tl.store(out_c + (3 * q + 1)[:, None] * W,
                 ((byte1 | (byte1 >> 8)) & 0xFFFF).to(tl.int16), mask=ok)
        tl.store(out_c + (3 * q + 2)[:, None] * W,
                 ((byte2 | (byte2 >> 8)) & 0xFFFF).to(tl.int16), mask=ok)

    # Row blocks, phase by phase.
    NBC: tl.constexpr = TILE_NBC
    _rows_phase_pairs(tl.reshape(x0, [A, NBC, BW]), first, b, tc, R, cblocks, scale_r_ptr,
                      data_r_ptr, blocks_c, row_bytes, A, NBC, BLOCK, CPG, WORDS, ENCODE, PTX,
                      F16, SCALE_MODE, BITS, MBITS, EMIN, EMAX, MAX_NORMAL, RCEIL_FRAC,
                      RCEIL_ZERO, CAP)
    _rows_phase_pairs(tl.reshape(x1, [A, NBC, BW]), first + 1, b, tc, R, cblocks, scale_r_ptr,
                      data_r_ptr, blocks_c, row_bytes, A, NBC, BLOCK, CPG, WORDS, ENCODE, PTX,
                      F16, SCALE_MODE, BITS, MBITS, EMIN, EMAX, MAX_NORMAL, RCEIL_FRAC,
                      RCEIL_ZERO, CAP)
    if CPG == 4:
        _rows_phase_pairs(tl.reshape(x2, [A, NBC, BW]), first + 2, b, tc, R, cblocks,
                          scale_r_ptr, data_r_ptr, blocks_c, row_bytes, A, NBC, BLOCK, CPG, WORDS,
                          ENCODE, PTX, F16, SCALE_MODE, BITS, MBITS, EMIN, EMAX, MAX_NORMAL,
                          RCEIL_FRAC, RCEIL_ZERO, CAP)
        _rows_phase_pairs(tl.reshape(x3, [A, NBC, BW]), first + 3, b, tc, R, cblocks,
                          scale_r_ptr, data_r_ptr, blocks_c, row_bytes, A, NBC, BLOCK, CPG, WORDS,
                          ENCODE, PTX, F16, SCALE_MODE, BITS, MBITS, EMIN, EMAX, MAX_NORMAL,
                          RCEIL_FRAC, RCEIL_ZERO, CAP)

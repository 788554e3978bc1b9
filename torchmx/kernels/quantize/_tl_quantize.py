"""Triton quantize kernels: blocks along the contiguous axis ("rows"), blocks along a strided
axis ("cols", no transpose pass), and one fused pass writing both.

Every kernel sees the input as a 3-d strided view [B, R, C] and writes contiguous outputs:
  rows:  blocks along C; scale [B, R, ceil(C / BLOCK)], data [B, R, packed(C)]
  cols:  blocks along R; scale [B, ceil(R / BLOCK), C], data [B, packed(R), C]
  fused: both of the above from one read of the input.
  fake quantize: blocks along C, the MX values in x's dtype (quantize, then dequantize).
An element's logical (row-major) index, the counter of stochastic rounding, is (b*R + r)*C + c.

Packing happens in registers: along C a tile of codes is reshaped so that the codes of one
packed group share a thread and split apart; along R the tile is loaded as CPG "phases"
(rows r = g*CPG + p), so the codes of one group sit in the same lane of CPG tensors and combine
elementwise. Blocks must hold whole groups (BLOCK % CPG == 0); the host packs other block sizes
with a separate pass (see _tl_packing.py).
"""

import triton
import triton.language as tl

from .._tl_numerics import (ROUND_EVEN, ROUND_STOCHASTIC, encode, inverse_scale, load_f32,
                           program_coordinates, scale_byte, to_output, uniform_from_index)
from ._tl_dequantize import scaled_values


@triton.jit
def _codes(x, a, byte, index, key, HW_FP8: tl.constexpr, ROUNDING: tl.constexpr,
           IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
           MAX_CODE: tl.constexpr, BIG_EMAX: tl.constexpr):
    """Codes (int32) of fp32 x (|x| bits `a`) in blocks of scale byte `byte` (broadcasts).

    Lanes outside the tensor hold x = 0 and get code 0, which is also what the packing of a
    partial group needs. A NaN-scale block stores code 0.
    """
    inverse = inverse_scale(byte)  # y = x / 2**(byte - 127), exact
    if HW_FP8 != 0:  # cvt.rn.satfinite: round half to even, saturate; equal to encode()
        y = tl.where(byte == 255, 0.0, x * inverse)
        if HW_FP8 == 1:
            return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
        else:
            return y.to(tl.float8e5).to(tl.uint8, bitcast=True).to(tl.int32)
    elif ROUNDING == ROUND_EVEN and IS_INT:
        return _int_codes_even(x, a, byte, inverse, MBITS, MAX_CODE)
    else:
        if ROUNDING == ROUND_STOCHASTIC:
            uniform = uniform_from_index(key, index)
        else:
            uniform = 0.0
        magnitude = a.to(tl.float32, bitcast=True) * inverse
        code = encode(magnitude, x.to(tl.int32, bitcast=True), uniform, ROUNDING, IS_INT, BITS,
                      MBITS, EMIN, MAX_CODE, BIG_EMAX)
        return tl.where(byte == 255, 0, code)


@triton.jit
def codes_rne(x, a, inverse, cap, sign_mask, ENC: tl.constexpr, BITS: tl.constexpr,
               MBITS: tl.constexpr, EMIN: tl.constexpr):
    """Float-format codes with round half to even (formats with emin <= 0, not BIG_EMAX):
    _codes()'s codes in fewer integer / logic instructions, which Hopper issues at half the
    rate of fp32 multiplies and adds.

    `inverse`, `cap` and `sign_mask` are per block (rne_block): 2**(127 - byte); `cap` the
    bits of MAX_NORMAL, or 0 where byte is 255; `sign_mask` the code's sign bit, or 0 where
    byte is 255. min(|y|, cap), an integer min of the (non-negative) fp32 bits, clamps to the
    largest code (rounding is monotone and MAX_NORMAL is on the grid) and sends every element
    of a NaN-scale block (finite, Inf or NaN) to 0. |y| is rounded to the grid by the magic
    2**(p + 23 - m), p = max(floor(log2 |y|), emin): r = (|y| + magic) - magic, the first
    addition rounds, the second is exact. r * 2**(bias - 127) (exact) puts the code in the
    fp32 bits above the low 23 - m (format subnormals on fp32 subnormals), read by one shift.
    ENC 1 takes the magic's exponent from |y|'s bits. ENC 2, for inputs of at most 20
    significant bits (bf16, fp16), uses magic = max(|y|, 2**emin) * 2**(23 - m): its lowest
    bit is the grid step (so ties still go to even) and |y| + magic stays in magic's binade,
    which 24-bit significands (fp32 inputs) could leave (a test checks that this matters)."""
    # min over the bits (y >= 0, NaN and Inf above every finite value): no NaN survives.
    y = tl.minimum((a.to(tl.float32, bitcast=True) * inverse).to(tl.int32, bitcast=True),
                   cap).to(tl.float32, bitcast=True)
    if ENC == 2:
        smallest = tl.full([], (EMIN + 127) << 23, tl.int32).to(tl.float32, bitcast=True)
        magic = tl.maximum(y, smallest) \
            * tl.full([], (150 - MBITS) << 23, tl.int32).to(tl.float32, bitcast=True)
    else:
        magic_bits = tl.maximum(y.to(tl.int32, bitcast=True) & 0x7F800000, (EMIN + 127) << 23) \
            + ((23 - MBITS) << 23)
        magic = magic_bits.to(tl.float32, bitcast=True)
    r = (y + magic) - magic
    placed = r * tl.full([], (1 - EMIN) << 23, tl.int32).to(tl.float32, bitcast=True)
    code = placed.to(tl.int32, bitcast=True) >> (23 - MBITS)
    return code | ((x.to(tl.int32, bitcast=True) >> (32 - BITS)) & sign_mask)


@triton.jit
def rne_block(byte, BITS: tl.constexpr, MAX_NORMAL: tl.constexpr):
    """Per-block operands of codes_rne: (inverse, cap, sign_mask) of scale bytes `byte`."""
    nan_scale = byte == 255
    cap = tl.full([], MAX_NORMAL, tl.float32).to(tl.int32, bitcast=True)
    # 2**(127 - byte): a normal fp32 for bytes 0..253, 2**-127 for 254 (255: unused, cap 0).
    inverse = tl.where(byte < 254, (254 - byte) << 23, 0x00400000).to(tl.float32, bitcast=True)
    return inverse, tl.where(nan_scale, 0, cap), tl.where(nan_scale, 0, 1 << (BITS - 1))


@triton.jit
def _int_codes_even(x, a, byte, inverse, MBITS: tl.constexpr, MAX_CODE: tl.constexpr):
    """MXINT8 codes with round half to even: encode()'s codes in fewer instructions (fewer
    registers too: the fused kernel went from 193 to 128 per thread). y * 64 + 1.5 * 2**23
    rounds y * 64 to an integer in the sum's low bits (|y * 64| < 2**8; the product is exact).
    A NaN-scale block multiplies by 0 instead of selecting per element: with its NaN and Inf
    replaced by a finite value, every element gives code 0."""
    inverse = tl.where(byte == 255, 0.0, inverse)
    finite = tl.minimum(a, 0x7F7FFFFF) | (x.to(tl.int32, bitcast=True) & -2147483648)
    steps = (finite.to(tl.float32, bitcast=True) * inverse) * (1 << MBITS) + 12582912.0
    code = steps.to(tl.int32, bitcast=True) - 0x4B400000
    return tl.maximum(tl.minimum(code, MAX_CODE), -MAX_CODE)


@triton.jit
def _abs_bits(x):
    """|x| as int32 fp32 bits: orders like |x|, with NaN and Inf above every finite value."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _store_packed_last(rows_ptr, codes, pos, start, limit, rows_ok, A: tl.constexpr, NB: tl.constexpr,
                       CPG: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_P: tl.constexpr, WORDS: tl.constexpr):
    """Store codes [A, NB, BLOCK_P] packed along the last axis.

    `rows_ptr` [A] points at each row's packed bytes, `pos` [1, NB, 1] is the packed-group
    index of each block's first group (block * BLOCK / CPG), `start` (a scalar) the first of
    them, `limit` the number of groups in a row and `rows_ok` [A] the rows in range.
    """
    ptr = rows_ptr[:, None, None]
    mask = rows_ok[:, None, None]
    G: tl.constexpr = BLOCK_P // CPG
    g = tl.arange(0, G)[None, None, :]
    q = pos + g  # packed-group index
    ok = mask & (g < BLOCK // CPG) & (q < limit)
    if CPG == 1:
        tl.store(ptr + q, codes.to(tl.uint8), mask=ok)
    elif CPG == 2:
        low, high = tl.split(tl.reshape(codes, [A, NB, G, 2]))
        tl.store(ptr + q, (low | (high << BITS)).to(tl.uint8), mask=ok)
    else:
        even, odd = tl.split(tl.reshape(codes, [A, NB, G, 2, 2]))
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
        word = c0 | (c1 << BITS) | (c2 << (2 * BITS)) | (c3 << (3 * BITS))
        store_group_words(rows_ptr, word, q, start, limit, rows_ok, ok, A, NB, G, WORDS)


@triton.jit
def store_group_words(rows_ptr, word, q, start, limit, rows_ok, ok, A: tl.constexpr,
                      NB: tl.constexpr, G: tl.constexpr, WORDS: tl.constexpr):
    """Store fp6 groups (24-bit words [A, NB, G] of 4 codes) at byte 3 * q of each row
    (`q` their group index, `ok` their mask; the other arguments as in _store_packed_last)."""
    if WORDS:
        # 16 codes = 4 groups = 12 bytes = 3 aligned 32-bit words. Three word stores per
        # 16 codes instead of twelve byte stores 3 apart (partial sectors: very slow).
        # WORDS needs BLOCK % 16 == 0 and rows of a multiple of 16 codes (host checks).
        NC: tl.constexpr = NB * G // 4  # 16-code chunks in the tile
        even_g, odd_g = tl.split(tl.reshape(word, [A, NC, 2, 2]))
        w0, w2 = tl.split(even_g)
        w1, w3 = tl.split(odd_g)
        word0 = w0 | (w1 << 24)
        word1 = ((w1 >> 8) & 0xFFFF) | (w2 << 16)
        word2 = ((w2 >> 16) & 0xFF) | (w3 << 8)
        chunk = start // 4 + tl.arange(0, NC)[None, :]  # chunk index in the row
        ptr32 = rows_ptr.to(tl.pointer_type(tl.int32))[:, None] + 3 * chunk
        ok32 = rows_ok[:, None] & (chunk < limit // 4)
        tl.store(ptr32, word0, mask=ok32)
        tl.store(ptr32 + 1, word1, mask=ok32)
        tl.store(ptr32 + 2, word2, mask=ok32)
    else:
        ptr = rows_ptr[:, None, None]
        tl.store(ptr + 3 * q, (word & 0xFF).to(tl.uint8), mask=ok)
        tl.store(ptr + 3 * q + 1, ((word >> 8) & 0xFF).to(tl.uint8), mask=ok)
        tl.store(ptr + 3 * q + 2, ((word >> 16) & 0xFF).to(tl.uint8), mask=ok)


@triton.jit
def _phase_codes(x0, a0, x1, a1, x2, a2, x3, a3, byte, index, C, key, CPG: tl.constexpr,
                 HW_FP8: tl.constexpr, ROUNDING: tl.constexpr, IS_INT: tl.constexpr,
                 BITS: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                 MAX_CODE: tl.constexpr, BIG_EMAX: tl.constexpr):
    """_codes of the CPG phases of a tile along R (phase p: rows g * CPG + p, logical indices
    index + p * C); the phases past CPG repeat phase 0 and go unused."""
    c0 = _codes(x0, a0, byte, index, key, HW_FP8, ROUNDING, IS_INT, BITS, MBITS, EMIN,
                MAX_CODE, BIG_EMAX)
    c1 = c0
    c2 = c0
    c3 = c0
    if CPG >= 2:
        c1 = _codes(x1, a1, byte, index + C, key, HW_FP8, ROUNDING, IS_INT, BITS, MBITS, EMIN,
                    MAX_CODE, BIG_EMAX)
    if CPG == 4:
        c2 = _codes(x2, a2, byte, index + 2 * C, key, HW_FP8, ROUNDING, IS_INT, BITS, MBITS,
                    EMIN, MAX_CODE, BIG_EMAX)
        c3 = _codes(x3, a3, byte, index + 3 * C, key, HW_FP8, ROUNDING, IS_INT, BITS, MBITS,
                    EMIN, MAX_CODE, BIG_EMAX)
    return c0, c1, c2, c3


@triton.jit
def _store_packed_phases(ptr, c0, c1, c2, c3, q, stride, ok, CPG: tl.constexpr, BITS: tl.constexpr):
    """Store codes packed across phases: group q holds c0..c(CPG-1) (same shape, same lanes);
    its bytes go to ptr + (q * bytes_per_group + i) * stride."""
    if CPG == 1:
        tl.store(ptr + q * stride, c0.to(tl.uint8), mask=ok)
    elif CPG == 2:
        tl.store(ptr + q * stride, (c0 | (c1 << BITS)).to(tl.uint8), mask=ok)
    else:
        word = c0 | (c1 << BITS) | (c2 << (2 * BITS)) | (c3 << (3 * BITS))
        tl.store(ptr + (3 * q) * stride, (word & 0xFF).to(tl.uint8), mask=ok)
        tl.store(ptr + (3 * q + 1) * stride, ((word >> 8) & 0xFF).to(tl.uint8), mask=ok)
        tl.store(ptr + (3 * q + 2) * stride, ((word >> 16) & 0xFF).to(tl.uint8), mask=ok)


@triton.jit(do_not_specialize=["key"])
def quantize_rows_kernel(
    x_ptr, scale_ptr, data_ptr, R, C, stride_b, stride_r, stride_c, tiles_r, tiles_c,
    blocks_c, groups_c, key,
    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, TILE_R: tl.constexpr, TILE_NB: tl.constexpr,
    I64: tl.constexpr, GRID: tl.constexpr, CPG: tl.constexpr, HW_FP8: tl.constexpr,
    WORDS: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr, RCEIL_ZERO: tl.constexpr,
    BIG_EMAX: tl.constexpr,
):
    """Blocks along C. Scale [B*R, blocks_c]; data [B*R, groups_c * bytes_per_group]."""
    b, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rows = tr * TILE_R + tl.arange(0, TILE_R)
    blocks = tc * TILE_NB + tl.arange(0, TILE_NB)
    t = tl.arange(0, BLOCK_P)
    cols = blocks[:, None] * BLOCK + t[None, :]  # [NB, BP]
    row_ok = rows < R
    mask = row_ok[:, None, None] & (cols < C)[None, :, :]
    if BLOCK_P != BLOCK:
        mask = mask & (t < BLOCK)[None, None, :]
    x = load_f32(x_ptr + b * stride_b + rows[:, None, None] * stride_r + cols[None, :, :] * stride_c,
                 mask)
    a = _abs_bits(x)
    amax = tl.max(a, axis=2)  # [TR, NB]
    byte = scale_byte(amax, SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO)
    line = b * R + rows  # [TR]
    tl.store(scale_ptr + line[:, None] * blocks_c + blocks[None, :], byte.to(tl.uint8),
             mask=row_ok[:, None] & (blocks < blocks_c)[None, :])
    index = 0
    if ROUNDING == ROUND_STOCHASTIC:
        index = line.to(tl.int64)[:, None, None] * C + cols[None, :, :]
    codes = _codes(x, a, byte[:, :, None], index, key, HW_FP8, ROUNDING, IS_INT, BITS, MBITS,
                   EMIN, MAX_CODE, BIG_EMAX)
    bytes_per_group: tl.constexpr = 3 if CPG == 4 else 1
    _store_packed_last(data_ptr + line * (groups_c * bytes_per_group), codes,
                       (blocks * (BLOCK // CPG))[None, :, None], tc * (TILE_NB * (BLOCK // CPG)),
                       groups_c, row_ok, TILE_R, TILE_NB, CPG, BITS, BLOCK, BLOCK_P, WORDS)


@triton.jit
def _store_chunks(row_ptr, codes, blocks, first, ok, BLOCK: tl.constexpr, CW: tl.constexpr,
                  CPG: tl.constexpr, BITS: tl.constexpr):
    """Store codes [NB, TR, NCH, CW] packed: chunk (b, r, j) holds the codes of columns
    first[b, 0, j, 0] + 0..CW-1 of the row at row_ptr[0, r, 0, 0]; ok [NB, TR, 1, 1]. The CW
    codes of a chunk sit in one thread, so a chunk is one vector store (fp6: every 32 codes of
    a block, 24 bytes, leave as three 8-byte stores; BLOCK % 32 == 0, CW 4 or 8)."""
    NB: tl.constexpr = codes.shape[0]
    TR: tl.constexpr = codes.shape[1]
    NCH: tl.constexpr = codes.shape[2]
    if CPG == 1:
        tl.store(row_ptr + first + tl.arange(0, CW)[None, None, None, :], codes.to(tl.uint8),
                 mask=ok)
    elif CPG == 2:
        low, high = tl.split(tl.reshape(codes, [NB, TR, NCH, CW // 2, 2]))
        tl.store(row_ptr + first // 2 + tl.arange(0, CW // 2)[None, None, None, :],
                 (low | (high << BITS)).to(tl.uint8), mask=ok)
    else:  # two 4-code groups per 8 codes (one chunk of 16-bit inputs, two of fp32)
        even, odd = tl.split(tl.reshape(codes, [NB, TR, BLOCK // 8, 2, 2, 2]))
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
        store_fp6_groups(row_ptr, c0 | (c1 << BITS) | (c2 << (2 * BITS)) | (c3 << (3 * BITS)),
                         blocks, ok, BLOCK)


@triton.jit
def store_fp6_groups(row_ptr, groups, blocks, ok, BLOCK: tl.constexpr):
    """Store 24-bit fp6 groups [NB, TR, NCH, 2] (group 2j + i of each block at [.., j, i]) of
    blocks `blocks` [NB] in the row at row_ptr [1, TR, 1, 1]: every 32 codes (8 groups, 24
    bytes) leave as three aligned 8-byte stores (BLOCK % 32 == 0)."""
    NB: tl.constexpr = groups.shape[0]
    TR: tl.constexpr = groups.shape[1]
    NP: tl.constexpr = groups.shape[2] // 4
    e, o = tl.split(tl.reshape(groups, [NB, TR, NP, 2, 2, 2]))  # group 4a + 2b + c
    e0, e1 = tl.split(e)
    o0, o1 = tl.split(o)
    g0, g4 = tl.split(e0)
    g2, g6 = tl.split(e1)
    g1, g5 = tl.split(o0)
    g3, g7 = tl.split(o1)
    ptr32 = row_ptr.to(tl.pointer_type(tl.int32)) + blocks[:, None, None, None] * (BLOCK // 16 * 3) \
        + tl.arange(0, NP)[None, None, :, None] * 6
    pair = tl.arange(0, 2)[None, None, None, :]
    tl.store(ptr32 + pair, tl.join(g0 | (g1 << 24), (g1 >> 8) | (g2 << 16)), mask=ok)
    tl.store(ptr32 + 2 + pair, tl.join((g2 >> 16) | (g3 << 8), g4 | (g5 << 24)), mask=ok)
    tl.store(ptr32 + 4 + pair, tl.join((g5 >> 8) | (g6 << 16), (g6 >> 16) | (g7 << 8)),
             mask=ok)


@triton.jit
def chunk_tile(tr, tc, R, blocks_c, BLOCK: tl.constexpr, CW: tl.constexpr,
               TILE_R: tl.constexpr, TILE_NB: tl.constexpr):
    """Indices of a one-block-per-thread rows tile [TILE_NB blocks, TILE_R rows, BLOCK / CW
    chunks, CW]: rows [TR], blocks [NB], ok [NB, TR] and first [NB, 1, NCH, 1], the column of
    each chunk's first element. CW elements are one 16-byte access; Triton gives the threads to
    the leading dims (blocks first, so a warp reads along a row) and keeps the chunk dim in
    registers: all chunks of a block are in one thread."""
    rows = tr * TILE_R + tl.arange(0, TILE_R)
    blocks = tc * TILE_NB + tl.arange(0, TILE_NB)
    ok = (blocks < blocks_c)[:, None] & (rows < R)[None, :]
    first = blocks[:, None, None, None] * BLOCK + tl.arange(0, BLOCK // CW)[None, None, :, None] * CW
    return rows, blocks, ok, first


@triton.jit(do_not_specialize=["key"])
def quantize_rows_thread_kernel(
    x_ptr, scale_ptr, data_ptr, R, C, stride_b, stride_r, tiles_r, tiles_c, blocks_c, row_bytes,
    key, BLOCK: tl.constexpr, CW: tl.constexpr, TILE_R: tl.constexpr, TILE_NB: tl.constexpr,
    I64: tl.constexpr, GRID: tl.constexpr, CPG: tl.constexpr, HW_FP8: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr, RCEIL_ZERO: tl.constexpr,
    BIG_EMAX: tl.constexpr,
):
    """Blocks along C (unit stride, C % BLOCK == 0), one whole block per thread (chunk_tile).
    Scale [B*R, blocks_c]; data [B*R, packed(C)]. The amax is a register loop (no shuffles),
    the scale math runs once per block, every load feeds that amax (so all are issued before
    any arithmetic) and each chunk leaves as one vector store."""
    b, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rows, blocks, ok2, first = chunk_tile(tr, tc, R, blocks_c, BLOCK, CW, TILE_R, TILE_NB)
    ok = ok2[:, :, None, None]
    cols = first + tl.arange(0, CW)[None, None, None, :]  # [NB, 1, NCH, CW]
    x = load_f32(x_ptr + b * stride_b + rows[None, :, None, None] * stride_r + cols, ok)
    a = _abs_bits(x)
    amax = tl.max(tl.max(a, axis=3), axis=2)  # [NB, TR]
    byte = scale_byte(amax, SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO)
    line = b * R + rows  # [TR]
    tl.store(scale_ptr + line[None, :] * blocks_c + blocks[:, None], byte.to(tl.uint8), mask=ok2)
    index = 0
    if ROUNDING == ROUND_STOCHASTIC:
        index = line.to(tl.int64)[None, :, None, None] * C + cols
    codes = _codes(x, a, byte[:, :, None, None], index, key, HW_FP8, ROUNDING, IS_INT, BITS,
                   MBITS, EMIN, MAX_CODE, BIG_EMAX)
    # row_bytes (packed(C)) is an argument so that Triton sees its divisibility by 16 (aligned
    # vector stores).
    _store_chunks(data_ptr + line[None, :, None, None] * row_bytes, codes, blocks, first, ok,
                  BLOCK, CW, CPG, BITS)


@triton.jit(do_not_specialize=["key"])
def quantize_cols_kernel(
    x_ptr, scale_ptr, data_ptr, R, C, stride_b, stride_r, stride_c, tiles_r, tiles_c,
    blocks_r, groups_r, key,
    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, TILE_NB: tl.constexpr, TILE_C: tl.constexpr,
    VEC: tl.constexpr, I64: tl.constexpr, GRID: tl.constexpr, CPG: tl.constexpr, HW_FP8: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr, RCEIL_ZERO: tl.constexpr,
    BIG_EMAX: tl.constexpr,
):
    """Blocks along R. Scale [B, blocks_r, C]; data [B, groups_r * bytes_per_group, C].

    The tile [TILE_NB blocks, BLOCK_P // CPG groups, TILE_C columns] is loaded once per phase p
    (rows block * BLOCK + g * CPG + p), so a group's codes meet lane by lane.
    """
    G: tl.constexpr = BLOCK_P // CPG
    b, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    blocks = tr * TILE_NB + tl.arange(0, TILE_NB)
    g = tl.arange(0, G)
    # VEC columns per thread: a narrow vector leaves the threads and warps of the tile along C,
    # so a block's rows sit in one thread and its amax needs no shuffle or shared memory.
    cols = tl.max_contiguous(tc * TILE_C + tl.arange(0, TILE_C), VEC)
    col_ok = (cols < C)[None, None, :]
    in_block = g[None, :] * CPG  # [1, G]: row of phase 0 inside its block
    first = blocks[:, None] * BLOCK + in_block  # [NB, G]
    base = x_ptr + b * stride_b + cols[None, None, :] * stride_c
    # Phase 0 (always), then 1..3 for packed formats.
    m0 = ((in_block < BLOCK) & (first < R))[:, :, None] & col_ok
    x0 = load_f32(base + first[:, :, None] * stride_r, m0)
    a0 = _abs_bits(x0)
    amax = tl.max(a0, axis=1)
    x1, a1, x2, a2, x3, a3 = x0, a0, x0, a0, x0, a0  # phases past CPG: unused
    if CPG >= 2:
        m1 = ((in_block + 1 < BLOCK) & (first + 1 < R))[:, :, None] & col_ok
        x1 = load_f32(base + (first + 1)[:, :, None] * stride_r, m1)
        a1 = _abs_bits(x1)
        amax = tl.maximum(amax, tl.max(a1, axis=1))
    if CPG == 4:
        m2 = ((in_block + 2 < BLOCK) & (first + 2 < R))[:, :, None] & col_ok
        x2 = load_f32(base + (first + 2)[:, :, None] * stride_r, m2)
        m3 = ((in_block + 3 < BLOCK) & (first + 3 < R))[:, :, None] & col_ok
        x3 = load_f32(base + (first + 3)[:, :, None] * stride_r, m3)
        a2 = _abs_bits(x2)
        a3 = _abs_bits(x3)
        amax = tl.maximum(amax, tl.maximum(tl.max(a2, axis=1), tl.max(a3, axis=1)))
    byte = scale_byte(amax, SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO)  # [NB, TC]
    tl.store(scale_ptr + (b * blocks_r + blocks)[:, None] * C + cols[None, :], byte.to(tl.uint8),
             mask=(blocks < blocks_r)[:, None] & (cols < C)[None, :])
    byte = byte[:, None, :]
    index = 0
    if ROUNDING == ROUND_STOCHASTIC:
        index = ((b * R + first).to(tl.int64))[:, :, None] * C + cols[None, None, :]
    c0, c1, c2, c3 = _phase_codes(x0, a0, x1, a1, x2, a2, x3, a3, byte, index, C, key, CPG,
                                  HW_FP8, ROUNDING, IS_INT, BITS, MBITS, EMIN, MAX_CODE,
                                  BIG_EMAX)
    bytes_per_group: tl.constexpr = 3 if CPG == 4 else 1
    q = blocks[:, None] * (BLOCK // CPG) + g[None, :]  # packed group index along R
    ok = ((g < BLOCK // CPG)[None, :] & (q < groups_r))[:, :, None] & col_ok
    out = data_ptr + b * (groups_r * bytes_per_group) * C + cols[None, None, :]
    _store_packed_phases(out, c0, c1, c2, c3, q[:, :, None], C, ok, CPG, BITS)


@triton.jit(do_not_specialize=["key"])
def quantize_fused_kernel(
    x_ptr, scale_r_ptr, data_r_ptr, scale_c_ptr, data_c_ptr, R, C, stride_b, stride_r, stride_c,
    tiles_r, tiles_c, blocks_r, blocks_c, groups_r, groups_c, key,
    BLOCK: tl.constexpr, TILE_NBR: tl.constexpr, TILE_NBC: tl.constexpr, VEC: tl.constexpr,
    I64: tl.constexpr, GRID: tl.constexpr, CPG: tl.constexpr, HW_FP8: tl.constexpr,
    WORDS: tl.constexpr, ENC: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr, RCEIL_ZERO: tl.constexpr,
    BIG_EMAX: tl.constexpr,
):
    """One read, two outputs: blocks along C (scale_r/data_r, as quantize_rows_kernel) and
    along R (scale_c/data_c, as quantize_cols_kernel). BLOCK is a power of two, BLOCK % CPG == 0.

    Per phase p the tile is 2-d, [TILE_NBR * BLOCK / CPG rows, TILE_NBC * BLOCK columns], rows
    rb * BLOCK + g * CPG + p. Seen as [TILE_NBR, G, columns] it gives the column-wise blocks
    (reduced over g, then over the phases); seen as [rows, TILE_NBC, BLOCK], the row-wise ones
    (each phase holds whole rows). ENC != 0: codes by codes_rne (float formats, round half
    to even, no hardware fp8), else by _codes.
    """
    G: tl.constexpr = BLOCK // CPG
    A: tl.constexpr = TILE_NBR * G  # rows per phase
    TC: tl.constexpr = TILE_NBC * BLOCK
    b, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rblocks, cblocks, i, first = fused_tile(tr, tc, TILE_NBR, TILE_NBC, BLOCK, CPG)
    # VEC columns per thread (see quantize_cols_kernel): the rows of a column block stay in
    # one thread; a row block's columns span a few lanes of one warp.
    cols = tl.max_contiguous(tc * TC + tl.arange(0, TC), VEC)
    col_ok = (cols < C)[None, :]
    ptr = x_ptr + b * stride_b + cols[None, :] * stride_c + first[:, None] * stride_r
    x0 = load_f32(ptr, (first < R)[:, None] & col_ok)
    a0 = _abs_bits(x0)
    amax_c = tl.max(tl.reshape(a0, [TILE_NBR, G, TC]), axis=1)  # [NBR, TC]
    x1, a1, x2, a2, x3, a3 = x0, a0, x0, a0, x0, a0  # phases past CPG: unused
    if CPG >= 2:
        x1 = load_f32(ptr + stride_r, (first + 1 < R)[:, None] & col_ok)
        a1 = _abs_bits(x1)
        amax_c = tl.maximum(amax_c, tl.max(tl.reshape(a1, [TILE_NBR, G, TC]), axis=1))
    if CPG == 4:
        x2 = load_f32(ptr + 2 * stride_r, (first + 2 < R)[:, None] & col_ok)
        a2 = _abs_bits(x2)
        x3 = load_f32(ptr + 3 * stride_r, (first + 3 < R)[:, None] & col_ok)
        a3 = _abs_bits(x3)
        amax_c = tl.maximum(amax_c, tl.maximum(tl.max(tl.reshape(a2, [TILE_NBR, G, TC]), axis=1),
                                               tl.max(tl.reshape(a3, [TILE_NBR, G, TC]), axis=1)))
    index = 0
    if ROUNDING == ROUND_STOCHASTIC:
        index = (b * R + first).to(tl.int64)[:, None] * C + cols[None, :]

    # Column-wise copy: scale [B, blocks_r, C], data [B, groups_r * bytes_per_group, C].
    byte_c = scale_byte(amax_c, SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO)  # [NBR, TC]
    tl.store(scale_c_ptr + (b * blocks_r + rblocks)[:, None] * C + cols[None, :],
             byte_c.to(tl.uint8), mask=(rblocks < blocks_r)[:, None] & col_ok)
    if ENC != 0:
        inv_c, cap_c, sign_c = rne_block(byte_c, BITS, MAX_NORMAL)
        inv_c = tl.reshape(tl.broadcast_to(inv_c[:, None, :], [TILE_NBR, G, TC]), [A, TC])
        cap_c = tl.reshape(tl.broadcast_to(cap_c[:, None, :], [TILE_NBR, G, TC]), [A, TC])
        sign_c = tl.reshape(tl.broadcast_to(sign_c[:, None, :], [TILE_NBR, G, TC]), [A, TC])
        c0 = codes_rne(x0, a0, inv_c, cap_c, sign_c, ENC, BITS, MBITS, EMIN)
        c1 = c0
        c2 = c0
        c3 = c0
        if CPG >= 2:
            c1 = codes_rne(x1, a1, inv_c, cap_c, sign_c, ENC, BITS, MBITS, EMIN)
        if CPG == 4:
            c2 = codes_rne(x2, a2, inv_c, cap_c, sign_c, ENC, BITS, MBITS, EMIN)
            c3 = codes_rne(x3, a3, inv_c, cap_c, sign_c, ENC, BITS, MBITS, EMIN)
    else:
        byte_c = tl.reshape(tl.broadcast_to(byte_c[:, None, :], [TILE_NBR, G, TC]), [A, TC])
        c0, c1, c2, c3 = _phase_codes(x0, a0, x1, a1, x2, a2, x3, a3, byte_c, index, C, key,
                                      CPG, HW_FP8, ROUNDING, IS_INT, BITS, MBITS, EMIN, MAX_CODE,
                                      BIG_EMAX)
    bytes_per_group: tl.constexpr = 3 if CPG == 4 else 1
    q = (tr * TILE_NBR * G + i)[:, None]  # packed group index along R
    out_c = data_c_ptr + b * (groups_r * bytes_per_group) * C + cols[None, :]
    _store_packed_phases(out_c, c0, c1, c2, c3, q, C, (q < groups_r) & col_ok, CPG, BITS)

    # Row-wise copy, phase by phase: scale [B*R, blocks_c], data [B*R, groups_c * bpg].
    pos = (cblocks * G)[None, :, None]
    index3 = index
    if ROUNDING == ROUND_STOCHASTIC:
        index3 = tl.reshape(index, [A, TILE_NBC, BLOCK])
    _rows_phase(tl.reshape(x0, [A, TILE_NBC, BLOCK]), tl.reshape(a0, [A, TILE_NBC, BLOCK]),
                first, index3, b, tc, R, cblocks, pos, scale_r_ptr, data_r_ptr, blocks_c, groups_c,
                key, A, TILE_NBC, BLOCK, CPG, HW_FP8, SCALE_MODE, ROUNDING, IS_INT, BITS, MBITS,
                EMIN, EMAX, MAX_CODE, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO, BIG_EMAX, WORDS, ENC)
    if CPG >= 2:
        _rows_phase(tl.reshape(x1, [A, TILE_NBC, BLOCK]), tl.reshape(a1, [A, TILE_NBC, BLOCK]),
                    first + 1, index3 + C, b, tc, R, cblocks, pos, scale_r_ptr, data_r_ptr, blocks_c,
                    groups_c, key, A, TILE_NBC, BLOCK, CPG, HW_FP8, SCALE_MODE, ROUNDING, IS_INT,
                    BITS, MBITS, EMIN, EMAX, MAX_CODE, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO, BIG_EMAX, WORDS, ENC)
    if CPG == 4:
        _rows_phase(tl.reshape(x2, [A, TILE_NBC, BLOCK]), tl.reshape(a2, [A, TILE_NBC, BLOCK]),
                    first + 2, index3 + 2 * C, b, tc, R, cblocks, pos, scale_r_ptr, data_r_ptr,
                    blocks_c, groups_c, key, A, TILE_NBC, BLOCK, CPG, HW_FP8, SCALE_MODE,
                    ROUNDING, IS_INT, BITS, MBITS, EMIN, EMAX, MAX_CODE, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO, BIG_EMAX, WORDS, ENC)
        _rows_phase(tl.reshape(x3, [A, TILE_NBC, BLOCK]), tl.reshape(a3, [A, TILE_NBC, BLOCK]),
                    first + 3, index3 + 3 * C, b, tc, R, cblocks, pos, scale_r_ptr, data_r_ptr,
                    blocks_c, groups_c, key, A, TILE_NBC, BLOCK, CPG, HW_FP8, SCALE_MODE,
                    ROUNDING, IS_INT, BITS, MBITS, EMIN, EMAX, MAX_CODE, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO, BIG_EMAX, WORDS, ENC)


@triton.jit
def fused_tile(tr, tc, TILE_NBR: tl.constexpr, TILE_NBC: tl.constexpr, BLOCK: tl.constexpr,
               CPG: tl.constexpr):
    """A fused tile's row blocks [TILE_NBR], column blocks [TILE_NBC], lane index i [A] and
    rows of phase 0 [A] (rb * BLOCK + g * CPG; phase p adds p)."""
    G: tl.constexpr = BLOCK // CPG
    rblocks = tr * TILE_NBR + tl.arange(0, TILE_NBR)
    cblocks = tc * TILE_NBC + tl.arange(0, TILE_NBC)
    i = tl.arange(0, TILE_NBR * G)
    return rblocks, cblocks, i, tr * (TILE_NBR * BLOCK) + (i // G) * BLOCK + (i % G) * CPG


@triton.jit
def _rows_phase(x, a, rows, index, b, tc, R, cblocks, pos, scale_ptr, data_ptr, blocks_c,
                groups_c, key, A: tl.constexpr, NBC: tl.constexpr, BLOCK: tl.constexpr,
                CPG: tl.constexpr, HW_FP8: tl.constexpr, SCALE_MODE: tl.constexpr,
                ROUNDING: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
                MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                MAX_CODE: tl.constexpr, MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr,
                RCEIL_ZERO: tl.constexpr, BIG_EMAX: tl.constexpr, WORDS: tl.constexpr,
                ENC: tl.constexpr):
    """Row-wise quantize of one phase: x [A rows, NBC blocks, BLOCK] of rows `rows` [A], a its
    |x| bits."""
    amax = tl.max(a, axis=2)  # [A, NBC]
    byte = scale_byte(amax, SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC, RCEIL_ZERO)
    line = b * R + rows  # [A]
    row_ok = rows < R
    tl.store(scale_ptr + line[:, None] * blocks_c + cblocks[None, :], byte.to(tl.uint8),
             mask=row_ok[:, None] & (cblocks < blocks_c)[None, :])
    if ENC != 0:
        inverse, cap, sign_mask = rne_block(byte, BITS, MAX_NORMAL)
        codes = codes_rne(x, a, inverse[:, :, None], cap[:, :, None], sign_mask[:, :, None], ENC,
                           BITS, MBITS, EMIN)
    else:
        codes = _codes(x, a, byte[:, :, None], index, key, HW_FP8, ROUNDING, IS_INT, BITS, MBITS,
                       EMIN, MAX_CODE, BIG_EMAX)
    bytes_per_group: tl.constexpr = 3 if CPG == 4 else 1
    _store_packed_last(data_ptr + line * (groups_c * bytes_per_group), codes, pos,
                       tc * (NBC * (BLOCK // CPG)), groups_c, row_ok, A, NBC, CPG, BITS, BLOCK,
                       BLOCK, WORDS)


@triton.jit
def fake_quantize_rows_kernel(
    x_ptr, out_ptr, R, C, tiles_r, tiles_c,
    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, TILE_R: tl.constexpr, TILE_NB: tl.constexpr,
    I64: tl.constexpr, GRID: tl.constexpr, HW_ENCODE: tl.constexpr, HW_DECODE: tl.constexpr,
    SCALE_MODE: tl.constexpr, ROUNDING: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, MAX_CODE: tl.constexpr,
    MAX_NORMAL: tl.constexpr, RCEIL_FRAC: tl.constexpr, RCEIL_ZERO: tl.constexpr,
    BIG_EMAX: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
    LSB: tl.constexpr, TO_VALUE: tl.constexpr, SOFT_BF16: tl.constexpr,
):
    """Blocks along C; every rounding but stochastic (no element counter here). Input and
    output contiguous [R, C]. The codes never leave registers: each is masked to its stored
    width, the byte (or packed field) quantize_rows_kernel would store and a dequantize kernel
    read back, so the output equals dequantize(quantize(x)) bit for bit."""
    _, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rows = tr * TILE_R + tl.arange(0, TILE_R)
    blocks = tc * TILE_NB + tl.arange(0, TILE_NB)
    t = tl.arange(0, BLOCK_P)
    cols = blocks[:, None] * BLOCK + t[None, :]  # [NB, BP]
    mask = (rows < R)[:, None, None] & (cols < C)[None, :, :]
    if BLOCK_P != BLOCK:
        mask = mask & (t < BLOCK)[None, None, :]
    offsets = rows[:, None, None] * C + cols[None, :, :]
    x = load_f32(x_ptr + offsets, mask)
    a = _abs_bits(x)
    byte = scale_byte(tl.max(a, axis=2), SCALE_MODE, MBITS, EMAX, MAX_NORMAL, RCEIL_FRAC,
                      RCEIL_ZERO)[:, :, None]
    codes = _codes(x, a, byte, 0, 0, HW_ENCODE, ROUNDING, IS_INT, BITS, MBITS, EMIN, MAX_CODE,
                   BIG_EMAX)
    codes = codes & ((1 << BITS) - 1)  # what the data bytes hold (MXINT8: two's complement)
    values = scaled_values(codes, byte, HW_DECODE, IS_INT, BITS, MBITS, BIAS, HAS_INF, HAS_NAN, LSB,
                     TO_VALUE)
    tl.store(out_ptr + offsets, to_output(values, out_ptr.dtype.element_ty, SOFT_BF16), mask=mask)

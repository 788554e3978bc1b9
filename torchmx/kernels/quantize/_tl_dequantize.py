"""Triton dequantize kernels: blocks along the contiguous axis ("rows") or along a strided one
("cols"). Inputs and the output are contiguous; the output is seen as [B, R, C]:
  rows: blocks along C; data [B*R, packed(C)], scale [B*R, ceil(C / BLOCK)]
  cols: blocks along R; data [B, packed(R), C], scale [B, ceil(R / BLOCK), C]
Unpacking mirrors the quantize kernels (split/join along C, phases along R).
"""

import triton
import triton.language as tl

from .._tl_numerics import (decode_scaled, decode_value, program_coordinates, scale_value,
                           to_output)


@triton.jit
def scaled_values(code, byte, HW_FP8: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
            MBITS: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr,
            HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr):
    if HW_FP8 == 0:
        return decode_scaled(code, byte, IS_INT, BITS, MBITS, BIAS, HAS_INF, HAS_NAN, LSB, TO_VALUE)
    else:
        if HW_FP8 == 1:
            value = code.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            value = code.to(tl.uint8).to(tl.float8e5, bitcast=True).to(tl.float32)
        # One rounding of an exact product; byte 255 (NaN) handled per block, not per element.
        return value * scale_value(byte)


@triton.jit
def dequantize_rows_kernel(
    data_ptr, scale_ptr, out_ptr, R, C, tiles_r, tiles_c, blocks_c, groups_c,
    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, TILE_R: tl.constexpr, TILE_NB: tl.constexpr,
    I64: tl.constexpr, GRID: tl.constexpr, CPG: tl.constexpr, HW_FP8: tl.constexpr, IS_INT: tl.constexpr,
    WORDS: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr,
    HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
):
    G: tl.constexpr = BLOCK_P // CPG
    _, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rows = tr * TILE_R + tl.arange(0, TILE_R)
    blocks = tc * TILE_NB + tl.arange(0, TILE_NB)
    row_ok = (rows < R)[:, None, None]
    byte = tl.load(scale_ptr + rows[:, None] * blocks_c + blocks[None, :],
                   mask=(rows < R)[:, None] & (blocks < blocks_c)[None, :], other=0).to(tl.int32)
    g = tl.arange(0, G)
    q = (blocks[:, None] * (BLOCK // CPG) + g[None, :])[None, :, :]  # [1, NB, G]
    qmask = row_ok & (q < groups_c) & (g < BLOCK // CPG)[None, None, :]
    bytes_per_group: tl.constexpr = 3 if CPG == 4 else 1
    src = data_ptr + rows[:, None, None] * (groups_c * bytes_per_group)
    if CPG == 1:
        code = tl.load(src + q, mask=qmask, other=0).to(tl.int32)
    elif CPG == 2:
        packed = tl.load(src + q, mask=qmask, other=0).to(tl.int32)
        code = tl.join(packed & 0xF, packed >> 4).reshape(TILE_R, TILE_NB, BLOCK_P)
    else:
        if WORDS:
            # 16 codes = 12 bytes = 3 aligned 32-bit words: three word loads per 16 codes
            # instead of twelve byte loads 3 apart (partial sectors: very slow). The host
            # checks BLOCK % 16 == 0, rows of a multiple of 16 codes and 4-byte alignment.
            NC: tl.constexpr = TILE_NB * G // 4
            chunk = tc * (TILE_NB * G // 4) + tl.arange(0, NC)[None, :]
            ptr32 = (data_ptr + rows * (groups_c * 3)).to(tl.pointer_type(tl.int32))[:, None] \
                + 3 * chunk
            ok32 = (rows < R)[:, None] & (chunk < groups_c // 4)
            word0 = tl.load(ptr32, mask=ok32, other=0)
            word1 = tl.load(ptr32 + 1, mask=ok32, other=0)
            word2 = tl.load(ptr32 + 2, mask=ok32, other=0)
            w0 = word0 & 0xFFFFFF
            w1 = ((word0 >> 24) & 0xFF) | ((word1 & 0xFFFF) << 8)
            w2 = ((word1 >> 16) & 0xFFFF) | ((word2 & 0xFF) << 16)
            w3 = (word2 >> 8) & 0xFFFFFF
            word = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [TILE_R, TILE_NB, G])
        else:
            word = (tl.load(src + 3 * q, mask=qmask, other=0).to(tl.int32)
                    | (tl.load(src + 3 * q + 1, mask=qmask, other=0).to(tl.int32) << 8)
                    | (tl.load(src + 3 * q + 2, mask=qmask, other=0).to(tl.int32) << 16))
        c0 = word & 0x3F
        c1 = (word >> 6) & 0x3F
        c2 = (word >> 12) & 0x3F
        c3 = word >> 18
        code = tl.join(tl.join(c0, c2), tl.join(c1, c3)).reshape(TILE_R, TILE_NB, BLOCK_P)
    out = scaled_values(code, byte[:, :, None], HW_FP8, IS_INT, BITS, MBITS, BIAS, HAS_INF, HAS_NAN, LSB,
                      TO_VALUE)
    t = tl.arange(0, BLOCK_P)
    cols = (blocks[:, None] * BLOCK + t[None, :])[None, :, :]
    mask = row_ok & (cols < C)
    if BLOCK_P != BLOCK:
        mask = mask & (t < BLOCK)[None, None, :]
    tl.store(out_ptr + rows[:, None, None] * C + cols, to_output(out, out_ptr.dtype.element_ty, SOFT_BF16), mask=mask)


@triton.jit
def dequantize_cols_kernel(
    data_ptr, scale_ptr, out_ptr, R, C, tiles_r, tiles_c, blocks_r, groups_r,
    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, TILE_NB: tl.constexpr, TILE_C: tl.constexpr,
    I64: tl.constexpr, GRID: tl.constexpr, CPG: tl.constexpr, HW_FP8: tl.constexpr, IS_INT: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, HAS_INF: tl.constexpr,
    HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
):
    G: tl.constexpr = BLOCK_P // CPG
    b, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    blocks = tr * TILE_NB + tl.arange(0, TILE_NB)
    g = tl.arange(0, G)
    cols = tc * TILE_C + tl.arange(0, TILE_C)
    col_ok = (cols < C)[None, None, :]
    byte = tl.load(scale_ptr + (b * blocks_r + blocks)[:, None] * C + cols[None, :],
                   mask=(blocks < blocks_r)[:, None] & (cols < C)[None, :], other=0).to(tl.int32)
    byte = byte[:, None, :]
    q = (blocks[:, None] * (BLOCK // CPG) + g[None, :])[:, :, None]  # [NB, G, 1]
    qmask = (q < groups_r) & (g < BLOCK // CPG)[None, :, None] & col_ok
    bytes_per_group: tl.constexpr = 3 if CPG == 4 else 1
    src = data_ptr + b * (groups_r * bytes_per_group) * C + cols[None, None, :]
    first = (blocks[:, None] * BLOCK + g[None, :] * CPG)[:, :, None]  # row of phase 0
    in_block = (g * CPG)[None, :, None]
    dst = out_ptr + b * R * C + cols[None, None, :]
    if CPG == 1:
        code = tl.load(src + q * C, mask=qmask, other=0).to(tl.int32)
        out = scaled_values(code, byte, HW_FP8, IS_INT, BITS, MBITS, BIAS, HAS_INF, HAS_NAN, LSB,
                      TO_VALUE)
        tl.store(dst + first * C, to_output(out, out_ptr.dtype.element_ty, SOFT_BF16),
                 mask=(in_block < BLOCK) & (first < R) & col_ok)
    else:
        if CPG == 2:
            word = tl.load(src + q * C, mask=qmask, other=0).to(tl.int32)
        else:
            word = (tl.load(src + (3 * q) * C, mask=qmask, other=0).to(tl.int32)
                    | (tl.load(src + (3 * q + 1) * C, mask=qmask, other=0).to(tl.int32) << 8)
                    | (tl.load(src + (3 * q + 2) * C, mask=qmask, other=0).to(tl.int32) << 16))
        mask_bits: tl.constexpr = (1 << BITS) - 1
        for p in tl.static_range(CPG):
            code = (word >> (BITS * p)) & mask_bits
            out = scaled_values(code, byte, HW_FP8, IS_INT, BITS, MBITS, BIAS, HAS_INF, HAS_NAN, LSB,
                      TO_VALUE)
            tl.store(dst + (first + p) * C, to_output(out, out_ptr.dtype.element_ty, SOFT_BF16),
                     mask=(in_block + p < BLOCK) & (first + p < R) & col_ok)


@triton.jit
def dequantize_fp6_rows_kernel(
    data_ptr, scale_ptr, out_ptr, R, C, tiles_r, tiles_c, blocks_c, row_bytes,
    BLOCK: tl.constexpr, TILE_R: tl.constexpr, TILE_CH: tl.constexpr, I64: tl.constexpr,
    GRID: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
    HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
):
    """fp6 blocks along C (C % 8 == 0, BLOCK % 8 == 0, data 2-byte aligned): each thread
    decodes 8 codes from their 6 bytes (three 16-bit loads) and writes them as one vector,
    so neighbouring threads write neighbouring output; no layout conversion in between.
    Data [R, row_bytes], scale [R, blocks_c]."""
    _, tr, tc = program_coordinates(tiles_c, tiles_r, GRID, I64)
    rows = tr * TILE_R + tl.arange(0, TILE_R)
    ch = tc * TILE_CH + tl.arange(0, TILE_CH)  # chunk: codes 8 * ch .. 8 * ch + 7
    ok = (rows < R)[:, None] & (ch < C // 8)[None, :]
    src = (data_ptr + rows[:, None] * row_bytes).to(tl.pointer_type(tl.uint16)) + 3 * ch[None, :]
    h0 = tl.load(src, mask=ok, other=0).to(tl.int32)
    h1 = tl.load(src + 1, mask=ok, other=0).to(tl.int32)
    h2 = tl.load(src + 2, mask=ok, other=0).to(tl.int32)
    low = h0 | (h1 << 16)  # bits 0..31 of the chunk's 48-bit stream
    high = h1 | (h2 << 16)  # bits 16..47
    byte = tl.load(scale_ptr + rows[:, None] * blocks_c + (ch * 8 // BLOCK)[None, :], mask=ok,
                   other=0).to(tl.int32)
    scale = scale_value(byte)
    v0 = decode_value(low & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    v1 = decode_value((low >> 6) & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    v2 = decode_value((low >> 12) & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    v3 = decode_value((low >> 18) & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    v4 = decode_value((low >> 24) & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    v5 = decode_value((high >> 14) & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    v6 = decode_value((high >> 20) & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    v7 = decode_value((high >> 26) & 0x3F, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) * scale
    dtype = out_ptr.dtype.element_ty
    # join puts its operands side by side in a new last dim: this nesting orders v0 .. v7.
    out = tl.join(tl.join(tl.join(to_output(v0, dtype, SOFT_BF16), to_output(v4, dtype, SOFT_BF16)),
                          tl.join(to_output(v2, dtype, SOFT_BF16), to_output(v6, dtype, SOFT_BF16))),
                  tl.join(tl.join(to_output(v1, dtype, SOFT_BF16), to_output(v5, dtype, SOFT_BF16)),
                          tl.join(to_output(v3, dtype, SOFT_BF16), to_output(v7, dtype, SOFT_BF16))))
    out = tl.reshape(out, [TILE_R, TILE_CH, 8])
    dst = out_ptr + rows[:, None, None] * C + (ch * 8)[None, :, None] + tl.arange(0, 8)[None, None, :]
    tl.store(dst, out, mask=ok[:, :, None])

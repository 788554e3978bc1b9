"""x [M, K] bf16 @ W.T for an MXFP8 (e4m3 / e5m2), MXFP6 (e2m3 / e3m2), MXFP4 (e2m1) or MXINT8
weight W [N, K] in the standard layout and 2..64 activation rows (1..64 for fp6), on Hopper
(sm_90) tensor cores.

W is wgmma's A operand, taken from registers ("swap AB": out^T = W x^T, the activation rows
are wgmma's N dimension and x^T goes through shared memory). In the m64nNk16 A fragment, lane
`4 g + t` of warp `w` holds rows `16 w + g` and `16 w + g + 8` of a 64 x 16 slice, at columns
`2 t`, `2 t + 1`, `2 t + 8`, `2 t + 9`. A dot only needs the same K order on both sides, so the
kernel reads K in a permuted order instead of rearranging W: per unit of a row of W (64
bytes: 64 one-byte codes or 128 fp4 codes; 96 bytes: 128 fp6 codes), lane `t` loads the
quarter of the unit at `t` of each of its two rows (a piece: 16 bytes, one 16-byte load; fp6
24 bytes, three 8-byte loads), and each word q of a piece (bytes `4 q .. + 3`; fp6: each
three-byte group q of four codes) becomes its registers of one slice (one-byte codes, fp6) or
two (fp4). Logical column L of a unit is physical column P:

- one-byte codes: L = 16 q + 8 h + 2 t + b, P = 16 t + 4 q + 2 h + b (h, b in {0, 1});
- fp4 (code 2 i in the low nibble of byte i): L = 32 q + 16 s + 8 h + 2 t + b,
  P = 32 t + 8 q + 4 s + 2 h + b (s, h, b in {0, 1});
- fp6 (code i in bits 6 i .. 6 i + 5 of the little-endian bitstream, q in 0..7):
  L = 16 q + 8 h + 2 t + b, P = 32 t + 4 q + 2 h + b.

x is loaded in the same order, and nothing of W passes through shared memory. Every piece lies
in one block (blocks are multiples of its 16 or 32 codes): one scale per piece, so no weight
layout and no prepack step is needed. Given a copy of W in the MMA layout (`pieces`,
mma_layout.py: the same pieces, stored so that each warp load is contiguous), the kernel
reads that instead and adds the split-K partials itself (`fp4_wgmma_matmul.store_split`).

Decode, about 2 to 3 instructions per code, and one bf16x2 multiply per two codes by the
piece's multiplier 2**(s + c) (s the scale byte, c the format's constant) that makes each
value exactly value * 2**(s - 127):

- e4m3 / e5m2: a byte permute puts each code in the low byte of a 16-bit half with its sign
  replicated above it, a shift by 4 / 5 brings sign, exponent and mantissa to the bit positions
  of bf16, and a mask clears the rest: the value times 2**-120 / 2**-112, subnormals included.
- e2m1: the same with the two codes of a byte (the low one shifted up by 4 first) and a shift
  by 2: the value times 2**-126.
- e2m3 / e3m2: four shifts of the group's word (funnel shifts where it spans two words) and
  three bit selects spread its four codes over the top six bits of four bytes; then as fp8,
  with a shift by 2 / 3: the value times 2**-126 / 2**-124.
- MXINT8: the codes plus 128 become the low bytes of fp32s 1.5 * 2**23 + code + 128; one
  subtraction leaves each code exactly and a conversion packs two into bf16x2: 64 times the
  value.

The multiply is exact when s is in FAST_SCALES (the multiplier is a normal bf16 and the scaled
value keeps all its bits). The tensor cores multiply these exact bf16 operands by x and
accumulate in fp32: the contract of kernels/linear/dispatch.py.

What the decode cannot do exactly, it poisons: a piece with a NaN or Inf code (e4m3's NaN,
e5m2's Inf and NaN) or a scale outside FAST_SCALES gets a NaN multiplier, found by a few integer
ops per word when the words are decoded. A program whose sums end up NaN or Inf, from such a
piece or otherwise (x, overflow), recomputes its tile over its part of K with exact fp32
decodes and an fp32 (non-tensor-core) dot, which gives the contract's result, NaN and Inf
included. Ordinary weights never take that path.

K is split over SPLIT programs per tile of 64 V rows; their fp32 partials are added in a fixed
order by matmul_kernels.reduce_splits_kernel. Under Triton's interpreter (CPU tests) the loads
are tl.loads and the decode is the exact fp32 bit arithmetic of _tl_numerics, times the same
multipliers, so the same pieces are poisoned and the same programs recompute.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ... import dtypes
from .._tl_numerics import decode_value, scale_value
from ..layouts.fast_decode import CHUNK, FAST_SCALES, MULTIPLIER_EXPONENT, UNITS
from ..layouts.mma_layout import check_pieces
from .fp4_wgmma_matmul import check_tile, split_steps, store_out, store_split, usable_on
from .._common import (aligned, block_m_for, empty, interpreting, packed_decode_constants,
                       sm_count)
from .matmul_kernels import reduce_splits_kernel
from .._launch import Launch, bound_product

__all__ = ["MmaConfig", "FAST_SCALES", "check_pieces", "default_config", "eligible", "mma_linear"]

_FORMATS = "e4m3, e5m2, e2m3, e3m2, e2m1 or int8"

# FAST_SCALES (fast_decode.py): the scale bytes for which the decode's one multiply is exact.
# Its multiplier's exponent field less the scale byte (fast_decode.MULTIPLIER_EXPONENT)
_EXPONENT_E4M3 = tl.constexpr(MULTIPLIER_EXPONENT[dtypes.float8_e4m3])
_EXPONENT_E5M2 = tl.constexpr(MULTIPLIER_EXPONENT[dtypes.float8_e5m2])
_EXPONENT_E2M1 = tl.constexpr(MULTIPLIER_EXPONENT[dtypes.float4_e2m1])
_EXPONENT_E2M3 = tl.constexpr(MULTIPLIER_EXPONENT[dtypes.float6_e2m3])
_EXPONENT_E3M2 = tl.constexpr(MULTIPLIER_EXPONENT[dtypes.float6_e3m2])
_EXPONENT_INT8 = tl.constexpr(MULTIPLIER_EXPONENT[dtypes.int8])

# A lane's two 16-byte pieces (row g's at $10, row g + 8's $12 bytes on) and their scale bytes
# (at $11, and $13 bytes on), where $14 != 0; else undefined words and scale bytes -1. Plain
# coherent loads: ptxas may not move them past the loop's barriers, so they stay ahead of the
# decode they feed.
_LOAD_STEP = tl.constexpr(
    "{ .reg .pred p; .reg .b64 a8, s8; setp.ne.b32 p, $14, 0; "
    "add.s64 a8, $10, $12; add.s64 s8, $11, $13; "
    "mov.b32 $8, -1; mov.b32 $9, -1; "
    "@p ld.global.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$10]; "
    "@p ld.global.L1::no_allocate.v4.u32 {$4, $5, $6, $7}, [a8]; "
    "@p ld.global.u8 $8, [$11]; "
    "@p ld.global.u8 $9, [s8]; }")
# The same for fp6's 24-byte pieces (8-byte aligned): words $0..$5 (row g), $6..$11 (row g +
# 8), scale bytes $12, $13; pointers $14, $15, row offsets $16, $17, condition $18.
_LOAD_STEP_FP6 = tl.constexpr(
    "{ .reg .pred p; .reg .b64 a8, s8; setp.ne.b32 p, $18, 0; "
    "add.s64 a8, $14, $16; add.s64 s8, $15, $17; "
    "mov.b32 $12, -1; mov.b32 $13, -1; "
    "@p ld.global.L1::no_allocate.v2.u32 {$0, $1}, [$14]; "
    "@p ld.global.L1::no_allocate.v2.u32 {$2, $3}, [$14+8]; "
    "@p ld.global.L1::no_allocate.v2.u32 {$4, $5}, [$14+16]; "
    "@p ld.global.L1::no_allocate.v2.u32 {$6, $7}, [a8]; "
    "@p ld.global.L1::no_allocate.v2.u32 {$8, $9}, [a8+8]; "
    "@p ld.global.L1::no_allocate.v2.u32 {$10, $11}, [a8+16]; "
    "@p ld.global.u8 $12, [$15]; "
    "@p ld.global.u8 $13, [s8]; }")
# Four fp8 codes of a word (code i in byte i of WORD: $4, or fp6's spread group) -> bf16 halves
# ($0..$3) times the bf16x2 multiplier $5.
_DECODE = """{ .reg .b32 x0, x1;
prmt.b32 x0, WORD, 0, 0x9180;
prmt.b32 x1, WORD, 0, 0xB3A2;
shl.b32 x0, x0, SHIFT;
shl.b32 x1, x1, SHIFT;
and.b32 x0, x0, MASK;
and.b32 x1, x1, MASK;
mul.rn.bf16x2 x0, x0, $5;
mul.rn.bf16x2 x1, x1, $5;
mov.b32 {$0, $1}, x0;
mov.b32 {$2, $3}, x1; }"""
DECODE_E4M3 = tl.constexpr(_DECODE.replace("WORD", "$4").replace("SHIFT", "4")
                            .replace("MASK", "0x87F087F0"))
DECODE_E5M2 = tl.constexpr(_DECODE.replace("WORD", "$4").replace("SHIFT", "5")
                            .replace("MASK", "0x8FE08FE0"))
# Four fp6 codes (a three-byte group) -> bf16 halves ($0..$3) times the bf16x2 multiplier $5.
# Byte k of e takes code k, bits 6 k .. 6 k + 5 of the group, in its top six bits (from the
# group shifted left by 2 + 2 k: the low two bits hold the previous code's top bits), so that
# e reads as four fp8-like codes (sign, exponent, mantissa, two bits the mask clears). The
# group's word is got by SPREAD: four shifts (funnel shifts where the group spans two words,
# $4 and $6) into s0..s3; three selects (lop3 0xE4: a where c, else b) keep byte k of s_k.
_DECODE_FP6 = """{ .reg .b32 s0, s1, s2, s3, e;
SPREAD
lop3.b32 e, s0, s1, 0x000000FF, 0xE4;
lop3.b32 e, e, s2, 0x0000FFFF, 0xE4;
lop3.b32 e, e, s3, 0x00FFFFFF, 0xE4;
""" + _DECODE.replace("WORD", "e") + " }"
# Group j of a piece's three words a, b, c ($4, $6): its bits start at bit 0 of a (j = 0),
# bit 24 of b:a (1), bit 16 of c:b (2), bit 8 of c (3); s_k is the group shifted left by
# 2 + 2 k.
_SPREAD_FP6 = (
    "shl.b32 s0, $4, 2; shl.b32 s1, $4, 4; shl.b32 s2, $4, 6; shl.b32 s3, $4, 8;",
    "shf.r.wrap.b32 s0, $4, $6, 22; shf.r.wrap.b32 s1, $4, $6, 20; "
    "shf.r.wrap.b32 s2, $4, $6, 18; shf.r.wrap.b32 s3, $4, $6, 16;",
    "shf.r.wrap.b32 s0, $4, $6, 14; shf.r.wrap.b32 s1, $4, $6, 12; "
    "shf.r.wrap.b32 s2, $4, $6, 10; shf.r.wrap.b32 s3, $4, $6, 8;",
    "shr.b32 s0, $4, 6; shr.b32 s1, $4, 4; shr.b32 s2, $4, 2; mov.b32 s3, $4;")


def _fp6_decoder(group: int, shift: int, mask: str) -> tl.constexpr:
    return tl.constexpr(_DECODE_FP6.replace("SPREAD", _SPREAD_FP6[group])
                        .replace("SHIFT", str(shift)).replace("MASK", mask))


# e2m3: sign, exponent and mantissa to bf16's places by a shift by 2 (value * 2**-126); e3m2
# by 3 (value * 2**-124). By group.
DECODE_E2M3_0, DECODE_E2M3_1, DECODE_E2M3_2, DECODE_E2M3_3 = (
    _fp6_decoder(j, 2, "0x81F081F0") for j in range(4))
DECODE_E3M2_0, DECODE_E3M2_1, DECODE_E3M2_2, DECODE_E3M2_3 = (
    _fp6_decoder(j, 3, "0x83E083E0") for j in range(4))
# Four MXINT8 codes of a word -> bf16 halves ($0..$3) times the bf16x2 multiplier $5. The codes,
# offset by 128 (a xor of their sign bits), become the low bytes of fp32s 1.5 * 2**23 + code +
# 128; one subtraction leaves each code exactly, and a conversion packs two of them (8
# significant bits at most: exact) into bf16x2.
DECODE_INT8 = tl.constexpr("""{ .reg .b32 u, f0, f1, f2, f3, x0, x1;
xor.b32 u, $4, 0x80808080;
prmt.b32 f0, u, 0x4B400000, 0x7640;
prmt.b32 f1, u, 0x4B400000, 0x7641;
prmt.b32 f2, u, 0x4B400000, 0x7642;
prmt.b32 f3, u, 0x4B400000, 0x7643;
sub.f32 f0, f0, 0f4B400080;
sub.f32 f1, f1, 0f4B400080;
sub.f32 f2, f2, 0f4B400080;
sub.f32 f3, f3, 0f4B400080;
cvt.rn.bf16x2.f32 x0, f1, f0;
cvt.rn.bf16x2.f32 x1, f3, f2;
mul.rn.bf16x2 x0, x0, $5;
mul.rn.bf16x2 x1, x1, $5;
mov.b32 {$0, $1}, x0;
mov.b32 {$2, $3}, x1; }""")
# The end of an e2m1 decode: its four bf16 pairs x0..x3 (bit patterns of value * 2**-126)
# times the bf16x2 multiplier $9, out as the halves $0..$7 (also the stream kernel's decode).
SCALE_E2M1_PAIRS = """mul.rn.bf16x2 x0, x0, $9;
mul.rn.bf16x2 x1, x1, $9;
mul.rn.bf16x2 x2, x2, $9;
mul.rn.bf16x2 x3, x3, $9;
mov.b32 {$0, $1}, x0;
mov.b32 {$2, $3}, x1;
mov.b32 {$4, $5}, x2;
mov.b32 {$6, $7}, x3; }"""
# Eight e2m1 codes of a word (code j in bits 4 j ..) -> bf16 halves ($0..$7) times the bf16x2
# multiplier $9. A byte permute puts the two codes of byte i in the top nibbles of the low
# bytes of the two 16-bit halves (the low one's from the word shifted by 4), each sign
# repeated above; a shift by 2 brings sign, exponent and mantissa to their bf16 positions and
# a mask clears the rest: the code's value times 2**-126, subnormals included.
DECODE_E2M1 = tl.constexpr("""{ .reg .b32 lo, x0, x1, x2, x3;
shl.b32 lo, $8, 4;
prmt.b32 x0, lo, $8, 0xC480;
prmt.b32 x1, lo, $8, 0xD591;
prmt.b32 x2, lo, $8, 0xE6A2;
prmt.b32 x3, lo, $8, 0xF7B3;
shl.b32 x0, x0, 2;
shl.b32 x1, x1, 2;
shl.b32 x2, x2, 2;
shl.b32 x3, x3, 2;
and.b32 x0, x0, 0x81C081C0;
and.b32 x1, x1, 0x81C081C0;
and.b32 x2, x2, 0x81C081C0;
and.b32 x3, x3, 0x81C081C0;
""" + SCALE_E2M1_PAIRS)


@triton.jit
def _pointers(w_ptr, s_ptr, n0, k0, c0, stride_wn, stride_sn, stride_sk, BLOCK: tl.constexpr,
              V: tl.constexpr, U: tl.constexpr, UNIT_CODES: tl.constexpr,
              UNIT_BYTES: tl.constexpr):
    """[4 (warp), V, U, 32 (lane)] pointers to each lane's piece of row n0 + 64 v + 16 w + g
    (lane 4 g + t): the quarter t of unit u from byte k0 (code c0) on, and its scale byte."""
    iw = tl.arange(0, 4)[:, None, None, None]
    iv = tl.arange(0, V)[None, :, None, None]
    iu = tl.arange(0, U)[None, None, :, None]
    lane = tl.arange(0, 32)[None, None, None, :]
    row = n0 + 64 * iv + 16 * iw + lane // 4
    col = k0 + UNIT_BYTES * iu + UNIT_BYTES // 4 * (lane % 4)
    code = c0 + UNIT_CODES * iu + UNIT_CODES // 4 * (lane % 4)
    return (w_ptr + row * stride_wn + col,
            s_ptr + row * stride_sn + (code // BLOCK) * stride_sk)


@triton.jit
def _piece_pointers(codes_ptr, scales_ptr, tile, first_unit, units, V: tl.constexpr,
                    U: tl.constexpr, UNIT_CODES: tl.constexpr, UNIT_BYTES: tl.constexpr):
    """_pointers for the MMA layout (mma_layout.py): the same pieces and scale bytes, of
    units first_unit .. of the 64 V-row tile `tile`, whose W has `units` units a row."""
    iw = tl.arange(0, 4)[:, None, None, None]
    iv = tl.arange(0, V)[None, :, None, None]
    iu = tl.arange(0, U)[None, None, :, None]
    lane = tl.arange(0, 32)[None, None, None, :]
    BLOCKS: tl.constexpr = UNIT_CODES // 32  # a unit's blocks
    chunk = (tile * V + iv) * units + first_unit + iu
    piece = (64 * iw + lane) * (UNIT_BYTES // 4)  # row half a = 0
    scale = ((8 * iw + lane // 4) * BLOCKS + (lane % 4) * BLOCKS // 4) * 2
    return (codes_ptr + chunk * (64 * UNIT_BYTES) + piece,
            scales_ptr + chunk * (64 * BLOCKS) + scale)


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def piece_multiplier(words, s, E5M2: tl.constexpr, IS_INT: tl.constexpr, S_MIN: tl.constexpr,
                S_MAX: tl.constexpr, CPG: tl.constexpr, MBITS: tl.constexpr):
    """bf16x2 bits (int32) of each word's piece multiplier, from the words [..., 4 (q)] of the
    pieces and their scale bytes s (the same shape, -1 where the loads were off): 2**(s - 7)
    (e4m3), 2**(s - 15) (e5m2), 2**(s - 1) (e2m1, e2m3), 2**(s - 3) (e3m2) or 2**(s - 133)
    (MXINT8) in both halves; NaN where s is outside [S_MIN, S_MAX] or the piece has a NaN /
    Inf code (`special_codes`); 0 where the loads were off (a step past the end then adds
    zeros)."""
    fast = (s >= S_MIN) & (s <= S_MAX)
    if CPG == 1 and not IS_INT:
        special = tl.expand_dims(special_codes(words, E5M2), len(words.shape) - 1)
        fast = fast & (special == 0)
    return _multiplier_where(fast, s, E5M2, IS_INT, CPG, MBITS)


@triton.jit
def scale_multiplier(s, E5M2: tl.constexpr, IS_INT: tl.constexpr, S_MIN: tl.constexpr,
                      S_MAX: tl.constexpr, CPG: tl.constexpr, MBITS: tl.constexpr):
    """`piece_multiplier` without the look at the codes, for decodes whose NaN / Inf codes their
    caller finds otherwise: NaN only where s is outside [S_MIN, S_MAX]."""
    return _multiplier_where((s >= S_MIN) & (s <= S_MAX), s, E5M2, IS_INT, CPG, MBITS)


@triton.jit
def _multiplier_where(fast, s, E5M2: tl.constexpr, IS_INT: tl.constexpr, CPG: tl.constexpr,
                      MBITS: tl.constexpr):
    """The format's multiplier for scale bytes s where fast, NaN where not, 0 where s < 0:
    bf16x2 bits of 2**(s - 127) over the factor that the decode leaves on a code's value
    (exponent field s + fast_decode.MULTIPLIER_EXPONENT[fmt])."""
    if CPG == 4:
        offset = _EXPONENT_E3M2 if MBITS == 2 else _EXPONENT_E2M3
    elif CPG == 2:
        offset = _EXPONENT_E2M1
    elif IS_INT:
        offset = _EXPONENT_INT8
    else:
        offset = _EXPONENT_E5M2 if E5M2 else _EXPONENT_E4M3
    m = tl.where(fast, (s + offset) * 0x00800080, 0x7FC07FC0)
    return tl.where(s < 0, 0, m)


@triton.jit
def special_codes(words, E5M2: tl.constexpr):
    """The words [..., 4 (q)] of fp8 pieces reduced over their last axis: nonzero for a piece
    with a NaN / Inf code (e4m3: magnitude all ones; e5m2: exponent all ones), found as the
    top bit of a byte of `(word & MASK) + ONES`."""
    MASK: tl.constexpr = 0x7C7C7C7C if E5M2 else 0x7F7F7F7F
    ONES: tl.constexpr = 0x04040404 if E5M2 else 0x01010101
    special = tl.reduce((words & MASK) + ONES, len(words.shape) - 1, _or)
    return special & -2139062144  # 0x80808080


@triton.jit
def _by_word(a0, a1, a2, a3, b0, b1, b2, b3):
    """[..., 2, 4] from the 8 tensors [...] of a lane's words: [..., 0, q] = a_q, [..., 1, q] =
    b_q."""
    t = tl.join(tl.join(tl.join(a0, a2), tl.join(a1, a3)),
                tl.join(tl.join(b0, b2), tl.join(b1, b3)))  # [..., i, j, a]: word 2 i + j
    return tl.permute(t, [0, 1, 2, 3, 6, 4, 5]).reshape(a0.shape + (2, 4))


@triton.jit
def _grid(x00, x01, x10, x11):
    """[..., 2, 2] from 4 tensors [...]: [..., i, j] = x_ij."""
    return tl.join(tl.join(x00, x10), tl.join(x01, x11))


@triton.jit
def _quad(a, b, c, d):
    """[..., 4] from 4 tensors [...], in order."""
    return tl.join(tl.join(a, c), tl.join(b, d)).reshape(a.shape + (4,))


@triton.jit
def _interpreter_scales(s_ptrs, scale_row8, cond):
    """The interpreter's scale bytes of a lane's two rows (int32), -1 where cond is off."""
    s0 = tl.load(s_ptrs, mask=cond, other=0).to(tl.int32)
    s1 = tl.load(s_ptrs + scale_row8, mask=cond, other=0).to(tl.int32)
    return tl.where(cond, s0, -1), tl.where(cond, s1, -1)


@triton.jit
def _load_operands(w_ptrs, s_ptrs, row8, scale_row8, cond):
    """The load asm's inputs: the pointers, the row offsets and the condition, per element."""
    return [w_ptrs, s_ptrs, tl.zeros(w_ptrs.shape, tl.int64) + row8,
            tl.zeros(w_ptrs.shape, tl.int64) + scale_row8,
            tl.zeros(w_ptrs.shape, tl.int32) + cond.to(tl.int32)]


@triton.jit
def _load_fp6(w_ptrs, s_ptrs, row8, scale_row8, cond, INTERPRETER: tl.constexpr):
    """_load for fp6's 24-byte pieces: words [4, V, U, 32, 2 (row), 2 (half r), 4] holding the
    three words a, b, c of each half of a piece (bytes 12 r ..) and a again, the scale bytes
    repeated in the same shape."""
    if INTERPRETER:
        words_ptrs = w_ptrs.to(tl.pointer_type(tl.int32))
        w0, w1, w2, w3, w4, w5 = (tl.load(words_ptrs, mask=cond, other=0),
                                  tl.load(words_ptrs + 1, mask=cond, other=0),
                                  tl.load(words_ptrs + 2, mask=cond, other=0),
                                  tl.load(words_ptrs + 3, mask=cond, other=0),
                                  tl.load(words_ptrs + 4, mask=cond, other=0),
                                  tl.load(words_ptrs + 5, mask=cond, other=0))
        words_ptrs += row8 // 4
        w6, w7, w8, w9, w10, w11 = (tl.load(words_ptrs, mask=cond, other=0),
                                    tl.load(words_ptrs + 1, mask=cond, other=0),
                                    tl.load(words_ptrs + 2, mask=cond, other=0),
                                    tl.load(words_ptrs + 3, mask=cond, other=0),
                                    tl.load(words_ptrs + 4, mask=cond, other=0),
                                    tl.load(words_ptrs + 5, mask=cond, other=0))
        s0, s1 = _interpreter_scales(s_ptrs, scale_row8, cond)
    else:
        w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, s0, s1 = tl.inline_asm_elementwise(
            _LOAD_STEP_FP6, "=r," * 14 + "l,l,l,l,r",
            _load_operands(w_ptrs, s_ptrs, row8, scale_row8, cond),
            dtype=(tl.int32,) * 14, is_pure=False, pack=1)
    a = _grid(w0, w3, w6, w9)
    b = _grid(w1, w4, w7, w10)
    c = _grid(w2, w5, w8, w11)
    s = _grid(s0, s0, s1, s1)
    return _quad(a, b, c, a), _quad(s, s, s, s)


@triton.jit
def _load(w_ptrs, s_ptrs, row8, scale_row8, cond, CPG: tl.constexpr, INTERPRETER: tl.constexpr):
    """A lane's code words [4, V, U, 32, 2 (row g, g + 8), 4 (q)] of its pieces and their
    pieces' scale bytes (int32, the same shape), where the scalar cond holds; else undefined
    words and scale bytes -1. fp6: see _load_fp6."""
    if CPG == 4:
        words, scales = _load_fp6(w_ptrs, s_ptrs, row8, scale_row8, cond, INTERPRETER)
    else:
        words, scales = _load_bytes(w_ptrs, s_ptrs, row8, scale_row8, cond, INTERPRETER)
    return words, scales


@triton.jit
def _load_bytes(w_ptrs, s_ptrs, row8, scale_row8, cond, INTERPRETER: tl.constexpr):
    """_load for 16-byte pieces (one-byte codes, fp4)."""
    if INTERPRETER:
        words_ptrs = w_ptrs.to(tl.pointer_type(tl.int32))
        w0, w1, w2, w3 = (tl.load(words_ptrs, mask=cond, other=0),
                          tl.load(words_ptrs + 1, mask=cond, other=0),
                          tl.load(words_ptrs + 2, mask=cond, other=0),
                          tl.load(words_ptrs + 3, mask=cond, other=0))
        words_ptrs += row8 // 4
        w4, w5, w6, w7 = (tl.load(words_ptrs, mask=cond, other=0),
                          tl.load(words_ptrs + 1, mask=cond, other=0),
                          tl.load(words_ptrs + 2, mask=cond, other=0),
                          tl.load(words_ptrs + 3, mask=cond, other=0))
        s0, s1 = _interpreter_scales(s_ptrs, scale_row8, cond)
    else:
        w0, w1, w2, w3, w4, w5, w6, w7, s0, s1 = tl.inline_asm_elementwise(
            _LOAD_STEP, "=r," * 10 + "l,l,l,l,r",
            _load_operands(w_ptrs, s_ptrs, row8, scale_row8, cond),
            dtype=(tl.int32,) * 10, is_pure=False, pack=1)
    # Nothing here reads the loaded values (the multipliers are made at the decode): an
    # instruction that did would wait for the loads in the step that issues them. The scale
    # bytes are repeated per word, joined as the words are: one layout for both (a broadcast
    # of [..., 2, 1] made Triton rematerialize the loads in a second layout).
    return (_by_word(w0, w1, w2, w3, w4, w5, w6, w7),
            _by_word(s0, s0, s0, s0, s1, s1, s1, s1))


@triton.jit
def _code_value(words, i: tl.constexpr, scale, IS_INT: tl.constexpr, BITS: tl.constexpr,
                MBITS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
                LSB: tl.constexpr, TO_VALUE: tl.constexpr):
    """The interpreter's exact decode of code i of each word (BITS bits a code) times scale."""
    return decode_value((words >> (BITS * i)) & ((1 << BITS) - 1), IS_INT, BITS, MBITS, HAS_INF,
                        HAS_NAN, LSB, TO_VALUE) * scale


@triton.jit
def _decode_bytes(words, multiplier, V: tl.constexpr, U: tl.constexpr, E5M2: tl.constexpr,
                  IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                  HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr,
                  INTERPRETER: tl.constexpr):
    """_decode_tile for one-byte codes (e4m3, e5m2, MXINT8; 4 a word): [64 V, 64 U]."""
    if INTERPRETER:
        # the GPU's decode reads fp8 codes as value * 2**-112 / 2**-120, MXINT8 codes as their
        # integer, value * 2**6
        scale = (multiplier << 16).to(tl.float32, bitcast=True) \
            * (2.0 ** 6 if IS_INT else 2.0 ** -112 if E5M2 else 2.0 ** -120)
        v0 = _code_value(words, 0, scale, IS_INT, BITS, MBITS, E5M2, HAS_NAN, LSB, TO_VALUE)
        v1 = _code_value(words, 1, scale, IS_INT, BITS, MBITS, E5M2, HAS_NAN, LSB, TO_VALUE)
        v2 = _code_value(words, 2, scale, IS_INT, BITS, MBITS, E5M2, HAS_NAN, LSB, TO_VALUE)
        v3 = _code_value(words, 3, scale, IS_INT, BITS, MBITS, E5M2, HAS_NAN, LSB, TO_VALUE)
    else:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(
            DECODE_INT8 if IS_INT else DECODE_E5M2 if E5M2 else DECODE_E4M3,
            "=h,=h,=h,=h,r,r", [words, multiplier], dtype=(tl.bfloat16,) * 4, is_pure=True,
            pack=1)
    return _bytes_tile(v0, v1, v2, v3, V, U, 4)


@triton.jit
def _bytes_tile(v0, v1, v2, v3, V: tl.constexpr, U: tl.constexpr, Q: tl.constexpr):
    """[64 V, 16 Q U] from the values [4 (w), V, U, 32 (lane), 2 (a), Q] of codes 2 h + b of
    each word / group q, logical column 16 q + 8 h + 2 t + b of their unit."""
    tile = tl.join(tl.join(v0, v2), tl.join(v1, v3))  # [..., a, q, h, b]
    tile = tile.reshape(4, V, U, 8, 4, 2, Q, 2, 2)  # w V U g t a q h b
    tile = tl.permute(tile, [1, 0, 5, 3, 2, 6, 7, 4, 8])  # rows (V w a g), cols (U q h t b)
    return tile.reshape(64 * V, 16 * Q * U)


@triton.jit
def _decode_e2m1(words, multiplier, V: tl.constexpr, U: tl.constexpr, BITS: tl.constexpr,
                 MBITS: tl.constexpr, TO_VALUE: tl.constexpr, INTERPRETER: tl.constexpr):
    """_decode_tile for e2m1 codes (8 a word): [64 V, 128 U]."""
    if INTERPRETER:
        scale = (multiplier << 16).to(tl.float32, bitcast=True) * 2.0 ** -126
        v0 = _code_value(words, 0, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        v1 = _code_value(words, 1, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        v2 = _code_value(words, 2, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        v3 = _code_value(words, 3, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        v4 = _code_value(words, 4, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        v5 = _code_value(words, 5, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        v6 = _code_value(words, 6, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        v7 = _code_value(words, 7, scale, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            DECODE_E2M1, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, multiplier],
            dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    # code j = 4 s + 2 h + b of word q is logical column 32 q + 16 s + 8 h + 2 t + b of its 128
    tile = tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)),
                   tl.join(tl.join(v1, v5), tl.join(v3, v7)))  # [..., a, q, s, h, b]
    tile = tile.reshape(4, V, U, 8, 4, 2, 4, 2, 2, 2)  # w V U g t a q s h b
    tile = tl.permute(tile, [1, 0, 5, 3, 2, 6, 7, 8, 4, 9])  # rows (V w a g), cols (U q s h t b)
    return tile.reshape(64 * V, 128 * U)


@triton.jit
def _split4(x, V: tl.constexpr, U: tl.constexpr):
    """The 4 tensors [4, V, U, 32, 2, 2] of x [4, V, U, 32, 2, 2, 4], in order."""
    p, q = tl.split(x.reshape(4, V, U, 32, 2, 2, 2, 2))
    x0, x2 = tl.split(p)
    x1, x3 = tl.split(q)
    return x0, x1, x2, x3


@triton.jit
def _fp6_group(a, b, multiplier, G: tl.constexpr, ASM: tl.constexpr, MBITS: tl.constexpr,
               TO_VALUE: tl.constexpr, INTERPRETER: tl.constexpr):
    """Codes 0..3 of group G (0..3) of the twelve bytes a, b, c (G 0: a; 1: a, b; 2: b, c; 3:
    c, given as a, b) times the multiplier, as _decode_tile's values; on the GPU by ASM, the
    format's decoder of group G."""
    if INTERPRETER:
        if G == 0:
            g = a & 0xFFFFFF
        elif G == 1:
            g = ((a >> 24) & 0xFF) | ((b & 0xFFFF) << 8)
        elif G == 2:
            g = ((a >> 16) & 0xFFFF) | ((b & 0xFF) << 16)
        else:
            g = (a >> 8) & 0xFFFFFF
        # the GPU's decode reads the codes as value * 2**-126 (e2m3) / 2**-124 (e3m2)
        scale = (multiplier << 16).to(tl.float32, bitcast=True) \
            * (2.0 ** -124 if MBITS == 2 else 2.0 ** -126)
        v0 = _code_value(g, 0, scale, False, 6, MBITS, False, False, 1.0, TO_VALUE)
        v1 = _code_value(g, 1, scale, False, 6, MBITS, False, False, 1.0, TO_VALUE)
        v2 = _code_value(g, 2, scale, False, 6, MBITS, False, False, 1.0, TO_VALUE)
        v3 = _code_value(g, 3, scale, False, 6, MBITS, False, False, 1.0, TO_VALUE)
    else:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,r,r,r", [a, multiplier, b],
                                                   dtype=(tl.bfloat16,) * 4, is_pure=True,
                                                   pack=1)
    return v0, v1, v2, v3


@triton.jit
def _decode_fp6(words, multiplier, V: tl.constexpr, U: tl.constexpr, MBITS: tl.constexpr,
                TO_VALUE: tl.constexpr, INTERPRETER: tl.constexpr):
    """_decode_tile for fp6 codes (four a three-byte group, 8 groups a piece): [64 V, 128 U]."""
    a, b, c, _ = _split4(words, V, U)
    m, _, _, _ = _split4(multiplier, V, U)
    E3M2: tl.constexpr = MBITS == 2
    v00, v01, v02, v03 = _fp6_group(a, a, m, 0, DECODE_E3M2_0 if E3M2 else DECODE_E2M3_0,
                                    MBITS, TO_VALUE, INTERPRETER)
    v10, v11, v12, v13 = _fp6_group(a, b, m, 1, DECODE_E3M2_1 if E3M2 else DECODE_E2M3_1,
                                    MBITS, TO_VALUE, INTERPRETER)
    v20, v21, v22, v23 = _fp6_group(b, c, m, 2, DECODE_E3M2_2 if E3M2 else DECODE_E2M3_2,
                                    MBITS, TO_VALUE, INTERPRETER)
    v30, v31, v32, v33 = _fp6_group(c, c, m, 3, DECODE_E3M2_3 if E3M2 else DECODE_E2M3_3,
                                    MBITS, TO_VALUE, INTERPRETER)
    # group q = 4 r + G of a piece (r: its half, the [..., 2, 2]'s last dim)
    v0 = _quad(v00, v10, v20, v30).reshape(4, V, U, 32, 2, 8)
    v1 = _quad(v01, v11, v21, v31).reshape(4, V, U, 32, 2, 8)
    v2 = _quad(v02, v12, v22, v32).reshape(4, V, U, 32, 2, 8)
    v3 = _quad(v03, v13, v23, v33).reshape(4, V, U, 32, 2, 8)
    return _bytes_tile(v0, v1, v2, v3, V, U, 8)


@triton.jit
def _decode_tile(words, multiplier, V: tl.constexpr, U: tl.constexpr, E5M2: tl.constexpr,
                 IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                 HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr,
                 CPG: tl.constexpr, INTERPRETER: tl.constexpr):
    """W's tile [64 V, U unit's codes] in the permuted column order, each code's value times its
    piece's multiplier times the decode's 2**-120 / 2**-112 / 2**-126 / 2**-124 / 2**6 (e4m3
    / e5m2 / e2m1 and e2m3 / e3m2 / MXINT8): bf16 (fp32 in the interpreter, exact). words,
    multiplier: [4 (w), V, U, 32 (lane), 2 (a), 4 (q)] (fp6: see _load_fp6)."""
    if CPG == 4:
        tile = _decode_fp6(words, multiplier, V, U, MBITS, TO_VALUE, INTERPRETER)
    elif CPG == 2:
        tile = _decode_e2m1(words, multiplier, V, U, BITS, MBITS, TO_VALUE, INTERPRETER)
    else:
        tile = _decode_bytes(words, multiplier, V, U, E5M2, IS_INT, BITS, MBITS, HAS_NAN, LSB,
                             TO_VALUE, INTERPRETER)
    return tile


@triton.jit
def _x_columns(k0, U: tl.constexpr, CPG: tl.constexpr, UNIT_CODES: tl.constexpr):
    """The physical columns of x for the logical columns 0 .. U UNIT_CODES of a step at column
    k0."""
    L = tl.arange(0, U * UNIT_CODES)
    if CPG == 4:
        u, q, h, t, b = L // 128, (L // 16) % 8, (L // 8) % 2, (L // 2) % 4, L % 2
        return k0 + 128 * u + 32 * t + 4 * q + 2 * h + b
    elif CPG == 2:
        u, q, s, h, t, b = L // 128, (L // 32) % 4, (L // 16) % 2, (L // 8) % 2, (L // 2) % 4, L % 2
        return k0 + 128 * u + 32 * t + 8 * q + 4 * s + 2 * h + b
    u, q, h, t, b = L // 64, (L // 16) % 4, (L // 8) % 2, (L // 2) % 4, L % 2
    return k0 + 64 * u + 16 * t + 4 * q + 2 * h + b


@triton.jit
def _step(acc, words, scales, x_ptrs, m_ok, V: tl.constexpr, U: tl.constexpr,
          E5M2: tl.constexpr, IS_INT: tl.constexpr, S_MIN: tl.constexpr, S_MAX: tl.constexpr,
          BITS: tl.constexpr, MBITS: tl.constexpr, HAS_NAN: tl.constexpr, LSB: tl.constexpr,
          TO_VALUE: tl.constexpr, CPG: tl.constexpr, INTERPRETER: tl.constexpr):
    """acc + W's step tile (decoded from `words` and their pieces' scale bytes) times x's
    matching columns."""
    x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
    multiplier = piece_multiplier(words, scales, E5M2, IS_INT, S_MIN, S_MAX, CPG, MBITS)
    w = _decode_tile(words, multiplier, V, U, E5M2, IS_INT, BITS, MBITS, HAS_NAN, LSB, TO_VALUE,
                     CPG, INTERPRETER)
    if INTERPRETER:
        return acc + tl.dot(w, tl.trans(x).to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(w, tl.trans(x), acc)


@triton.jit
def _exact_tile(x_ptr, w_ptr, s_ptr, n0, k_first, k_count, M, stride_xm, stride_wn, stride_sn,
                stride_sk, BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                E5M2: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
                MBITS: tl.constexpr, HAS_NAN: tl.constexpr, LSB: tl.constexpr,
                TO_VALUE: tl.constexpr, CPG: tl.constexpr):
    """The tile's sums over the k_count columns (codes) from k_first (a multiple of 16), with W
    decoded exactly in fp32 (NaN and Inf codes, any scale) and fp32 products and sums, 16
    columns at a time in plain column order."""
    rows = n0 + tl.arange(0, BLOCK_N)[:, None]
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_first, k_first + k_count, 16):
        cols = k0 + tl.arange(0, 16)
        if CPG == 4:  # code i in bits 6 i .. of the bitstream: 1 or 2 bytes of its group
            group = 3 * (cols[None, :] // 4)
            first = group + 6 * (cols[None, :] % 4) // 8
            low = tl.load(w_ptr + rows * stride_wn + first).to(tl.int32)
            high = tl.load(w_ptr + rows * stride_wn + tl.minimum(first + 1, group + 2))
            codes = ((low | (high.to(tl.int32) << 8)) >> (6 * (cols[None, :] % 4) % 8)) & 0x3F
        else:
            codes = tl.load(w_ptr + rows * stride_wn + cols[None, :] // CPG).to(tl.int32)
        if CPG == 2:  # code 2 i in the low nibble of byte i
            codes = (codes >> (4 * (cols[None, :] % 2))) & 0xF
        s = tl.load(s_ptr + rows * stride_sn + (k0 // BLOCK) * stride_sk).to(tl.int32)
        w = decode_value(codes, IS_INT, BITS, MBITS, E5M2, HAS_NAN, LSB, TO_VALUE) \
            * scale_value(s)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :],
                    mask=offs_m[:, None] < M, other=0.0).to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    return acc


@triton.jit
def mma_linear_kernel(
    x_ptr, w_ptr, s_ptr, pieces_ptr, piece_scales_ptr, counters_ptr, bias_ptr, out_ptr,
    partials_ptr, M, N, K, steps, stride_xm, stride_wn, stride_sn, stride_sk, stride_om,
    BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, V: tl.constexpr, U: tl.constexpr,
    SPLIT: tl.constexpr, AHEAD: tl.constexpr, HAS_BIAS: tl.constexpr, E5M2: tl.constexpr,
    S_MIN: tl.constexpr, S_MAX: tl.constexpr, INTERPRETER: tl.constexpr, IS_INT: tl.constexpr,
    BITS: tl.constexpr, MBITS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
    LSB: tl.constexpr, TO_VALUE: tl.constexpr, CPG: tl.constexpr, UNIT_CODES: tl.constexpr,
    UNIT_BYTES: tl.constexpr, PIECES: tl.constexpr,
):
    """Program (tile of 64 V rows of W, part of K): out[m, n] for all m < M <= BLOCK_M, or its
    fp32 partial with SPLIT > 1. N is a multiple of 64 V, K of U units (UNITS); the `steps` =
    K / (U unit's codes) steps are shared out over the SPLIT programs of a tile (SPLIT <=
    steps). The format constants are _common.packed_decode_constants' (E5M2 is HAS_INF; CPG, 1, 2 or
    4, the codes a packed group); UNIT_CODES and UNIT_BYTES the format's UNITS.

    With PIECES, the fast path reads W from its MMA layout (pieces_ptr, piece_scales_ptr;
    w_ptr and s_ptr, the standard layout, only in the exact recomputation), and the last
    program of a tile to finish adds the split-K partials (counters_ptr: a zero int32 a tile,
    left at zero); without, the partials are added by reduce_splits_kernel."""
    BLOCK_N: tl.constexpr = 64 * V
    BLOCK_K: tl.constexpr = UNIT_BYTES * U  # bytes of a row a step
    STEP_K: tl.constexpr = UNIT_CODES * U  # columns (codes) a step
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    first, count = split_steps(pid_k, steps, SPLIT)
    tl.assume(count > 0)  # SPLIT <= steps: the loop's zero-trip path never runs
    n0 = pid_n * BLOCK_N
    k_first = first * BLOCK_K
    x_first = first * STEP_K
    w_ptr = w_ptr.to(tl.pointer_type(tl.uint8))
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    if PIECES:
        w_ptrs, s_ptrs = _piece_pointers(pieces_ptr, piece_scales_ptr, pid_n, first * U,
                                         K // UNIT_CODES, V, U, UNIT_CODES, UNIT_BYTES)
        row8 = 8 * UNIT_BYTES  # to row half a = 1: 32 pieces on
        scale_row8 = 1
        code_step = 64 * UNIT_BYTES * U
        scale_step = 2 * UNIT_CODES * U  # 64 rows x (UNIT_CODES / 32) blocks a unit
    else:
        w_ptrs, s_ptrs = _pointers(w_ptr, s_ptr, n0, k_first, x_first, stride_wn, stride_sn,
                                   stride_sk, BLOCK, V, U, UNIT_CODES, UNIT_BYTES)
        row8 = 8 * stride_wn
        scale_row8 = 8 * stride_sn
        code_step = BLOCK_K
        scale_step = (STEP_K // BLOCK) * stride_sk  # BLOCK <= STEP_K
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + _x_columns(x_first, U, CPG, UNIT_CODES)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    words, scales = _load(w_ptrs, s_ptrs, row8, scale_row8, count > 0, CPG, INTERPRETER)
    if AHEAD == 2:
        words1, scales1 = _load(w_ptrs + code_step, s_ptrs + scale_step, row8, scale_row8,
                                count > 1, CPG, INTERPRETER)
        for i in range(count):
            # step i + 2's words, in flight during the decode and dot of step i
            words2, scales2 = _load(w_ptrs + (i + 2) * code_step, s_ptrs + (i + 2) * scale_step,
                                    row8, scale_row8, i + 2 < count, CPG, INTERPRETER)
            acc = _step(acc, words, scales, x_ptrs + i * STEP_K, m_ok, V, U, E5M2, IS_INT,
                        S_MIN, S_MAX, BITS, MBITS, HAS_NAN, LSB, TO_VALUE, CPG, INTERPRETER)
            words, scales = words1, scales1
            words1, scales1 = words2, scales2
    else:
        # Unrolled by two, each step's words loaded one step ahead into registers that the loop
        # does not rotate (no register moves at the back edge). An odd count runs one step
        # more, on zero multipliers and zero x: it adds zeros.
        for j in range((count + 1) // 2):
            odd_ok = 2 * j + 1 < count
            words1, scales1 = _load(w_ptrs + (2 * j + 1) * code_step,
                                    s_ptrs + (2 * j + 1) * scale_step, row8, scale_row8,
                                    odd_ok, CPG, INTERPRETER)
            acc = _step(acc, words, scales, x_ptrs + 2 * j * STEP_K, m_ok, V, U, E5M2, IS_INT,
                        S_MIN, S_MAX, BITS, MBITS, HAS_NAN, LSB, TO_VALUE, CPG, INTERPRETER)
            words, scales = _load(w_ptrs + (2 * j + 2) * code_step,
                                  s_ptrs + (2 * j + 2) * scale_step, row8, scale_row8,
                                  2 * j + 2 < count, CPG, INTERPRETER)
            acc = _step(acc, words1, scales1, x_ptrs + (2 * j + 1) * STEP_K, m_ok & odd_ok, V,
                        U, E5M2, IS_INT, S_MIN, S_MAX, BITS, MBITS, HAS_NAN, LSB, TO_VALUE, CPG,
                        INTERPRETER)
    # A piece off the fast path made its products NaN; Inf / NaN sums have other causes too
    # (x, overflow). Either way the exact recomputation gives the contract's result.
    if tl.max((tl.abs(acc) == float("inf")) | (acc != acc)):
        acc = _exact_tile(x_ptr, w_ptr, s_ptr, n0, x_first, count * STEP_K, M, stride_xm,
                          stride_wn, stride_sn, stride_sk, BLOCK, BLOCK_M, BLOCK_N, E5M2, IS_INT,
                          BITS, MBITS, HAS_NAN, LSB, TO_VALUE, CPG)
    cols = (n0 + tl.arange(0, BLOCK_N))[:, None]
    rows = offs_m[None, :]
    mask = rows < M
    if SPLIT > 1 and PIECES:
        store_split(acc, partials_ptr, counters_ptr, bias_ptr, out_ptr, pid_n, pid_k, M, rows,
                    cols, N, stride_om, mask, SPLIT, HAS_BIAS, INTERPRETER)
    elif SPLIT > 1:
        tl.store(partials_ptr + (pid_k * M + rows) * N + cols, acc, mask=mask)
    else:
        store_out(acc, bias_ptr, out_ptr, rows, cols, stride_om, mask, HAS_BIAS, INTERPRETER)


@dataclass(frozen=True)
class MmaConfig:
    """Launch parameters: a tile of 64 V rows x U units of each row of W per step (`UNITS`: 64 U
    one-byte codes, 128 U fp4 or fp6 codes), K split over `split` programs, W's words loaded `ahead`
    (1 or 2) steps before their decode, and a cap on registers per thread (`maxnreg`, None:
    ptxas chooses) that keeps enough programs on each SM. A program is one warpgroup (4
    warps): the loads' layout is wgmma's for 4 warps."""
    v: int
    u: int
    split: int
    ahead: int = 2
    maxnreg: Optional[int] = None

    def __post_init__(self):
        check_tile(self)


# Per format (codes a packed group) and tile of activation rows (16, 32, 64): units of a row a
# step (u), programs per SM and register cap, for tiles of 64 W rows. K is split so that one
# wave of programs fills the SMs at the registers ptxas takes. fp8: 128 codes a step; about
# 134 registers a thread at 16 rows, capped at 128 (4 programs of 4 warps a SM, no spills),
# about 165 at 32 rows, capped at 168 (3), about 226 at 64 rows (2). fp4: 256 codes a step up to
# 32 rows (about 196 registers, 2 programs a SM), 128 at 64 rows. fp6: 128 codes a step, as
# fp8's tiles (about 125 registers at 16 rows, 159 at 32 and 225 at 64). From H100 sweeps at
# N = K = 8192 (benchmarks/bench_gpu_matmul.py --sweep), where 128-row tiles do no better.
_TILES = {(1, 16): (2, 4, 128), (1, 32): (2, 3, 168), (1, 64): (2, 2, None),
          (2, 16): (2, 2, None), (2, 32): (2, 2, None), (2, 64): (1, 2, None),
          (4, 16): (1, 4, 128), (4, 32): (1, 3, 168), (4, 64): (1, 2, None)}


def _unit_constants(fmt: dtypes.DType) -> dict:
    unit_codes, unit_bytes = UNITS[fmt.codes_per_group]
    return dict(UNIT_CODES=unit_codes, UNIT_BYTES=unit_bytes)


def default_config(fmt: dtypes.DType, M: int, N: int, K: int, block_size: int,
                   device: torch.device) -> MmaConfig:
    """`_TILES`' tile for the format and M's activation-row tile (fewer bytes a step where they
    do not divide K; at least a block a step), W's words loaded two steps ahead, and K split
    into one wave of programs at its programs per SM."""
    if fmt not in FAST_SCALES or not 1 <= M <= 64:
        raise ValueError(f"default_config: the kernel takes {_FORMATS} weights and 1..64 rows, "
                         f"got {fmt.name} and M={M}")
    unit = UNITS[fmt.codes_per_group][0]  # the codes of a unit
    if K <= 0 or K % unit or N <= 0 or N % CHUNK:
        raise ValueError(f"default_config: K must be a positive multiple of {unit} for "
                         f"{fmt.name} (whole units) and N of {CHUNK}, got N={N}, K={K}")
    u, per_sm, maxnreg = _TILES[fmt.codes_per_group, block_m_for(M)]
    while K % (unit * u):
        u //= 2
    u = max(u, block_size // unit)
    steps = K // (unit * u)
    tiles = N // CHUNK
    split = max(1, min(steps, round(per_sm * sm_count(device) / tiles)))
    return MmaConfig(1, u, split, maxnreg=maxnreg)


def eligible(x: torch.Tensor, w_data: torch.Tensor, fmt: dtypes.DType, block_size: int) -> bool:
    """Whether `mma_linear` takes this product: 2..64 contiguous bf16 rows x [M, K] (1..64 for
    fp6, whose one-row kernel is slower), an e4m3, e5m2, e2m3, e3m2, e2m1 or MXINT8 weight
    [N, K] with N a non-zero multiple of 64 and K of the block size and of a unit's codes
    (`UNITS`: 64 one-byte, 128 fp4 or fp6 codes); a block a multiple of a piece's codes (a
    quarter unit); unit stride along K, rows and both tensors 16-byte aligned; an sm_90 GPU (or
    Triton's interpreter on the CPU)."""
    if x.dim() != 2 or w_data.dim() != 2 or fmt not in FAST_SCALES:
        return False
    (M, K), N = x.shape, w_data.shape[0]
    unit = UNITS[fmt.codes_per_group][0]
    fewest_rows = 1 if fmt.codes_per_group == 4 else 2
    return (block_size % (unit // 4) == 0 and fewest_rows <= M <= 64
            and x.dtype == torch.bfloat16 and x.is_contiguous()
            and w_data.shape[1] * fmt.codes_per_group == K * fmt.bytes_per_group
            and N > 0 and K > 0 and N % CHUNK == 0 and K % max(unit, block_size) == 0
            and w_data.stride(1) == 1 and w_data.stride(0) % 16 == 0
            and aligned(x) and aligned(w_data) and usable_on(x.device))


def mma_linear(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor,
               fmt: dtypes.DType, block_size: int, bias: Optional[torch.Tensor],
               out_dtype: torch.dtype, config: Optional[MmaConfig] = None,
               pieces: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
               ) -> torch.Tensor:
    """x [M, K] @ W.T + bias (contiguous), rounded once to out_dtype, for the MXFP8, MXFP6,
    MXFP4 or MXINT8 weight W [N, K] given by its codes `w_data` [N, K] (fp6: [N, 3 K / 4],
    four in three bytes; fp4: [N, K / 2], two a byte) and scale bytes `w_scale`
    [N, K / block_size].

    `pieces`: W's MMA layout (codes and scales from mma_layout.pack, blocks of 32) and its
    int32 split counters [N / 64] (zero between calls; calls with the same counters must not
    run concurrently): the kernel then reads W from the pieces and adds the split-K partials
    itself."""
    if not eligible(x, w_data, fmt, block_size):
        raise ValueError(f"mma_linear: needs 2..64 (fp6: 1..64) contiguous bf16 rows and an "
                         f"{_FORMATS} weight with N a multiple of {CHUNK}, K of the block size "
                         f"and of a unit's codes (UNITS), unit stride along K and 16-byte "
                         f"aligned rows on an sm_90 GPU (see eligible), got x {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}, {fmt.name} codes "
                         f"{tuple(w_data.shape)} with strides {w_data.stride()}, block size "
                         f"{block_size}")
    M, K = x.shape
    N = w_data.shape[0]
    cfg = config or default_config(fmt, M, N, K, block_size, x.device)
    step = UNITS[fmt.codes_per_group][0] * cfg.u  # columns a step
    if N % (CHUNK * cfg.v) or K % step or step < block_size:
        raise ValueError(f"mma_linear: config {cfg} does not fit N={N}, K={K} (tiles of "
                         f"{CHUNK} v rows and {step} >= {block_size} columns must divide W)")
    if pieces is not None:
        check_pieces(pieces, fmt, block_size, N, K, x.device)
    return MmaPlan(x, w_scale, w_data, fmt, block_size, bias, out_dtype, cfg,
                   pieces is not None)(x, w_scale, w_data, bias, pieces)


class MmaPlan:
    """mma_linear's launches for products like the one it is built from (same shapes,
    strides, dtypes, alignments, format, bias or none, pieces or none, config): decided once,
    then a call allocates the output (and split-K partials) and launches with the new
    tensors."""

    def __init__(self, x, w_scale, w_data, fmt: dtypes.DType, block_size: int, bias,
                 out_dtype: torch.dtype, cfg: MmaConfig, pieces: bool):
        M, K = x.shape
        N = w_data.shape[0]
        steps = K // (UNITS[fmt.codes_per_group][0] * cfg.u)
        split = min(cfg.split, steps)
        self.out_shape, self.out_dtype, self.device = (M, N), out_dtype, x.device
        self.split, self.pieces = split, pieces
        interpreter = interpreting()
        low, high = FAST_SCALES[fmt]
        # out [M, N] is contiguous: stride(0) N
        self.main = Launch(mma_linear_kernel, (N // (CHUNK * cfg.v), split),
            (None,) * 9 + (M, N, K, steps, x.stride(0), w_data.stride(0), w_scale.stride(0),
                           w_scale.stride(1), N),
            dict(BLOCK=block_size, BLOCK_M=block_m_for(M), V=cfg.v, U=cfg.u, SPLIT=split,
                 AHEAD=cfg.ahead, HAS_BIAS=bias is not None, E5M2=fmt == dtypes.float8_e5m2,
                 S_MIN=low, S_MAX=high, INTERPRETER=interpreter, PIECES=pieces,
                 num_warps=4, num_stages=2, **packed_decode_constants(fmt), **_unit_constants(fmt),
                 **({} if cfg.maxnreg is None or interpreter else {"maxnreg": cfg.maxnreg})),
            range(9))
        self.reduce = None
        if split > 1 and not pieces:
            block = 1024
            self.reduce = Launch(reduce_splits_kernel, (triton.cdiv(M * N, block),),
                (None,) * 3 + (M, N, N, 1),
                dict(SPLIT_K=split, BLOCK=block, HAS_BIAS=bias is not None,
                     INTERPRETER=interpreter),
                range(3))

    def __call__(self, x, w_scale, w_data, bias, pieces=None) -> torch.Tensor:
        out = empty(self.out_shape, self.out_dtype, self.device)
        partials = (empty((self.split, *self.out_shape), torch.float32, self.device)
                    if self.split > 1 else out)
        piece_codes, piece_scales, counters = pieces if pieces is not None else (w_data, w_scale,
                                                                                 out)
        bias_arg = bias if bias is not None else out
        self.main(x, w_data, w_scale, piece_codes, piece_scales, counters, bias_arg, out,
                  partials)
        if self.reduce is not None:
            self.reduce(partials, bias_arg, out)
        return out

    def bind(self, w_scale, w_data, out_shape: tuple):
        """`f(x, bias) -> out` (out of `out_shape`) for this weight in the standard layout
        (a plan made without pieces): the compiled kernels called directly
        (`bound_product`), or None where they cannot be yet. The pieces and counters slots,
        unread without PIECES, keep the weight's own tensors."""
        if self.pieces:
            return None
        index = self.device.index
        main = self.main.direct({1: w_data, 2: w_scale, 3: w_data, 4: w_scale, 5: w_scale},
                                (0, 6, 7, 8), index)
        reduce = self.reduce.direct({}, (0, 1, 2), index) if self.reduce is not None else None
        if main is None or (self.split > 1 and reduce is None):
            return None
        return bound_product(main, reduce, out_shape, self.out_dtype, self.device,
                             (self.split, *self.out_shape) if self.split > 1 else None)

"""Triton kernels of the fused MX-weight matmul: out[m, n] = sum_k x[m, k] * W[n, k] + bias[n].

W is an MX matrix [N, K] with blocks along K: codes `w` [N, packed(K)] (any strides) and E8M0
scale bytes `s` [N, ceil(K / BLOCK)]. The codes are decoded in registers to their *unscaled*
values, which every eligible format holds exactly in the activation dtype (bf16 or fp16; the
host checks), so each block's partial product

    p[m, n] = sum over the block's k of x[m, k] * value(w[n, k])

is a tensor-core dot of exact operands with fp32 accumulation, and the block's scale, an exact
power of two, multiplies that fp32 partial once: acc += p * 2**(s - 127). Never scaling the
elements keeps every product exact whatever the scale (a scaled fp8 value can be below bf16's
normal range), and costs one multiply-add per output element per block, not per weight.

Three variants (VARIANT): "rows" (one activation row per program, fp32 multiply-adds, each
block's partial scaled once and kept apart until the end; fp4 and fp6 read as 32-bit words
when the rows are whole words; fp4 words and fp8 codes laid out block-major, each thread
holding whole blocks of one or more weight rows and the matching x values, see
`_block_major_codes`), "block dots" (a tensor-core dot per block of unscaled values,
each partial scaled once) and "scaled dots" (the values of several blocks scaled in fp32,
rounded to bf16, one dot: exact but for fp8 values below 2**-126). The dots take W as the left
operand ("swap AB"): N fills the MMA's long side and the few activation rows are padded to 16.
fp4 is split into its even (low nibble) and odd (high nibble) codes, each multiplied by the
matching half of x: no interleaving of the nibbles in registers. fp6 runs only in the rows
variant, on rows of whole 32-bit words (WORDS): the only fp6 products the dispatch sends here
(one activation row; more rows take mma_linear or dequantize + cuBLAS).

Split-K: programs along K write fp32 partials [SPLIT_K, M, N] and `reduce_splits_kernel` adds
them in a fixed order (deterministic, unlike atomics), adds the bias and rounds once.
"""

import triton
import triton.language as tl

from .._tl_numerics import decode_value, ptx, scale_value, to_output

FP4_UNSHIFT = tl.constexpr(16384.0)  # fp4 decoded through fp16 bits is 2**-14 of its value


@triton.jit
def _values(code, dtype: tl.constexpr, FAST: tl.constexpr, IS_INT: tl.constexpr,
            BITS: tl.constexpr, MBITS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
            LSB: tl.constexpr, TO_VALUE: tl.constexpr):
    """The unscaled element values of int32 `code` (raw bits) in `dtype`, exactly.

    FAST 1 / 2: fp8 e4m3 / e5m2 through the hardware conversion; FAST 4: fp4 e2m1 moved into
    an fp16 (its value times 2**-14, exact; the caller multiplies by FP4_UNSHIFT). Otherwise
    the dequantize kernels' exact bit arithmetic (_tl_numerics.decode_value).
    """
    if FAST == 1:
        return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(dtype)
    elif FAST == 2:
        return code.to(tl.uint8).to(tl.float8e5, bitcast=True).to(dtype)
    elif FAST == 4:
        half = ((code & 8) << 12) | ((code & 7) << 9)
        return half.to(tl.int16).to(tl.float16, bitcast=True).to(dtype)
    else:
        return decode_value(code, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB,
                            TO_VALUE).to(dtype)


@triton.jit
def _load(ptrs, mask, EVEN: tl.constexpr):
    """tl.load, unmasked (so it can be vectorized) when every tile is whole; 0 where masked."""
    if EVEN:
        value = tl.load(ptrs)
    else:
        value = tl.load(ptrs, mask=mask, other=0)
    return value


@triton.jit
def _raw_codes(w_ptr, offs_n, N, K, b0, last, stride_wn, stride_wk, BLOCK: tl.constexpr,
               NB: tl.constexpr, CPG: tl.constexpr, EVEN: tl.constexpr, WORDS: tl.constexpr):
    """The packed codes of the blocks b0 .. b0 + NB - 1 as loaded (0 at or past `last` and at
    k >= K). WORDS (fp6 rows of whole, 4-byte aligned 32-bit words): the three words of each
    sixteen codes and a fourth read as 0,
    [BLOCK_N, NB, BLOCK // 16, 4]. Else (one-byte codes, fp4) [BLOCK_N, NB, G], the bytes of
    the G packed groups per block."""
    j = tl.arange(0, NB)[None, :, None]
    rows = w_ptr + offs_n[:, None, None] * stride_wn
    row_ok = (offs_n < N)[:, None, None] & (b0 + j < last)
    if WORDS and CPG == 4:
        G16: tl.constexpr = BLOCK // 16
        j4 = j[:, :, :, None]
        g = tl.arange(0, G16)[None, None, :, None]
        i = tl.arange(0, 4)[None, None, None, :]
        ok = row_ok[:, :, :, None] & ((b0 + j4) * BLOCK + 16 * g < K) & (i < 3)
        word = ((b0 + j4) * G16 + g) * 3 + i
        raw = tl.load(rows[:, :, :, None].to(tl.pointer_type(tl.int32)) + word, mask=ok, other=0)
    else:
        tl.static_assert(CPG != 4, "fp6 codes are read as whole 32-bit words only (WORDS)")
        G: tl.constexpr = BLOCK // CPG  # packed groups per block
        group = (b0 + j) * G + tl.arange(0, G)[None, None, :]
        raw = _load(rows + group * stride_wk, row_ok & (group * CPG < K), EVEN)
    return raw


@triton.jit
def _split_codes(raw, CPG: tl.constexpr):
    """int32 codes from `_raw_codes`' bytes: [BLOCK_N, NB, BLOCK], or for fp4 the even and odd
    codes, each [BLOCK_N, NB, BLOCK // 2] (code 2i is the low nibble of byte i)."""
    codes = raw.to(tl.int32) & 0xFF
    if CPG == 2:
        first = codes & 0xF
        second = codes >> 4
    else:
        first = codes
        second = codes
    return first, second


@triton.jit
def _x_blocks_row(x_row_ptr, K, b0, last, stride_xk, BLOCK: tl.constexpr, NB: tl.constexpr,
                  EVEN: tl.constexpr):
    """One row of x over the blocks b0 .. b0 + NB - 1 as fp32 [NB, BLOCK] (0 past K, `last`)."""
    j = tl.arange(0, NB)[:, None]
    k = (b0 + j) * BLOCK + tl.arange(0, BLOCK)[None, :]
    return _load(x_row_ptr + k * stride_xk, (k < K) & (b0 + j < last), EVEN).to(tl.float32)


@triton.jit
def _x_row(x_row_ptr, K, b0, last, stride_xk, BLOCK: tl.constexpr, NB: tl.constexpr,
           STEP: tl.constexpr, EVEN: tl.constexpr):
    """One row of x over the blocks b0 .. b0 + NB - 1 as fp32 [NB, BLOCK], loaded contiguously;
    for fp4 (STEP 2) split into its even and odd columns, [NB, BLOCK // 2] each. 0 past K and
    past `last`."""
    x = _x_blocks_row(x_row_ptr, K, b0, last, stride_xk, BLOCK, NB, EVEN)
    if STEP == 2:
        first, second = tl.split(x.reshape(NB, BLOCK // 2, 2))
    else:
        first = x
        second = x
    return first, second


@triton.jit
def _x_columns(x_ptr, offs_m, M, K, b0, last, stride_xm, stride_xk, BLOCK: tl.constexpr,
               NB: tl.constexpr, STEP: tl.constexpr, EVEN: tl.constexpr):
    """x[offs_m, k] over the blocks b0 .. b0 + NB - 1, transposed for the dot:
    [NB * BLOCK, BLOCK_M], or for fp4 its even and odd k, [NB * BLOCK // 2, BLOCK_M] each.
    Loaded along k (contiguous), split and transposed in registers."""
    k = b0 * BLOCK + tl.arange(0, NB * BLOCK)
    ok = (offs_m < M)[:, None] & ((k < K) & (k < last * BLOCK))[None, :]
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk, mask=ok, other=0.0)
    if STEP == 2:
        even, odd = tl.split(x.reshape(offs_m.shape[0], NB * BLOCK // 2, 2))
        first = tl.trans(even)
        second = tl.trans(odd)
    else:
        first = tl.trans(x)
        second = first
    return first, second


# Eight fp4 codes of a 32-bit word (code p in bits 4p .. 4p + 3) to fp32 values times 2**-14.
# Each code is first rewritten as the high byte of its fp16 (sign to bit 7, magnitude to bits
# 1-3: the value times 2**-14, exact), four codes to a register: `o` the odd codes 1 3 5 7,
# `e` the even codes 0 2 4 6, three and four logic operations. One byte permute per two codes
# then puts two such bytes in the high bytes of an fp16 pair (codes p and p + 4, low bytes 0),
# and each half is converted exactly: about 1.4 logic operations and one conversion per code.
_FP4_WORD_TO_F32 = ptx(" ".join([
    "{", ".reg .b32 o, e, t, h;", ".reg .b16 lo, hi;",
    "shr.b32 t, $8, 3;", "and.b32 t, t, 0x0E0E0E0E;", "and.b32 o, $8, 0x80808080;",
    "or.b32 o, o, t;",
    "shl.b32 t, $8, 1;", "and.b32 t, t, 0x0E0E0E0E;", "shl.b32 e, $8, 4;",
    "and.b32 e, e, 0x80808080;", "or.b32 e, e, t;"]
    # prmt selector 0x2404: bytes (0, b0, 0, b2) of the register; 0x3414: (0, b1, 0, b3)
    + [line for p, (reg, sel) in enumerate([("e", "0x2404"), ("o", "0x2404"), ("e", "0x3414"),
                                           ("o", "0x3414")]) for line in (
        f"prmt.b32 h, {reg}, 0, {sel};",
        "mov.b32 {lo, hi}, h;",
        f"cvt.f32.f16 ${p}, lo;",
        f"cvt.f32.f16 ${p + 4}, hi;")]
    + ["}"]))


@triton.jit
def fp16_pair_to_f32(h):
    """The two fp16 halves of int32 `h` (low half first) as fp32."""
    lo = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (h >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _fp4_word_values(words, INTERPRETER: tl.constexpr):
    """The eight fp4 codes of each int32 word (code p in bits 4p .. 4p + 3) as eight fp32
    tensors, values times 2**-14: `_FP4_WORD_TO_F32`, or under the interpreter (which runs no
    PTX) the same steps in Triton."""
    if INTERPRETER:
        o = ((words >> 3) & 0x0E0E0E0E) | (words & -0x7F7F7F80)  # 0x80808080
        e = ((words << 1) & 0x0E0E0E0E) | ((words << 4) & -0x7F7F7F80)
        v0, v4 = fp16_pair_to_f32((e << 8) & -0xFF0100)  # 0xFF00FF00
        v1, v5 = fp16_pair_to_f32((o << 8) & -0xFF0100)
        v2, v6 = fp16_pair_to_f32(e & -0xFF0100)
        v3, v7 = fp16_pair_to_f32(o & -0xFF0100)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _FP4_WORD_TO_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r", [words], dtype=(tl.float32,) * 8,
            is_pure=True, pack=1)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _to_f32(x, INTERPRETER: tl.constexpr):
    """bf16 / fp16 `x` as fp32. bf16 on the GPU: one logic operation per value on the 32-bit
    register of two (pack=2: element 2i in the low half, 2i + 1 in the high half), where
    Triton's conversion moves the high half down and shifts it back up."""
    if x.dtype == tl.bfloat16 and not INTERPRETER:
        value = tl.inline_asm_elementwise(
            "shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000;", "=r,=r,r", [x],
            dtype=tl.float32, is_pure=True, pack=2)
    else:
        value = x.to(tl.float32)
    return value


@triton.jit
def _phases4(t):
    """t [..., 2, 2] -> its four [...] slices in index order (index 2 * a + b of t[..., a, b])."""
    b0, b1 = tl.split(t)
    t0, t2 = tl.split(b0)
    t1, t3 = tl.split(b1)
    return t0, t1, t2, t3


@triton.jit
def _phases8(t):
    """t [..., 2, 2, 2] -> its eight [...] slices in index order (index 4 * a + 2 * b + c of
    t[..., a, b, c])."""
    c0, c1 = tl.split(t)
    t0, t2, t4, t6 = _phases4(c0)
    t1, t3, t5, t7 = _phases4(c1)
    return t0, t1, t2, t3, t4, t5, t6, t7


@triton.jit
def _block_major_codes(w_ptr, offs_n, N, K, b0, last, stride_wn, stride_wk, BLOCK: tl.constexpr,
                       NB: tl.constexpr, EVEN: tl.constexpr, WORDS: tl.constexpr):
    """The codes of W's rows offs_n over the blocks b0 .. b0 + NB - 1, [BLOCK_N, NB, E] (0 past
    K and at or past `last`): WORDS, fp4 as int32 words of eight codes (E = BLOCK // 8), else
    one code per byte (fp8, E = BLOCK).

    Loaded block-major, [NB, BLOCK_N, E // V, V] in 16-byte vectors of V elements, then
    permuted: Triton (3.6) lays a load out with each thread holding a vector along the
    contiguous last dimension and the lanes, then the warps, along the other dimensions in
    order. So the lanes run along the blocks, the warps along the rows, and each thread holds
    whole blocks of one or more rows (4 rows of 16 over 4 warps). `_block_major_x` loads x the
    same way, so each thread has the x values of its blocks at hand (no layout conversion
    through shared memory) and converts each once for all the rows it holds. (Any other
    layout gives the same results, only slower: benchmarks/sass_matmul.py shows it.)"""
    BN: tl.constexpr = offs_n.shape[0]
    E: tl.constexpr = BLOCK // 8 if WORDS else BLOCK
    V: tl.constexpr = 4 if WORDS else 16
    CODES: tl.constexpr = 8 if WORDS else 1  # per element
    j = tl.arange(0, NB)[:, None, None, None]
    rows = offs_n[None, :, None, None]
    e = ((b0 + j) * E + V * tl.arange(0, E // V)[None, None, :, None]
         + tl.arange(0, V)[None, None, None, :])
    ok = (rows < N) & (b0 + j < last) & (e * CODES < K)
    if WORDS:
        ptrs = (w_ptr + rows * stride_wn).to(tl.pointer_type(tl.int32)) + e
    else:
        ptrs = w_ptr + rows * stride_wn + e * stride_wk
    return tl.permute(_load(ptrs, ok, EVEN), (1, 0, 2, 3)).reshape(BN, NB, E)


@triton.jit
def _block_major_x(x_row_ptr, K, b0, last, stride_xk, BN: tl.constexpr, BLOCK: tl.constexpr,
                   NB: tl.constexpr, EVEN: tl.constexpr, INTERPRETER: tl.constexpr):
    """x over the blocks b0 .. b0 + NB - 1 in fp32, laid out as `_block_major_codes`:
    [BN, NB, BLOCK // 8, 8], x[k] at [:, j, g, p] for k = (b0 + j) * BLOCK + 8g + p, the same
    for each of the BN rows (0 past K and at or past `last`).

    Loaded block-major in vectors of eight. The rows dimension (offset 0) is there so that the
    load is laid out as the codes: warps along it, not along the vectors of a block. A thread
    holding several rows loads and converts their (equal) x values once: the compiler merges
    the identical loads."""
    j = tl.arange(0, NB)[:, None, None, None]
    row = tl.arange(0, BN)[None, :, None, None]
    k = ((b0 + j) * BLOCK + 8 * tl.arange(0, BLOCK // 8)[None, None, :, None]
         + tl.arange(0, 8)[None, None, None, :] + 0 * row)
    x = _load(x_row_ptr + k * stride_xk, (k < K) & (b0 + j < last), EVEN)
    return _to_f32(tl.permute(x, (1, 0, 2, 3)), INTERPRETER)


@triton.jit
def _fp4_words_row_partial(words, x, BLOCK: tl.constexpr, INTERPRETER: tl.constexpr):
    """fp32 [BLOCK_N, NB]: each block's unscaled partial times 2**-14 for one activation row,
    from the blocks' fp4 codes as int32 words and x as `_block_major_codes` and
    `_block_major_x` lay them out, decoded eight at a time. Each block's products are one
    chain of multiply-adds per row."""
    BN: tl.constexpr = words.shape[0]
    NB: tl.constexpr = words.shape[1]
    C: tl.constexpr = BLOCK // 32  # groups of four words per block
    w_words = _phases4(words.reshape(BN, NB, C, 2, 2))  # word 4c + i: [BN, NB, C]
    x_words = _phases4(tl.permute(x.reshape(BN, NB, C, 4, 8), (0, 1, 2, 4, 3))
                       .reshape(BN, NB, C, 8, 2, 2))  # its eight x values: [BN, NB, C, 8]
    part = tl.zeros([BN, NB, C], dtype=tl.float32)
    for i in tl.static_range(4):
        v = _fp4_word_values(w_words[i], INTERPRETER)
        xp = _phases8(x_words[i].reshape(BN, NB, C, 2, 2, 2))  # k = 8 * word + p
        for p in tl.static_range(8):
            part += v[p] * xp[p]
    return tl.sum(part, axis=2)


@triton.jit
def _fp6_words_row_partial(raw, x_row_ptr, K, b0, last, stride_xk, BLOCK: tl.constexpr,
                           NB: tl.constexpr, EVEN: tl.constexpr, BITS: tl.constexpr,
                           MBITS: tl.constexpr, TO_VALUE: tl.constexpr):
    """fp32 [BLOCK_N, NB]: each block's unscaled partial for one activation row, from the
    blocks' fp6 codes as `_raw_codes` loads whole words, [BLOCK_N, NB, BLOCK // 16, 4]: the
    three words w0 w1 w2 of each sixteen codes (code p in bits 6p .. 6p + 5 of the 96-bit
    little-endian w2:w1:w0) and a 0."""
    G16: tl.constexpr = BLOCK // 16
    w0, w1, w2, _ = _phases4(raw.reshape(raw.shape[0], NB, G16, 2, 2))
    codes = (w0, w0 >> 6, w0 >> 12, w0 >> 18, w0 >> 24, ((w0 >> 30) & 3) | (w1 << 2),
             w1 >> 4, w1 >> 10, w1 >> 16, w1 >> 22, ((w1 >> 28) & 15) | (w2 << 4),
             w2 >> 2, w2 >> 8, w2 >> 14, w2 >> 20, w2 >> 26)
    x = _x_blocks_row(x_row_ptr, K, b0, last, stride_xk, BLOCK, NB, EVEN)
    x_even, x_odd = tl.split(x.reshape(NB, G16, 8, 2))  # k = 16 * group + 2 * q + r
    x_even = _phases8(x_even.reshape(NB, G16, 2, 2, 2))
    x_odd = _phases8(x_odd.reshape(NB, G16, 2, 2, 2))
    part = tl.zeros([raw.shape[0], NB, G16], dtype=tl.float32)
    for p in tl.static_range(16):
        value = decode_value(codes[p] & 0x3F, False, BITS, MBITS, False, False, 1.0, TO_VALUE)
        if p % 2 == 0:
            part += value * x_even[p // 2][None]
        else:
            part += value * x_odd[p // 2][None]
    return tl.sum(part, axis=2)


@triton.jit
def _rows_partial(raw, x_row_ptr, K, b0, last, stride_xk, BLOCK: tl.constexpr,
                  NB: tl.constexpr, CPG: tl.constexpr, EVEN: tl.constexpr, WORDS: tl.constexpr,
                  FAST: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
                  MBITS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
                  LSB: tl.constexpr, TO_VALUE: tl.constexpr, INTERPRETER: tl.constexpr,
                  BLOCK_MAJOR: tl.constexpr):
    """fp32 [BLOCK_N, NB]: one activation row times each of the blocks b0 .. b0 + NB - 1
    (unscaled), from the blocks' codes `raw` as `_block_major_codes` (BLOCK_MAJOR) or
    `_raw_codes` loaded them."""
    if BLOCK_MAJOR:
        x = _block_major_x(x_row_ptr, K, b0, last, stride_xk, raw.shape[0], BLOCK, NB, EVEN,
                           INTERPRETER)
        if FAST == 5:
            part = _fp4_words_row_partial(raw, x, BLOCK, INTERPRETER) * FP4_UNSHIFT
        else:
            value = _values(raw.to(tl.int32) & 0xFF, tl.float32, FAST, IS_INT, BITS, MBITS,
                            HAS_INF, HAS_NAN, LSB, TO_VALUE)
            part = tl.sum(value * x.reshape(raw.shape), axis=2)
    elif WORDS:  # fp6 as whole words
        part = _fp6_words_row_partial(raw, x_row_ptr, K, b0, last, stride_xk, BLOCK, NB, EVEN,
                                      BITS, MBITS, TO_VALUE)
    else:
        STEP: tl.constexpr = 2 if CPG == 2 else 1
        first, second = _split_codes(raw, CPG)
        x_first, x_second = _x_row(x_row_ptr, K, b0, last, stride_xk, BLOCK, NB, STEP, EVEN)
        value = _values(first, tl.float32, FAST, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB,
                        TO_VALUE)
        part = tl.sum(value * x_first[None, :, :], axis=2)
        if STEP == 2:
            value = _values(second, tl.float32, FAST, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN,
                            LSB, TO_VALUE)
            part += tl.sum(value * x_second[None, :, :], axis=2)
        if FAST == 4:
            part = part * FP4_UNSHIFT
    return part


@triton.jit
def _block_scales(s_ptr, offs_n, N, b0, last, stride_sn, stride_sk, NB: tl.constexpr,
                  EVEN: tl.constexpr, BLOCK_MAJOR: tl.constexpr = False):
    """fp32 [BLOCK_N, NB]: the scales 2**(s - 127) of blocks b0 .. b0 + NB - 1 (0 at or past
    `last`). BLOCK_MAJOR: in `_block_major_codes`' layout, one byte at a time (a load
    vectorized along the blocks would need a layout conversion through shared memory)."""
    blk = b0 + tl.arange(0, NB)
    if BLOCK_MAJOR:
        offs = offs_n[None, :] * stride_sn + blk[:, None] * stride_sk
        if NB > 1:  # (a [1, 1] tensor is folded to a scalar, which takes no such hint)
            offs = tl.max_contiguous(offs, [1, 1])
        byte = tl.permute(_load(s_ptr + offs, (offs_n < N)[None, :] & (blk < last)[:, None],
                                EVEN), (1, 0)).to(tl.int32)
    else:
        byte = _load(s_ptr + offs_n[:, None] * stride_sn + blk[None, :] * stride_sk,
                     (offs_n < N)[:, None] & (blk < last)[None, :], EVEN).to(tl.int32)
    scale = scale_value(byte)
    if not EVEN:
        scale = tl.where((blk < last)[None, :], scale, 0.0)
    return scale


@triton.jit
def row_times_blocks(w_ptr, s_ptr, x_row_ptr, offs_n, N, K, first, last, blocks_per_split,
                     stride_wn, stride_wk, stride_sn, stride_sk, stride_xk, BLOCK: tl.constexpr,
                     BLOCK_N: tl.constexpr, NB: tl.constexpr, CPG: tl.constexpr,
                     EVEN: tl.constexpr, WORDS: tl.constexpr, FAST: tl.constexpr,
                     IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                     HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr, LSB: tl.constexpr,
                     TO_VALUE: tl.constexpr, INTERPRETER: tl.constexpr):
    """fp32 [BLOCK_N]: one activation row times the blocks first .. last - 1 of W's rows offs_n
    (the rows variant's body; also routed_gemv's, one row per routed pair). Per-block sums
    are kept apart and added across blocks once, after the loop (no cross-thread reduction
    per step)."""
    # fp4 words and fp8 bytes: see _block_major_codes (MXINT8, bound by its int-to-float
    # conversions, measured no faster so on an H100)
    BLOCK_MAJOR: tl.constexpr = FAST == 5 or (CPG == 1 and not IS_INT)
    acc = tl.zeros([BLOCK_N, NB], dtype=tl.float32)
    for i in range(0, blocks_per_split, NB):
        b0 = first + i
        if BLOCK_MAJOR:
            raw = _block_major_codes(w_ptr, offs_n, N, K, b0, last, stride_wn, stride_wk,
                                     BLOCK, NB, EVEN, FAST == 5)
        else:
            raw = _raw_codes(w_ptr, offs_n, N, K, b0, last, stride_wn, stride_wk, BLOCK, NB,
                             CPG, EVEN, WORDS)
        scale = _block_scales(s_ptr, offs_n, N, b0, last, stride_sn, stride_sk, NB, EVEN,
                              BLOCK_MAJOR)
        acc += scale * _rows_partial(raw, x_row_ptr, K, b0, last, stride_xk, BLOCK, NB, CPG,
                                     EVEN, WORDS, FAST, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN,
                                     LSB, TO_VALUE, INTERPRETER, BLOCK_MAJOR)
    return tl.sum(acc, axis=1)


@triton.jit
def _dot(value, x, INTERPRETER: tl.constexpr):
    """tl.dot of exact bf16/fp16 operands with fp32 accumulation (Triton 3.6's interpreter gets
    bf16 dots wrong: exact fp32 there)."""
    if INTERPRETER:
        product = tl.dot(value.to(tl.float32), x.to(tl.float32), input_precision="ieee")
    else:
        product = tl.dot(value, x)
    return product


@triton.jit
def _dots_step(w_ptr, x_ptr, offs_n, offs_m, M, N, K, b0, last, scale, stride_wn, stride_wk,
               stride_xm, stride_xk, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr,
               NB: tl.constexpr, CPG: tl.constexpr, SCALED: tl.constexpr, EVEN: tl.constexpr,
               INTERPRETER: tl.constexpr, FAST: tl.constexpr, IS_INT: tl.constexpr,
               BITS: tl.constexpr, MBITS: tl.constexpr, HAS_INF: tl.constexpr,
               HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr):
    """fp32 [BLOCK_N, BLOCK_M]: the activation rows offs_m times the blocks b0 .. b0 + NB - 1.
    SCALED: the values scaled in fp32 and rounded to x's dtype, one dot; else NB = 1, a dot of
    unscaled values whose fp32 result is scaled."""
    STEP: tl.constexpr = 2 if CPG == 2 else 1
    W: tl.constexpr = NB * BLOCK // STEP
    dtype = x_ptr.dtype.element_ty
    first, second = _split_codes(_raw_codes(w_ptr, offs_n, N, K, b0, last, stride_wn, stride_wk,
                                            BLOCK, NB, CPG, EVEN, False), CPG)
    x_first, x_second = _x_columns(x_ptr, offs_m, M, K, b0, last, stride_xm, stride_xk, BLOCK,
                                   NB, STEP, EVEN)
    if SCALED:
        value = _values(first, tl.float32, FAST, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB,
                        TO_VALUE)
        if FAST == 4:
            value = value * FP4_UNSHIFT
        value = (value * scale[:, :, None]).reshape(BLOCK_N, W).to(dtype)
        out = _dot(value, x_first, INTERPRETER)
        if STEP == 2:
            value = _values(second, tl.float32, FAST, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN,
                            LSB, TO_VALUE)
            if FAST == 4:
                value = value * FP4_UNSHIFT
            value = (value * scale[:, :, None]).reshape(BLOCK_N, W).to(dtype)
            out += _dot(value, x_second, INTERPRETER)
    else:
        value = _values(first, dtype, FAST, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB,
                        TO_VALUE).reshape(BLOCK_N, W)
        out = _dot(value, x_first, INTERPRETER)
        if STEP == 2:
            value = _values(second, dtype, FAST, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB,
                            TO_VALUE).reshape(BLOCK_N, W)
            out += _dot(value, x_second, INTERPRETER)
        if FAST == 4:
            out = out * FP4_UNSHIFT
        out = out * scale  # [BLOCK_N, BLOCK_M] * [BLOCK_N, 1]
    return out


@triton.jit
def mx_weight_matmul_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, ws_ptr,
    M, N, K, blocks_k, blocks_per_split,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sk, stride_om, stride_on,
    BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr,
    VARIANT: tl.constexpr, SPLIT: tl.constexpr, EVEN: tl.constexpr, HAS_BIAS: tl.constexpr,
    WORDS: tl.constexpr, FAST: tl.constexpr, CPG: tl.constexpr, INTERPRETER: tl.constexpr,
    IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr, HAS_INF: tl.constexpr,
    HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr,
):
    """Program (n tile, K split, m tile): VARIANT 0 rows (BLOCK_M = 1), 1 block dots (NB = 1),
    2 scaled dots. EVEN: every tile is whole (N, K and the splits are multiples of the tiles),
    so no load is masked. WORDS (rows variant): fp4 / fp6 rows are read as 32-bit words (whole,
    4-byte aligned rows). FAST: see `_values`; 5: fp4 words decoded through inline PTX."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    first = pid_k * blocks_per_split
    last = tl.minimum(first + blocks_per_split, blocks_k)
    if VARIANT == 0:
        out = row_times_blocks(w_ptr, s_ptr, x_ptr + pid_m * stride_xm, offs_n, N, K, first,
                               last, blocks_per_split, stride_wn, stride_wk, stride_sn,
                               stride_sk, stride_xk, BLOCK, BLOCK_N, NB, CPG, EVEN, WORDS, FAST,
                               IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE, INTERPRETER)
        rows = pid_m
        cols = offs_n
        mask = n_ok & (pid_m < M)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        out = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for i in range(0, blocks_per_split, NB):
            b0 = first + i
            scale = _block_scales(s_ptr, offs_n, N, b0, last, stride_sn, stride_sk, NB, EVEN)
            out += _dots_step(w_ptr, x_ptr, offs_n, offs_m, M, N, K, b0, last, scale, stride_wn,
                              stride_wk, stride_xm, stride_xk, BLOCK_N, BLOCK, NB, CPG,
                              VARIANT == 2, EVEN, INTERPRETER, FAST, IS_INT, BITS, MBITS,
                              HAS_INF, HAS_NAN, LSB, TO_VALUE)
        rows = offs_m[None, :]
        cols = offs_n[:, None]
        mask = (rows < M) & (cols < N)
    if not SPLIT:
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            if VARIANT == 0:
                out += bias
            else:
                out += bias[:, None]
        tl.store(out_ptr + rows * stride_om + cols * stride_on,
                 to_output(out, out_ptr.dtype.element_ty, INTERPRETER), mask=mask)
    else:
        tl.store(ws_ptr + (pid_k * M + rows) * N + cols, out, mask=mask)


@triton.jit
def reduce_splits_kernel(ws_ptr, bias_ptr, out_ptr, M, N, stride_om, stride_on,
                         SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
                         INTERPRETER: tl.constexpr):
    """out[m, n] = round(sum over splits in order of ws[s, m, n] + bias[n])."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    total = tl.load(ws_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        total += tl.load(ws_ptr + s * M * N + offs, mask=ok, other=0.0)
    m = offs // N
    n = offs % N
    if HAS_BIAS:
        total += tl.load(bias_ptr + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + n * stride_on,
             to_output(total, out_ptr.dtype.element_ty, INTERPRETER), mask=ok)

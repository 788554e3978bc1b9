"""The Gluon kernel of stream_matmul.py (device code only; see that module for what it computes).

Gluon is Triton's explicit-layout dialect: this module needs a Triton with
`triton.experimental.gluon` and its Hopper TMA / wgmma API (Triton 3.6), and its kernels run
on sm_90 GPUs only (never under Triton's interpreter). stream_linear imports it lazily.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from .._tl_numerics import decode_value, scale_value
# mma_linear's decoders (tl.constexpr), under this module's own names for them
from .mma_linear import (DECODE_E2M3_0 as _DECODE_E2M3_0, DECODE_E2M3_1 as _DECODE_E2M3_1,
                         DECODE_E2M3_2 as _DECODE_E2M3_2, DECODE_E2M3_3 as _DECODE_E2M3_3,
                         DECODE_E3M2_0 as _DECODE_E3M2_0, DECODE_E3M2_1 as _DECODE_E3M2_1,
                         DECODE_E3M2_2 as _DECODE_E3M2_2, DECODE_E3M2_3 as _DECODE_E3M2_3,
                         DECODE_E4M3 as _DECODE_E4M3, DECODE_E5M2 as _DECODE_E5M2,
                         DECODE_INT8 as _DECODE_INT8, SCALE_E2M1_PAIRS)

# The CTA-wide barrier: gl.thread_barrier in Triton 3.6, gl.barrier from 3.7 (both emit the same
# debug_barrier).
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

KB = gl.constexpr(128)  # codes of a row in one sub-step (tma_stream_layout.STEP_CODES)
BLOCK = gl.constexpr(32)
EXACT_K = gl.constexpr(16)  # columns a step of the exact recomputation (half a block)
DECODE_E4M3 = gl.constexpr(_DECODE_E4M3.value)
DECODE_E5M2 = gl.constexpr(_DECODE_E5M2.value)
DECODE_INT8 = gl.constexpr(_DECODE_INT8.value)
# A word of fp4 codes in the TMA stream layout (tma_stream_layout.FP4_BITS) and its multiplier ->
# its four bf16 pairs: each register's bits (sign, then the magnitude as a bf16 denormal's
# exponent and mantissa bits) masked into place in one or two instructions, then scaled.
DECODE_E2M1 = gl.constexpr("""{ .reg .b32 r1, r2, r3, x0, x1, x2, x3;
and.b32 x0, $8, 0x81C081C0;
shf.l.wrap.b32 r1, $8, $8, 10;
and.b32 x1, r1, 0x81C081C0;
shf.l.wrap.b32 r2, $8, $8, 13;
and.b32 x2, r2, 0x81C081C0;
and.b32 r3, $8, 0x001B001B;
mul.lo.u32 r3, r3, 0x1084;
and.b32 x3, r3, 0x81C081C0;
""" + SCALE_E2M1_PAIRS)

__all__ = ["stream_linear_kernel"]


@gluon.constexpr_function
def fp6_decoder(j, MBITS):
    """mma_linear's decode of group j (0..3) of an fp6 piece's three words (e3m2: MBITS 2)."""
    e3m2 = (_DECODE_E3M2_0, _DECODE_E3M2_1, _DECODE_E3M2_2, _DECODE_E3M2_3)
    e2m3 = (_DECODE_E2M3_0, _DECODE_E2M3_1, _DECODE_E2M3_2, _DECODE_E2M3_3)
    return (e3m2 if MBITS == 2 else e2m3)[j].value


@gluon.constexpr_function
def word_layout(S):
    """Registers of [64 rows, 4 t, S s] words: lane 4 g + t of warp w holds rows 16 w + g and
    16 w + g + 8, its S words of each in registers (one shared-memory load a row)."""
    regs = [[0, 0, 1 << j] for j in range(S.bit_length() - 1)] + [[8, 0, 0]]
    return gl.DistributedLinearLayout(
        reg_bases=regs, lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, S])


@gluon.constexpr_function
def lane_word_layout():
    """Registers of [64 rows, 4 t] words, one of each lane's row (word_layout's with S = 1)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[8, 0]], lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 4])


@gluon.constexpr_function
def row_words_layout(S):
    """word_layout(S) of the words viewed [64 rows, 4 S] (column S t + s), as loaded."""
    regs = [[0, 1 << j] for j in range(S.bit_length() - 1)] + [[8, 0]]
    return gl.DistributedLinearLayout(
        reg_bases=regs, lane_bases=[[0, S], [0, 2 * S], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 4 * S])


@gluon.constexpr_function
def mma_layout(MP):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, MP, 16])


@gluon.jit
def _launch_dependents():
    """Lets the next kernel on the stream, where it was launched with programmatic dependent
    launch, start on the SMs as this grid's CTAs leave them (once every CTA of this grid has
    run this instruction; once a CTA is enough)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _wait_for_previous():
    """Waits (this thread) until the kernels this one was launched after, with programmatic
    dependent launch, have finished and their memory is visible; at once without it."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _prefetch_l2(address, size):
    """Asks L2 for `size` bytes (a multiple of 16) from `address`, one instruction a warp. An
    L2 prefetch cannot leave anything stale (L2 is where the GPU's memory is coherent), so it
    may run before _wait_for_previous."""
    gl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
                              "=r,l,r", [address, size], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _loader(w_desc, wb_desc, x_desc, s_desc, w_smem, wb_smem, x_smem, s_smem, ready, empty,
            plane_a, plane_b, stream_scales, tile, tiles, step0, slots, STAGES: gl.constexpr,
            SUB: gl.constexpr, FP6: gl.constexpr, PDL: gl.constexpr, PREFETCH: gl.constexpr):
    """One warp: slot i % STAGES gets the tile's sub-steps step0 + i * SUB .. (x's columns
    from (step0 + i * SUB) * KB, and W's codes, fp6: both planes, and scales: one TMA box each
    sub-step, at row step * tiles + tile of the step-major TMA stream layout) once its consumer
    freed it (empty), and signals `ready` when the bytes have landed. With PDL it first asks
    L2 for the part's first PREFETCH sub-steps of W and scales, then waits for the previous
    kernel: x may be its output, and W may be too (prepack)."""
    if PDL:
        A_BYTES: gl.constexpr = 64 * w_desc.block_type.shape[1]  # a sub-step's, plane A
        B_BYTES: gl.constexpr = 64 * wb_desc.block_type.shape[1]
        S_BYTES: gl.constexpr = 64 * KB // BLOCK
        for q in gl.static_range(PREFETCH):
            if q < slots * SUB:
                run = ((step0 + q) * tiles + tile).to(gl.int64)
                _prefetch_l2(plane_a + run * A_BYTES, A_BYTES)
                if FP6:
                    _prefetch_l2(plane_b + run * B_BYTES, B_BYTES)
                _prefetch_l2(stream_scales + run * S_BYTES, S_BYTES)
        _wait_for_previous()
    for i in range(slots):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        if FP6:
            mbarrier.expect(ready.index(slot), SUB * (w_desc.block_type.nbytes
                                                      + wb_desc.block_type.nbytes
                                                      + s_desc.block_type.nbytes)
                            + x_desc.block_type.nbytes)
        else:
            mbarrier.expect(ready.index(slot), SUB * (w_desc.block_type.nbytes
                                                      + s_desc.block_type.nbytes)
                            + x_desc.block_type.nbytes)
        step = step0 + i * SUB
        for u in gl.static_range(SUB):
            run = (step + u) * tiles + tile
            tma.async_copy_global_to_shared(w_desc, [run * 64, 0], ready.index(slot),
                                            w_smem.index(slot).slice(64 * u, 64))
            if FP6:
                tma.async_copy_global_to_shared(wb_desc, [run * 64, 0], ready.index(slot),
                                                wb_smem.index(slot).slice(64 * u, 64))
            tma.async_copy_global_to_shared(s_desc, [run, 0], ready.index(slot),
                                            s_smem.index(slot).slice(u, 1))
        tma.async_copy_global_to_shared(x_desc, [0, step * KB], ready.index(slot),
                                        x_smem.index(slot))


@gluon.jit
def lane_words(tile, WB: gl.constexpr):
    """A sub-step's tile [64 rows, WB bytes] (shared memory, WB-byte swizzle) as each lane's
    words [64, 4, S = WB / 16] of its rows: lane 4 g + t's S words of a row, one shared-memory
    load a row, in word_layout(S)."""
    S: gl.constexpr = WB // 16
    words = tile._reinterpret(gl.int32, [64, 4 * S], gl.NVMMASharedLayout(
        swizzle_byte_width=WB, element_bitwidth=32, rank=2)).load(row_words_layout(S))
    return gl.convert_layout(words.reshape([64, 4, S]), word_layout(S))  # same registers


@gluon.jit
def _words(w_tile, s_row, FP4: gl.constexpr):
    """A sub-step's W tile [64, KB codes] (shared memory) as each lane's words [64, 4, S] of
    its rows (one shared-memory load a row), and the rows' scale bytes (4 a row, one a block)."""
    words = lane_words(w_tile, KB // 2 if FP4 else KB)
    return words, s_row.load(gl.SliceLayout(1, gl.SliceLayout(2, words.type.layout)))


@gluon.jit
def _fp6_words(a_tile, b_tile, s_row):
    """A sub-step's fp6 planes (shared memory: [64, 64] and [64, 32] bytes) as each lane's six
    words of its rows, the two halves of K as three words each ((A0, A1, A2), (A3, B0, B1):
    [64, 4] each), and the rows' scale bytes."""
    a, b = lane_words(a_tile, 64), lane_words(b_tile, 32)  # [64, 4, 4], [64, 4, 2]
    even, odd = gl.split(a.reshape([64, 4, 2, 2]))  # words 0, 2 and 1, 3
    a0, a2 = gl.split(even)
    a1, a3 = gl.split(odd)
    b0, b1 = gl.split(b)
    L: gl.constexpr = lane_word_layout()  # each word's layout as split: the same registers
    first = (gl.convert_layout(a0, L), gl.convert_layout(a1, L), gl.convert_layout(a2, L))
    second = (gl.convert_layout(a3, L), gl.convert_layout(b0, L), gl.convert_layout(b1, L))
    return first, second, s_row.load(gl.SliceLayout(1, L))


@gluon.jit
def _multiplier(exponent):
    """A block's bf16 multiplier in both halves of a word, from its byte in the stream scales
    (the multiplier's exponent field, tma_stream_layout; 255 gives Inf, which makes each of the
    block's products Inf or NaN and so its tile's sums: the tile is recomputed exactly)."""
    return exponent * 0x00800080


@gluon.jit
def _fp6_decoded(piece, rows, half: gl.constexpr, MP: gl.constexpr, MBITS: gl.constexpr):
    """Half `half` of a sub-step's fp6 codes (a lane's piece: three words [64, 4], groups s = 4
    half + j) as wgmma's A operand [64, KB / 2], as _decoded."""
    p0, p1, p2 = piece
    layout: gl.constexpr = p0.type.layout
    rows = gl.convert_layout(rows, gl.SliceLayout(1, layout))[:, None]
    # groups 4 half + j lie in block 2 half + j // 2 of the step
    s_lo, _ = gl.broadcast((rows >> (16 * half)) & 255, p0)
    s_hi, _ = gl.broadcast((rows >> (16 * half + 8)) & 255, p0)
    m_lo = _multiplier(s_lo)
    m_hi = _multiplier(s_hi)
    g0 = gl.inline_asm_elementwise(fp6_decoder(0, MBITS), "=h,=h,=h,=h,r,r,r", [p0, m_lo, p0],
                                   dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
    g1 = gl.inline_asm_elementwise(fp6_decoder(1, MBITS), "=h,=h,=h,=h,r,r,r", [p0, m_lo, p1],
                                   dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
    g2 = gl.inline_asm_elementwise(fp6_decoder(2, MBITS), "=h,=h,=h,=h,r,r,r", [p1, m_hi, p2],
                                   dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
    g3 = gl.inline_asm_elementwise(fp6_decoder(3, MBITS), "=h,=h,=h,=h,r,r,r", [p2, m_hi, p2],
                                   dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
    # code k = 2 h + b of each group j: [64, t, s = j] (s = 2 s1 + s0)
    v0 = _groups(g0[0], g1[0], g2[0], g3[0])
    v1 = _groups(g0[1], g1[1], g2[1], g3[1])
    v2 = _groups(g0[2], g1[2], g2[2], g3[2])
    v3 = _groups(g0[3], g1[3], g2[3], g3[3])
    return a_operand(v0, v1, v2, v3, MP)


@gluon.jit
def _groups(g0, g1, g2, g3):
    """Four [64, 4] tensors (groups 0..3) as one [64, 4, 4] (group last)."""
    v = gl.join(gl.join(g0, g1), gl.join(g2, g3))  # [64, t, s0, s1]
    return v.permute((0, 1, 3, 2)).reshape([64, 4, 4])


@gluon.jit
def a_operand(v0, v1, v2, v3, MP: gl.constexpr):
    """The values of codes 16 s + 8 h + 2 t + b (v_{2 h + b} [64, t, s]) as wgmma's A operand
    [64, KB / 2]: the same registers, in the operand's layout."""
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(MP),
                                                 k_width=2)
    t = gl.join(gl.join(v0, v1), gl.join(v2, v3))  # [64, t, s, b, h]
    t = t.permute((0, 2, 4, 1, 3))
    return gl.convert_layout(t.reshape([64, KB // 2]), a_layout)


@gluon.jit
def _halves(words):
    """words [64, 4, S] -> (words[..., :S / 2], words[..., S / 2:]): the codes of the first
    and second half of the sub-step's K (registers only)."""
    S: gl.constexpr = words.shape[2]
    return gl.split(words.reshape([64, 4, 2, S // 2]).permute((0, 1, 3, 2)))


@gluon.jit
def _decoded(words, rows, half: gl.constexpr, MP: gl.constexpr, FP4: gl.constexpr,
             E5M2: gl.constexpr, IS_INT: gl.constexpr):
    """Half `half` of a sub-step's words [64, 4, S / 2] as wgmma's A operand [64, KB / 2]: bf16
    registers value * 2**(s - 127), exact (Inf or NaN in a block marked for recomputation)."""
    SH: gl.constexpr = words.shape[2]
    layout: gl.constexpr = words.type.layout
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(MP),
                                                 k_width=2)
    s_index = gl.arange(0, SH, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout))) + half * SH
    shift = (s_index % 4) * 8 if FP4 else ((s_index // 2) % 4) * 8  # word s's block's byte
    rows = gl.convert_layout(rows, gl.SliceLayout(1, gl.SliceLayout(2, layout)))  # no moves
    m = _multiplier((rows[:, None, None] >> shift[None, None, :]) & 255)
    if FP4:  # code (r, b) = 32 s + 16 o + 8 h + 2 t + b with r = 2 o + h (tma_stream_layout)
        v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
            DECODE_E2M1, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, m], dtype=(gl.bfloat16,) * 8,
            is_pure=True, pack=1)
        t = gl.join(gl.join(gl.join(v0, v1), gl.join(v2, v3)),
                    gl.join(gl.join(v4, v5), gl.join(v6, v7)))  # [64, t, s, b, h, o]
        t = t.permute((0, 2, 5, 4, 1, 3))
        a = gl.convert_layout(t.reshape([64, KB // 2]), a_layout)  # same registers
    else:  # 4 codes a word: byte 2 h + b is code 16 s + 8 h + 2 t + b
        if IS_INT:
            v0, v1, v2, v3 = gl.inline_asm_elementwise(
                DECODE_INT8, "=h,=h,=h,=h,r,r", [words, m], dtype=(gl.bfloat16,) * 4,
                is_pure=True, pack=1)
        elif E5M2:
            v0, v1, v2, v3 = gl.inline_asm_elementwise(
                DECODE_E5M2, "=h,=h,=h,=h,r,r", [words, m], dtype=(gl.bfloat16,) * 4,
                is_pure=True, pack=1)
        else:
            v0, v1, v2, v3 = gl.inline_asm_elementwise(
                DECODE_E4M3, "=h,=h,=h,=h,r,r", [words, m], dtype=(gl.bfloat16,) * 4,
                is_pure=True, pack=1)
        a = a_operand(v0, v1, v2, v3, MP)
    return a


@gluon.jit
def _mma(acc, a, x_half, FIRST: gl.constexpr):
    """Issues (not waits for) the wgmma acc + a x_half^T (acc undefined where FIRST)."""
    if FIRST:
        return warpgroup_mma(a, x_half.permute((1, 0)), acc, use_acc=False, is_async=True)
    return warpgroup_mma(a, x_half.permute((1, 0)), acc, is_async=True)


@gluon.jit
def _slot(acc, w_smem, wb_smem, x_smem, s_smem, slot, FIRST: gl.constexpr, MP: gl.constexpr,
          SUB: gl.constexpr, CPG: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
          MBITS: gl.constexpr):
    """acc plus the products of one ring slot's SUB sub-steps. Each sub-step is decoded in
    two halves of K, the first half's wgmma running while the second is decoded, and the
    slot's wgmmas are waited for once, at its end: the decode overlaps the tensor cores (and
    the other warpgroup fills what is left)."""
    scale_words = s_smem.index(slot)._reinterpret(gl.int32, [SUB * 64],
                                                  gl.SwizzledSharedLayout(1, 1, 1, [0]))
    x_u = x_smem.index(slot)
    for u in gl.static_range(SUB):
        x_first = x_u.slice(KB * u, KB // 2, dim=1)
        x_second = x_u.slice(KB * u + KB // 2, KB // 2, dim=1)
        scale_rows = scale_words.slice(64 * u, 64)
        if CPG == 4:
            first, second, rows = _fp6_words(w_smem.index(slot).slice(64 * u, 64),
                                             wb_smem.index(slot).slice(64 * u, 64), scale_rows)
            acc = _mma(acc, _fp6_decoded(first, rows, 0, MP, MBITS), x_first,
                       FIRST and u == 0)
            acc = _mma(acc, _fp6_decoded(second, rows, 1, MP, MBITS), x_second,
                       False)
        else:
            words, rows = _words(w_smem.index(slot).slice(64 * u, 64), scale_rows, CPG == 2)
            first, second = _halves(words)
            acc = _mma(acc, _decoded(first, rows, 0, MP, CPG == 2, E5M2, IS_INT),
                       x_first, FIRST and u == 0)
            acc = _mma(acc, _decoded(second, rows, 1, MP, CPG == 2, E5M2, IS_INT),
                       x_second, False)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _consume(c: gl.constexpr, w_smem, wb_smem, x_smem, s_smem, ready, empty, slots,
             MP: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr, CPG: gl.constexpr,
             E5M2: gl.constexpr, IS_INT: gl.constexpr, MBITS: gl.constexpr):
    """Consumer warpgroup c (0, 1) takes slots c, c + 2, ...; returns its fp32 partial [64, MP]
    of out^T. The first slot is peeled so that its wgmma (use_acc off) defines the accumulator:
    a zero-initialised one reaching the loop's exit on a zero-trip path made ptxas serialize
    every wgmma."""
    mbarrier.wait(ready.index(c), 0)
    acc = _slot(gl.zeros([64, MP], gl.float32, mma_layout(MP)), w_smem, wb_smem, x_smem, s_smem,
                c, True, MP, SUB, CPG, E5M2, IS_INT, MBITS)
    mbarrier.arrive(empty.index(c))
    for j in range(1, (slots - c + 1) // 2):
        i = c + 2 * j
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc = _slot(acc, w_smem, wb_smem, x_smem, s_smem, slot, False, MP, SUB, CPG, E5M2,
                    IS_INT, MBITS)
        mbarrier.arrive(empty.index(slot))
    return acc


@gluon.jit
def _consume_first(w_smem, wb_smem, x_smem, s_smem, ready, empty, slots, MP: gl.constexpr,
                   STAGES: gl.constexpr, SUB: gl.constexpr, CPG: gl.constexpr,
                   E5M2: gl.constexpr, IS_INT: gl.constexpr, MBITS: gl.constexpr):
    return (_consume(0, w_smem, wb_smem, x_smem, s_smem, ready, empty, slots, MP, STAGES, SUB,
                     CPG, E5M2, IS_INT, MBITS),)


@gluon.jit
def _consume_second(w_smem, wb_smem, x_smem, s_smem, ready, empty, partial, done, slots,
                    MP: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr,
                    CPG: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
                    MBITS: gl.constexpr):
    acc = _consume(1, w_smem, wb_smem, x_smem, s_smem, ready, empty, slots, MP, STAGES, SUB, CPG,
                   E5M2, IS_INT, MBITS)
    partial.store(acc)
    mbarrier.arrive(done)


@gluon.jit
def _exact_tile(x_ptr, w_ptr, s_ptr, n0, M, K, stride_xm, stride_wn, stride_sn,
                MP: gl.constexpr, CPG: gl.constexpr, IS_INT: gl.constexpr, BITS: gl.constexpr,
                MBITS: gl.constexpr, HAS_INF: gl.constexpr, HAS_NAN: gl.constexpr,
                LSB: gl.constexpr, TO_VALUE: gl.constexpr):
    """The tile's sums [64, MP] from the standard layout, W decoded exactly in fp32 (NaN and Inf
    codes, any scale byte) and fp32 products and sums (FMA), EXACT_K columns at a time in K
    order."""
    L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])
    rows = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, L))
    k = gl.arange(0, EXACT_K, layout=gl.SliceLayout(0, L))
    m = gl.arange(0, MP, layout=gl.SliceLayout(0, L))
    kx = gl.arange(0, EXACT_K, layout=gl.SliceLayout(1, L))
    acc = gl.zeros([64, MP], gl.float32, L)
    for k0 in range(0, K, EXACT_K):
        cols = k0 + k
        if CPG == 4:  # code i in bits 6 i .. of the bitstream: 1 or 2 bytes of its group
            group = 3 * (cols // 4)
            first = group + 6 * (cols % 4) // 8
            row_bytes = w_ptr + rows[:, None] * stride_wn
            low = gl.load(row_bytes + first[None, :]).to(gl.int32)
            high = gl.load(row_bytes + gl.minimum(first + 1, group + 2)[None, :]).to(gl.int32)
            codes = ((low | (high << 8)) >> (6 * (cols % 4) % 8)[None, :]) & 0x3F
        else:
            codes = gl.load(w_ptr + rows[:, None] * stride_wn
                            + (cols // CPG)[None, :]).to(gl.int32)
        if CPG == 2:  # code 2 i in the low nibble of byte i
            codes = (codes >> (4 * (cols % 2))[None, :]) & 0xF
        scale = scale_value(gl.load(s_ptr + rows * stride_sn + k0 // BLOCK).to(gl.int32))
        w = decode_value(codes, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) \
            * scale[:, None]
        x_t = gl.load(x_ptr + m[None, :] * stride_xm + (k0 + kx)[:, None],
                      mask=(m[None, :] < M) & (kx[:, None] < EXACT_K), other=0.0)
        acc = gl.dot_fma(gl.convert_layout(w, gl.DotOperandLayout(0, L, 0)),
                         gl.convert_layout(x_t.to(gl.float32), gl.DotOperandLayout(1, L, 0)),
                         acc)
    return acc


@gluon.jit
def stream_linear_kernel(w_desc, wb_desc, x_desc, s_desc, plane_a, plane_b, stream_scales, x_ptr,
                         w_ptr, s_ptr, bias_ptr, out_ptr, partials_ptr, counters_ptr, M, K,
                         stride_xm, stride_wn, stride_sn, stride_om, MP: gl.constexpr,
                         STAGES: gl.constexpr, SUB: gl.constexpr, SPLIT: gl.constexpr,
                         PDL: gl.constexpr, PREFETCH: gl.constexpr,
                         HAS_BIAS: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
                         BITS: gl.constexpr, MBITS: gl.constexpr, HAS_INF: gl.constexpr,
                         HAS_NAN: gl.constexpr, LSB: gl.constexpr, TO_VALUE: gl.constexpr,
                         CPG: gl.constexpr):
    """out[:M, 64 tile ..] = x @ W[64 tile ..].T (+ bias), rounded once to out's dtype: CTA
    `SPLIT tile + part` takes part `part` of the tile's K (its share of the tile's ring slots)
    with a TMA loader warp and two consumer warpgroups (stream_matmul.py). PDL: launched with
    programmatic dependent launch, it lets the next kernel start as its CTAs finish, and its
    loader waits for the previous kernel (after asking L2 for PREFETCH sub-steps of W)."""
    FP6: gl.constexpr = CPG == 4
    if PDL:
        _launch_dependents()
    tile = gl.program_id(0) // SPLIT
    part = gl.program_id(0) % SPLIT
    tiles = gl.num_programs(0) // SPLIT
    steps = K // KB
    first = part * (steps // SUB) // SPLIT  # the part's slots of the tile, as evenly as they go
    slots = (part + 1) * (steps // SUB) // SPLIT - first
    # a slot: SUB sub-steps of W (the descriptors' boxes: one sub-step) and scales, x's columns
    w_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, SUB * 64, w_desc.block_type.shape[1]],
                                       w_desc.layout)
    x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape,
                                       x_desc.layout)
    s_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, SUB, s_desc.block_type.shape[1]],
                                       s_desc.layout)
    if FP6:  # W's plane B (w_smem holds plane A)
        wb_smem = gl.allocate_shared_memory(gl.uint8,
                                            [STAGES, SUB * 64, wb_desc.block_type.shape[1]],
                                            wb_desc.layout)
    else:
        wb_smem = w_smem  # not read
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    partial = gl.allocate_shared_memory(gl.float32, [64, MP],
                                        gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=1)
    mbarrier.init(done, count=1)
    acc = gl.warp_specialize([
        (_consume_first, (w_smem, wb_smem, x_smem, s_smem, ready, empty, slots, MP, STAGES, SUB,
                          CPG, E5M2, IS_INT, MBITS)),
        (_consume_second, (w_smem, wb_smem, x_smem, s_smem, ready, empty, partial, done, slots,
                           MP, STAGES, SUB, CPG, E5M2, IS_INT, MBITS)),
        (_loader, (w_desc, wb_desc, x_desc, s_desc, w_smem, wb_smem, x_smem, s_smem, ready,
                   empty, plane_a, plane_b, stream_scales, tile, tiles, first * SUB, slots,
                   STAGES, SUB, FP6, PDL, PREFETCH)),
    ], [4, 1], [152, 40])[0]
    if PDL:  # (passed already by the loader) before these threads' stores and loads
        _wait_for_previous()
    mbarrier.wait(done, 0)
    acc = acc + partial.load(mma_layout(MP))
    n = tile * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma_layout(MP)))
    m = gl.arange(0, MP, layout=gl.SliceLayout(0, mma_layout(MP)))
    if SPLIT == 1:
        _finish(acc, x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, tile, n, m, M, K, stride_xm,
                stride_wn, stride_sn, stride_om, MP, HAS_BIAS, IS_INT, BITS, MBITS, HAS_INF,
                HAS_NAN, LSB, TO_VALUE, CPG)
    else:
        # partials [SPLIT, N, MP]: each part stores its own and counts its arrival; the last to
        # arrive adds them in part order (a sum that does not depend on the order of arrival),
        # finishes the tile and leaves the tile's counter at zero for the next call
        part_size = tiles * 64 * MP
        offsets = n[:, None] * MP + m[None, :]
        gl.store(partials_ptr + part * part_size + offsets, acc)
        _cta_barrier()  # every thread's partial is stored before the arrival is counted
        if gl.atomic_add(counters_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:
            _cta_barrier()
            acc = gl.load(partials_ptr + offsets, cache_modifier=".cg")
            for j in gl.static_range(1, SPLIT):
                acc = acc + gl.load(partials_ptr + j * part_size + offsets, cache_modifier=".cg")
            gl.store(counters_ptr + tile, 0)
            _finish(acc, x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, tile, n, m, M, K, stride_xm,
                    stride_wn, stride_sn, stride_om, MP, HAS_BIAS, IS_INT, BITS, MBITS, HAS_INF,
                    HAS_NAN, LSB, TO_VALUE, CPG)


@gluon.jit
def _finish(acc, x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, tile, n, m, M, K, stride_xm, stride_wn,
            stride_sn, stride_om, MP: gl.constexpr, HAS_BIAS: gl.constexpr, IS_INT: gl.constexpr,
            BITS: gl.constexpr, MBITS: gl.constexpr, HAS_INF: gl.constexpr,
            HAS_NAN: gl.constexpr, LSB: gl.constexpr, TO_VALUE: gl.constexpr,
            CPG: gl.constexpr):
    """The tile's sums acc [64 rows n, MP] (fp32, all of K) plus the bias, rounded once and
    stored as out[m, n] for m < M."""
    # A poisoned word made its products NaN; Inf / NaN sums have other causes too (x,
    # overflow). Either way the exact recomputation gives the contract's result.
    bad = ((acc != acc) | (gl.abs(acc) == float("inf"))).to(gl.int32)
    if gl.max(gl.max(bad, axis=1), axis=0) > 0:
        acc = gl.convert_layout(
            _exact_tile(x_ptr, w_ptr, s_ptr, tile * 64, M, K, stride_xm, stride_wn, stride_sn,
                        MP, CPG, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE),
            mma_layout(MP))
    if HAS_BIAS:
        acc = acc + gl.load(bias_ptr + n).to(gl.float32)[:, None]
    gl.store(out_ptr + m[None, :] * stride_om + n[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=(m[None, :] < M) & (n[:, None] >= 0))

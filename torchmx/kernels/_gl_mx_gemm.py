"""The Gluon kernels of mx_gemm.py (device code only; see that module for what they compute).

Gluon kernels run on sm_90 GPUs only (never under Triton's interpreter); mx_gemm imports this
module lazily. Both kernels share one order of K inside each step of 64 columns: physical
column P = 16 t + 4 Q + 2 h + b (t, Q in 0..3; h, b in 0..1) is column L = 16 Q + 8 h + 2 t + b
of the product, so that lane 4 g + t's 16 contiguous codes of an activation row are exactly
its wgmma A fragment (mma_linear's order for one-byte codes; for fp4 the same 16 codes are one
8-byte load), and the weight is dequantized into the same order.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ._gl_stream import (DECODE_E4M3, DECODE_E5M2, DECODE_INT8, _a_operand, _lane_words,
                         mma_layout, word_layout)
from .mma_linear import _DECODE_E2M1, _multiplier

# mma_linear's decode of eight fp4 codes of a word in the standard packing (code j in bits 4 j)
DECODE_E2M1_PLAIN = gl.constexpr(_DECODE_E2M1.value)
BM = gl.constexpr(128)  # activation rows of a tile: 64 for each consumer warpgroup
BN = gl.constexpr(256)  # weight rows (output columns) of a tile: wgmma's N
STEP = gl.constexpr(64)  # K columns of a step

__all__ = ["mx_gemm_kernel", "permuted_dequantize_kernel"]


@gluon.jit
def _decoded(words, s, FP4: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
             S_MIN: gl.constexpr, S_MAX: gl.constexpr):
    """A step's codes of 64 rows, lane t's words [64, 4, S] (S = 4 words of one-byte codes, 2 of
    fp4) with their scale bytes s (the same shape), as the decoded values: one-byte codes as
    four bf16 tensors v_{2h+b} [64, 4, 4] (byte 2 h + b of word Q), fp4 as eight v_{2r+b} [64,
    4, 2] (nibble 2 r + b of word w: Q = 2 w + r // 2, h = r % 2). value * 2**(s - 127) exact,
    NaN where mma_linear's multiplier is poisoned."""
    m = _multiplier(words, s, E5M2, IS_INT, S_MIN, S_MAX, 2 if FP4 else 1, 0)
    if FP4:
        v = gl.inline_asm_elementwise(DECODE_E2M1_PLAIN, "=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                      [words, m], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    elif IS_INT:
        v = gl.inline_asm_elementwise(DECODE_INT8, "=h,=h,=h,=h,r,r", [words, m],
                                      dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
    elif E5M2:
        v = gl.inline_asm_elementwise(DECODE_E5M2, "=h,=h,=h,=h,r,r", [words, m],
                                      dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
    else:
        v = gl.inline_asm_elementwise(DECODE_E4M3, "=h,=h,=h,=h,r,r", [words, m],
                                      dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
    return v


@gluon.jit
def _fp4_by_q(v):
    """fp4's eight tensors [R, 4, 2 (w)] as [R, t, Q, h, b] with Q = 2 w + o (registers only)."""
    t = gl.join(gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3])),
                gl.join(gl.join(v[4], v[5]), gl.join(v[6], v[7])))  # [R, t, w, b, h, o]
    t = t.permute((0, 1, 2, 5, 4, 3))  # [R, t, w, o, h, b]
    return t.reshape([t.shape[0], 4, 4, 2, 2])


@gluon.jit
def _a_registers(words, s, FP4: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
                 S_MIN: gl.constexpr, S_MAX: gl.constexpr):
    """A step's words [64, 4, S] of a warpgroup's rows as wgmma's A operand [64, 64] (column L
    of the module docstring's order)."""
    v = _decoded(words, s, FP4, E5M2, IS_INT, S_MIN, S_MAX)
    if FP4:
        t = _fp4_by_q(v).permute((0, 2, 3, 1, 4))  # [64, Q, h, t, b]
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(BN),
                                                     k_width=2)
        a = gl.convert_layout(t.reshape([64, STEP]), a_layout)  # same registers
    else:
        a = _a_operand(v[0], v[1], v[2], v[3], BN)
    return a


@gluon.jit
def _scale_bytes(xs_ptr, row0, M, stride_xs, step, layout: gl.constexpr):
    """Scale bytes [64 rows, 4 t] of a step: lane t's codes lie in block 2 step + t // 2; 127
    (one) for rows past M, whose codes TMA reads as zeros."""
    rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    t = gl.arange(0, 4, layout=gl.SliceLayout(0, layout))
    ptrs = xs_ptr + rows[:, None].to(gl.int64) * stride_xs + (2 * step + t // 2)[None, :]
    mask = (rows < M)[:, None] & (t < 4)[None, :]
    return gl.load(ptrs, mask=mask, other=127).to(gl.int32)


@gluon.jit
def _step(acc, x_tile, w_tile, s, FIRST: gl.constexpr, XB: gl.constexpr, FP4: gl.constexpr,
          E5M2: gl.constexpr, IS_INT: gl.constexpr, S_MIN: gl.constexpr, S_MAX: gl.constexpr):
    """Issues (does not wait for) acc + A W^T for one step: A the step's codes of the
    warpgroup's 64 rows (x_tile, shared memory) decoded into registers, W^T the bf16 weight
    tile [BN, 64] (shared memory, in the permuted order)."""
    words = _lane_words(x_tile, XB)
    s = gl.convert_layout(s, gl.SliceLayout(2, words.type.layout))  # same registers
    s, _ = gl.broadcast(gl.expand_dims(s, 2), words)
    a = _a_registers(words, s, FP4, E5M2, IS_INT, S_MIN, S_MAX)
    if FIRST:
        return warpgroup_mma(a, w_tile.permute((1, 0)), acc, use_acc=False, is_async=True)
    return warpgroup_mma(a, w_tile.permute((1, 0)), acc, is_async=True)


@gluon.jit
def _next_slot(it, ready, STAGES: gl.constexpr):
    slot = it % STAGES
    mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    return slot


@gluon.jit
def _store_tile(acc, out_desc, c_smem, flags_ptr, flag, row0, col0, c: gl.constexpr):
    """The warpgroup's sums [64, BN]: a flag where any is NaN or Inf (the exact fix-up then
    recomputes them), and the sums rounded to out's dtype, stored by TMA in four [64, 64]
    pieces through two shared-memory buffers."""
    bad = gl.max(((acc != acc) | (gl.abs(acc) == float("inf"))).to(gl.int32), axis=1)
    gl.store(flags_ptr + flag + bad * 0, bad, mask=bad > 0)
    halves = acc.reshape([64, 2, BN // 2]).permute((0, 2, 1)).split()
    pieces = (halves[0].reshape([64, 2, BN // 4]).permute((0, 2, 1)).split()
              + halves[1].reshape([64, 2, BN // 4]).permute((0, 2, 1)).split())
    for i in gl.static_range(4):
        buffer = c_smem.index(2 * c + i % 2)
        tma.store_wait(pendings=1)  # the store that last read this buffer is done
        buffer.store(pieces[i].to(out_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [row0, col0 + 64 * i], buffer)


@gluon.jit
def _consume(c: gl.constexpr, x_smem, w_smem, c_smem, ready, empty, out_desc, xs_ptr, flags_ptr,
             M, stride_xs, tiles, tiles_m, steps, flag_stride,
             STAGES: gl.constexpr, XB: gl.constexpr, FP4: gl.constexpr, E5M2: gl.constexpr,
             IS_INT: gl.constexpr, S_MIN: gl.constexpr, S_MAX: gl.constexpr):
    """Consumer warpgroup c (rows 64 c .. of each tile): every step of every tile of this CTA.
    Steps go in pairs, so that the A registers of the wgmma left in flight across the loop's
    back edge are not the ones being written (ptxas serializes the wgmmas otherwise); each
    wgmma runs while the next step is decoded."""
    s_layout: gl.constexpr = gl.SliceLayout(2, word_layout(XB // 16))
    acc = gl.zeros([64, BN], gl.float32, mma_layout(BN))
    it = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        m0 = (tile % tiles_m) * BM
        n0 = (tile // tiles_m) * BN
        row0 = m0 + 64 * c
        s0 = _scale_bytes(xs_ptr, row0, M, stride_xs, 0, s_layout)
        s1 = _scale_bytes(xs_ptr, row0, M, stride_xs, 1, s_layout)
        slot = _next_slot(it, ready, STAGES)
        acc = _step(acc, x_smem.index(slot).slice(64 * c, 64), w_smem.index(slot), s0, True, XB,
                    FP4, E5M2, IS_INT, S_MIN, S_MAX)
        first = slot
        it += 1
        slot = _next_slot(it, ready, STAGES)
        acc = _step(acc, x_smem.index(slot).slice(64 * c, 64), w_smem.index(slot), s1, False,
                    XB, FP4, E5M2, IS_INT, S_MIN, S_MAX)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index(first))
        last = slot
        it += 1
        for pair in range(1, steps // 2):
            s0 = _scale_bytes(xs_ptr, row0, M, stride_xs, 2 * pair, s_layout)
            s1 = _scale_bytes(xs_ptr, row0, M, stride_xs, 2 * pair + 1, s_layout)
            slot = _next_slot(it, ready, STAGES)
            acc = _step(acc, x_smem.index(slot).slice(64 * c, 64), w_smem.index(slot), s0,
                        False, XB, FP4, E5M2, IS_INT, S_MIN, S_MAX)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty.index(last))
            first = slot
            it += 1
            slot = _next_slot(it, ready, STAGES)
            acc = _step(acc, x_smem.index(slot).slice(64 * c, 64), w_smem.index(slot), s1,
                        False, XB, FP4, E5M2, IS_INT, S_MIN, S_MAX)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty.index(first))
            last = slot
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(last))
        flag = (row0 // 64) * flag_stride + n0 // BN
        _store_tile(acc, out_desc, c_smem, flags_ptr, flag, row0, n0, c)
    tma.store_wait(pendings=0)


@gluon.jit
def _load(x_desc, w_desc, x_smem, w_smem, ready, empty, tiles, tiles_m, steps,
          STAGES: gl.constexpr, XB: gl.constexpr):
    """One warp: the codes of the tile's activation rows [BM, XB bytes] and the weight tile
    [BN, 64] of each step into slot it % STAGES, once both consumers freed it."""
    it = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        m0 = (tile % tiles_m) * BM
        n0 = (tile // tiles_m) * BN
        for k in range(steps):
            slot = it % STAGES
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(slot),
                            x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [m0, k * XB], ready.index(slot),
                                            x_smem.index(slot))
            tma.async_copy_global_to_shared(w_desc, [n0, k * STEP], ready.index(slot),
                                            w_smem.index(slot))
            it += 1


@gluon.jit
def mx_gemm_kernel(x_desc, w_desc, out_desc, xs_ptr, flags_ptr, M, stride_xs, tiles_m, tiles_n,
                   steps, flag_stride, STAGES: gl.constexpr, FP4: gl.constexpr,
                   E5M2: gl.constexpr, IS_INT: gl.constexpr, S_MIN: gl.constexpr,
                   S_MAX: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """out = x @ W^T for the MX activation x (codes by x_desc [M, K bytes], scale bytes at
    xs_ptr [M, K / 32]) and the weight W (bf16 in the permuted order, w_desc [N, K]): a
    persistent CTA an SM taking tiles [BM, BN] m fastest; a loader warp and two consumer
    warpgroups (mx_gemm.py). flags [ceil(M / 64), flag_stride]: set where a warpgroup's sums
    hold NaN or Inf."""
    XB: gl.constexpr = x_desc.block_type.shape[1]
    x_smem = gl.allocate_shared_memory(gl.uint8, [STAGES] + x_desc.block_type.shape,
                                       x_desc.layout)
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape,
                                       w_desc.layout)
    c_smem = gl.allocate_shared_memory(out_desc.dtype, [4] + out_desc.block_type.shape,
                                       out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=2)
    tiles = tiles_m * tiles_n
    gl.warp_specialize([
        (_consume, (0, x_smem, w_smem, c_smem, ready, empty, out_desc, xs_ptr, flags_ptr, M,
                     stride_xs, tiles, tiles_m, steps, flag_stride, STAGES, XB, FP4, E5M2,
                     IS_INT, S_MIN, S_MAX)),
        (_consume, (1, x_smem, w_smem, c_smem, ready, empty, out_desc, xs_ptr, flags_ptr, M,
                     stride_xs, tiles, tiles_m, steps, flag_stride, STAGES, XB, FP4, E5M2,
                     IS_INT, S_MIN, S_MAX)),
        (_load, (x_desc, w_desc, x_smem, w_smem, ready, empty, tiles, tiles_m, steps, STAGES,
                 XB)),
    ], [4, 1], [CONSUMER_REGS, 40])


@gluon.jit
def permuted_dequantize_kernel(data_ptr, scale_ptr, out_ptr, N, K, stride_d, stride_s,
                               R: gl.constexpr, UNITS: gl.constexpr, S: gl.constexpr,
                               FP4: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
                               S_MIN: gl.constexpr, S_MAX: gl.constexpr):
    """out [N, K] bf16 = the MX weight (codes data_ptr [N, K bytes], scale bytes [N, K / 32])
    dequantized into the permuted order of each 64-column step (module docstring): R rows (a
    row a warp: launch with num_warps=R), UNITS steps a program. Values as the GEMM's decode
    gives them: exact, or NaN where its multiplier is poisoned (the fix-up then recomputes the
    outputs exactly)."""
    WORDS: gl.constexpr = 4 * S  # 32-bit words of codes in a row's step
    rows = gl.program_id(0) * R
    step0 = gl.program_id(1) * UNITS
    # lane 4 u + t loads its S words of step u (16 contiguous codes): a warp load is contiguous
    load_layout: gl.constexpr = gl.BlockedLayout([1, S], [1, 32], [R, 1], [1, 0])
    r = rows + gl.arange(0, R, layout=gl.SliceLayout(1, load_layout))
    w = gl.arange(0, UNITS * WORDS, layout=gl.SliceLayout(0, load_layout))
    ok = (r < N)[:, None] & ((step0 + w // WORDS) * STEP < K)[None, :]
    row_words = (data_ptr + r[:, None].to(gl.int64) * stride_d).to(gl.pointer_type(gl.int32))
    words = gl.load(row_words + step0 * WORDS + w[None, :], mask=ok, other=0)
    words = words.reshape([R * UNITS, 4, S])
    # lane t's codes lie in block 2 u + t // 2 of the row
    block = 2 * (step0 + w // WORDS) + (w % WORDS) // (2 * S)
    s = gl.load(scale_ptr + r[:, None].to(gl.int64) * stride_s + block[None, :],
                mask=ok, other=127).to(gl.int32)
    s = s.reshape([R * UNITS, 4, S])
    s = gl.convert_layout(s, words.type.layout)
    v = _decoded(words, s, FP4, E5M2, IS_INT, S_MIN, S_MAX)
    if FP4:
        t = _fp4_by_q(v)  # [R u, t, Q, h, b]
    else:
        t = gl.join(gl.join(v[0], v[2]), gl.join(v[1], v[3]))  # [R u, t, Q, h, b]
    t = t.permute((0, 2, 3, 1, 4))  # [R u, Q, h, t, b]: column 16 Q + 8 h + 2 t + b
    t = t.reshape([R, UNITS * STEP])
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [R, 1], [1, 0])
    t = gl.convert_layout(t, store_layout)
    ro = rows + gl.arange(0, R, layout=gl.SliceLayout(1, store_layout))
    co = step0 * STEP + gl.arange(0, UNITS * STEP, layout=gl.SliceLayout(0, store_layout))
    gl.store(out_ptr + ro[:, None].to(gl.int64) * K + co[None, :], t,
             mask=(ro < N)[:, None] & (co < K)[None, :])

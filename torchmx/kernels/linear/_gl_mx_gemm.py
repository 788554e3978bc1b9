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
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ._gl_stream import (DECODE_E4M3, DECODE_E5M2, DECODE_INT8, a_operand, lane_words,
                         mma_layout, word_layout)
from .mma_linear import DECODE_E2M1, piece_multiplier, scale_multiplier, special_codes

# mma_linear's decode of eight fp4 codes of a word in the standard packing (code j in bits 4 j)
DECODE_E2M1_PLAIN = gl.constexpr(DECODE_E2M1.value)
BM = gl.constexpr(128)  # activation rows of a tile: 64 for each consumer warpgroup
BN = gl.constexpr(256)  # weight rows (output columns) of a tile: wgmma's N
STEP = gl.constexpr(64)  # K columns of a step
GROUP = gl.constexpr(8)  # steps of a row the weight's dequantize takes at once (lane 4 u + t)
# _dequantize_ahead: its warps (a row each) and the groups in its ring; a block's counter once
# all of its units are written (an arrival per lane per unit)
AHEAD_WARPS = gl.constexpr(2)
AHEAD_DEPTH = gl.constexpr(8)
BLOCK_WRITTEN = gl.constexpr(32 * AHEAD_WARPS.value * (256 // AHEAD_WARPS.value))

__all__ = ["mx_gemm_kernel", "permuted_dequantize_kernel"]


@gluon.jit
def _decoded(words, s, FP4: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
             S_MIN: gl.constexpr, S_MAX: gl.constexpr, CODES_CHECKED: gl.constexpr):
    """A step's codes of 64 rows, lane t's words [64, 4, S] (S = 4 words of one-byte codes, 2 of
    fp4) with their scale bytes s (the same shape), as the decoded values: one-byte codes as
    four bf16 tensors v_{2h+b} [64, 4, 4] (byte 2 h + b of word Q), fp4 as eight v_{2r+b} [64,
    4, 2] (nibble 2 r + b of word w: Q = 2 w + r // 2, h = r % 2). value * 2**(s - 127) exact,
    NaN where mma_linear's multiplier is poisoned: for a scale byte outside [S_MIN, S_MAX],
    and for a NaN / Inf code if CODES_CHECKED (otherwise such a code decodes to a finite
    value, and the caller must find it another way)."""
    if CODES_CHECKED:
        m = piece_multiplier(words, s, E5M2, IS_INT, S_MIN, S_MAX, 2 if FP4 else 1, 0)
    else:
        m = scale_multiplier(s, E5M2, IS_INT, S_MIN, S_MAX, 2 if FP4 else 1, 0)
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
    of the module docstring's order); NaN / Inf codes are not looked for (`_consume`)."""
    v = _decoded(words, s, FP4, E5M2, IS_INT, S_MIN, S_MAX, False)
    if FP4:
        t = _fp4_by_q(v).permute((0, 2, 3, 1, 4))  # [64, Q, h, t, b]
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(BN),
                                                     k_width=2)
        a = gl.convert_layout(t.reshape([64, STEP]), a_layout)  # same registers
    else:
        a = a_operand(v[0], v[1], v[2], v[3], BN)
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
def _step(acc, special, check, x_tile, w_tile, s, FIRST: gl.constexpr, XB: gl.constexpr,
          FP4: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr, S_MIN: gl.constexpr,
          S_MAX: gl.constexpr):
    """Issues (does not wait for) acc + A W^T for one step: A the step's codes of the
    warpgroup's 64 rows (x_tile, shared memory) decoded into registers, W^T the bf16 weight
    tile [BN, 64] (shared memory, in the permuted order). If check (fp8 x only), special
    [64, 4] (s's layout) also collects the codes' NaN / Inf finds: (acc, special)."""
    words = lane_words(x_tile, XB)
    s = gl.convert_layout(s, gl.SliceLayout(2, words.type.layout))  # same registers
    if _has_special_codes(FP4, IS_INT):
        if check:
            special = special | special_codes(words, E5M2)
    s, _ = gl.broadcast(gl.expand_dims(s, 2), words)
    a = _a_registers(words, s, FP4, E5M2, IS_INT, S_MIN, S_MAX)
    if FIRST:
        return warpgroup_mma(a, w_tile.permute((1, 0)), acc, use_acc=False,
                             is_async=True), special
    return warpgroup_mma(a, w_tile.permute((1, 0)), acc, is_async=True), special


@gluon.constexpr_function
def _has_special_codes(FP4, IS_INT):
    """Whether x's format has NaN / Inf codes (e4m3, e5m2)."""
    return not (FP4 or IS_INT)


@gluon.jit
def _next_slot(it, ready, STAGES: gl.constexpr):
    slot = it % STAGES
    mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    return slot


@gluon.jit
def _step_freeing(acc, special, check, it, previous, c: gl.constexpr, x_smem, w_smem, s, ready,
                  empty, STAGES: gl.constexpr, XB: gl.constexpr, FP4: gl.constexpr,
                  E5M2: gl.constexpr, IS_INT: gl.constexpr, S_MIN: gl.constexpr,
                  S_MAX: gl.constexpr):
    """Issues step `it` (once its slot is ready), waits for the wgmma before it and frees that
    one's slot `previous`: (acc, special, this step's slot)."""
    slot = _next_slot(it, ready, STAGES)
    acc, special = _step(acc, special, check, x_smem.index(slot).slice(64 * c, 64),
                         w_smem.index(slot), s, False, XB, FP4, E5M2, IS_INT, S_MIN, S_MAX)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    mbarrier.arrive(empty.index(previous))
    return acc, special, slot


@gluon.jit
def _store_tile(acc, out_desc, c_smem, flag_ptr, row0, col0, c: gl.constexpr):
    """The warpgroup's sums [64, BN]: their flag set where any is NaN or Inf (the exact fix-up
    then recomputes them), and the sums rounded to out's dtype, stored by TMA in four [64, 64]
    pieces through two shared-memory buffers."""
    bad = gl.max(((acc != acc) | (gl.abs(acc) == float("inf"))).to(gl.int32), axis=1)
    gl.store(flag_ptr + bad * 0, bad, mask=bad > 0)
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
    wgmma runs while the next step is decoded.

    x's NaN / Inf codes (fp8) are looked for once, not in every tile that decodes them: a
    row's outputs are all NaN or Inf where one of its codes is (and the fix-up gives them
    exactly), so the tile of the first 256 columns checks its rows' codes and, where it finds
    one, flags every tile of these 64 rows; the other tiles decode without looking (a few
    integer ops a word: about 4% of the GEMM's time at e4m3 8192^3)."""
    s_layout: gl.constexpr = gl.SliceLayout(2, word_layout(XB // 16))
    acc = gl.zeros([64, BN], gl.float32, mma_layout(BN))
    it = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        m0 = (tile % tiles_m) * BM
        n0 = (tile // tiles_m) * BN
        row0 = m0 + 64 * c
        check = n0 == 0
        special = gl.zeros([64, 4], gl.int32, s_layout)
        s0 = _scale_bytes(xs_ptr, row0, M, stride_xs, 0, s_layout)
        s1 = _scale_bytes(xs_ptr, row0, M, stride_xs, 1, s_layout)
        first = _next_slot(it, ready, STAGES)
        acc, special = _step(acc, special, check, x_smem.index(first).slice(64 * c, 64),
                             w_smem.index(first), s0, True, XB, FP4, E5M2, IS_INT, S_MIN,
                             S_MAX)
        acc, special, last = _step_freeing(acc, special, check, it + 1, first, c, x_smem,
                                           w_smem, s1, ready, empty, STAGES, XB, FP4, E5M2,
                                           IS_INT, S_MIN, S_MAX)
        it += 2
        for pair in range(1, steps // 2):
            s0 = _scale_bytes(xs_ptr, row0, M, stride_xs, 2 * pair, s_layout)
            s1 = _scale_bytes(xs_ptr, row0, M, stride_xs, 2 * pair + 1, s_layout)
            acc, special, first = _step_freeing(acc, special, check, it, last, c, x_smem,
                                                w_smem, s0, ready, empty, STAGES, XB, FP4,
                                                E5M2, IS_INT, S_MIN, S_MAX)
            acc, special, last = _step_freeing(acc, special, check, it + 1, first, c, x_smem,
                                               w_smem, s1, ready, empty, STAGES, XB, FP4,
                                               E5M2, IS_INT, S_MIN, S_MAX)
            it += 2
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(last))
        flags = flags_ptr + (row0 // 64) * flag_stride
        if _has_special_codes(FP4, IS_INT):
            if check:
                for j in range(flag_stride):  # every tile of these rows, where a code was
                    gl.store(flags + j + special * 0, special * 0 + 1, mask=special != 0)
        _store_tile(acc, out_desc, c_smem, flags + n0 // BN, row0, n0, c)
    tma.store_wait(pendings=0)


@gluon.jit
def _async_proxy_fence(x):
    """Zeros of x's shape, after `fence.proxy.async.global`: this thread's generic-proxy view
    of global memory ordered with its async-proxy (TMA) accesses. Adding the zeros to an
    address or coordinate keeps what uses it after the fence."""
    return gl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.b32 $0, 0;", "=r,r", [x],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _load(x_desc, w_desc, x_smem, w_smem, ready, empty, counts_ptr, first_block, tiles, tiles_m,
          steps, STAGES: gl.constexpr, XB: gl.constexpr):
    """One warp: the codes of the tile's activation rows [BM, XB bytes] and the weight tile
    [BN, 64] of each step into slot it % STAGES, once both consumers freed it; a tile of W's
    blocks from first_block on once `_dequantize_ahead` has written that block."""
    it = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        m0 = (tile % tiles_m) * BM
        block = tile // tiles_m
        n0 = block * BN
        if block >= first_block:
            done = gl.atomic_add(counts_ptr + block, 0, sem="acquire", scope="gpu")
            while done < BLOCK_WRITTEN:
                done = gl.atomic_add(counts_ptr + block, 0, sem="acquire", scope="gpu")
            lanes = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
            n0 += gl.max(_async_proxy_fence(lanes + done), axis=0)
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
def _dequantize_ahead(wd_ptr, ws_ptr, w_ptr, counts_ptr, codes_smem, scales_smem, N, K,
                      stride_wd, stride_ws, first_block, tiles_n, S: gl.constexpr,
                      FP4: gl.constexpr, E5M2: gl.constexpr, IS_INT: gl.constexpr,
                      S_MIN: gl.constexpr, S_MAX: gl.constexpr):
    """AHEAD_WARPS warps: W's blocks of BN rows from first_block on, dequantized into the
    GEMM's bf16 weight w_ptr (the permuted order) in units of AHEAD_WARPS rows (a row a
    warp), GROUP steps at a time. The units are taken in order from a queue that the
    CTAs share (counts_ptr[tiles_n]), so the blocks are written in the order the tiles need
    them, and only by CTAs that are running (no CTA waits for one that is not); each lane
    counts its part of a unit in the block's counter (release: its stores are visible to
    whoever reads the count). The codes and scale words of a unit's next AHEAD_DEPTH - 1 step
    groups are in flight (cp.async into this partition's ring; each lane reads back only
    what it copied, so no barrier): with one group in flight, a wave of tiles at 2048
    activation rows (8 of W's blocks) outran the dequantize."""
    lanes = gl.arange(0, 32 * AHEAD_WARPS,
                      layout=gl.BlockedLayout([1], [32], [AHEAD_WARPS], [0]))
    units = (tiles_n - first_block) * (BN // AHEAD_WARPS)
    groups = gl.cdiv(gl.cdiv(K, STEP), GROUP)
    unit = gl.atomic_add(counts_ptr + tiles_n, 1, sem="relaxed", scope="gpu")
    while unit < units:
        rows = first_block * BN + unit * AHEAD_WARPS
        for g in range(AHEAD_DEPTH - 1):
            _copy_group(wd_ptr, ws_ptr, codes_smem, scales_smem, g, rows, g * GROUP, N, K,
                        stride_wd, stride_ws, S)
        for g in range(groups):
            ahead = g + AHEAD_DEPTH - 1
            _copy_group(wd_ptr, ws_ptr, codes_smem, scales_smem, ahead % AHEAD_DEPTH, rows,
                        ahead * GROUP, N, K, stride_wd, stride_ws, S)
            async_copy.wait_group(AHEAD_DEPTH - 1)  # this lane's copies of group g landed
            words_layout: gl.constexpr = gl.BlockedLayout([1, S], [1, 32], [AHEAD_WARPS, 1],
                                                          [1, 0])
            words = codes_smem.index(g % AHEAD_DEPTH).load(words_layout)
            scale_words = scales_smem.index(g % AHEAD_DEPTH).load(_lane_layout(AHEAD_WARPS))
            _decode_store(words, _lane_scales(scale_words, S), w_ptr, rows, g * GROUP, N, K,
                          AHEAD_WARPS, S, AHEAD_WARPS, FP4, E5M2, IS_INT, S_MIN, S_MAX)
        async_copy.wait_group(0)  # the copies past the unit's end (masked off) too
        zeros = _async_proxy_fence(lanes)
        gl.atomic_add(counts_ptr + rows // BN + zeros, zeros + 1, sem="release", scope="gpu")
        unit = gl.atomic_add(counts_ptr + tiles_n, 1, sem="relaxed", scope="gpu")


@gluon.jit
def mx_gemm_kernel(x_desc, w_desc, out_desc, xs_ptr, flags_ptr, M, stride_xs, tiles_m, tiles_n,
                   steps, flag_stride, wd_ptr, ws_ptr, w_ptr, counts_ptr, N, K, stride_wd,
                   stride_ws, first_block, STAGES: gl.constexpr, FP4: gl.constexpr,
                   E5M2: gl.constexpr, IS_INT: gl.constexpr, S_MIN: gl.constexpr,
                   S_MAX: gl.constexpr, W_S: gl.constexpr, W_FP4: gl.constexpr,
                   W_E5M2: gl.constexpr, W_IS_INT: gl.constexpr, W_S_MIN: gl.constexpr,
                   W_S_MAX: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   AHEAD_REGS: gl.constexpr):
    """out = x @ W^T for the MX activation x (codes by x_desc [M, K bytes], scale bytes at
    xs_ptr [M, K / 32]) and the MX weight W (codes wd_ptr [N, K bytes], scale bytes ws_ptr
    [N, K / 32]), read as bf16 in the permuted order through w_desc (w_ptr [N, K]): its blocks
    of BN rows before first_block are already there, the others are written by this kernel
    (`_dequantize_ahead`) before the tiles that need them load them. A persistent CTA an SM
    taking tiles [BM, BN] m fastest; a loader warp, AHEAD_WARPS dequantize warps and two
    consumer warpgroups (mx_gemm.py). flags [ceil(M / 64), flag_stride]: set where a warpgroup's sums
    hold NaN or Inf; counts_ptr [tiles_n + 1] zeros: the written blocks' counters and the
    dequantize's queue."""
    XB: gl.constexpr = x_desc.block_type.shape[1]
    x_smem = gl.allocate_shared_memory(gl.uint8, [STAGES] + x_desc.block_type.shape,
                                       x_desc.layout)
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape,
                                       w_desc.layout)
    c_smem = gl.allocate_shared_memory(out_desc.dtype, [4] + out_desc.block_type.shape,
                                       out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # _dequantize_ahead's ring: a group's codes and scale words for each of its rows
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    codes_smem = gl.allocate_shared_memory(gl.int32, [AHEAD_DEPTH, AHEAD_WARPS, 32 * W_S],
                                           plain)
    scales_smem = gl.allocate_shared_memory(gl.int32, [AHEAD_DEPTH, AHEAD_WARPS, 32], plain)
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
        (_load, (x_desc, w_desc, x_smem, w_smem, ready, empty, counts_ptr, first_block, tiles,
                 tiles_m, steps, STAGES, XB)),
        (_dequantize_ahead, (wd_ptr, ws_ptr, w_ptr, counts_ptr, codes_smem, scales_smem, N, K,
                             stride_wd, stride_ws,
                             first_block, tiles_n, W_S, W_FP4, W_E5M2, W_IS_INT, W_S_MIN,
                             W_S_MAX)),
    ], [4, 1, AHEAD_WARPS], [CONSUMER_REGS, 40, AHEAD_REGS])


@gluon.constexpr_function
def _lane_layout(WARPS):
    """[WARPS rows, 32]: a row a warp, an element a lane."""
    return gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])


@gluon.jit
def _group_pointers(data_ptr, scale_ptr, rows, step0, N, K, stride_d, stride_s,
                    R: gl.constexpr, S: gl.constexpr, WARPS: gl.constexpr):
    """Where rows rows .. rows + R of the MX weight (codes data_ptr [N, K bytes], scale bytes
    [N, K / 32]) hold steps step0 .. step0 + GROUP (step0 a multiple of GROUP): lane 4 u + t's
    S words of codes (16 codes of step u: a warp's load is contiguous) and the scale word
    holding the byte of its codes' block, 2 (step0 + u) + t // 2 (`_lane_scales` picks it
    out), as (code pointers [R, 32 S], their mask, scale pointers [R, 32], their mask)."""
    WORDS: gl.constexpr = 4 * S  # 32-bit words of codes in a row's step
    layout: gl.constexpr = gl.BlockedLayout([1, S], [1, 32], [WARPS, 1], [1, 0])
    r = rows + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    w = gl.arange(0, GROUP * WORDS, layout=gl.SliceLayout(0, layout))
    ok = (r < N)[:, None] & ((step0 + w // WORDS) * STEP < K)[None, :]
    codes = (data_ptr + r[:, None].to(gl.int64) * stride_d).to(gl.pointer_type(gl.int32))
    codes = codes + step0 * WORDS + w[None, :]
    lane: gl.constexpr = _lane_layout(WARPS)
    r = rows + gl.arange(0, R, layout=gl.SliceLayout(1, lane))
    u = gl.arange(0, 32, layout=gl.SliceLayout(0, lane)) // 4
    scale_ok = (r < N)[:, None] & ((step0 + u) * STEP < K)[None, :]
    scales = (scale_ptr + r[:, None].to(gl.int64) * stride_s + 2 * step0).to(
        gl.pointer_type(gl.int32)) + (u // 2)[None, :]
    return codes, ok, scales, scale_ok


@gluon.jit
def _lane_scales(scale_words, S: gl.constexpr):
    """Each lane's scale byte (out of the word `_group_pointers` points it to) as an int32
    for each of its S words of codes: [R, 32] -> [R, 32 S] (copies in the lane's registers)."""
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, scale_words.type.layout))
    s = (scale_words >> (8 * (2 * (lane // 4 % 2) + lane % 4 // 2))[None, :]) & 0xFF
    s = gl.join(s, s)
    if S == 4:
        s = gl.join(s, s)
    return s.reshape([s.shape[0], 32 * S])


@gluon.jit
def _decode_store(words, s, out_ptr, rows, step0, N, K, R: gl.constexpr, S: gl.constexpr,
                  WARPS: gl.constexpr, FP4: gl.constexpr, E5M2: gl.constexpr,
                  IS_INT: gl.constexpr, S_MIN: gl.constexpr, S_MAX: gl.constexpr):
    """The codes words [R, GROUP 4 S] of rows rows .., steps step0 .. (lane 4 u + t: step u's
    16 codes t) with their scale bytes s (the same shape), dequantized into out [N, K] bf16 in
    the permuted order of each 64-column step (module docstring). Values as the GEMM's
    decode gives them: exact, or NaN where its multiplier is poisoned (the fix-up then
    recomputes the outputs exactly)."""
    words = words.reshape([R * GROUP, 4, S])
    s = gl.convert_layout(s.reshape([R * GROUP, 4, S]), words.type.layout)
    v = _decoded(words, s, FP4, E5M2, IS_INT, S_MIN, S_MAX, True)
    if FP4:
        t = _fp4_by_q(v)  # [R u, t, Q, h, b]
    else:
        t = gl.join(gl.join(v[0], v[2]), gl.join(v[1], v[3]))  # [R u, t, Q, h, b]
    t = t.permute((0, 2, 3, 1, 4))  # [R u, Q, h, t, b]: column 16 Q + 8 h + 2 t + b
    t = t.reshape([R, GROUP * STEP])
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])
    t = gl.convert_layout(t, store_layout)
    ro = rows + gl.arange(0, R, layout=gl.SliceLayout(1, store_layout))
    co = step0 * STEP + gl.arange(0, GROUP * STEP, layout=gl.SliceLayout(0, store_layout))
    gl.store(out_ptr + ro[:, None].to(gl.int64) * K + co[None, :], t,
             mask=(ro < N)[:, None] & (co < K)[None, :])


@gluon.jit
def _copy_group(data_ptr, scale_ptr, codes_smem, scales_smem, slot, rows, step0, N, K,
                stride_d, stride_s, S: gl.constexpr):
    """cp.async of `_group_pointers`' codes and scale words into slot `slot` of the ring, one
    commit group (masked off past the weight: zeros)."""
    codes, ok, scales, scale_ok = _group_pointers(data_ptr, scale_ptr, rows, step0, N, K,
                                                  stride_d, stride_s, AHEAD_WARPS, S,
                                                  AHEAD_WARPS)
    async_copy.async_copy_global_to_shared(codes_smem.index(slot), codes, mask=ok)
    async_copy.async_copy_global_to_shared(scales_smem.index(slot), scales, mask=scale_ok)
    async_copy.commit_group()


@gluon.jit
def permuted_dequantize_kernel(data_ptr, scale_ptr, out_ptr, N, K, stride_d, stride_s,
                               R: gl.constexpr, S: gl.constexpr, FP4: gl.constexpr,
                               E5M2: gl.constexpr, IS_INT: gl.constexpr, S_MIN: gl.constexpr,
                               S_MAX: gl.constexpr):
    """out [N, K] bf16 = the MX weight (codes data_ptr [N, K bytes], scale bytes [N, K / 32])
    dequantized into the GEMM's order (`_decode_store`): R rows (a row a warp: launch with
    num_warps=R), GROUP steps a program."""
    rows = gl.program_id(0) * R
    step0 = gl.program_id(1) * GROUP
    codes, ok, scales, scale_ok = _group_pointers(data_ptr, scale_ptr, rows, step0, N, K,
                                                  stride_d, stride_s, R, S, R)
    words = gl.load(codes, mask=ok, other=0)
    scale_words = gl.load(scales, mask=scale_ok, other=0x7F7F7F7F)  # off: 127, one
    _decode_store(words, _lane_scales(scale_words, S), out_ptr, rows, step0, N, K, R, S, R,
                  FP4, E5M2, IS_INT, S_MIN, S_MAX)

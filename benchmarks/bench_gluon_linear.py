"""A warp-specialized Gluon prototype of the few-row MX matmul vs torchmx's kernels (issue #7).

    python benchmarks/bench_gluon_linear.py        # MXFP4 and MXFP8 (e4m3), M = 16, N = K = 8192

torchmx's few-row tensor-core kernels (fragment_matmul, mma_linear) split K over several
programs per 64-row tile and hand their fp32 partials over at the end; bench_stream_shapes.py
showed that one program per tile, streaming its 512 KiB through a deep pipeline, can read the
weight at the memory floor, with no hand-over at all. This script tries that shape in Gluon
(Triton's explicit-layout dialect), which Triton's own language cannot express:

- One CTA per 64-row tile of W, no split-K. A loader warp brings each step's codes, x^T and
  scale bytes into a STAGES-deep shared-memory ring by TMA; two consumer warpgroups take the
  ring's slots in turn, each with its own fp32 accumulator, and add them once at the end
  (through shared memory, inside the CTA).
- The weight is prepacked so that each step (64 rows x 128 codes) is one contiguous run and,
  within a row, each lane's words are the codes of its wgmma A fragment in K order: lane (g, t)
  reads 16 bytes per row from shared memory and decodes them (the decode of mma_linear.py) into
  exactly its A registers, and x^T is read in natural order.
- Word (t, s) of a row holds, for fp8, the codes 16 s + 2 t + {0, 1, 8, 9}; for fp4, the eight
  codes 32 s + 16 o + 8 h + 2 t + b (nibble 4 o + 2 h + b).

Numerics are those of the library's kernels (exact bf16 products, fp32 sums, one rounding); the
script checks every configuration against the exact product first (bench_gpu_matmul.check).
Here the weights are ordinary (every scale byte in the decode's exact range: mma_linear.
FAST_SCALES; no e4m3 NaN codes); the prototype has no fallback for the others (mma_linear's
poisoned multipliers and exact recompute). It then times, by CUDA-graph
replays over 8 weight copies, the prototype at a few pipeline depths, the same kernel with the
decode and MMAs switched off (what its data movement costs), the library's prepacked kernel
and the read-only floor.
"""

import datetime
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gpu_matmul import (ROTATE, check, make_weights, prepacked_linear,  # noqa: E402
                              prepacked_parts, read_floor_us)
from torchmx import dtypes  # noqa: E402
from torchmx.kernels.mma_linear import _DECODE_E2M1, _DECODE_E4M3, FAST_SCALES  # noqa: E402
from torchmx.numerics.packing import unpack_codes  # noqa: E402
from _timing import graph_time_us  # noqa: E402

KB_CODES = 128  # codes of a row in one sub-step (fp8: 128 bytes, fp4: 64), 4 scale bytes
KB = gl.constexpr(KB_CODES)
DECODE_E4M3 = gl.constexpr(_DECODE_E4M3.value)
DECODE_E2M1 = gl.constexpr(_DECODE_E2M1.value)
# scale bytes for which the decode's one multiply is exact (mma_linear.FAST_SCALES)
E2M1_S_MAX = gl.constexpr(FAST_SCALES[dtypes.float4_e2m1][1])
E4M3_S_MIN = gl.constexpr(FAST_SCALES[dtypes.float8_e4m3][0])
E4M3_S_MAX = gl.constexpr(FAST_SCALES[dtypes.float8_e4m3][1])
CONFIGS = [(4, 2), (6, 1), (6, 2), (8, 1)]  # (STAGES, SUB): ring slots, sub-steps a slot


@gluon.constexpr_function
def word_layout(S):
    """Registers of [64 rows, 4 t, S s] words: lane 4 g + t of warp w holds rows 16 w + g and
    16 w + g + 8, its S words of each in registers (one 16-byte shared-memory load a row)."""
    regs = [[0, 0, 1 << j] for j in range(S.bit_length() - 1)] + [[8, 0, 0]]
    return gl.DistributedLinearLayout(
        reg_bases=regs, lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, S])


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
def _loader(w_desc, x_desc, s_desc, w_smem, x_smem, s_smem, ready, empty, step0, slots,
            STAGES: gl.constexpr, SUB: gl.constexpr):
    """One warp: slot i % STAGES gets sub-steps i * SUB .. of the tile once its consumer freed
    it (empty), and signals `ready` when the bytes have landed."""
    for i in range(slots):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes + x_desc.block_type.nbytes
                        + s_desc.block_type.nbytes)
        step = step0 + i * SUB
        tma.async_copy_global_to_shared(w_desc, [step * 64, 0], ready.index(slot),
                                        w_smem.index(slot))
        tma.async_copy_global_to_shared(x_desc, [0, i * SUB * KB], ready.index(slot),
                                        x_smem.index(slot))
        tma.async_copy_global_to_shared(s_desc, [step, 0], ready.index(slot), s_smem.index(slot))


@gluon.jit
def _decoded(w_tile, s_row, shift, MP: gl.constexpr, FP4: gl.constexpr):
    """A sub-step's W tile [64, KB] (shared memory) as wgmma's A operand: bf16 registers."""
    WB: gl.constexpr = KB // 2 if FP4 else KB
    S: gl.constexpr = WB // 16
    l3: gl.constexpr = word_layout(S)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(MP),
                                                 k_width=2)
    words = w_tile._reinterpret(gl.int32, [64, 4 * S], gl.NVMMASharedLayout(
        swizzle_byte_width=WB, element_bitwidth=32, rank=2)).load(row_words_layout(S))
    words = gl.convert_layout(words.reshape([64, 4, S]), l3)  # same registers: no data moves
    rows = s_row.load(gl.SliceLayout(1, gl.SliceLayout(2, l3)))  # a row's 4 scale bytes
    s = (rows[:, None, None] >> shift[None, None, :]) & 255
    if FP4:  # value * 2**-126 from the decode, times 2**(s - 1)
        m = gl.where(s <= E2M1_S_MAX, (s + 126) * 0x00800080, 0x7FC07FC0)
        v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
            DECODE_E2M1, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, m], dtype=(gl.bfloat16,) * 8,
            is_pure=True, pack=1)
        t = gl.join(gl.join(gl.join(v0, v1), gl.join(v2, v3)),
                    gl.join(gl.join(v4, v5), gl.join(v6, v7)))  # [64, t, s, b, h, o]
        t = t.permute((0, 2, 5, 4, 1, 3))  # k = 32 s + 16 o + 8 h + 2 t + b
    else:  # value * 2**-120, times 2**(s - 7)
        m = gl.where((s >= E4M3_S_MIN) & (s <= E4M3_S_MAX), (s + 120) * 0x00800080,
                     0x7FC07FC0)
        v0, v1, v2, v3 = gl.inline_asm_elementwise(DECODE_E4M3, "=h,=h,=h,=h,r,r", [words, m],
                                                   dtype=(gl.bfloat16,) * 4, is_pure=True,
                                                   pack=1)
        t = gl.join(gl.join(v0, v1), gl.join(v2, v3))  # [64, t, s, b, h]
        t = t.permute((0, 2, 4, 1, 3))  # k = 16 s + 8 h + 2 t + b
    return gl.convert_layout(t.reshape([64, KB]), a_layout)  # same registers: no data moves


@gluon.jit
def _slot(acc, w_smem, x_smem, s_smem, slot, shift, FIRST: gl.constexpr, MP: gl.constexpr,
          SUB: gl.constexpr, FP4: gl.constexpr, DECODE: gl.constexpr):
    """acc plus the products of one ring slot's SUB sub-steps."""
    scale_words = s_smem.index(slot)._reinterpret(gl.int32, [SUB * 64],
                                                  gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for u in gl.static_range(SUB):
        if DECODE:
            a = _decoded(w_smem.index(slot).slice(64 * u, 64), scale_words.slice(64 * u, 64),
                         shift, MP, FP4)
            x_t = x_smem.index(slot).slice(KB * u, KB, dim=1).permute((1, 0))
            if FIRST and u == 0:
                acc = warpgroup_mma(a, x_t, acc, use_acc=False, is_async=True)
            else:
                acc = warpgroup_mma(a, x_t, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc


@gluon.jit
def _consume(c: gl.constexpr, w_smem, x_smem, s_smem, ready, empty, slots, MP: gl.constexpr,
             STAGES: gl.constexpr, SUB: gl.constexpr, FP4: gl.constexpr, DECODE: gl.constexpr):
    """Consumer warpgroup c (0, 1) takes slots c, c + 2, ...; returns its fp32 partial [64, MP]
    of out^T. The first slot is peeled so that its wgmma (use_acc off) defines the accumulator:
    a zero-initialised one reaching the loop's exit on a zero-trip path made ptxas serialize
    every wgmma. Each wgmma is waited for at once: with the next step's A registers decoded
    while it ran, ptxas serialized them for lack of registers."""
    S: gl.constexpr = KB // 32 if FP4 else KB // 16
    s_index = gl.arange(0, S, layout=gl.SliceLayout(0, gl.SliceLayout(1, word_layout(S))))
    shift = (s_index % 4) * 8 if FP4 else ((s_index // 2) % 4) * 8  # word s's block's byte
    mbarrier.wait(ready.index(c), 0)
    acc = _slot(gl.zeros([64, MP], gl.float32, mma_layout(MP)), w_smem, x_smem, s_smem, c,
                shift, True, MP, SUB, FP4, DECODE)
    mbarrier.arrive(empty.index(c))
    for j in range(1, (slots - c + 1) // 2):
        i = c + 2 * j
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        acc = _slot(acc, w_smem, x_smem, s_smem, slot, shift, False, MP, SUB, FP4, DECODE)
        mbarrier.arrive(empty.index(slot))
    return acc


@gluon.jit
def _consume_first(w_smem, x_smem, s_smem, ready, empty, slots, MP: gl.constexpr,
                   STAGES: gl.constexpr, SUB: gl.constexpr, FP4: gl.constexpr,
                   DECODE: gl.constexpr):
    return (_consume(0, w_smem, x_smem, s_smem, ready, empty, slots, MP, STAGES, SUB, FP4,
                     DECODE),)


@gluon.jit
def _consume_second(w_smem, x_smem, s_smem, ready, empty, partial, done, slots,
                    MP: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr,
                    FP4: gl.constexpr, DECODE: gl.constexpr):
    acc = _consume(1, w_smem, x_smem, s_smem, ready, empty, slots, MP, STAGES, SUB, FP4, DECODE)
    partial.store(acc)
    mbarrier.arrive(done)


@gluon.jit
def gluon_linear_kernel(w_desc, x_desc, s_desc, out_ptr, M, K, stride_om, MP: gl.constexpr,
                        STAGES: gl.constexpr, SUB: gl.constexpr, FP4: gl.constexpr,
                        DECODE: gl.constexpr):
    """out[:M, 64 tile ..] (bf16) = x @ W[64 tile ..].T for one 64-row tile of W."""
    tile = gl.program_id(0)
    steps = K // KB
    w_smem = gl.allocate_shared_memory(gl.uint8, [STAGES] + w_desc.block_type.shape,
                                       w_desc.layout)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + x_desc.block_type.shape,
                                       x_desc.layout)
    s_smem = gl.allocate_shared_memory(gl.uint8, [STAGES] + s_desc.block_type.shape,
                                       s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    partial = gl.allocate_shared_memory(gl.float32, [64, MP],
                                        gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=1)
    mbarrier.init(done, count=1)
    slots = steps // SUB
    acc = gl.warp_specialize([
        (_consume_first, (w_smem, x_smem, s_smem, ready, empty, slots, MP, STAGES, SUB, FP4,
                          DECODE)),
        (_consume_second, (w_smem, x_smem, s_smem, ready, empty, partial, done, slots, MP,
                           STAGES, SUB, FP4, DECODE)),
        (_loader, (w_desc, x_desc, s_desc, w_smem, x_smem, s_smem, ready, empty, tile * steps,
                   slots, STAGES, SUB)),
    ], [4, 1], [152, 40])[0]
    mbarrier.wait(done, 0)
    acc = acc + partial.load(mma_layout(MP))
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, mma_layout(MP)))
    cols = gl.arange(0, MP, layout=gl.SliceLayout(0, mma_layout(MP)))
    gl.store(out_ptr + cols[None, :] * stride_om + (tile * 64 + rows)[:, None],
             acc.to(gl.bfloat16), mask=(cols[None, :] < M) & (rows[:, None] < 64))


def pack(w):
    """(codes, scales) of an MXFP4 or e4m3 MXTensor [N, K] in the prototype's layout: codes
    [N / 64 * K / KB_CODES * 64, KB_CODES bytes] (fp4: KB_CODES / 2 bytes), each sub-step (64
    rows x KB_CODES codes) one run; scales [N / 64 * K / KB_CODES, 256], a sub-step's rows' 4
    bytes each."""
    N, K = w.shape
    data, scale = w._data.view(torch.uint8), w._scale_e8m0
    if w.elem_dtype == dtypes.float4_e2m1:
        codes = unpack_codes(data, w.elem_dtype, K).to(torch.uint8)  # [N, K]
        c = codes.reshape(N // 64, 64, K // KB_CODES, 4, 2, 2, 4, 2)  # nb r step | s o h t b
        c = c.permute(0, 2, 1, 6, 3, 4, 5, 7).reshape(N // 64, K // KB_CODES, 64, KB_CODES // 2, 2)
        codes = (c[..., 0] | (c[..., 1] << 4)).reshape(-1, KB_CODES // 2)
    else:
        c = data.reshape(N // 64, 64, K // KB_CODES, KB_CODES // 16, 2, 4, 2)  # nb r step | s h t b
        codes = c.permute(0, 2, 1, 5, 3, 4, 6).reshape(-1, KB_CODES)
    scales = scale.reshape(N // 64, 64, K // KB_CODES, KB_CODES // 32).permute(0, 2, 1, 3)
    return codes.contiguous(), scales.reshape(-1, 64 * KB_CODES // 32).contiguous()


def gluon_linear(x, packed, fp4, stages, sub, decode=True):
    """x [M, K] bf16 (M <= 64) @ W.T from pack(W)'s parts: bf16 [M, N]."""
    codes, scales = packed
    M, K = x.shape
    N = codes.numel() * (2 if fp4 else 1) // K
    # An even ring, so that each slot always serves the same consumer (a parity wait on a slot
    # whose phase has not completed yet passes at once); and at least a slot for each
    # consumer, which waits for its first one before its loop.
    assert M <= 64 and N % 64 == 0 and stages % 2 == 0
    assert K % (KB_CODES * sub) == 0 and K >= 2 * KB_CODES * sub
    MP = max(16, triton.next_power_of_2(M))
    wb = KB_CODES // 2 if fp4 else KB_CODES
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    w_desc = TensorDescriptor(codes, list(codes.shape), [wb, 1], [64 * sub, wb],
                              gl.NVMMASharedLayout.get_default_for([64 * sub, wb], gl.uint8))
    x_block = [MP, KB_CODES * sub]
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), x_block,
                              gl.NVMMASharedLayout.get_default_for(x_block, gl.bfloat16))
    s_desc = TensorDescriptor(scales, list(scales.shape), [scales.shape[1], 1],
                              [sub, scales.shape[1]], gl.NVMMASharedLayout(
                                  swizzle_byte_width=0, element_bitwidth=8, rank=2))
    gluon_linear_kernel[(N // 64,)](w_desc, x_desc, s_desc, out, M, K, out.stride(0), MP=MP,
                                    STAGES=stages, SUB=sub, FP4=fp4, DECODE=decode, num_warps=4)
    return out


def main():
    N = K = 8192
    M = 16
    device = torch.cuda.get_device_name()
    print(f"Gluon prototype (one CTA per 64-row tile, TMA ring, two consumer warpgroups) vs the "
          f"library's prepacked kernel, M = {M}, N = K = {N}: microseconds per call\n"
          f"({device}, torch {torch.__version__}, Triton {triton.__version__}, "
          f"{datetime.date.today()}; CUDA-graph replays over {ROTATE} weight copies)\n")
    print(f"{'format':<12} {'floor':>6} {'library':>8} {'prototype (stages, sub)':>26} "
          f"{'no math':>8} {'vs library':>11}")
    for fmt in (dtypes.float4_e2m1, dtypes.float8_e4m3):
        fp4 = fmt == dtypes.float4_e2m1
        ws = make_weights(fmt, N, K, ROTATE)
        packed = [pack(w) for w in ws]
        parts = [prepacked_parts(w) for w in ws]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        for stages, sub in CONFIGS:
            check(gluon_linear(x, packed[0], fp4, stages, sub), x, ws[0], None,
                  f"prototype {fmt.name} stages={stages} sub={sub}")
        times = {cfg: graph_time_us([lambda p=p, cfg=cfg: gluon_linear(x, p, fp4, *cfg)
                                     for p in packed]) for cfg in CONFIGS}
        best = min(times, key=times.get)
        no_math = graph_time_us([lambda p=p: gluon_linear(x, p, fp4, *best, decode=False)
                                 for p in packed])
        library = graph_time_us([lambda w=w, p=p: prepacked_linear(x, w, p)
                                 for w, p in zip(ws, parts)])
        floor = read_floor_us(ws)
        label = f"{times[best]:.1f} ({best[0]}, {best[1]})"
        print(f"{fmt.name:<12} {floor:>6.1f} {library:>8.1f} {label:>26} {no_math:>8.1f} "
              f"{library / times[best]:>10.3f}x")
        print("             all configurations: " + ", ".join(
            f"({s}, {u}) {t:.1f}" for (s, u), t in times.items()))
        del ws, packed, parts
    print("\ncheck: every configuration matched the exact product (bench_gpu_matmul.check)")


if __name__ == "__main__":
    main()

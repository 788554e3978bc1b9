"""Generic pack / unpack passes for block sizes that split a packed group (fp4 with an odd
block, fp6 with a block that is not a multiple of 4): the quantize kernels then write one code
per byte into a scratch tensor [B, n, C] and this pass packs it along n (and the reverse for
dequantize). Slower (one more pass), exact, any shape.
"""

import triton
import triton.language as tl


@triton.jit
def _group_coordinates(total, inner, groups, TILE: tl.constexpr):
    """This program's TILE lanes of the [B, groups, inner] grid of packed groups: whether each
    is in range, and its (b, group q, inner k) coordinates (64-bit)."""
    i = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    return i < total, i // (inner * groups), (i // inner) % groups, i % inner


@triton.jit
def pack_kernel(codes_ptr, out_ptr, n, inner, groups, total, BITS: tl.constexpr,
                CPG: tl.constexpr, BPG: tl.constexpr, TILE: tl.constexpr):
    """codes [B, n, inner] (one code per byte) -> out [B, groups * BPG, inner]."""
    ok, b, q, k = _group_coordinates(total, inner, groups, TILE)
    word = tl.zeros([TILE], dtype=tl.int32)
    for c in tl.static_range(CPG):
        j = q * CPG + c
        code = tl.load(codes_ptr + (b * n + j) * inner + k, mask=ok & (j < n), other=0)
        word = word | ((code.to(tl.int32) & ((1 << BITS) - 1)) << (BITS * c))
    for byte in tl.static_range(BPG):
        tl.store(out_ptr + (b * (groups * BPG) + q * BPG + byte) * inner + k,
                 ((word >> (8 * byte)) & 0xFF).to(tl.uint8), mask=ok)


@triton.jit
def unpack_kernel(data_ptr, codes_ptr, n, inner, groups, total, BITS: tl.constexpr,
                  CPG: tl.constexpr, BPG: tl.constexpr, TILE: tl.constexpr):
    """data [B, groups * BPG, inner] -> codes [B, n, inner] (one code per byte)."""
    ok, b, q, k = _group_coordinates(total, inner, groups, TILE)
    word = tl.zeros([TILE], dtype=tl.int32)
    for byte in tl.static_range(BPG):
        value = tl.load(data_ptr + (b * (groups * BPG) + q * BPG + byte) * inner + k, mask=ok,
                        other=0)
        word = word | (value.to(tl.int32) << (8 * byte))
    for c in tl.static_range(CPG):
        j = q * CPG + c
        tl.store(codes_ptr + (b * n + j) * inner + k,
                 ((word >> (BITS * c)) & ((1 << BITS) - 1)).to(tl.uint8), mask=ok & (j < n))

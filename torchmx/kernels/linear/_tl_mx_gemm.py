"""The Triton kernel of mx_gemm.py's exact fix-up: the outputs of the GEMM's flagged tiles
recomputed from both MX operands with exact fp32 decodes and fp32 products and sums (runs
under Triton's interpreter too, so the CPU tests check it bit for bit)."""

import triton
import triton.language as tl

from .._tl_numerics import decode_value, scale_value, to_output

__all__ = ["fixup_kernel"]


@triton.jit
def _exact_block(data_ptr, scale_ptr, rows, row_ok, k0, stride_d, stride_s, CPG: tl.constexpr,
                 IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                 HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr, LSB: tl.constexpr,
                 TO_VALUE: tl.constexpr):
    """[rows, 32] fp32: block k0 / 32 of these rows of an MX matrix (codes [rows, K bytes],
    scale bytes [rows, K / 32]) decoded exactly, zeros for rows past the end."""
    k = k0 + tl.arange(0, 32)
    row_data = data_ptr + rows[:, None].to(tl.int64) * stride_d
    if CPG == 2:  # code 2 i in the low nibble of byte i
        packed = tl.load(row_data + (k // 2)[None, :], mask=row_ok[:, None], other=0)
        code = (packed.to(tl.int32) >> (4 * (k % 2))[None, :]) & 0xF
    else:
        code = tl.load(row_data + k[None, :], mask=row_ok[:, None], other=0).to(tl.int32)
    byte = tl.load(scale_ptr + rows.to(tl.int64) * stride_s + k0 // 32, mask=row_ok,
                   other=127).to(tl.int32)
    return decode_value(code, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE) \
        * scale_value(byte)[:, None]


@triton.jit
def fixup_kernel(flags_ptr, x_data, x_scale, w_data, w_scale, out_ptr, M, N, K, stride_xd,
                 stride_xs, stride_wd, stride_ws, stride_om, flag_stride, TILE_M: tl.constexpr,
                 TILE_N: tl.constexpr, SOFT_BF16: tl.constexpr, X_CPG: tl.constexpr,
                 X_IS_INT: tl.constexpr, X_BITS: tl.constexpr, X_MBITS: tl.constexpr,
                 X_HAS_INF: tl.constexpr, X_HAS_NAN: tl.constexpr, X_LSB: tl.constexpr,
                 X_TO_VALUE: tl.constexpr, W_CPG: tl.constexpr, W_IS_INT: tl.constexpr,
                 W_BITS: tl.constexpr, W_MBITS: tl.constexpr, W_HAS_INF: tl.constexpr,
                 W_HAS_NAN: tl.constexpr, W_LSB: tl.constexpr, W_TO_VALUE: tl.constexpr):
    """Program p: if flags[p] is set, out's tile (p // flag_stride, p % flag_stride) of TILE_M x
    TILE_N outputs = x @ W^T with exact fp32 operands, fp32 products (no tensor-core
    rounding: input_precision "ieee") and fp32 sums, rounded once; the flag is cleared."""
    p = tl.program_id(0)
    if tl.load(flags_ptr + p) != 0:
        rows = (p // flag_stride) * TILE_M + tl.arange(0, TILE_M)
        row_ok = rows < M
        for part in tl.static_range(TILE_N // 64):
            cols = (p % flag_stride) * TILE_N + part * 64 + tl.arange(0, 64)
            col_ok = cols < N
            acc = tl.zeros([TILE_M, 64], tl.float32)
            for k0 in range(0, K, 32):
                x = _exact_block(x_data, x_scale, rows, row_ok, k0, stride_xd, stride_xs, X_CPG,
                                 X_IS_INT, X_BITS, X_MBITS, X_HAS_INF, X_HAS_NAN, X_LSB,
                                 X_TO_VALUE)
                w = _exact_block(w_data, w_scale, cols, col_ok, k0, stride_wd, stride_ws, W_CPG,
                                 W_IS_INT, W_BITS, W_MBITS, W_HAS_INF, W_HAS_NAN, W_LSB,
                                 W_TO_VALUE)
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
                     to_output(acc, out_ptr.dtype.element_ty, SOFT_BF16),
                     mask=row_ok[:, None] & col_ok[None, :])
        tl.store(flags_ptr + p, 0)

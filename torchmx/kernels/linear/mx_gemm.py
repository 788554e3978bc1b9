"""MX x MX products on Hopper (sm_90): x [M, K] @ W.T with both x and W [N, K] MX matrices
(blocks of 32 along K), for many activation rows, without dequantizing x.

The large-M path of kernels/linear/dispatch.py dequantizes both operands to bf16 and runs cuBLAS; the
weight's dequantize hides behind the GEMMs (chunks on a side stream), the activation's does
not. Here x stays in its codes:

- `mx_gemm_kernel` (_gl_mx_gemm.py, Gluon) is a persistent GEMM, one CTA an SM, tiles of 128 x
  256 outputs (activation rows fastest): a loader warp brings each step's codes of x [128
  rows, 64 columns] and the bf16 weight tile [256, 64] into a four-slot shared-memory ring by
  TMA; two consumer warpgroups each decode their 64 rows' codes straight into wgmma's A
  registers (mma_linear's decode: value * 2**(s - 127) in bf16, exact for the scale bytes of
  FAST_SCALES) and run wgmma with the weight tile from shared memory; each tile's sums leave
  through shared memory by TMA while the next tile's main loop runs.
- So that a lane's A fragment is 16 contiguous codes of a row (one shared-memory load), K is
  read in a permuted order inside each 64-column step (_gl_mx_gemm's docstring), and the
  weight is read as bf16 in that order from a buffer [N, K] that the GEMM itself fills, just
  ahead of the tiles that need it: a third partition of two warps dequantizes W's rows in
  pairs, taken in order from a queue the CTAs share, through a ring of cp.async copies, and
  counts each pair in its 256-row block's counter; the loader waits for a block's count
  before loading its first tile of it. The blocks that the first wave of tiles reads
  (`first_wave_blocks`) are dequantized before the GEMM by `permuted_dequantize_kernel`, at
  the whole GPU's bandwidth. Dequantizing all of W first would expose its time, and chunks on
  a side stream do not hide it (the two kernels then share the SMs' issue slots). Deadlock-free with any number of CTAs running: a CTA waits only for
  blocks whose pairs running CTAs have taken or will take.
- Exactness: a decode that cannot give a value exactly in bf16 (a scale byte outside
  FAST_SCALES, W's NaN / Inf codes) gives NaN instead (mma_linear's poisoned multiplier);
  every 64 x 256 tile whose sums come out NaN or Inf, from that or from the data (NaN / Inf
  values, overflow), is flagged, and `fixup_kernel` (_tl_mx_gemm.py, Triton) recomputes the
  flagged tiles from both MX operands with exact fp32 decodes, fp32 products and fp32 sums.
  x's NaN / Inf codes are looked for only by the tiles of the first TILE_N columns, which flag
  every tile of the 64 rows where they find one (such a row is not finite anywhere); the
  other tiles, which decode the same codes again, skip the check. Ordinary operands never
  take the fix-up; its one launch costs a few microseconds when nothing is flagged.

Numerics are those of kernels/linear/dispatch.py (exact products of the dequantized operands,
fp32 sums, one rounding) for every input, including the bf16 subnormal values that the
dequantize path rounds (here they take the exact fix-up). The fp32 sums run in the tensor
cores' order over the permuted K, not cuBLAS's, so where they round (e4m3's wide range) the
last bits can differ from the dequantize path's; runs on one GPU give the same bits.

Takes: x and W in e4m3, e5m2, MXINT8 or e2m1 (any pair), blocks of 32, bf16 output, K a
multiple of 128, N of 8, both operands' parts with rows of unit stride, the codes' rows
16-byte aligned and the scale bytes' rows 4-byte aligned (TMA, the weight's copies), on an
sm_90 GPU with Gluon (`eligible`); MX x MX products take it where `preferred`. Gluon kernels
do not run under Triton's interpreter: the CPU tests compile them for sm_90 and run the fix-up
kernel; the bits are checked on an H100.
"""

from typing import Optional

import torch

from ... import dtypes
from .._common import interpreting, packed_decode_constants, sm_count
from .mma_linear import FAST_SCALES
# Gluon with the Hopper TMA / wgmma API, an sm_90 GPU, not the interpreter: what the stream
# kernel needs too (_gl_mx_gemm builds on _gl_stream)
from .stream_matmul import available, usable_on

__all__ = ["FORMATS", "MIN_M", "PREFERRED_FORMATS", "available", "eligible", "first_wave_blocks",
           "mx_gemm", "permuted_weight",
           "permutation", "preferred", "usable_on"]

FORMATS = (dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.int8, dtypes.float4_e2m1)
BLOCK = 32
TILE_M, TILE_N, STEP = 128, 256, 64
# Flags, one per 64 x 256 outputs (a consumer warpgroup's part of a tile)
FLAG_M = 64
STAGES = 4
# setmaxnreg: the consumer warpgroups (the first gets what the others leave), and the
# warpgroup of the loader warp and the dequantize warps (a ring of cp.async keeps their
# registers few)
CONSUMER_REGS = 232
AHEAD_REGS = 56
# Where MX x MX products take this path (`preferred`): where it measured faster than the
# dequantize + cuBLAS path on an H100 (benchmarks/bench_gpu_matmul.py --mx-gemm): x and W each MXFP4, e4m3 or e5m2 (any pair), at least MIN_M rows and
# enough tiles to fill MIN_WAVE_FILL of the SMs (at 2048 x 1024 half of them idle and it lost
# by a third). With both operands MXINT8 it lost to the dequantize path at N >= 8192 (mixed
# pairs with MXINT8 were not measured).
PREFERRED_FORMATS = (dtypes.float4_e2m1, dtypes.float8_e4m3, dtypes.float8_e5m2)
MIN_M = 2048
MIN_WAVE_FILL = 0.9
_DEQUANTIZE_ROWS = 4  # a row a warp
_DEQUANTIZE_STEPS = 8  # _gl_mx_gemm.GROUP: steps a program


def permutation(K: int) -> torch.Tensor:
    """int64 [K]: column L of the GEMM's order is physical column permutation(K)[L] (inside
    each 64-column step, L = 16 Q + 8 h + 2 t + b reads P = 16 t + 4 Q + 2 h + b)."""
    if K % STEP:
        raise ValueError(f"mx_gemm.permutation: K must be a multiple of {STEP}, got {K}")
    L = torch.arange(K)
    Q, h, t, b = (L % STEP) // 16, (L % 16) // 8, (L % 8) // 2, L % 2
    return L - L % STEP + 16 * t + 4 * Q + 2 * h + b


def _unit_rows(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1


def eligible(x_data: torch.Tensor, x_scale: torch.Tensor, x_fmt: dtypes.DType, x_block: int,
             w_data: torch.Tensor, w_scale: torch.Tensor, w_fmt: dtypes.DType, w_block: int,
             out_dtype: torch.dtype) -> bool:
    """Whether `mx_gemm` takes x [M, K] @ W.T given by their parts (codes [rows, packed K],
    scale bytes [rows, K / 32]): see the module docstring."""
    if x_fmt not in FORMATS or w_fmt not in FORMATS or x_block != BLOCK or w_block != BLOCK:
        return False
    if out_dtype != torch.bfloat16 or x_scale.dim() != 2 or w_scale.dim() != 2:
        return False
    M, N, K = x_scale.shape[0], w_scale.shape[0], x_scale.shape[1] * BLOCK
    # TMA: rows of x's codes and of the bf16 output 16-byte aligned (N a multiple of 8)
    if M == 0 or N == 0 or N % 8 or K % (2 * STEP) or w_scale.shape[1] * BLOCK != K:
        return False
    x_bytes = K * x_fmt.bytes_per_group // x_fmt.codes_per_group
    return (all(_unit_rows(t) for t in (x_data, x_scale, w_data, w_scale))
            and x_data.shape == (M, x_bytes) and _aligned(x_data, 16)
            and _aligned(w_data, 16) and _aligned(w_scale, 4) and usable_on(x_data.device))


def _aligned(t: torch.Tensor, size: int) -> bool:
    """Rows that start on `size`-byte boundaries: x's codes for TMA, W's codes and scale
    bytes for the dequantize's 16-byte copies and 4-byte words."""
    return t.data_ptr() % size == 0 and t.stride(0) * t.element_size() % size == 0


def preferred(x_fmt: dtypes.DType, w_fmt: dtypes.DType, M: int, N: int,
              device: torch.device) -> bool:
    """Whether an MX x MX product of this shape is faster here than through dequantize +
    cuBLAS on `device` (PREFERRED_FORMATS, MIN_M, MIN_WAVE_FILL); `eligible` decides whether
    it can run."""
    tiles = -(-M // TILE_M) * -(-N // TILE_N)
    return (x_fmt in PREFERRED_FORMATS and w_fmt in PREFERRED_FORMATS and M >= MIN_M
            and tiles >= MIN_WAVE_FILL * sm_count(device))


def _decode_flags(fmt: dtypes.DType) -> dict:
    low, high = FAST_SCALES[fmt]
    return dict(FP4=fmt == dtypes.float4_e2m1, E5M2=fmt == dtypes.float8_e5m2,
                IS_INT=fmt == dtypes.int8, S_MIN=low, S_MAX=high)


def _lane_words(fmt: dtypes.DType) -> int:
    """32-bit words of a lane's 16 codes."""
    return 4 if fmt.codes_per_group == 1 else 2


def dequantize_arguments(w_data: torch.Tensor, w_scale: torch.Tensor, w_fmt: dtypes.DType,
                         out: torch.Tensor, rows: Optional[int] = None):
    """(grid, arguments, constexprs) of permuted_dequantize_kernel writing W [N, K] (its codes
    and scale bytes, rows of unit stride), or its first `rows` rows, into out (bf16 [N, K],
    contiguous)."""
    N, K = out.shape
    N = N if rows is None else min(rows, N)
    grid = (-(-N // _DEQUANTIZE_ROWS), -(-K // (STEP * _DEQUANTIZE_STEPS)))
    arguments = (w_data.view(torch.uint8), w_scale, out, N, K, w_data.stride(0),
                 w_scale.stride(0))
    constants = dict(R=_DEQUANTIZE_ROWS, S=_lane_words(w_fmt),
                     num_warps=_DEQUANTIZE_ROWS, **_decode_flags(w_fmt))
    return grid, arguments, constants


def permuted_weight(w_data: torch.Tensor, w_scale: torch.Tensor,
                    w_fmt: dtypes.DType) -> torch.Tensor:
    """W [N, K] (codes, scale bytes; blocks of 32) as bf16 with the columns of each 64-column
    step in the GEMM's order: out[:, L] = W[:, permutation(K)[L]], exact where the decode is
    exact, NaN where it is poisoned."""
    from ._gl_mx_gemm import permuted_dequantize_kernel
    if not (_unit_rows(w_data) and _unit_rows(w_scale) and _aligned(w_data, 16)
            and _aligned(w_scale, 4)):
        raise ValueError("mx_gemm.permuted_weight: needs codes and scale bytes with rows of "
                         "unit stride, starting on 16- and 4-byte boundaries")
    N, K = w_scale.shape[0], w_scale.shape[1] * BLOCK
    out = torch.empty((N, K), dtype=torch.bfloat16, device=w_data.device)
    if N:
        grid, arguments, constants = dequantize_arguments(w_data, w_scale, w_fmt, out)
        with torch.cuda.device_of(out):  # (Triton launches on the current device)
            permuted_dequantize_kernel[grid](*arguments, **constants)
    return out


def gemm_arguments(x_data: torch.Tensor, x_scale: torch.Tensor, x_fmt: dtypes.DType,
                   w_data: torch.Tensor, w_scale: torch.Tensor, w_fmt: dtypes.DType,
                   w: torch.Tensor, out: torch.Tensor, flags: torch.Tensor,
                   counts: torch.Tensor, first_block: int, sms: Optional[int] = None):
    """(grid, arguments, constexprs) of mx_gemm_kernel for out = x @ W.T: w bf16 [N, K], W in
    the GEMM's order, its blocks of TILE_N rows before first_block already written (the
    kernel writes the others); flags int32 [ceil(M / 64) * ceil(N / 256)] (`new_flags`),
    counts int32 [ceil(N / 256) + 1] zeros."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    M, N = x_scale.shape[0], w.shape[0]
    K = x_scale.shape[1] * BLOCK
    codes = x_data.view(torch.uint8)
    x_box = [TILE_M, STEP * x_fmt.bytes_per_group // x_fmt.codes_per_group]
    x_desc = TensorDescriptor(codes, list(codes.shape), [codes.stride(0), 1], x_box,
                              gl.NVMMASharedLayout.get_default_for(x_box, gl.uint8))
    w_box = [TILE_N, STEP]
    w_desc = TensorDescriptor(w, [N, K], [w.stride(0), 1], w_box,
                              gl.NVMMASharedLayout.get_default_for(w_box, gl.bfloat16))
    out_box = [FLAG_M, 64]
    out_desc = TensorDescriptor(out, list(out.shape), [out.stride(0), 1], out_box,
                                gl.NVMMASharedLayout.get_default_for(out_box, gl.bfloat16))
    tiles_m, tiles_n = -(-M // TILE_M), -(-N // TILE_N)
    sms = sms or sm_count(x_data.device)
    arguments = (x_desc, w_desc, out_desc, x_scale, flags, M, x_scale.stride(0), tiles_m,
                 tiles_n, K // STEP, tiles_n, w_data.view(torch.uint8), w_scale, w, counts, N,
                 K, w_data.stride(0), w_scale.stride(0), first_block)
    constants = dict(STAGES=STAGES, CONSUMER_REGS=CONSUMER_REGS, AHEAD_REGS=AHEAD_REGS,
                     num_warps=4, W_S=_lane_words(w_fmt), **_decode_flags(x_fmt),
                     **{f"W_{k}": v for k, v in _decode_flags(w_fmt).items()})
    return (min(sms, tiles_m * tiles_n),), arguments, constants


def fixup_arguments(x_data, x_scale, x_fmt, w_data, w_scale, w_fmt, out, flags):
    """(grid, arguments, constexprs) of fixup_kernel: a program per flag."""
    M, N = out.shape
    K = x_scale.shape[1] * BLOCK
    x_constants = {f"X_{k}": v for k, v in packed_decode_constants(x_fmt).items()}
    w_constants = {f"W_{k}": v for k, v in packed_decode_constants(w_fmt).items()}
    arguments = (flags, x_data.view(torch.uint8), x_scale, w_data.view(torch.uint8), w_scale,
                 out, M, N, K, x_data.stride(0), x_scale.stride(0), w_data.stride(0),
                 w_scale.stride(0), out.stride(0), -(-N // TILE_N))
    constants = dict(TILE_M=FLAG_M, TILE_N=TILE_N, SOFT_BF16=interpreting(), **x_constants,
                     **w_constants)
    return (flags.numel(),), arguments, constants


def new_flags(M: int, N: int, device: torch.device) -> torch.Tensor:
    """The fix-up's flags for an output [M, N], cleared: one per 64 x 256 outputs."""
    return torch.zeros(_flag_count(M, N), dtype=torch.int32, device=device)


def _flag_count(M: int, N: int) -> int:
    return -(-M // FLAG_M) * -(-N // TILE_N)


def fixup(x_data, x_scale, x_fmt, w_data, w_scale, w_fmt, out, flags) -> None:
    """Recomputes out's flagged tiles exactly (and clears their flags)."""
    from ._tl_mx_gemm import fixup_kernel
    if flags.numel():
        grid, arguments, constants = fixup_arguments(x_data, x_scale, x_fmt, w_data, w_scale,
                                                     w_fmt, out, flags)
        with torch.cuda.device_of(out):  # (Triton launches on the current device)
            fixup_kernel[grid](*arguments, **constants)


def first_wave_blocks(M: int, N: int, sms: int) -> int:
    """W's blocks of TILE_N rows that the GEMM's first wave of tiles (one a CTA, m fastest)
    reads: dequantized before the GEMM starts, the rest inside it."""
    tiles_m, tiles_n = -(-M // TILE_M), -(-N // TILE_N)
    return min(tiles_n, (min(sms, tiles_m * tiles_n) - 1) // tiles_m + 1)


def mx_gemm(x_data: torch.Tensor, x_scale: torch.Tensor, x_fmt: dtypes.DType,
            w_data: torch.Tensor, w_scale: torch.Tensor, w_fmt: dtypes.DType,
            blocks_before: Optional[int] = None, ctas: Optional[int] = None) -> torch.Tensor:
    """x @ W.T rounded once to bf16, for MX x [M, K] and W [N, K] given by their codes and
    scale bytes (`eligible`'s operands): W's first `blocks_before` blocks of TILE_N rows
    (default: `first_wave_blocks`) dequantized in the GEMM's order, the GEMM (which
    dequantizes the other blocks ahead of the tiles that need them), the fix-up of flagged
    tiles. `ctas` (default: one an SM) and `blocks_before` are there for tests and
    measurements; the bits do not depend on them."""
    if blocks_before is not None and blocks_before < 0:
        raise ValueError(f"mx_gemm: blocks_before must be >= 0, got {blocks_before}")
    if ctas is not None and ctas < 1:
        raise ValueError(f"mx_gemm: ctas must be >= 1, got {ctas}")
    if not eligible(x_data, x_scale, x_fmt, BLOCK, w_data, w_scale, w_fmt, BLOCK,
                    torch.bfloat16):
        raise ValueError(f"mx_gemm: needs {', '.join(f.name for f in FORMATS)} operands with "
                         f"blocks of 32, K a multiple of 128, N of 8, parts with rows of unit "
                         f"stride (codes' rows 16-byte aligned, scale bytes' rows 4-byte "
                         f"aligned), on an sm_90 GPU with Gluon; got x {x_fmt.name} "
                         f"{tuple(x_data.shape)}, W {w_fmt.name} {tuple(w_data.shape)} on "
                         f"{x_data.device}")
    from ._gl_mx_gemm import mx_gemm_kernel, permuted_dequantize_kernel
    M, N, K = x_scale.shape[0], w_scale.shape[0], x_scale.shape[1] * BLOCK
    device = x_data.device
    sms = ctas or sm_count(device)
    tiles_n = -(-N // TILE_N)
    before = min(first_wave_blocks(M, N, sms) if blocks_before is None else blocks_before,
                 tiles_n)
    out = torch.empty((M, N), dtype=torch.bfloat16, device=device)
    # one cleared allocation for the fix-up's flags and the GEMM's block counters + queue
    state = torch.zeros(_flag_count(M, N) + tiles_n + 1, dtype=torch.int32, device=device)
    flags, counts = state[:-(tiles_n + 1)], state[-(tiles_n + 1):]
    w = torch.empty((N, K), dtype=torch.bfloat16, device=device)
    with torch.cuda.device_of(out):  # (Triton launches on the current device)
        if before:
            grid, arguments, constants = dequantize_arguments(w_data, w_scale, w_fmt, w,
                                                              rows=before * TILE_N)
            permuted_dequantize_kernel[grid](*arguments, **constants)
        grid, arguments, constants = gemm_arguments(x_data, x_scale, x_fmt, w_data, w_scale,
                                                    w_fmt, w, out, flags, counts, before, sms)
        mx_gemm_kernel[grid](*arguments, **constants)
        fixup(x_data, x_scale, x_fmt, w_data, w_scale, w_fmt, out, flags)
    return out

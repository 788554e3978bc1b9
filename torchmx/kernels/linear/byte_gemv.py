"""One activation row times an MX weight of one-byte codes (MXFP8 e4m3 / e5m2, MXINT8):
out[n] = sum_k x[k] * W[n, k] + bias[n].

W is an MX matrix [N, K] in the standard layout: codes [N, K] (a byte each, unit stride along
K) and E8M0 scale bytes [N, K / BLOCK]. The kernel reads the codes in 16-byte pieces (16 codes
of one row, inside one block since BLOCK is a multiple of 16). A program takes BLOCK_N rows and
PIECES consecutive pieces of each per step; the lanes of a warp run along a row's pieces, so
every load instruction of a warp reads 512 contiguous bytes.

Each piece's partial sum, one fp32 multiply-add chain over its 16 exact products of unscaled
values (for MXINT8 the integer codes, whose 2**-6 joins the scale), is multiplied by its
block's scale 2**(s - 127) (exact: a power of two of at least 2**-133) and kept in its own fp32
accumulator: no cross-thread reduction until the end, where a row's accumulators are added and
the result (plus bias) is rounded once. Products are exact and sums fp32: the contract of
kernels/linear/dispatch.py.

Why it is fast (H100, N = K = 8192: benchmarks/bench_gpu_matmul.py): a step's loads (the
codes and the scale byte of each piece, x's 16 values of each piece) are plain (coherent) PTX
loads followed by a barrier, which ptxas may not move them past: every load of a step is issued
before its program's warps go on to the next step, and the warps of a program read their rows
together. Without the barrier the kernel is slower: ptxas then spreads the loads through the
step's arithmetic. Under Triton's interpreter
(the CPU tests) the loads are masked tl.loads and the codes are decoded by the bit arithmetic
of _tl_numerics.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ... import dtypes
from .._launch import Launch, bind_weight, planned_product, traced_product
from .._tl_numerics import decode_value, ptx, scale_value, to_output
from .._common import aligned, interpreting, packed_decode_constants, sm_count
from .matmul_kernels import fp16_pair_to_f32, reduce_splits_kernel

__all__ = ["GemvConfig", "TILE", "default_config", "eligible", "byte_gemv"]

PIECE = 16  # codes (bytes) per piece
_PIECE = tl.constexpr(PIECE)

# A piece's 4 code words and its block's scale byte, where $6 != 0 (else undefined).
_LOAD_PIECE = tl.constexpr(
    "{ .reg .pred p; setp.ne.b32 p, $6, 0; "
    "@p ld.global.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$5]; "
    "@p ld.global.u8 $4, [$7]; }")
# The 8 words of x's 16 values (bf16 / fp16 pairs) of a piece, where $9 != 0.
_LOAD_X = tl.constexpr(
    "{ .reg .pred p; setp.ne.b32 p, $9, 0; "
    "@p ld.global.v4.u32 {$0, $1, $2, $3}, [$8]; "
    "@p ld.global.v4.u32 {$4, $5, $6, $7}, [$8+16]; }")
# The 4 fp8 codes of a word (code i in byte i) as fp32, through the exact fp8 -> fp16x2
# conversion: two conversions and four widenings, no byte extraction.
_DECODE_FP8 = """{ .reg .b16 lo, hi, a, b, c, d; .reg .b32 h0, h1;
mov.b32 {lo, hi}, $4;
cvt.rn.f16x2.FMTx2 h0, lo;
cvt.rn.f16x2.FMTx2 h1, hi;
mov.b32 {a, b}, h0;
mov.b32 {c, d}, h1;
cvt.f32.f16 $0, a;
cvt.f32.f16 $1, b;
cvt.f32.f16 $2, c;
cvt.f32.f16 $3, d; }"""
_DECODE_E4M3 = ptx(_DECODE_FP8.replace("FMT", "e4m3"))
_DECODE_E5M2 = ptx(_DECODE_FP8.replace("FMT", "e5m2"))
# The 4 int8 codes of a word as fp32 integers without int -> float conversions (a quarter of
# the fp32 rate): code c + 128 (the byte xor 0x80) goes into the mantissa of 2**23, one byte
# permute each, and subtracting 2**23 + 128 leaves c, exactly.
_DECODE_INT8 = ptx("""{ .reg .b32 u, c;
xor.b32 u, $4, 0x80808080;
mov.b32 c, 0x4B000000;
prmt.b32 $0, u, c, 0x7540;
prmt.b32 $1, u, c, 0x7541;
prmt.b32 $2, u, c, 0x7542;
prmt.b32 $3, u, c, 0x7543;
sub.f32 $0, $0, 0f4B000080;
sub.f32 $1, $1, 0f4B000080;
sub.f32 $2, $2, 0f4B000080;
sub.f32 $3, $3, 0f4B000080; }""")


@triton.jit
def _load_pieces(w_ptrs, s_ptrs, ok, INTERPRETER: tl.constexpr):
    """(the 4 code words of each piece, its scale byte), int32, where ok (else undefined)."""
    if INTERPRETER:
        words = w_ptrs.to(tl.pointer_type(tl.int32))
        return (tl.load(words, mask=ok, other=0), tl.load(words + 1, mask=ok, other=0),
                tl.load(words + 2, mask=ok, other=0), tl.load(words + 3, mask=ok, other=0),
                tl.load(s_ptrs, mask=ok, other=0).to(tl.int32))
    else:  # pure: nothing in the kernel writes what it reads (torch.compile's analysis asks)
        return tl.inline_asm_elementwise(_LOAD_PIECE, "=r,=r,=r,=r,=r,l,r,l",
                                         [w_ptrs, ok.to(tl.int32), s_ptrs],
                                         dtype=(tl.int32,) * 5, is_pure=True, pack=1)


@triton.jit
def _load_x(x_ptrs, ok, INTERPRETER: tl.constexpr):
    """The 8 int32 words (value pairs) of x's 16 values at each piece, where ok (else
    undefined). Pure: the rows of a thread share their pieces' x, and one load serves them."""
    if INTERPRETER:
        words = x_ptrs.to(tl.pointer_type(tl.int32))
        return (tl.load(words, mask=ok, other=0), tl.load(words + 1, mask=ok, other=0),
                tl.load(words + 2, mask=ok, other=0), tl.load(words + 3, mask=ok, other=0),
                tl.load(words + 4, mask=ok, other=0), tl.load(words + 5, mask=ok, other=0),
                tl.load(words + 6, mask=ok, other=0), tl.load(words + 7, mask=ok, other=0))
    else:
        return tl.inline_asm_elementwise(_LOAD_X, "=r,=r,=r,=r,=r,=r,=r,=r,l,r",
                                         [x_ptrs, ok.to(tl.int32)], dtype=(tl.int32,) * 8,
                                         is_pure=True, pack=1)


@triton.jit
def _decode_word(word, IS_INT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
                 HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr, TO_VALUE: tl.constexpr,
                 INTERPRETER: tl.constexpr):
    """The 4 codes of int32 words (code i in byte i) as 4 fp32 tensors, exactly: fp8 values
    (e5m2 is the format with Inf), MXINT8 integer codes (the unit 2**-6 is left out)."""
    if INTERPRETER:
        return (decode_value(word & 0xFF, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, 1.0, TO_VALUE),
                decode_value((word >> 8) & 0xFF, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, 1.0,
                             TO_VALUE),
                decode_value((word >> 16) & 0xFF, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, 1.0,
                             TO_VALUE),
                decode_value((word >> 24) & 0xFF, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN, 1.0,
                             TO_VALUE))
    elif IS_INT:
        return tl.inline_asm_elementwise(_DECODE_INT8, "=r,=r,=r,=r,r", [word],
                                         dtype=(tl.float32,) * 4, is_pure=True, pack=1)
    elif HAS_INF:
        return tl.inline_asm_elementwise(_DECODE_E5M2, "=r,=r,=r,=r,r", [word],
                                         dtype=(tl.float32,) * 4, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(_DECODE_E4M3, "=r,=r,=r,=r,r", [word],
                                         dtype=(tl.float32,) * 4, is_pure=True, pack=1)


@triton.jit
def _pair_values(word, X_FP16: tl.constexpr):
    """The two bf16 / fp16 values of int32 words (low half first) as fp32."""
    if X_FP16:
        lo, hi = fp16_pair_to_f32(word)
    else:
        lo = (word << 16).to(tl.float32, bitcast=True)
        hi = (word & -65536).to(tl.float32, bitcast=True)  # 0xFFFF0000
    return lo, hi


@triton.jit
def _piece_sums(codes, x_words, IS_INT: tl.constexpr, BITS: tl.constexpr,
                MBITS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr,
                TO_VALUE: tl.constexpr, X_FP16: tl.constexpr, INTERPRETER: tl.constexpr):
    """fp32: each piece's sum of its 16 products (unscaled codes times x), in k order."""
    total = tl.zeros(x_words[0].shape, tl.float32)
    for q in tl.static_range(4):
        v0, v1, v2, v3 = _decode_word(codes[q], IS_INT, BITS, MBITS, HAS_INF, HAS_NAN,
                                      TO_VALUE, INTERPRETER)
        x0, x1 = _pair_values(x_words[2 * q], X_FP16)
        x2, x3 = _pair_values(x_words[2 * q + 1], X_FP16)
        total += v0 * x0
        total += v1 * x1
        total += v2 * x2
        total += v3 * x3
    return total


@triton.jit
def _all_or(condition, ALL: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """`condition` broadcast to [R, C], or all true when ALL (known to hold)."""
    if ALL:
        return tl.full([R, C], 1, tl.int1)
    else:
        return tl.broadcast_to(condition, [R, C])


@triton.jit
def byte_gemv_kernel(x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, partials_ptr, N, K,
                     steps_per_split, stride_wn, stride_sn, stride_sk, BLOCK: tl.constexpr,
                     BLOCK_N: tl.constexpr, PIECES: tl.constexpr, SPLIT: tl.constexpr,
                     X_FP16: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
                     HAS_BIAS: tl.constexpr, INTERPRETER: tl.constexpr, IS_INT: tl.constexpr,
                     BITS: tl.constexpr, MBITS: tl.constexpr, HAS_INF: tl.constexpr,
                     HAS_NAN: tl.constexpr, LSB: tl.constexpr, TO_VALUE: tl.constexpr,
                     CPG: tl.constexpr):
    """Program (BLOCK_N rows, part of K): out[n] for its rows n, or with SPLIT > 1 the fp32
    partial sums over its `steps_per_split` steps of 16 PIECES columns (partials[split, n]).
    EVEN_N: N is a multiple of BLOCK_N; EVEN_K: K of 16 PIECES (no piece is masked). The format
    constants are _common.packed_decode_constants' (CPG, codes per group, is 1 here)."""
    STEP: tl.constexpr = _PIECE * PIECES
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
    k_start = tl.program_id(1) * steps_per_split * STEP
    k_end = tl.minimum(K, k_start + steps_per_split * STEP)
    piece = tl.arange(0, PIECES)[None, :]
    first = k_start + piece * _PIECE
    w_ptrs = w_ptr.to(tl.pointer_type(tl.uint8)) + rows * stride_wn + first  # int8: MXINT8
    s_ptrs = s_ptr + rows * stride_sn + (first // BLOCK) * stride_sk
    x_ptrs = tl.broadcast_to(x_ptr + first, [BLOCK_N, PIECES])
    row_ok = _all_or(rows < N, EVEN_N, BLOCK_N, PIECES)
    acc = tl.zeros([BLOCK_N, PIECES], dtype=tl.float32)
    for k0 in range(k_start, k_end, STEP):
        k_ok = _all_or(k0 + piece * _PIECE < k_end, EVEN_K, BLOCK_N, PIECES)
        codes = _load_pieces(w_ptrs, s_ptrs, row_ok & k_ok, INTERPRETER)
        x_words = _load_x(x_ptrs, k_ok, INTERPRETER)
        tl.debug_barrier()  # keeps the loads above together (see the module docstring)
        scale = scale_value(codes[4])
        if IS_INT:
            scale = scale * LSB  # the codes' unit, exact: 2**(s - 133) >= fp32's 2**-149
        partial = scale * _piece_sums(codes, x_words, IS_INT, BITS, MBITS, HAS_INF, HAS_NAN,
                                      TO_VALUE, X_FP16, INTERPRETER)
        if EVEN_K:
            acc += partial
        else:
            acc += tl.where(k_ok, partial, 0.0)  # a masked piece's loads are undefined
        w_ptrs += STEP
        s_ptrs += (STEP // BLOCK) * stride_sk  # a step is whole blocks
        x_ptrs += STEP
    out = tl.sum(acc, axis=1)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT > 1:
        tl.store(partials_ptr + tl.program_id(1) * N + offs_n, out, mask=offs_n < N)
    else:
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs_n, to_output(out, out_ptr.dtype.element_ty, INTERPRETER),
                 mask=offs_n < N)


@dataclass(frozen=True)
class GemvConfig:
    """Launch parameters: weight rows per program, 16-byte pieces of each row per step, warps
    per program (powers of two) and programs along K (their fp32 partial sums are added in a
    fixed order by a second kernel)."""
    block_n: int
    pieces: int
    num_warps: int
    split_k: int = 1

    def __post_init__(self):
        for name in ("block_n", "pieces", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"GemvConfig: {name} must be a power of two, got {value!r}")
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"GemvConfig: split_k must be a positive int, got {self.split_k!r}")


# From H100 sweeps (benchmarks/bench_gpu_matmul.py --sweep) and interleaved timings at N = K =
# 8192 and 4096: 2 rows x 256 pieces (4 KiB of each row a step) over 4 warps, each thread 4
# pieces of one row.
TILE = GemvConfig(block_n=2, pieces=256, num_warps=4)


def default_config(N: int, K: int, device: torch.device) -> GemvConfig:
    """TILE, with K split (in parts of whole steps) when N alone gives fewer than 3 programs
    per SM."""
    programs = triton.cdiv(N, TILE.block_n)
    steps = triton.cdiv(K, PIECE * TILE.pieces)
    split = 1
    while programs * split < 3 * sm_count(device) and steps >= 2 * split:
        split *= 2
    return GemvConfig(TILE.block_n, TILE.pieces, TILE.num_warps, split)


_FORMATS = (dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.int8)  # the decodes above


def eligible(x: torch.Tensor, w_data: torch.Tensor, fmt: dtypes.DType, block_size: int) -> bool:
    """Whether `byte_gemv` takes this product: one row x [1, K] (bf16 / fp16, contiguous), an
    e4m3 / e5m2 / MXINT8 weight whose rows are whole 16-byte pieces (K a multiple of 16, unit
    stride along K, rows and both tensors 16-byte aligned), blocks a multiple of 16."""
    K = x.shape[-1]
    return (fmt in _FORMATS and block_size % PIECE == 0 and x.dim() == 2 and x.shape[0] == 1
            and x.dtype in (torch.bfloat16, torch.float16) and x.is_contiguous()
            and K % PIECE == 0 and w_data.dim() == 2 and w_data.shape[1] == K
            and (K == 0 or (w_data.stride(1) == 1 and w_data.stride(0) % PIECE == 0))
            and aligned(x) and aligned(w_data))


def byte_gemv(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor, fmt: dtypes.DType,
              block_size: int, bias: Optional[torch.Tensor], out_dtype: torch.dtype,
              config: Optional[GemvConfig] = None) -> torch.Tensor:
    """x [1, K] @ W.T + bias (contiguous), rounded once to out_dtype, for the MX weight W
    [N, K] given by its codes `w_data` [N, K] and scale bytes `w_scale` [N, K / block_size]."""
    if not eligible(x, w_data, fmt, block_size):
        raise ValueError(f"byte_gemv: needs one contiguous bf16 / fp16 row and an e4m3 / e5m2 "
                         f"/ int8 weight of whole, aligned 16-byte pieces (see eligible), got x "
                         f"{x.dtype} {tuple(x.shape)}, {fmt.name} codes {tuple(w_data.shape)} "
                         f"with strides {w_data.stride()}, block size {block_size}")
    N, K = w_data.shape
    cfg = config or default_config(N, K, x.device)
    if (PIECE * cfg.pieces) % block_size:
        raise ValueError(f"byte_gemv: a step of {cfg.pieces} pieces ({PIECE * cfg.pieces} "
                         f"columns) must be whole blocks of {block_size}")
    if N == 0:
        return torch.empty((1, N), dtype=out_dtype, device=x.device)
    return GemvPlan(x, w_scale, w_data, fmt, block_size, bias, out_dtype, cfg)(
        x, w_scale, w_data, bias)


class GemvPlan:
    """byte_gemv's launches for products like the one it is built from (same shapes, strides,
    dtypes, alignments, format, bias or none, config; N > 0): decided once, then a call
    allocates the output (and split-K partials) and launches with the new tensors."""

    def __init__(self, x, w_scale, w_data, fmt: dtypes.DType, block_size: int, bias,
                 out_dtype: torch.dtype, cfg: GemvConfig):
        N, K = w_data.shape
        steps = triton.cdiv(K, PIECE * cfg.pieces)
        steps_per_split = triton.cdiv(steps, min(cfg.split_k, max(steps, 1)))
        split = triton.cdiv(steps, steps_per_split) if steps else 1
        self.N, self.split, self.out_dtype, self.device = N, split, out_dtype, x.device
        interpreter = interpreting()
        self.main = Launch(byte_gemv_kernel, (triton.cdiv(N, cfg.block_n), split),
            (None,) * 6 + (N, K, steps_per_split, w_data.stride(0), w_scale.stride(0),
                           w_scale.stride(1)),
            dict(BLOCK=block_size, BLOCK_N=cfg.block_n, PIECES=cfg.pieces, SPLIT=split,
                 X_FP16=x.dtype == torch.float16, EVEN_N=N % cfg.block_n == 0,
                 EVEN_K=K % (PIECE * cfg.pieces) == 0, HAS_BIAS=bias is not None,
                 INTERPRETER=interpreter, num_warps=cfg.num_warps, **packed_decode_constants(fmt)),
            range(6))
        self.reduce = None
        if split > 1:
            reduce_block = 1024
            # out [1, N] is contiguous: strides (N, 1)
            self.reduce = Launch(reduce_splits_kernel, (triton.cdiv(N, reduce_block),),
                (None,) * 3 + (1, N, N, 1),
                dict(SPLIT_K=split, BLOCK=reduce_block, HAS_BIAS=bias is not None,
                     INTERPRETER=interpreter),
                range(3))

    def __call__(self, x, w_scale, w_data, bias) -> torch.Tensor:
        return planned_product(self.main, self.reduce, (x, w_data, w_scale), bias, (1, self.N),
                               self.out_dtype, self.device, (self.split, self.N))

    def bind(self, w_scale, w_data, out_shape: tuple):
        """`f(x, bias) -> out` (out of `out_shape`) for this weight: the compiled kernels
        called directly (`bind_weight`), or None where they cannot be yet."""
        return bind_weight(self.main, self.reduce, w_scale, w_data, out_shape, self.out_dtype,
                           self.device, (self.split, self.N))

    def traced(self, x, w_scale, w_data, bias):
        """The call's product through torch.library.wrap_triton (`traced_product`), for a
        plan without a split (one launch); else None."""
        if self.reduce is not None:
            return None
        return traced_product(self.main, (x, w_data, w_scale), bias, (1, self.N),
                              self.out_dtype, self.device)

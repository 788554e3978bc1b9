"""MX-weight matmuls on CUDA: F.linear(x, W) with W an MX matrix [N, K] (blocks along K).

Two paths, both exact products of the dequantized operands accumulated in fp32 and rounded
once to the output dtype:

- M <= SMALL_M activation rows (decode): the fused Triton kernel of matmul_kernels.py. The
  weight stays packed in memory and is decoded in registers; the scales multiply fp32 block
  partials, so no element is ever rounded. fp6 only for one row whose weight rows are whole
  32-bit words (K a multiple of 16), or through mma_linear (below). One row of an fp8
  or MXINT8 weight (one-byte codes) whose rows are whole, aligned 16-byte pieces takes
  byte_gemv.py's kernel instead, and 2..64 bf16 rows times an fp8, fp6, fp4 or MXINT8 weight
  whose rows are whole units (64 one-byte codes, 128 fp6 or fp4 codes; N a multiple of 64)
  take mma_linear.py's tensor-core kernel on Hopper.
- larger M (prefill, training), and fp6 otherwise: the weight is dequantized to bf16 (one
  pass of the dequantize kernel) and multiplied by cuBLAS with fp32 accumulation (bf16
  reduced-precision reductions off; for few rows with an fp32 output rounded once here).
  For large bf16 products without bias (PIPELINE_*: M >= 4096, K >= 8192, N 4096..8192) the
  weight is dequantized in chunks of rows (output columns) on a side stream, one GEMM per
  chunk over all of K, so that the dequantize of the next chunk runs behind the GEMM of the
  current one (same sums, same single rounding).
  Every MX value of every format is exact in bf16 except fp8 values below bf16's normal
  range, 2**-126, which only blocks with a scale below 2**-124 (e4m3) or 2**-117 (e5m2) can
  hold: they are rounded to bf16's subnormal grid (round half to even). fp16 activations are
  split into two bf16 parts (x = hi + lo exactly) whose products are accumulated in fp32.

Routed pairs of a mixture of experts (`routed_linear`): each (token, expert) pair's row times
its expert's weight from a 3-D MX tensor [E, N, K], all pairs in one launch of routed_gemv.py's
kernel (the rows variant, one program per pair and tile of weight rows), optionally with
gpt-oss's gated activation in its epilogue; up to ROUTED_MAX_PAIRS pairs (decode). Pairs of one
expert each decode its weight: a variant that decodes each tile once for all the expert's
pairs (block dots on the pairs sorted by expert) was measured slower on an H200 at 1 and 16
gpt-oss tokens (benchmarks/results/gpt_oss_moe_2026-11-28_0841_nvidia-h200.txt).

Which formats qualify: those whose unscaled values the activation dtype holds exactly (all
OCP formats in bf16 and fp16; custom ExMy formats when their mantissa and exponent range fit),
block sizes 32..256 that are powers of two, activations in bf16 or fp16.
"""

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

from ... import dtypes
from .._common import (aligned, block_m_for, empty, interpreting, packed_decode_constants,
                       sm_count)
from ..._memo import memo
from .._launch import Launch, bind_weight, planned_product, traced_product

__all__ = ["SMALL_M", "supported", "linear", "bound_linear", "traced_linear", "fused_linear",
           "dequantized_linear", "Config", "ROUTED_MAX_PAIRS", "routed_eligible", "routed_linear"]

# Up to this many activation rows the fused kernel beats dequantize + cuBLAS (measured on an
# H200, benchmarks/bench_gpu_matmul.py).
SMALL_M = 64
# Up to this many rows, one program per activation row with fp32 multiply-adds; above,
# tensor-core dots with the activation rows padded to 16.
ROWS_MAX_M = 1
# The large-M path pipelines the weight's dequantize behind cuBLAS (`_pipelined_linear`) for
# bf16 products without bias of M >= PIPELINE_MIN_M rows, K >= PIPELINE_MIN_K and N in
# PIPELINE_N, in chunks of PIPELINE_COLUMNS output columns: where it was measured to win on an
# H100 (M = 4096 and 8192 at N = K = 8192; no gain at K = 4096, a loss at M <= 2048 or with
# chunks of 512 or 2048 columns; docs/matmul.md). Elsewhere one dequantize, then one GEMM.
PIPELINE_MIN_M = 4096
PIPELINE_MIN_K = 8192
PIPELINE_N = (4096, 8192)
PIPELINE_COLUMNS = 1024
_PIPELINE_PRIORITY = -1  # of the side stream (lower is higher)

_BLOCK_SIZES = (32, 64, 128, 256)
# (mantissa bits, largest exponent, exponent of the smallest subnormal) of each dtype.
_DTYPE_RANGE = {torch.bfloat16: (7, 127, -133), torch.float16: (10, 15, -24)}


def supported(fmt: dtypes.DType, block_size: int, dtype: torch.dtype) -> bool:
    """True when the kernels take an MX weight of this format and block size with
    activations of `dtype`: the unscaled element values must be exact in `dtype`."""
    if dtype not in _DTYPE_RANGE or block_size not in _BLOCK_SIZES:
        return False
    mantissa, emax, min_exponent = _DTYPE_RANGE[dtype]
    if fmt.kind == "int":  # code / 2**m with |code| <= 127: 7 significant bits
        return mantissa >= 6 and -fmt.mantissa_bits >= min_exponent
    return (fmt.mantissa_bits <= mantissa and fmt.emax <= emax
            and fmt.min_exponent - fmt.mantissa_bits >= min_exponent)


ROWS, BLOCK_DOTS, SCALED_DOTS = 0, 1, 2  # the kernel's variants (matmul_kernels.py)


@dataclass(frozen=True)
class Config:
    """Launch parameters of the fused kernel (see `_default_config`): the variant, output
    columns per program, K split across programs, blocks per loop step (NB)."""
    variant: int
    block_n: int
    split_k: int
    blocks: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        if self.variant not in (ROWS, BLOCK_DOTS, SCALED_DOTS):
            raise ValueError(f"Config: variant must be ROWS, BLOCK_DOTS or SCALED_DOTS "
                             f"({ROWS}, {BLOCK_DOTS}, {SCALED_DOTS}), got {self.variant!r}")
        for name in ("block_n", "blocks", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"Config: {name} must be a power of two, got {value!r}")
        for name in ("split_k", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Config: {name} must be a positive int, got {value!r}")
        if self.variant != ROWS and self.block_n < 16:
            raise ValueError(f"Config: the dot variants need block_n >= 16 (tensor-core "
                             f"tiles), got {self.block_n}")


def _default_config(fmt: dtypes.DType, M: int, N: int, blocks_k: int, dtype: torch.dtype,
                    device: torch.device) -> Config:
    """Tiles from benchmarks/bench_gpu_matmul.py --sweep (H100, N = K = 8192), and enough
    programs to fill every SM at least three times over, splitting K when N alone gives too
    few."""
    fp4 = fmt == dtypes.float4_e2m1
    stages = 2
    if M <= ROWS_MAX_M:
        # Few rows per program, long runs of each row per step (1 KiB of fp4 or of fp8): N
        # alone gives enough programs, so K is not split and no second pass is needed. fp4
        # takes 8 rows x 64 blocks: each thread converts its x values once for the rows it
        # holds (bench_gpu_matmul.py --sweep). fp6 decodes sixteen
        # codes from three words: more rows amortize the x broadcast.
        variant = ROWS
        block_n, blocks = {2: (8, 64), 4: (64, 4)}.get(fmt.codes_per_group, (8, 32))
        blocks = min(blocks, 1 << max(0, blocks_k - 1).bit_length())
    elif dtype == torch.bfloat16:
        variant, block_n, blocks, stages = SCALED_DOTS, *((64, 2) if fp4 else (128, 4)), 3
    else:
        variant, block_n, blocks = BLOCK_DOTS, 64, 1
    tiles = -(-N // block_n) * (M if variant == ROWS else -(-M // block_m_for(M)))
    split_k = 1
    while tiles * split_k < 3 * sm_count(device) and blocks_k // (2 * split_k) >= 2 * blocks:
        split_k *= 2
    return Config(variant, block_n, split_k, blocks, num_stages=stages)


def _fast_decode(fmt: dtypes.DType, device: torch.device, variant: int = ROWS,
                 words: bool = False) -> int:
    """matmul_kernels' FAST: on a GPU the hardware fp8 conversions, and for fp4 its fp16-bits
    decode (4), or whole 32-bit words through inline PTX (5) for one activation row when
    `words` (rows of whole, 4-byte aligned words); 0, the general bit arithmetic, elsewhere."""
    if device.type != "cuda" or interpreting():
        return 0
    if fmt == dtypes.float4_e2m1:
        return 5 if variant == ROWS and words else 4
    return {dtypes.float8_e4m3: 1, dtypes.float8_e5m2: 2}.get(fmt, 0)


def _whole_words(fmt: dtypes.DType, w_data: torch.Tensor, K: int) -> bool:
    """fp4 / fp6 rows that the kernel may read as aligned 32-bit words (of 8 / 16 codes)."""
    codes = {2: 8, 4: 16}.get(fmt.codes_per_group)
    return (codes is not None and K % codes == 0 and w_data.stride(1) == 1
            and w_data.stride(0) % 4 == 0 and aligned(w_data, 4))


def _read_words(fmt: dtypes.DType, w_data: torch.Tensor, K: int, variant: int,
                fast: int) -> bool:
    """The rows variant reads fp6 as whole words wherever it can, fp4 where its words are
    decoded by inline PTX (FAST 5, GPU only)."""
    return (variant == ROWS and _whole_words(fmt, w_data, K)
            and (fmt.codes_per_group == 4 or fast == 5))


def _even(N: int, K: int, blocks_k: int, block_size: int, block_n: int, per_split: int) -> bool:
    """Every tile of the fused kernel whole: no masks needed."""
    return (N % block_n == 0 and K == blocks_k * block_size and blocks_k % per_split == 0)


def fused_linear(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor,
                 fmt: dtypes.DType, block_size: int, bias: Optional[torch.Tensor],
                 out_dtype: torch.dtype, config: Optional[Config] = None) -> torch.Tensor:
    """x [M, K] (bf16/fp16) @ W.T + bias with the fused kernel; W [N, K] given by its codes
    `w_data` [N, packed(K)] and scale bytes `w_scale` [N, ceil(K / block_size)]."""
    from . import byte_gemv, mma_linear

    M, K = x.shape
    N, blocks_k = w_scale.shape
    if config is None and byte_gemv.eligible(x, w_data, fmt, block_size):
        return byte_gemv.byte_gemv(x, w_scale, w_data, fmt, block_size, bias, out_dtype)
    if config is None and mma_linear.eligible(x, w_data, fmt, block_size):
        return mma_linear.mma_linear(x, w_scale, w_data, fmt, block_size, bias, out_dtype)
    if M == 0 or N == 0 or K == 0:
        out = torch.empty((M, N), dtype=out_dtype, device=x.device)
        if M == 0 or N == 0:
            return out
        return out.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(out))
    cfg = config or _default_config(fmt, M, N, blocks_k, x.dtype, x.device)
    if cfg.variant == SCALED_DOTS and x.dtype != torch.bfloat16:
        raise ValueError("the scaled-dots variant needs bf16 activations")
    if fmt.codes_per_group == 4 and not (cfg.variant == ROWS and _whole_words(fmt, w_data, K)):
        raise ValueError("config: the fused kernel reads fp6 codes only in the rows variant, as "
                         "whole 32-bit words (K a multiple of 16, word-aligned rows)")
    return FusedPlan(x, w_scale, w_data, fmt, block_size, bias, out_dtype, cfg)(
        x, w_scale, w_data, bias)


class FusedPlan:
    """fused_linear's launches for products like the one it is built from (same shapes,
    strides, dtypes, alignments, format, bias or none, config): decided once, then a call
    allocates the output (and split-K partials) and launches with the new tensors."""

    def __init__(self, x, w_scale, w_data, fmt: dtypes.DType, block_size: int, bias,
                 out_dtype: torch.dtype, cfg: Config):
        from . import matmul_kernels as kernels
        M, K = x.shape
        N, blocks_k = w_scale.shape
        block_m = 1 if cfg.variant == ROWS else block_m_for(M)
        nb = 1 if cfg.variant == BLOCK_DOTS else cfg.blocks
        per_split = -(-blocks_k // cfg.split_k)
        per_split = -(-per_split // nb) * nb
        split_k = -(-blocks_k // per_split)
        self.out_shape, self.out_dtype, self.device = (M, N), out_dtype, x.device
        self.split_k = split_k
        interpreter = interpreting()
        fast = _fast_decode(fmt, x.device, cfg.variant, _whole_words(fmt, w_data, K))
        words = _read_words(fmt, w_data, K, cfg.variant, fast)
        # out's strides: a fresh contiguous [M, N] tensor's (what __call__ allocates)
        self.main = Launch(kernels.mx_weight_matmul_kernel,
            (-(-N // cfg.block_n), split_k, -(-M // block_m)),
            (None,) * 6 + (M, N, K, blocks_k, per_split,
             x.stride(0), x.stride(1), w_data.stride(0), w_data.stride(1),
             w_scale.stride(0), w_scale.stride(1), N, 1),
            dict(BLOCK=block_size, BLOCK_M=block_m, BLOCK_N=cfg.block_n, NB=nb,
                 VARIANT=cfg.variant, SPLIT=split_k > 1,
                 EVEN=_even(N, K, blocks_k, block_size, cfg.block_n, per_split),
                 HAS_BIAS=bias is not None, INTERPRETER=interpreter, WORDS=words,
                 num_warps=cfg.num_warps, num_stages=cfg.num_stages, FAST=fast,
                 **packed_decode_constants(fmt)),
            range(6))
        self.reduce = None
        if split_k > 1:
            block = 1024
            self.reduce = Launch(kernels.reduce_splits_kernel, (-(-M * N // block),),
                (None,) * 3 + (M, N, N, 1),
                dict(SPLIT_K=split_k, BLOCK=block, HAS_BIAS=bias is not None,
                     INTERPRETER=interpreter),
                range(3))

    def __call__(self, x, w_scale, w_data, bias) -> torch.Tensor:
        return planned_product(self.main, self.reduce, (x, w_data, w_scale), bias,
                               self.out_shape, self.out_dtype, self.device,
                               (self.split_k, *self.out_shape))

    def bind(self, w_scale, w_data, out_shape: tuple):
        """`f(x, bias) -> out` (out of `out_shape`) for this weight: the compiled kernels
        called directly (`bind_weight`), or None where they cannot be yet."""
        return bind_weight(self.main, self.reduce, w_scale, w_data, out_shape, self.out_dtype,
                           self.device, (self.split_k, *self.out_shape))

    def traced(self, x, w_scale, w_data, bias):
        """The call's product through torch.library.wrap_triton (`traced_product`), for a
        plan without a split (one launch); else None."""
        if self.reduce is not None:
            return None
        return traced_product(self.main, (x, w_data, w_scale), bias, self.out_shape,
                              self.out_dtype, self.device)


def _int32_offsets(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, M: int) -> bool:
    """The fused kernel indexes in 32 bits: every offset it forms must stay below 2**31
    (weights of more than 2 GiB take the dequantize path, which indexes in 64 bits)."""
    def span(t):
        return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1
    limit = 2**31 - 1
    return max(span(x), span(w_data), span(w_scale), 16 * M * w_scale.shape[0]) < limit


@contextlib.contextmanager
def _fp32_reductions():
    """cuBLAS may otherwise reduce split-K bf16 partial sums in bf16."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = saved


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of bf16 matrices with an fp32 result (products exact, fp32 accumulation)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()  # aten's mm.dtype is CUDA-only


_side_streams = {}


def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    """One side stream per device and priority, taken once from PyTorch's pool (before any
    graph capture that uses it: torch.cuda.graph fills the pool before capturing)."""
    key = (device.index if device.index is not None else torch.cuda.current_device(),
           _PIPELINE_PRIORITY)
    if key not in _side_streams:
        _side_streams[key] = torch.cuda.Stream(device=key[0], priority=_PIPELINE_PRIORITY)
    return _side_streams[key]


def _chunk_bounds(N: int, columns: int) -> list:
    """[0, columns, 2 * columns, ..., N]: ranges of `columns` output columns, the last shorter."""
    return list(range(0, N, max(columns, 1))) + [N]


def _pipeline_bounds(M: int, N: int, K: int) -> Optional[list]:
    """The chunks of the pipelined path for a bf16 product without bias of this shape, or None
    where one dequantize and one GEMM are used (see PIPELINE_MIN_M)."""
    if M < max(PIPELINE_MIN_M, SMALL_M + 1) or K < PIPELINE_MIN_K:
        return None
    if not PIPELINE_N[0] <= N <= PIPELINE_N[1]:
        return None
    bounds = _chunk_bounds(N, PIPELINE_COLUMNS)
    return bounds if len(bounds) > 2 else None


def _dequantize(w_data, w_scale, fmt, block_size, K):
    """W [N, K] dequantized to bf16 (the operator's body itself where nothing traces the
    call: _eager.short_path)."""
    from ... import ops
    return ops.dequantize_mx.eager()(w_data, w_scale, fmt.name, block_size, torch.bfloat16, 1,
                                     block_dim_size=K)


def _dequantize_rows(w_data, w_scale, fmt, block_size, K, r0, r1):
    return _dequantize(w_data[r0:r1], w_scale[r0:r1], fmt, block_size, K)


def _pipelined_linear(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor,
                      fmt: dtypes.DType, block_size: int, K: int, bounds: list) -> torch.Tensor:
    """x @ W.T for bf16 x [M, K] and a bf16 result, one GEMM per chunk of W's rows (output
    columns) bounds[j]:bounds[j + 1], each over all of K: every output is the same
    fp32-accumulated sum, rounded once. On CUDA the chunks are dequantized in order on a side
    stream and each GEMM waits only for its own chunk, so the dequantize of chunk j + 1 runs
    behind the GEMM of chunk j; under graph capture the events become the graph's edges.
    No bias: torch.addmm into column slices of the output was seen (torch 2.11, H100) to miss
    the single rounding of product + bias by one ulp in 9.5% of the outputs."""
    out = x.new_empty((x.shape[0], w_scale.shape[0]))
    cuda = x.is_cuda
    if cuda:
        main, side = torch.cuda.current_stream(x.device), _side_stream(x.device)
        side.wait_stream(main)  # the operands are ready
    chunks = []
    with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
        for c0, c1 in zip(bounds, bounds[1:]):
            w = _dequantize_rows(w_data, w_scale, fmt, block_size, K, c0, c1)
            event = None
            if cuda:
                event = torch.cuda.Event()
                event.record(side)
            chunks.append((c0, c1, w, event))
    for c0, c1, w, event in chunks:
        if cuda:
            main.wait_event(event)
            w.record_stream(main)  # its memory is not reused before main's GEMM has read it
        torch.mm(x, w.t(), out=out[:, c0:c1])
    return out


def dequantized_linear(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor,
                       fmt: dtypes.DType, block_size: int, K: int, bias: Optional[torch.Tensor],
                       out_dtype: torch.dtype) -> torch.Tensor:
    """The large-M path: W dequantized to bf16, then cuBLAS GEMMs with fp32 accumulation (one,
    or for large bf16 products without bias one per chunk of W: `_pipelined_linear`)."""
    bf16 = x.dtype == torch.bfloat16 and out_dtype == torch.bfloat16
    bounds = _pipeline_bounds(x.shape[0], w_scale.shape[0], K) if bf16 and bias is None else None
    if bounds is not None:
        with _fp32_reductions():
            return _pipelined_linear(x, w_scale, w_data, fmt, block_size, K, bounds)
    w = _dequantize(w_data, w_scale, fmt, block_size, K).t()
    with _fp32_reductions():
        if bf16 and x.shape[0] > SMALL_M:
            return torch.mm(x, w) if bias is None else torch.addmm(bias, x, w)
        # Few rows (cuBLAS's bf16 matrix-vector path was seen to round beyond one final
        # rounding on an H100), fp16 (x = hi + lo, two exact bf16 parts) or another output
        # dtype: fp32 products, one rounding at the end.
        parts = [x]
        if x.dtype != torch.bfloat16:
            hi = x.to(torch.bfloat16)
            parts = [hi, (x.float() - hi.float()).to(torch.bfloat16)]  # exact: 11 bits
        acc = _mm_fp32(parts[0], w)
        for part in parts[1:]:
            acc += _mm_fp32(part, w)
        if bias is not None:
            acc += bias.float()
        return acc.to(out_dtype)


_PLANS = {}  # what `_plan` depends on -> the plan: a callable (x2, w_scale, w_data, bias) -> out


def _route(x2: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor, fmt: dtypes.DType,
           block_size: int, K: int):
    """("byte_gemv" | "mma" | "fused" | "dequantized", config): the path for this product, a
    pure function of the operands' formats, shapes, strides, alignments and device."""
    from . import byte_gemv, mma_linear  # mma_linear imports this module

    M, (N, blocks_k) = x2.shape[0], w_scale.shape
    fused = (M <= SMALL_M and _int32_offsets(x2, w_data, w_scale, M)
             and (fmt.codes_per_group != 4 or (M <= ROWS_MAX_M and _whole_words(fmt, w_data, K))
                  or mma_linear.eligible(x2, w_data, fmt, block_size)))
    if not fused:
        return "dequantized", None
    if byte_gemv.eligible(x2, w_data, fmt, block_size):
        return "byte_gemv", byte_gemv.default_config(N, K, x2.device)
    if mma_linear.eligible(x2, w_data, fmt, block_size):
        return "mma", mma_linear.default_config(fmt, M, N, K, block_size, x2.device)
    if M == 0 or N == 0 or K == 0:
        return "fused", None
    return "fused", _default_config(fmt, M, N, blocks_k, x2.dtype, x2.device)


def _plan(x2, w_scale, w_data, fmt: dtypes.DType, block_size: int, K: int, bias,
          out_dtype: torch.dtype):
    """The callable that computes this product (and every product with the same key in
    `linear`): the route's kernel launches prepared once (FusedPlan, GemvPlan, MmaPlan), or
    the dequantize + cuBLAS path."""
    from .byte_gemv import GemvPlan
    from .mma_linear import MmaPlan
    path, config = _route(x2, w_scale, w_data, fmt, block_size, K)
    if path == "dequantized":
        return lambda x2, w_scale, w_data, bias: dequantized_linear(
            x2, w_scale, w_data, fmt, block_size, K, bias, out_dtype)
    if path == "byte_gemv" and w_scale.shape[0]:
        return GemvPlan(x2, w_scale, w_data, fmt, block_size, bias, out_dtype, config)
    if path == "mma":
        return MmaPlan(x2, w_scale, w_data, fmt, block_size, bias, out_dtype, config, False)
    if path == "fused" and config is not None:
        if config.variant == SCALED_DOTS and x2.dtype != torch.bfloat16:
            raise ValueError("the scaled-dots variant needs bf16 activations")
        return FusedPlan(x2, w_scale, w_data, fmt, block_size, bias, out_dtype, config)
    return lambda x2, w_scale, w_data, bias: fused_linear(  # empty products, N == 0
        x2, w_scale, w_data, fmt, block_size, bias, out_dtype, config)


def _input_key(x2: torch.Tensor, bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> tuple:
    """What a plan depends on of the input side of a product (x2 [M, K], bias contiguous)."""
    bias_key = None if bias is None else (bias.dtype, bias.get_device(), bias.data_ptr() & 15)
    return (x2.shape, x2.stride(), x2.dtype, x2.data_ptr() & 15, x2.device, bias_key, out_dtype)


def _weight_key(w_scale: torch.Tensor, w_data: torch.Tensor, fmt: dtypes.DType,
                block_size: int, K: int) -> tuple:
    """What a plan depends on of the weight side (in `_PLANS`, the plans of every weight)."""
    return (fmt, block_size, K, w_data.shape, w_data.stride(), w_data.dtype,
            w_data.data_ptr() & 15, w_scale.shape, w_scale.stride(), w_scale.data_ptr() & 15)


def _operands(x: torch.Tensor, K: int, bias: Optional[torch.Tensor]):
    """(x as rows [M, K], bias) as the plans take them."""
    x2 = x.reshape(-1, K)
    if x2.shape[0] <= SMALL_M:  # a cheap copy keeps the kernel's offsets small, unit-stride
        x2 = x2.contiguous()
    if bias is not None:  # the kernels index the bias with unit stride
        bias = bias.contiguous()
    return x2, bias


def linear(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor, fmt: dtypes.DType,
           block_size: int, K: int, bias: Optional[torch.Tensor],
           out_dtype: torch.dtype, plans: Optional[dict] = None) -> torch.Tensor:
    """x [..., K] @ W.T + bias, W [N, K] in MX (see the module docstring). The path and its
    launches are decided once for each combination of what they depend on (`_plan`: the
    operands' formats, shapes, strides, alignments, dtypes and device, the bias or none) and
    looked up after. `plans`: a dict that one weight (these very w_scale and w_data) keeps for
    its own plans, keyed by the input's side alone (MXInferenceLinear's); None: the plans of
    every weight, keyed by both sides."""
    x2, bias = _operands(x, K, bias)
    key = _input_key(x2, bias, out_dtype)
    if plans is None:
        plans = _PLANS
        key += _weight_key(w_scale, w_data, fmt, block_size, K)
    plan = memo(plans, key,
                   lambda: _plan(x2, w_scale, w_data, fmt, block_size, K, bias, out_dtype))
    out = plan(x2, w_scale, w_data, bias)
    return out.reshape(*x.shape[:-1], w_scale.shape[0])


def bound_linear(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor,
                 fmt: dtypes.DType, block_size: int, K: int, bias: Optional[torch.Tensor],
                 out_dtype: torch.dtype, plans: Optional[dict] = None):
    """After `linear` ran with these arguments (`plans` as it took them: a weight's own, or
    None): `f(x, bias) -> out`, the product `linear` computes, for inputs like x (same shape,
    dtype and device, contiguous, 16-byte aligned) and a bias like `bias` (None, or the same
    dtype, contiguous and 16-byte aligned) times this very weight: the plan's compiled kernels
    called directly with the weight's addresses bound (the plans' `bind`). None where x or
    the bias is not like that, or the plan has no launches to bind (dequantize + cuBLAS, an
    empty product) or cannot bind them yet."""
    x2 = x.reshape(-1, K)
    if (x2.shape[0] > SMALL_M or not x.is_contiguous() or x.data_ptr() & 15
            or (bias is not None and (not bias.is_contiguous() or bias.data_ptr() & 15))):
        return None
    key = _input_key(x2, bias, out_dtype)
    if plans is None:
        plans = _PLANS
        key += _weight_key(w_scale, w_data, fmt, block_size, K)
    bind = getattr(plans.get(key), "bind", None)
    return None if bind is None else bind(w_scale, w_data, (*x.shape[:-1], w_scale.shape[0]))


def traced_linear(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor,
                  fmt: dtypes.DType, block_size: int, K: int, bias: Optional[torch.Tensor],
                  out_dtype: torch.dtype) -> Optional[torch.Tensor]:
    """`linear`'s product with its plan's kernel launches made through
    torch.library.wrap_triton (the plans' `traced`), for the body of a triton_op that
    torch.compile traces on fake tensors (mx_ops/weight_matmul_compiled.py): the plan is
    built from the operands' shapes, strides, dtypes and storage offsets, as `linear` builds
    it. None where the plan is not one Triton launch (a split of K and its reduce, the
    tensor-core kernel, dequantize + cuBLAS, an empty product) or a shape or stride is
    symbolic."""
    x2, bias = _operands(x, K, bias)
    sizes = (*x2.shape, *x2.stride(), *w_data.shape, *w_data.stride(), *w_scale.shape,
             *w_scale.stride())
    if not all(type(size) is int for size in sizes):
        return None
    traced = getattr(_plan(x2, w_scale, w_data, fmt, block_size, K, bias, out_dtype),
                     "traced", None)
    out = None if traced is None else traced(x2, w_scale, w_data, bias)
    return None if out is None else out.reshape(*x.shape[:-1], w_scale.shape[0])


# Routed pairs per launch up to which routed_linear takes them (16 decode tokens x top-4 of
# gpt-oss); above, each expert's rows are one F.linear (prefill).
ROUTED_MAX_PAIRS = 64


def routed_eligible(x: torch.Tensor, w_scale: torch.Tensor, w_data: torch.Tensor,
                    fmt: dtypes.DType, block_size: int, pairs: int) -> bool:
    """Whether routed_linear takes `pairs` routed rows of x [T, K] (bf16 / fp16) times
    the 3-D MX weight of codes `w_data` [E, N, packed(K)] (unit stride along K; each expert's
    offsets in 32 bits) and scale bytes `w_scale` [E, N, K / block_size]: any format of
    `supported` but fp6."""
    return (x.dim() == 2 and w_data.dim() == 3 and x.device == w_data.device
            and 0 < pairs <= ROUTED_MAX_PAIRS and supported(fmt, block_size, x.dtype)
            and fmt.codes_per_group != 4 and w_data.shape[0] > 0 and w_data.shape[1] > 0
            and w_data.stride(2) == 1 and _int32_offsets(x, w_data[0], w_scale[0], 1))


class RoutedPlan:
    """routed_linear's launch for products like the one it is built from (same shapes,
    strides, dtypes, alignments, format, bias or none, gate or none): decided once."""

    def __init__(self, x, experts, w_scale, w_data, fmt: dtypes.DType, block_size: int, bias,
                 per_row: int, swiglu):
        from .routed_gemv import routed_rows_kernel
        E, N, blocks_k = w_scale.shape
        K = x.shape[1]
        pairs = experts.numel()
        block_n, nb = {2: (8, 64), 4: (64, 4)}.get(fmt.codes_per_group, (8, 32))
        nb = min(nb, 1 << max(0, blocks_k - 1).bit_length())
        expert0 = w_data[0]
        fast = _fast_decode(fmt, x.device, ROWS,
                            _whole_words(fmt, expert0, K) and w_data.stride(0) % 4 == 0)
        words = _read_words(fmt, expert0, K, ROWS, fast) and w_data.stride(0) % 4 == 0
        self.out_shape = (pairs, N // 2 if swiglu is not None else N)
        self.dtype, self.device = x.dtype, x.device
        alpha, limit = swiglu if swiglu is not None else (0.0, 0.0)
        self.main = Launch(routed_rows_kernel, (pairs, -(-N // block_n)),
            (None,) * 6 + (N, K, blocks_k, per_row, E, float(alpha), float(limit),
                           x.stride(0), x.stride(1), *w_data.stride(), *w_scale.stride(),
                           bias.stride(0) if bias is not None else 0, self.out_shape[1]),
            dict(BLOCK=block_size, BLOCK_N=block_n, NB=nb,
                 EVEN=N % block_n == 0 and K == blocks_k * block_size and blocks_k % nb == 0,
                 HAS_BIAS=bias is not None, SWIGLU=swiglu is not None, WORDS=words, FAST=fast,
                 INTERPRETER=interpreting(), num_warps=4, num_stages=2,
                 **packed_decode_constants(fmt)),
            range(6))

    def __call__(self, x, experts, w_scale, w_data, bias) -> torch.Tensor:
        out = empty(self.out_shape, self.dtype, self.device)
        self.main(x, w_data, w_scale, bias if bias is not None else out, out, experts)
        return out


def routed_linear(x: torch.Tensor, experts: torch.Tensor, w_scale: torch.Tensor,
                  w_data: torch.Tensor, fmt: dtypes.DType, block_size: int,
                  bias: Optional[torch.Tensor], per_row: int = 1, swiglu=None) -> torch.Tensor:
    """out [P, N] (x's dtype), row p = x[p // per_row] @ W[experts[p]].T + bias[experts[p]]
    for the P = experts.numel() routed pairs (`experts` int [P], in x's row order), W [E, N, K]
    the MX weight given by codes `w_data` [E, N, packed(K)] and scale bytes `w_scale` [E, N,
    K / block_size]; bias [E, N] or None. swiglu: (alpha, limit) for gpt-oss's gated
    activation of interleaved gate / up rows, then out is [P, N / 2] (see routed_gemv.py).
    The caller checks `routed_eligible` first."""
    experts = experts.reshape(-1).contiguous()
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()
    key = ("routed", x.shape, x.stride(), x.dtype, x.data_ptr() & 15, x.device, experts.dtype,
           experts.numel(), experts.data_ptr() & 15, fmt, block_size, w_data.shape,
           w_data.stride(), w_data.data_ptr() & 15, w_scale.shape, w_scale.stride(),
           w_scale.data_ptr() & 15, None if bias is None else (bias.stride(), bias.data_ptr() & 15),
           per_row, swiglu)
    plan = memo(_PLANS, key, lambda: RoutedPlan(x, experts, w_scale, w_data, fmt, block_size,
                                                   bias, per_row, swiglu))
    return plan(x, experts, w_scale, w_data, bias)

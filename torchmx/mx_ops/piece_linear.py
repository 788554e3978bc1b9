"""`torch.ops.torchmx.mx_piece_linear`: F.linear with an MX weight that also has a copy in the
MMA layout (torchmx/kernels/layouts/mma_layout.py).

    mx_piece_linear(input, piece_codes, piece_scales, piece_counters, weight_scale,
                    weight_data, elem_dtype_name, in_features, bias, out_dtype)
        = mx_weight_linear(input, weight_scale, weight_data, elem_dtype_name, 32, in_features,
                           bias, out_dtype)

On a Hopper GPU (sm_90), for bf16 input with PIECE_ROWS activation rows, it runs mma_linear
on the pieces (contiguous warp loads, the split-K sum in the kernel); otherwise the
standard-layout parts take the usual path (mx_weight_linear). Both are the exact product,
fp32 accumulation and one rounding (the fp32 summation orders can differ, so can the last
bits), so the choice is by speed alone. Being one custom op, the choice is made at run time,
also under torch.compile with dynamic shapes.

`piece_counters` is written during a call and left at zero (the split-K arrival counters): the
op is not declared as mutating it, since no call observes a change; calls on one weight must
not run concurrently on two streams. MXInferenceLinear.prepack builds the parts.
"""

from typing import Optional

import torch
from torch import Tensor

from .._library import custom_op
from .. import dtypes
from . import weight_matmul

__all__ = ["mx_piece_linear", "PIECE_ROWS", "uses_piece_kernel"]

# Activation rows for which the MMA-layout kernel runs, by codes a packed group (interleaved H100
# timings at N = K = 8192, benchmarks/bench_gpu_matmul.py): one-byte codes 2..64, where one
# row is faster in byte_gemv on the standard layout; fp6 1..32, where at 64 rows the standard
# layout's kernel is the faster. (MXFP4 weights have no MMA layout: mma_layout.FORMATS.)
PIECE_ROWS = {1: range(2, 65), 4: range(1, 33)}


def uses_piece_kernel(input: Tensor, weight_scale: Tensor, weight_data: Tensor,
                      fmt: dtypes.DType) -> bool:
    """Whether mx_piece_linear runs the MMA-layout kernel for this input and weight."""
    return _piece_rows(input, weight_scale, weight_data, fmt) is not None


def _piece_rows(input: Tensor, weight_scale: Tensor, weight_data: Tensor,
                fmt: dtypes.DType) -> Optional[Tensor]:
    """input as the contiguous [rows, K] matrix the MMA-layout kernel takes, or None where it does
    not run."""
    if not input.dim() or not input.shape[-1] or fmt.codes_per_group not in PIECE_ROWS:
        return None
    rows = input.numel() // input.shape[-1]
    if rows not in PIECE_ROWS[fmt.codes_per_group] or not weight_matmul._kernels_usable(
            input.device):
        return None
    from ..kernels.linear import dispatch, mma_linear  # imports Triton: only where the kernels run
    # at most 64 rows: a cheap copy keeps the kernel's offsets small and unit-stride
    x = input.reshape(rows, input.shape[-1]).contiguous()
    # the kernel indexes in 32 bits (the pieces span as many bytes as weight_data)
    return (x if mma_linear.eligible(x, weight_data, fmt, 32)
            and dispatch._int32_offsets(x, weight_data, weight_scale, rows) else None)


@custom_op("torchmx::mx_piece_linear")
def mx_piece_linear(input: Tensor, piece_codes: Tensor, piece_scales: Tensor,
                    piece_counters: Tensor, weight_scale: Tensor, weight_data: Tensor,
                    elem_dtype_name: str, in_features: int, bias: Optional[Tensor],
                    out_dtype: torch.dtype) -> Tensor:
    """F.linear(input, W, bias) rounded once to out_dtype, W the MX weight (blocks of 32) given
    both ways (see the module docstring)."""
    from ..kernels.layouts import mma_layout
    fmt = weight_matmul._check_parts(input, weight_scale, weight_data, elem_dtype_name, 32,
                                     in_features, bias, out_dtype, op="mx_piece_linear")
    N = weight_scale.shape[0]
    pieces = (piece_codes, piece_scales, piece_counters)
    mma_layout.check_pieces(pieces, fmt, 32, N, in_features, weight_scale.device,
                              op="mx_piece_linear")
    x = _piece_rows(input, weight_scale, weight_data, fmt)
    if x is None:
        return torch.ops.torchmx.mx_weight_linear(input, weight_scale, weight_data,
                                                  elem_dtype_name, 32, in_features, bias,
                                                  out_dtype)
    from ..kernels.linear import mma_linear  # imports Triton: only where the kernel runs
    bias = bias.contiguous() if bias is not None else None
    out = mma_linear.mma_linear(x, weight_scale, weight_data, fmt, 32, bias, out_dtype,
                                pieces=pieces)
    return out.reshape(*input.shape[:-1], N)


@mx_piece_linear.register_fake
def _mx_piece_linear_fake(input, piece_codes, piece_scales, piece_counters, weight_scale,
                          weight_data, elem_dtype_name, in_features, bias, out_dtype):
    return input.new_empty((*input.shape[:-1], weight_scale.shape[0]), dtype=out_dtype)

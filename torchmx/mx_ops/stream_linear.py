"""`torch.ops.torchmx.mx_stream_linear`: F.linear with an MX weight that also has a copy in the
TMA stream layout (torchmx/kernels/layouts/tma_stream_layout.py).

    mx_stream_linear(input, stream_codes, stream_scales, stream_counters, weight_scale,
                     weight_data, elem_dtype_name, in_features, bias, out_dtype)
        = mx_weight_linear(input, weight_scale, weight_data, elem_dtype_name, 32, in_features,
                           bias, out_dtype)

On a Hopper GPU (sm_90) with Gluon, for bf16 input with STREAM_ROWS activation rows and a
weight whose CTAs fill enough of the GPU's waves (stream_matmul.fills_waves: one a 64-row
tile, or a few sharing its K where the tiles are few), it runs stream_linear on the copy;
otherwise the standard-layout parts take the usual path (mx_weight_linear). Both are the exact
product, fp32 accumulation and one rounding (the fp32 summation orders can differ, so can the
last bits), so the choice is by speed alone. Being one custom op, the choice is made at run
time, also under torch.compile with dynamic shapes.

`stream_counters` (int32 [N / 64] zeros) is written during a call where K is split and left at
zero (the split-K arrival counters): the op is not declared as mutating it, since no call
observes a change; calls on one weight must not run concurrently on two streams, as for the
fragment and piece ops. MXInferenceLinear.prepack builds the copy and its counters.
"""

from typing import Optional

import torch
from torch import Tensor

from .._library import custom_op
from .. import dtypes
from . import weight_matmul

__all__ = ["mx_stream_linear", "STREAM_ROWS", "uses_stream_kernel"]

# Activation rows for which the stream kernel runs, by codes a packed group (1: MXFP8 and
# MXINT8, 2: MXFP4, 4: MXFP6), from H100 timings at N = K = 8192 against the kernels it
# replaces (benchmarks/bench_stream_linear.py): one row of one-byte codes
# is faster in byte_gemv's one-row kernel on the standard layout.
STREAM_ROWS = {1: range(2, 65), 2: range(1, 65), 4: range(1, 65)}


def uses_stream_kernel(input: Tensor, weight_scale: Tensor, fmt: dtypes.DType,
                       out_dtype: torch.dtype) -> bool:
    """Whether mx_stream_linear runs the stream kernel for this input and weight."""
    return _stream_rows(input, weight_scale, fmt, out_dtype) is not None


def _stream_rows(input: Tensor, weight_scale: Tensor, fmt: dtypes.DType,
                 out_dtype: torch.dtype) -> Optional[Tensor]:
    """input as the contiguous [rows, K] matrix the kernel takes, or None where it does not
    run."""
    if (not input.dim() or not input.shape[-1] or fmt.codes_per_group not in STREAM_ROWS
            or out_dtype not in (torch.bfloat16, torch.float32)):
        return None
    rows = input.numel() // input.shape[-1]
    if (rows not in STREAM_ROWS[fmt.codes_per_group]
            or not weight_matmul._kernels_usable(input.device)):
        return None
    from ..kernels.linear import stream_matmul  # imports Triton: only where the kernels run
    # at most 64 rows: a cheap copy gives TMA its unit-stride, 16-byte aligned rows
    x = input.reshape(rows, input.shape[-1])
    if not x.is_contiguous() or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)
    N, K = weight_scale.shape[0], input.shape[-1]
    return (x if stream_matmul.eligible(x, fmt, N, K)
            and stream_matmul.fills_waves(fmt, N, K, x.device, rows) else None)


@custom_op("torchmx::mx_stream_linear")
def mx_stream_linear(input: Tensor, stream_codes: Tensor, stream_scales: Tensor,
                     stream_counters: Tensor, weight_scale: Tensor, weight_data: Tensor,
                     elem_dtype_name: str, in_features: int, bias: Optional[Tensor],
                     out_dtype: torch.dtype) -> Tensor:
    """F.linear(input, W, bias) rounded once to out_dtype, W the MX weight (blocks of 32) given
    both ways (see the module docstring)."""
    from ..kernels.linear import stream_matmul
    fmt = weight_matmul._check_parts(input, weight_scale, weight_data, elem_dtype_name, 32,
                                     in_features, bias, out_dtype, op="mx_stream_linear")
    N = weight_scale.shape[0]
    stream_matmul.check_parts(stream_codes, stream_scales, stream_counters, fmt, N, in_features,
                              weight_scale.device, op="mx_stream_linear")
    x = _stream_rows(input, weight_scale, fmt, out_dtype)
    if x is None:
        return torch.ops.torchmx.mx_weight_linear(input, weight_scale, weight_data,
                                                  elem_dtype_name, 32, in_features, bias,
                                                  out_dtype)
    bias = bias.contiguous() if bias is not None else None
    out = stream_matmul.stream_linear(x, stream_codes, stream_scales, weight_scale.contiguous(),
                                      weight_data.contiguous(), fmt, bias, out_dtype,
                                      counters=stream_counters)
    return out.reshape(*input.shape[:-1], N)


@mx_stream_linear.register_fake
def _mx_stream_linear_fake(input, stream_codes, stream_scales, stream_counters, weight_scale,
                           weight_data, elem_dtype_name, in_features, bias, out_dtype):
    return input.new_empty((*input.shape[:-1], weight_scale.shape[0]), dtype=out_dtype)

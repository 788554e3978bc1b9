"""`torch.ops.torchmx.mx_fp4_fragment_linear`: F.linear with an MXFP4 weight that also has a
pre-shuffled copy in the fp4 wgmma layout (torchmx/kernels/layouts/fp4_wgmma_layout.py).

    mx_fp4_fragment_linear(input, fragment_codes, fragment_scales, fragment_counters,
                           fragment_fold, weight_scale, weight_data, in_features, bias, out_dtype)
        = mx_weight_linear(input, weight_scale, weight_data, "float4_e2m1", 32, in_features,
                           bias, out_dtype)

On a Hopper GPU (sm_90), for bf16 input and output with FRAGMENT_ROWS activation rows, it runs
the fp4 wgmma kernel (kernels/linear/fp4_wgmma_matmul.py); otherwise the standard-layout parts take the
usual path (mx_weight_linear): one activation row is faster with the one-row kernel, many rows
with dequantize + cuBLAS. Both are the exact product, fp32 accumulation and one rounding
(the fp32 summation orders differ, so the last bits can), so the choice is by speed alone. Being one custom op, the choice is made at run time, also under
torch.compile with dynamic shapes.

`fragment_counters` is written during a call and left at zero (the split-K arrival counters):
the op is not declared as mutating it, since no call observes a change; calls on one weight
must not run concurrently on two streams. MXInferenceLinear.prepack builds the parts.
"""

from typing import Optional

import torch
from torch import Tensor

from .._library import custom_op
from .. import dtypes
from ..numerics import arguments as args
from . import weight_matmul

__all__ = ["mx_fp4_fragment_linear", "FRAGMENT_ROWS", "uses_fragment_kernel"]

# Activation rows for which the fp4 wgmma kernel runs (an H100 sweep at N = K = 8192,
# benchmarks/bench_gpu_matmul.py: one row is faster in the one-row kernel, and beyond 64 rows
# the standard path's dequantize + cuBLAS takes over).
FRAGMENT_ROWS = range(2, 65)


def uses_fragment_kernel(input: Tensor, out_dtype: torch.dtype) -> bool:
    """Whether mx_fp4_fragment_linear runs the fp4 wgmma kernel for this input."""
    rows = input.numel() // input.shape[-1] if input.dim() and input.shape[-1] else 0
    if not (rows in FRAGMENT_ROWS and input.dtype == torch.bfloat16 == out_dtype
            and weight_matmul._kernels_usable(input.device)):
        return False
    from ..kernels.linear import fp4_wgmma_matmul  # imports Triton: only where the kernels run
    return fp4_wgmma_matmul.usable_on(input.device)


def _check_fragment(fragment_codes, fragment_scales, fragment_counters, weight_scale,
                    in_features) -> None:
    from ..kernels.layouts import fp4_wgmma_layout as fl
    N = weight_scale.shape[0] if weight_scale.dim() == 2 else -1
    if not fl.fits(dtypes.float4_e2m1, 32, N, in_features):
        raise ValueError(f"mx_fp4_fragment_linear: the fp4 wgmma layout needs an MXFP4 weight "
                         f"with out and in features multiples of {fl.CHUNK}, got weight scale "
                         f"{tuple(weight_scale.shape)} and in_features={in_features}")
    expected = [(fragment_codes, N * in_features // 2 + fl.PAD_CODE_BYTES, torch.uint8, 16),
                (fragment_scales, N * in_features // 32 + fl.PAD_SCALE_BYTES, torch.uint8, 4),
                (fragment_counters, N // fl.CHUNK, torch.int32, 4)]
    for name, (t, numel, dtype, alignment) in zip(("codes", "scales", "counters"), expected):
        args.check_flat_part(t, f"mx_fp4_fragment_linear: fragment_{name}", numel, dtype,
                             weight_scale.device, alignment, "fp4_wgmma_layout.preshuffle")


@custom_op("torchmx::mx_fp4_fragment_linear")
def mx_fp4_fragment_linear(input: Tensor, fragment_codes: Tensor, fragment_scales: Tensor,
                           fragment_counters: Tensor, fragment_fold: bool, weight_scale: Tensor,
                           weight_data: Tensor, in_features: int, bias: Optional[Tensor],
                           out_dtype: torch.dtype) -> Tensor:
    """F.linear(input, W, bias) rounded once to out_dtype, W the MXFP4 weight given both ways
    (see the module docstring)."""
    weight_matmul._check_parts(input, weight_scale, weight_data, dtypes.float4_e2m1.name, 32,
                               in_features, bias, out_dtype, op="mx_fp4_fragment_linear")
    _check_fragment(fragment_codes, fragment_scales, fragment_counters, weight_scale,
                    in_features)
    if not uses_fragment_kernel(input, out_dtype) or (bias is not None and bias.dtype != out_dtype):
        return torch.ops.torchmx.mx_weight_linear(input, weight_scale, weight_data,
                                                  dtypes.float4_e2m1.name, 32, in_features,
                                                  bias, out_dtype)
    from ..kernels.linear import fp4_wgmma_matmul
    N = weight_scale.shape[0]
    # at most 64 rows: a cheap copy keeps the kernel's offsets small and unit-stride
    x = input.reshape(-1, in_features).contiguous()
    bias = bias.contiguous() if bias is not None else None
    out = fp4_wgmma_matmul.fp4_wgmma_linear(x, fragment_codes, fragment_scales, fragment_counters,
                                          N, fragment_fold, bias)
    return out.reshape(*input.shape[:-1], N)


@mx_fp4_fragment_linear.register_fake
def _mx_fp4_fragment_linear_fake(input, fragment_codes, fragment_scales, fragment_counters,
                                 fragment_fold, weight_scale, weight_data, in_features, bias,
                                 out_dtype):
    return input.new_empty((*input.shape[:-1], weight_scale.shape[0]), dtype=out_dtype)

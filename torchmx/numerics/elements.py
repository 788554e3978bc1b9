"""Element encode/decode: scaled fp32 values <-> integer codes of an MX element format.

A float code's magnitude is (E << m) | M. For a value |y| whose binade exponent is
p = max(floor(log2 |y|), emin) the grid spacing is 2**(p - m), and the code magnitude is
(p - emin) * 2**m + round(|y| / 2**(p - m)). That one formula covers subnormals, normals and a
rounding carry into the next binade; saturation is a clamp to the largest finite code.
"""

from typing import Optional

import torch

from .. import dtypes
from .bits import exact_pow2
from .rounding import round_magnitude


def encode(y: torch.Tensor, elem_dtype: dtypes.DType, rounding: str,
           uniform: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Codes (int32, sign bit included; two's complement for MXINT8) of finite fp32 `y`."""
    magnitude = y.abs()
    negative = torch.signbit(y)
    if elem_dtype.kind == "int":
        steps = magnitude * 2.0**elem_dtype.mantissa_bits  # exact: a power-of-two scaling
        code = round_magnitude(steps, rounding, uniform).clamp(max=elem_dtype.max_code)
        code = code.to(torch.int32)
        return torch.where(negative, -code, code)

    m = elem_dtype.mantissa_bits
    emin = elem_dtype.min_exponent
    # fp32 exponent field; fp32 subnormals lie far below emin for every format, so the clamp
    # makes the exponent exact where it matters.
    exponent = ((magnitude.view(torch.int32) >> 23) - 127).clamp(min=emin)
    steps = magnitude * exact_pow2(m - exponent)  # exact: a power-of-two scaling
    rounded = round_magnitude(steps, rounding, uniform).to(torch.int32)
    code = ((exponent - emin) << m) + rounded
    code = code.clamp(max=elem_dtype.max_code)
    return code | (negative.to(torch.int32) << (elem_dtype.bits - 1))


def decode(code: torch.Tensor, elem_dtype: dtypes.DType) -> torch.Tensor:
    """fp32 values of codes (any integer dtype), exact; NaN/Inf codes decode to NaN/Inf."""
    code = code.to(torch.int32)
    if elem_dtype.kind == "int":
        return code.to(torch.float32) * 2.0**-elem_dtype.mantissa_bits
    m = elem_dtype.mantissa_bits
    magnitude_mask = (1 << (elem_dtype.bits - 1)) - 1
    magnitude = code & magnitude_mask
    biased_exponent = magnitude >> m
    mantissa = magnitude & ((1 << m) - 1)
    significand = torch.where(biased_exponent > 0, mantissa + (1 << m), mantissa)
    exponent = biased_exponent.clamp(min=1) - elem_dtype.exponent_bias - m
    value = significand.to(torch.float32) * exact_pow2(exponent)
    if elem_dtype.has_inf:  # IEEE-style: all-ones exponent is Inf (mantissa 0) or NaN
        top = biased_exponent == (1 << elem_dtype.exponent_bits) - 1
        value = torch.where(top, torch.where(mantissa == 0, float("inf"), float("nan")), value)
    elif elem_dtype.has_nan:  # "fn" style: only the all-ones magnitude is NaN
        value = torch.where(magnitude == magnitude_mask, float("nan"), value)
    negative = (code >> (elem_dtype.bits - 1)) & 1 == 1
    return torch.where(negative, -value, value)

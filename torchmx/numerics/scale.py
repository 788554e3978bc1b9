"""Shared E8M0 block scales: the four scale modes of the numerics contract.

Each block's scale is 2**e with e an integer in [-127, 127], stored as the byte e + 127; a block
holding NaN or +-Inf gets the NaN byte 255 and an all-zero block gets byte 0.
"""

import torch

from .. import dtypes
from .bits import exact_pow2, floor_log2, is_power_of_two
from .modes import SCALE_MODES


def _even_log2(amax: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """AMD/aiter: round amax's fp32 bits to `mantissa_bits` (ties up), then take the exponent.

    A rounded amax that carries into the all-ones exponent field (2**128) counts as exponent 128.
    """
    bits = amax.view(torch.int32).to(torch.int64)
    rounded = (bits + (1 << (22 - mantissa_bits))) & 0xFF800000
    return ((rounded >> 23) - 127).to(torch.int32)


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    return floor_log2(x) + (~is_power_of_two(x)).to(torch.int32)


def scale_exponent(amax: torch.Tensor, elem_dtype: dtypes.DType, scale_mode: str) -> torch.Tensor:
    """Unclamped shared exponent e (int32) of blocks with finite, nonzero fp32 `amax`."""
    if scale_mode == "floor":  # OCP MX v1.0 section 6.3
        return floor_log2(amax) - elem_dtype.emax
    if scale_mode == "ceil":
        return _ceil_log2(amax) - elem_dtype.emax
    if scale_mode == "even":  # MXINT8 counts 6 mantissa bits: 127/64 = 1.111111b
        return _even_log2(amax, elem_dtype.mantissa_bits) - elem_dtype.emax
    if scale_mode == "rceil":  # NVIDIA: d = fp32(amax / max_normal) with IEEE RNE, e = ceil(log2 d)
        d = amax / torch.tensor(elem_dtype.max, dtype=torch.float32)
        return torch.where(d > 0, _ceil_log2(d), dtypes.E8M0_MIN_EXPONENT)
    raise ValueError(f"unknown scale_mode {scale_mode!r}; allowed: {', '.join(SCALE_MODES)}")


def shared_scale_byte(amax: torch.Tensor, elem_dtype: dtypes.DType, scale_mode: str) -> torch.Tensor:
    """E8M0 byte (uint8) of each block, given its fp32 amax (NaN when the block has NaN/Inf)."""
    e = scale_exponent(amax, elem_dtype, scale_mode)
    e = e.clamp(dtypes.E8M0_MIN_EXPONENT, dtypes.E8M0_MAX_EXPONENT)
    byte = e + dtypes.E8M0_EXPONENT_BIAS
    byte = torch.where(amax == 0, 0, byte)
    byte = torch.where(torch.isfinite(amax), byte, dtypes.E8M0_EXPONENT_NAN_VAL)
    return byte.to(torch.uint8)


def scale_value(scale_byte: torch.Tensor) -> torch.Tensor:
    """The fp32 value 2**(b - 127) of E8M0 bytes, exact (NaN for 255)."""
    value = exact_pow2(scale_byte.to(torch.int32) - dtypes.E8M0_EXPONENT_BIAS)
    return torch.where(scale_byte == dtypes.E8M0_EXPONENT_NAN_VAL, float("nan"), value)

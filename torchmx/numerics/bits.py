"""Exact bit-level helpers shared by the reference numerics (powers of two, binary exponents)."""

import torch


def exact_pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as fp32, built from its bits, exact for every integer in [-149, 127].

    Never `torch.exp2` or a division chain: the E8M0 scale 2**-127 is an fp32 subnormal and must
    come out exact, not flushed or halved.
    """
    exponent = exponent.to(torch.int32)
    normal_bits = (exponent + 127) << 23
    subnormal_bits = torch.ones_like(exponent) << (exponent + 149).clamp(0, 22)
    return torch.where(exponent >= -126, normal_bits, subnormal_bits).view(torch.float32)


def floor_log2(x: torch.Tensor) -> torch.Tensor:
    """floor(log2(x)) of positive finite fp32 values, exact for subnormals too (int32).

    Read from the float64 exponent field: every fp32 value, subnormal or not, is normal there.
    Zero gives -1023, which every caller clamps away.
    """
    bits64 = x.to(torch.float64).view(torch.int64)
    return (((bits64 >> 52) & 0x7FF) - 1023).to(torch.int32)


def is_power_of_two(x: torch.Tensor) -> torch.Tensor:
    """True where the positive fp32 value x is an exact power of two."""
    bits64 = x.to(torch.float64).view(torch.int64)
    return (bits64 & ((1 << 52) - 1)) == 0

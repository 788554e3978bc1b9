"""Element rounding modes and the counter-based random numbers of stochastic rounding."""

from typing import Optional

import torch

from .modes import ROUNDING_MODES

_MASK32 = 0xFFFFFFFF
_HASH_MULTIPLIER = 0x45D9F3B  # < 2**27: products of 32-bit values stay exact in int64


def _mix32(h):
    """A 32-bit integer hash (multiply-xorshift). Works on Python ints and int64 tensors alike,
    and in Triton on uint32, where the multiplication wraps to the same low 32 bits."""
    h = (((h >> 16) ^ h) * _HASH_MULTIPLIER) & _MASK32
    h = (((h >> 16) ^ h) * _HASH_MULTIPLIER) & _MASK32
    return (h >> 16) ^ h


def seed_key(seed: int) -> int:
    """The 32-bit key a 64-bit seed contributes to every element's random number."""
    return _mix32((seed & _MASK32) ^ _mix32((seed >> 32) & _MASK32))


def uniform_from_index(key: int, index: torch.Tensor) -> torch.Tensor:
    """A uniform number in [0, 1) with 24 random bits per element, from the element's logical
    (row-major, unpadded) index: the same on every backend and for every launch grid."""
    low = index & _MASK32
    high = index >> 32
    h = _mix32(_mix32(low ^ key) ^ high)
    return (h >> 8).to(torch.float32) * 2.0**-24


def round_magnitude(t: torch.Tensor, rounding: str, uniform: Optional[torch.Tensor] = None):
    """Round non-negative fp32 `t` to an integer-valued fp32 by `rounding`.

    Callers round magnitudes, so "away" and "toward_zero" are the half-way rules of
    round-to-nearest and "trunc" always rounds toward zero.
    """
    if rounding == "even":
        return torch.round(t)  # half to even
    low = torch.floor(t)
    fraction = t - low  # exact
    if rounding == "away":
        return low + (fraction >= 0.5).to(t.dtype)
    if rounding == "toward_zero":
        return low + (fraction > 0.5).to(t.dtype)
    if rounding == "trunc":
        return low
    if rounding == "stochastic":
        return low + (uniform < fraction).to(t.dtype)
    raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDING_MODES)}")

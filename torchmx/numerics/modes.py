"""The scale modes and element roundings of the numerics contract, and the integer each backend
passes for them: the reference reads the names, the Triton kernels take the integers as
constexprs (kernels/_tl_numerics.py), the C kernels as the enums of csrc/mx_cpu.c
(tests/numerics/test_modes.py checks them against this table).
"""

import enum


class ScaleMode(enum.IntEnum):
    """How a block's shared exponent follows from its amax (numerics/scale.py)."""

    FLOOR = 0  # OCP MX v1.0 section 6.3: floor(log2 amax) - emax
    CEIL = 1  # ceil(log2 amax) - emax
    EVEN = 2  # AMD / aiter: amax rounded to the element's mantissa width, then floor
    RCEIL = 3  # NVIDIA: ceil(log2(amax / max_normal)), the quotient rounded to nearest even

    @property
    def spelling(self) -> str:
        """The name users pass as `scale_mode`."""
        return self.name.lower()


class Rounding(enum.IntEnum):
    """How a scaled element rounds to the element format's grid (numerics/rounding.py)."""

    EVEN = 0  # round half to even
    AWAY = 1  # round half away from zero
    TOWARD_ZERO = 2  # round half toward zero
    TRUNC = 3  # toward zero
    STOCHASTIC = 4  # up with probability equal to the fraction (seeded)

    @property
    def spelling(self) -> str:
        """The name users pass as `rounding`."""
        return self.name.lower()


SCALE_MODES = tuple(mode.spelling for mode in ScaleMode)
ROUNDING_MODES = tuple(rounding.spelling for rounding in Rounding)

# By the user's spelling, for the calls that pass the integer on every quantize.
SCALE_MODE_BY_NAME = {mode.spelling: mode for mode in ScaleMode}
ROUNDING_BY_NAME = {rounding.spelling: rounding for rounding in Rounding}

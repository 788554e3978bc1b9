"""MX element formats as data: one frozen descriptor drives every backend.

The table of OCP MX v1.0 element formats (docs/numerics.md) lives here and nowhere else.
Every fact a backend needs (widths, bias, emax, max normal, the largest finite code, special
codes, how codes are packed into bytes) is a field or a property of `DType`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Optional, Union

import torch

__all__ = [
    "DType",
    "ExMy",
    "float8_e4m3",
    "float8_e5m2",
    "float6_e3m2",
    "float6_e2m3",
    "float4_e2m1",
    "int8",
    "SUPPORTED_ELEM_DTYPES",
    "SUPPORTED_FP_ELEM_DTYPES",
    "STR_TO_SUPPORTED_ELEM_DTYPE",
    "ALIASES",
    "TORCH_DTYPE_TO_ELEM_DTYPE",
    "E8M0_EXPONENT_BIAS",
    "E8M0_EXPONENT_NAN_VAL",
    "from_name",
    "resolve",
]

# E8M0 scale (OCP MX v1.0 section 5.4.1): byte b means 2**(b - 127) for b in 0..254; 255 is NaN.
E8M0_EXPONENT_BIAS = 127
E8M0_EXPONENT_NAN_VAL = 255
E8M0_MIN_EXPONENT = -127
E8M0_MAX_EXPONENT = 127


@dataclass(frozen=True, repr=False)
class DType:
    """An MX element format.

    `kind` is "float" (sign / exponent / mantissa minifloat) or "int" (MXINT8: two's complement
    code with an implicit scale of 2**-mantissa_bits, so its values are code / 64).
    """

    name: str
    kind: str
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int
    # Largest unbiased exponent of a normal value (OCP "emax"); torchmx 0.1.0 called it max_pow2.
    emax: int
    # Largest finite magnitude.
    max: float
    # Largest finite code magnitude (sign bit clear): saturation clamps codes to it.
    max_code: int
    has_nan: bool
    has_inf: bool
    torch_dtype: Optional[torch.dtype] = None

    def __post_init__(self):
        # Formats are compared and hashed on every kernel call (dict keys, ==): the fields'
        # tuple is built once instead of at each comparison.
        object.__setattr__(self, "_key", tuple(getattr(self, f.name) for f in fields(self)))

    def __eq__(self, other) -> bool:
        return self is other or (type(other) is DType and self._key == other._key)

    def __hash__(self) -> int:
        return hash(self._key)

    @property
    def bits(self) -> int:
        if self.kind == "int":
            return 8
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def max_pow2(self) -> int:
        """torchmx 0.1.0 name of `emax`."""
        return self.emax

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal value (subnormals share it)."""
        return 1 - self.exponent_bias

    @property
    def codes_per_group(self) -> int:
        """How many codes share one packed group of bytes along the block axis."""
        return {4: 2, 6: 4}.get(self.bits, 1)

    @property
    def bytes_per_group(self) -> int:
        return {4: 1, 6: 3}.get(self.bits, 1)

    @property
    def storage_dtype(self) -> torch.dtype:
        """dtype of the packed data tensor."""
        return torch.int8 if self.kind == "int" else torch.uint8

    def __repr__(self) -> str:
        return self.name


def _float_format(name, exponent_bits, mantissa_bits, bias, *, nan_inf="none", torch_dtype=None):
    """A sign/exponent/mantissa minifloat.

    nan_inf: "none" (every code finite: fp6, fp4, custom), "fn" (only S.1..1.1..1 is NaN: e4m3),
    "ieee" (top exponent reserved for Inf/NaN: e5m2).
    """
    all_ones_exponent = (1 << exponent_bits) - 1
    if nan_inf == "ieee":
        emax = all_ones_exponent - 1 - bias
        max_code = ((all_ones_exponent - 1) << mantissa_bits) | ((1 << mantissa_bits) - 1)
        max_mantissa = (1 << mantissa_bits) - 1
    elif nan_inf == "fn":
        emax = all_ones_exponent - bias
        max_code = (all_ones_exponent << mantissa_bits) | ((1 << mantissa_bits) - 2)
        max_mantissa = (1 << mantissa_bits) - 2
    else:
        emax = all_ones_exponent - bias
        max_code = (1 << (exponent_bits + mantissa_bits)) - 1
        max_mantissa = (1 << mantissa_bits) - 1
    max_value = 2.0**emax * (1 + max_mantissa / 2**mantissa_bits)
    return DType(
        name=name,
        kind="float",
        exponent_bits=exponent_bits,
        mantissa_bits=mantissa_bits,
        exponent_bias=bias,
        emax=emax,
        max=max_value,
        max_code=max_code,
        has_nan=nan_inf != "none",
        has_inf=nan_inf == "ieee",
        torch_dtype=torch_dtype,
    )


float8_e4m3 = _float_format("float8_e4m3", 4, 3, 7, nan_inf="fn", torch_dtype=torch.float8_e4m3fn)
float8_e5m2 = _float_format("float8_e5m2", 5, 2, 15, nan_inf="ieee", torch_dtype=torch.float8_e5m2)
float6_e3m2 = _float_format("float6_e3m2", 3, 2, 3)
float6_e2m3 = _float_format("float6_e2m3", 2, 3, 1)
float4_e2m1 = _float_format("float4_e2m1", 2, 1, 1)
# MXINT8: 8-bit two's complement with an implicit scale of 2**-6; -128 is never produced.
int8 = DType(
    name="int8",
    kind="int",
    exponent_bits=0,
    mantissa_bits=6,
    exponent_bias=0,
    emax=0,
    max=127 / 64,
    max_code=127,
    has_nan=False,
    has_inf=False,
    torch_dtype=torch.int8,
)

SUPPORTED_ELEM_DTYPES = (float8_e4m3, float8_e5m2, float6_e3m2, float6_e2m3, float4_e2m1, int8)
SUPPORTED_FP_ELEM_DTYPES = tuple(d for d in SUPPORTED_ELEM_DTYPES if d.is_float)
STR_TO_SUPPORTED_ELEM_DTYPE = {d.name: d for d in SUPPORTED_ELEM_DTYPES}

# Other names of the built-in formats: the OCP MX names ("MXFP8" is E4M3, as in torchao, NVIDIA
# and compressed-tensors; OCP's two 6-bit formats have no shorter name), torch's and ml_dtypes'
# dtype names and torchao's strings. Every entry point resolves names here, so they work everywhere.
ALIASES = {
    "mxfp8": float8_e4m3, "mxfp8_e4m3": float8_e4m3, "float8_e4m3fn": float8_e4m3,
    "fp8_e4m3": float8_e4m3,
    "mxfp8_e5m2": float8_e5m2, "fp8_e5m2": float8_e5m2,
    "mxfp6_e3m2": float6_e3m2, "float6_e3m2fn": float6_e3m2, "fp6_e3m2": float6_e3m2,
    "mxfp6_e2m3": float6_e2m3, "float6_e2m3fn": float6_e2m3, "fp6_e2m3": float6_e2m3,
    "mxfp4": float4_e2m1, "mxfp4_e2m1": float4_e2m1, "float4_e2m1fn": float4_e2m1,
    "float4_e2m1fn_x2": float4_e2m1, "fp4_e2m1": float4_e2m1,
    "mxint8": int8,
}
_AMBIGUOUS = {"mxfp6": "OCP MX defines two 6-bit formats: use 'mxfp6_e2m3' (float6_e2m3, more "
                       "precision) or 'mxfp6_e3m2' (float6_e3m2, more range)"}
_BY_NAME = {**STR_TO_SUPPORTED_ELEM_DTYPE, **ALIASES}

# torch dtypes that name an MX element format (torch has no fp6 dtype).
TORCH_DTYPE_TO_ELEM_DTYPE = {
    torch.float8_e4m3fn: float8_e4m3,
    torch.float8_e5m2: float8_e5m2,
    torch.int8: int8,
}
if hasattr(torch, "float4_e2m1fn_x2"):
    TORCH_DTYPE_TO_ELEM_DTYPE[torch.float4_e2m1fn_x2] = float4_e2m1

# Custom formats must keep every value, and every value times any E8M0 scale, exact in fp32:
# the smallest subnormal 2**(1 - bias - m) times 2**-127 must not fall below 2**-149, and the
# scaled values (below 2**(emax + 1)) and their grid spacings must stay normal fp32 numbers.
_MAX_CUSTOM_BIAS_PLUS_MANTISSA = 23
_MAX_CUSTOM_EMAX = 64


def _default_bias(exponent_bits: int) -> int:
    return max(1, 2 ** (exponent_bits - 1) - 1)


def ExMy(exponent_bits: int, mantissa_bits: int, *, bias: Optional[int] = None) -> DType:
    """A custom sign/exponent/mantissa minifloat of at most 8 bits with no NaN/Inf codes.

    The default bias is max(1, 2**(e-1) - 1), which reproduces the OCP fp6/fp4 formats and makes
    E1M2 the uniform grid 0, 0.25, ..., 1.75. Every code is finite; saturation clamps to all ones.
    """
    for arg, value in (("exponent_bits", exponent_bits), ("mantissa_bits", mantissa_bits)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"ExMy: {arg} must be an int, got {type(value).__name__}")
    if exponent_bits < 1 or mantissa_bits < 0 or 1 + exponent_bits + mantissa_bits > 8:
        raise ValueError(
            "ExMy: need exponent_bits >= 1, mantissa_bits >= 0 and 1 + exponent_bits + "
            f"mantissa_bits <= 8, got exponent_bits={exponent_bits}, mantissa_bits={mantissa_bits}"
        )
    default = _default_bias(exponent_bits)
    if bias is None:
        bias = default
    if not isinstance(bias, int) or isinstance(bias, bool):
        raise TypeError(f"ExMy: bias must be an int or None, got {type(bias).__name__}")
    if bias < 0 or bias + mantissa_bits > _MAX_CUSTOM_BIAS_PLUS_MANTISSA:
        raise ValueError(
            f"ExMy: bias must be in [0, {_MAX_CUSTOM_BIAS_PLUS_MANTISSA - mantissa_bits}] for "
            f"mantissa_bits={mantissa_bits} (so scaled values stay exact in fp32), got {bias}"
        )
    emax = 2**exponent_bits - 1 - bias
    if emax > _MAX_CUSTOM_EMAX:
        raise ValueError(
            f"ExMy: emax = 2**exponent_bits - 1 - bias must be <= {_MAX_CUSTOM_EMAX} (the E8M0 scale "
            f"already spans 2**-127..2**127), got {emax} for exponent_bits={exponent_bits}, bias={bias}"
        )
    name = f"e{exponent_bits}m{mantissa_bits}" + ("" if bias == default else f"_bias{bias}")
    return _float_format(name, exponent_bits, mantissa_bits, bias)


_CUSTOM_NAME = re.compile(r"e(\d)m(\d)(?:_bias(\d+))?")


def from_name(name: str) -> DType:
    """The format called `name`: a built-in OCP name, one of its `ALIASES` ("mxfp4",
    "float8_e4m3fn", ...) or a custom one such as "e1m2"."""
    if not isinstance(name, str):
        raise TypeError(f"elem_dtype name must be a str, got {type(name).__name__}")
    dtype = _BY_NAME.get(name)
    if dtype is not None:
        return dtype
    match = _CUSTOM_NAME.fullmatch(name)
    if match:
        e, m, bias = match.groups()
        dtype = ExMy(int(e), int(m), bias=None if bias is None else int(bias))
        if dtype.name == name:
            return dtype
    if name in _AMBIGUOUS:
        raise ValueError(f"elem_dtype {name!r} is ambiguous: {_AMBIGUOUS[name]}")
    raise ValueError(
        f"unknown elem_dtype {name!r}; allowed: {', '.join(STR_TO_SUPPORTED_ELEM_DTYPE)}, "
        f"their aliases {', '.join(ALIASES)} "
        "or a custom minifloat name 'e<E>m<M>[_bias<B>]' (see torchmx.dtypes.ExMy)"
    )


def resolve(elem_dtype: Union[DType, str, torch.dtype]) -> DType:
    """Accept a DType, its name (or alias) or a torch dtype wherever a format is asked for."""
    if isinstance(elem_dtype, DType):
        return elem_dtype
    if isinstance(elem_dtype, str):
        return from_name(elem_dtype)
    if isinstance(elem_dtype, torch.dtype):
        dtype = TORCH_DTYPE_TO_ELEM_DTYPE.get(elem_dtype)
        if dtype is None:
            raise ValueError(f"elem_dtype {elem_dtype} is not an MX element format; allowed torch "
                             f"dtypes: {', '.join(map(str, TORCH_DTYPE_TO_ELEM_DTYPE))}, or a "
                             "format name")
        return dtype
    raise TypeError(
        "elem_dtype must be a torchmx.dtypes.DType or its name (or a torch dtype such as "
        f"torch.float8_e4m3fn), got {type(elem_dtype).__name__}"
    )

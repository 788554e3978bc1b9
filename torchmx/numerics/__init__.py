"""Reference numerics: the bit-exact contract of DESIGN.md section 2 in plain PyTorch."""

from .elements import decode, encode
from .packing import pack_codes, packed_length, unpack_codes
from .reference import dequantize_mx_reference, quantize_mx_reference
from .rounding import ROUNDING_MODES
from .scale import SCALE_MODES

__all__ = [
    "ROUNDING_MODES",
    "SCALE_MODES",
    "decode",
    "dequantize_mx_reference",
    "encode",
    "pack_codes",
    "packed_length",
    "quantize_mx_reference",
    "unpack_codes",
]

"""Reference numerics: the bit-exact contract of docs/numerics.md in plain PyTorch."""

from .elements import decode, encode
from .packing import pack_codes, packed_length, unpack_codes
from .reference import dequantize_mx_reference, quantize_mx_reference
from .modes import ROUNDING_MODES, SCALE_MODES, Rounding, ScaleMode

__all__ = [
    "ROUNDING_MODES",
    "Rounding",
    "SCALE_MODES",
    "ScaleMode",
    "decode",
    "dequantize_mx_reference",
    "encode",
    "pack_codes",
    "packed_length",
    "quantize_mx_reference",
    "unpack_codes",
]

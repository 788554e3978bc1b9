"""Packing element codes into bytes along the last axis (callers move the block axis there).

fp4: two codes per byte, element 2i in the LOW nibble (as torch.float4_e2m1fn_x2, Triton,
cuBLAS and aiter). fp6: four codes in three bytes, the little-endian bitstream
w = c0 | c1 << 6 | c2 << 12 | c3 << 18 stored as w, w >> 8, w >> 16. Every other width: one
byte per code (in its low bits; quantize writes the bits above as zero, dequantize ignores
them). The missing codes of a partial last group are zero.
"""

import torch
import torch.nn.functional as F

from .. import dtypes


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -x.shape[-1] % multiple
    return F.pad(x, (0, extra)) if extra else x


def packed_length(n: int, elem_dtype: dtypes.DType) -> int:
    """Bytes along the block axis that hold n codes."""
    groups = -(-n // elem_dtype.codes_per_group)
    return groups * elem_dtype.bytes_per_group


def pack_codes(codes: torch.Tensor, elem_dtype: dtypes.DType) -> torch.Tensor:
    """int32 codes [..., n] -> packed bytes [..., packed_length(n)] of elem_dtype.storage_dtype."""
    bits = elem_dtype.bits
    if elem_dtype.codes_per_group == 1:
        return codes.to(elem_dtype.storage_dtype)
    codes = _pad_last(codes, elem_dtype.codes_per_group)
    groups = codes.unflatten(-1, (-1, elem_dtype.codes_per_group))
    word = torch.zeros_like(groups[..., 0])
    for i in range(elem_dtype.codes_per_group):
        word = word | (groups[..., i] << (bits * i))
    packed = torch.stack([(word >> (8 * i)) & 0xFF for i in range(elem_dtype.bytes_per_group)], -1)
    return packed.flatten(-2).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, elem_dtype: dtypes.DType, n: int) -> torch.Tensor:
    """Packed bytes [..., L] -> int32 codes [..., n] (two's complement codes keep their sign).

    A byte holding one code of a narrower format (custom widths 2, 3, 5, 7) keeps its code in
    the low `bits` bits: the bits above are ignored, on every backend."""
    if elem_dtype.codes_per_group == 1:
        codes = packed.to(torch.int32)[..., :n]
        return codes if elem_dtype.bits == 8 else codes & ((1 << elem_dtype.bits) - 1)
    groups = packed.to(torch.int32).unflatten(-1, (-1, elem_dtype.bytes_per_group))
    word = torch.zeros_like(groups[..., 0])
    for i in range(elem_dtype.bytes_per_group):
        word = word | (groups[..., i] << (8 * i))
    mask = (1 << elem_dtype.bits) - 1
    codes = torch.stack([(word >> (elem_dtype.bits * i)) & mask
                         for i in range(elem_dtype.codes_per_group)], -1)
    return codes.flatten(-2)[..., :n]

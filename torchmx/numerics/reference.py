"""The reference MX quantize / dequantize: the numerics contract in plain PyTorch.

Every backend (compiled CPU, Triton) must equal these functions bit for bit. The steps:
move the block axis last, zero-pad it to whole blocks, take each block's exact amax, pick the
E8M0 scale (scale.py), divide exactly by it, encode each element (elements.py) and pack the
codes (packing.py). Dequantize is decode(code) * 2**(b - 127) in fp32, then one rounding.
"""

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from .. import dtypes
from . import arguments as args
from .elements import decode, encode
from .packing import pack_codes, packed_length, unpack_codes
from .rounding import seed_key, uniform_from_index
from .scale import scale_value, shared_scale_byte


def effective_block_size(block_size: int, n: int) -> int:
    """The block size that gives the same blocks along an axis of n elements with padding only
    up to the next block: a block longer than the axis is one block of n elements (so a huge
    block_size costs no memory). At least 1, for an empty axis."""
    return max(1, min(block_size, n))


def block_last(x: torch.Tensor, axis: int) -> torch.Tensor:
    """View x with its block axis last (a 0-d tensor counts as a 1-element vector)."""
    return x.reshape(1) if x.dim() == 0 else x.movedim(axis, -1)


def quantize_blocks(
    x: torch.Tensor,
    elem_dtype: dtypes.DType,
    block_size: int,
    scale_mode: str,
    rounding: str,
    index: Optional[torch.Tensor] = None,
    key: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize along the last axis: x [..., n] -> (scale bytes [..., ceil(n / B)], codes [..., n]).

    `index` (same shape as x) holds each element's logical index, the counter of its stochastic
    rounding random number; `key` comes from the seed.
    """
    n = x.shape[-1]
    block_size = effective_block_size(block_size, n)
    padding = -n % block_size
    blocks = F.pad(x.float(), (0, padding)).unflatten(-1, (-1, block_size))
    amax = blocks.abs().amax(-1)  # exact; NaN propagates
    scale_byte = shared_scale_byte(amax, elem_dtype, scale_mode)
    finite_block = (scale_byte != dtypes.E8M0_EXPONENT_NAN_VAL).unsqueeze(-1)
    y = blocks / scale_value(scale_byte).unsqueeze(-1)  # exact: a division by a power of two
    y = torch.where(finite_block, y, 0.0)  # elements of a NaN-scale block are stored as code 0
    uniform = None
    if rounding == "stochastic":
        uniform = uniform_from_index(key, F.pad(index, (0, padding)).unflatten(-1, (-1, block_size)))
    codes = encode(y, elem_dtype, rounding, uniform)
    return scale_byte, codes.flatten(-2)[..., :n]


def quantize_mx_reference(
    data_hp: torch.Tensor,
    elem_dtype: Union[dtypes.DType, str],
    block_size: int = 32,
    *,
    scale_mode: str = "floor",
    rounding: str = "even",
    block_dim: int = -1,
    seed: Union[int, torch.Generator, None] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize `data_hp` to MX: returns (scale_u8, packed data).

    scale_u8 has data_hp's shape with the block axis reduced to ceil(n / block_size); the data
    holds the packed codes along the block axis (see packing.py). A 0-d input is treated as a
    1-element vector. `seed` (int or torch.Generator) makes stochastic rounding reproducible.
    """
    elem_dtype = args.check_elem_dtype(elem_dtype)
    args.check_high_precision_input(data_hp)
    args.check_block_size(block_size)
    args.check_scale_mode(scale_mode)
    args.check_rounding(rounding)
    axis = args.normalize_block_dim(block_dim, data_hp.dim())
    seed = args.resolve_seed(seed, rounding)

    x = block_last(data_hp, axis)
    index = None
    if rounding == "stochastic":
        index = block_last(torch.arange(data_hp.numel(), device=data_hp.device).view(data_hp.shape), axis)
    scale, codes = quantize_blocks(
        x, elem_dtype, block_size, scale_mode, rounding, index, seed_key(seed or 0)
    )
    data = pack_codes(codes, elem_dtype)
    return scale.movedim(-1, axis).contiguous(), data.movedim(-1, axis).contiguous()


def check_dequantize_arguments(data_lp, scale_u8, elem_dtype, block_size, target_dtype, block_dim,
                               block_dim_size) -> Tuple[dtypes.DType, int, int]:
    """Validate dequantize's arguments; returns (format, block axis, elements along it)."""
    elem_dtype = args.check_elem_dtype(elem_dtype)
    args.check_tensor(data_lp, "data_lp")
    args.check_tensor(scale_u8, "shared_exp_e8m0")
    args.check_same_device(data_lp, "data_lp", scale_u8, "shared_exp_e8m0")
    args.check_block_size(block_size)
    args.check_target_dtype(target_dtype)
    allowed = (torch.uint8, torch.int8) if elem_dtype.kind == "int" else (torch.uint8,)
    if data_lp.dtype not in allowed:
        raise TypeError(f"data_lp of {elem_dtype.name} must have dtype {args._names(allowed)}, got {data_lp.dtype}")
    if scale_u8.dtype != torch.uint8:
        raise TypeError(f"shared_exp_e8m0 must have dtype torch.uint8, got {scale_u8.dtype}")
    if data_lp.dim() != scale_u8.dim() or data_lp.dim() == 0:
        raise ValueError(
            f"data_lp and shared_exp_e8m0 must have the same number (>= 1) of dims, got shapes "
            f"{tuple(data_lp.shape)} and {tuple(scale_u8.shape)}"
        )
    axis = args.normalize_block_dim(block_dim, data_lp.dim())
    length = data_lp.shape[axis]
    group, group_bytes = elem_dtype.codes_per_group, elem_dtype.bytes_per_group
    if block_dim_size is None:
        if length % group_bytes:
            raise ValueError(f"data_lp has {length} bytes along block_dim {block_dim}, not whole "
                             f"{group_bytes}-byte groups of {elem_dtype.name}")
        block_dim_size = length // group_bytes * group
    elif not args.is_int(block_dim_size) or block_dim_size < 0:
        raise ValueError(f"block_dim_size must be None or an int >= 0, got {block_dim_size!r}")
    expected_data = list(scale_u8.shape)
    expected_data[axis] = packed_length(block_dim_size, elem_dtype)
    expected_scale = list(data_lp.shape)
    expected_scale[axis] = -(-block_dim_size // block_size)
    if list(data_lp.shape) != expected_data or list(scale_u8.shape) != expected_scale:
        raise ValueError(
            f"shapes do not match: data_lp {tuple(data_lp.shape)} and shared_exp_e8m0 "
            f"{tuple(scale_u8.shape)} cannot hold {block_dim_size} {elem_dtype.name} elements in "
            f"blocks of {block_size} along block_dim {block_dim}"
        )
    return elem_dtype, axis, block_dim_size


# The one NaN every backend writes (positive, quiet): torch's own float-to-bf16/fp16 NaN
# conversion differs between CPU and CUDA, so NaN bits are set explicitly.
CANONICAL_NAN_BITS = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def round_to_target(values: torch.Tensor, target_dtype: torch.dtype) -> torch.Tensor:
    """One rounding of exact fp32 values to target_dtype; every NaN becomes the canonical NaN."""
    out = values.to(target_dtype)
    bits_dtype = torch.int32 if target_dtype == torch.float32 else torch.int16
    canonical = torch.tensor(CANONICAL_NAN_BITS[target_dtype], dtype=bits_dtype).view(target_dtype)
    return torch.where(torch.isnan(out), canonical.to(out.device), out)


def dequantize_blocks(data: torch.Tensor, scale: torch.Tensor, elem_dtype: dtypes.DType,
                      block_size: int, n: int, target_dtype: torch.dtype) -> torch.Tensor:
    """Dequantize along the last axis: packed data [..., L], scale [..., ceil(n / B)] -> [..., n]."""
    if elem_dtype.kind == "int":
        data = data.view(torch.int8)
    values = decode(unpack_codes(data, elem_dtype, n), elem_dtype)
    scales = scale_value(scale).repeat_interleave(effective_block_size(block_size, n), -1)[..., :n]
    return round_to_target(values * scales, target_dtype)  # exact fp32 product, one rounding


def dequantize_mx_reference(
    data_lp: torch.Tensor,
    scale_u8: torch.Tensor,
    elem_dtype: Union[dtypes.DType, str],
    block_size: int,
    target_dtype: torch.dtype = torch.float32,
    block_dim: int = -1,
    *,
    block_dim_size: Optional[int] = None,
) -> torch.Tensor:
    """Dequantize packed MX data to `target_dtype` (fp32, bf16 or fp16).

    `block_dim_size` is the number of elements along the block axis; by default the data is
    taken to hold whole packing groups (it matters for fp4 and fp6 only).
    """
    elem_dtype, axis, n = check_dequantize_arguments(
        data_lp, scale_u8, elem_dtype, block_size, target_dtype, block_dim, block_dim_size)
    out = dequantize_blocks(data_lp.movedim(axis, -1), scale_u8.movedim(axis, -1), elem_dtype,
                            block_size, n, target_dtype)
    return out.movedim(-1, axis).contiguous()

"""Block placement: pure arithmetic on shapes and strides (no MX values are read).

An MXTensor of logical shape S with blocks along `axis` stores a uint8 scale of shape S with
S[axis] reduced to ceil(n / block_size) and packed data with S[axis] reduced to
packed_length(n) bytes (a 0-d tensor is stored as one element). A rearrangement keeps MX
storage when every block of the result is a block (or the leading part of the last block) of
the input; the functions here say when that holds. Errors for bad arguments are torch's own
(type and message), so an MXTensor fails exactly like a plain tensor.
"""

import math
from typing import List, Optional, Sequence, Tuple

import torch
from torch._prims_common import canonicalize_dim, infer_size

from .. import dtypes
from ..numerics.packing import packed_length

__all__ = [
    "ceil_div", "normalize_dim", "stored_shape", "storage_shapes", "aligned", "view_block_dim",
    "infer_size", "expanded_size", "clamp_range", "split_lengths", "check_slice_step",
    "storage_order",
    "outer_strides",
]


def ceil_div(a, b):
    return -(-a // b)


def normalize_dim(dim: int, ndim: int) -> int:
    """`dim` wrapped into [0, ndim) (a 0-d tensor has one wrappable dim, as in torch); out of
    range raises torch's IndexError("Dimension out of range ...")."""
    return canonicalize_dim(ndim, dim)


def stored_shape(shape: Sequence[int]) -> List[int]:
    """The logical shape the storage uses: a 0-d tensor is stored as (1,)."""
    return list(shape) if len(shape) else [1]


def storage_shapes(shape: Sequence[int], axis: int, elem_dtype: dtypes.DType,
                   block_size: int) -> Tuple[List[int], List[int]]:
    """(data shape, scale shape) of an MX tensor of logical `shape` with blocks along `axis`."""
    data_shape, scale_shape = stored_shape(shape), stored_shape(shape)
    n = data_shape[axis]
    data_shape[axis] = packed_length(n, elem_dtype)
    scale_shape[axis] = ceil_div(n, block_size)
    return data_shape, scale_shape


def aligned(index, elem_dtype: dtypes.DType, block_size: int) -> bool:
    """True when `index` along the block axis starts a block and a packing group."""
    return index % block_size == 0 and index % elem_dtype.codes_per_group == 0


def view_block_dim(shape: Sequence[int], axis: int, new_shape: Sequence[int],
                   elem_dtype: dtypes.DType, block_size: int) -> Optional[int]:
    """Where the block axis lands when a tensor of `shape` (blocks along `axis`) is viewed as
    `new_shape`, or None when the blocks cannot follow.

    The elements after the block axis must keep their count (a suffix of new_shape whose
    product equals that of the old suffix). The block axis then keeps its length n, or, when
    n and its new length are whole blocks and whole packing groups, merges with or splits off
    outer dims (blocks stay aligned in the flattened index).
    """
    old, new = stored_shape(shape), stored_shape(new_shape)
    n, inner = old[axis], math.prod(old[axis + 1:])
    candidates, suffix = [], 1
    for d in reversed(range(len(new))):
        if suffix == inner:
            candidates.append(d)
        suffix = suffix * new[d]
    for d in candidates:
        if new[d] == n:
            return d
    if aligned(n, elem_dtype, block_size):
        for d in candidates:
            if aligned(new[d], elem_dtype, block_size):
                return d
    return None


def clamp_range(start, end, size):
    """A slice's [start, end) clamped into [0, size], as torch's slice does."""
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start, end = min(max(start, 0), size), min(max(end, 0), size)
    return start, max(end, start)


def check_slice_step(step) -> None:
    if step <= 0:
        raise RuntimeError("slice step must be positive")


def split_lengths(size, split_size=None, split_sizes=None, dim=0) -> List[int]:
    """The piece lengths of split(split_size) or split_with_sizes(split_sizes) along a dim of
    length `size`, with torch's errors."""
    if split_sizes is not None:
        lengths = list(split_sizes)
        if any(n < 0 for n in lengths):
            raise RuntimeError(f"split_with_sizes expects split_sizes have only non-negative "
                               f"entries, but got split_sizes={lengths}")
        if sum(lengths) != size:
            raise RuntimeError(
                f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's "
                f"size at dimension {dim}), but got split_sizes={lengths}")
        return lengths
    if split_size < 0:
        raise RuntimeError(f"split expects split_size be non-negative, but got "
                           f"split_size={split_size}")
    if split_size == 0:
        if size != 0:
            raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got "
                               f"dimension size of {size}")
        return [0]
    return [min(split_size, size - s) for s in range(0, size, split_size)] or [0]


def expanded_size(shape: Sequence[int], size: Sequence[int]) -> List[int]:
    """The target size of expand(size) on a tensor of `shape`, -1 resolved, with torch's
    errors."""
    size, ndim = list(size), len(shape)
    if len(size) < ndim:
        raise RuntimeError(f"expand(MXTensor{{{list(shape)}}}, size={size}): the number of sizes "
                           f"provided ({len(size)}) must be greater or equal to the number of "
                           f"dimensions in the tensor ({ndim})")
    lead = len(size) - ndim
    for j, s in enumerate(size[:lead]):
        if s < 0:
            raise RuntimeError(f"The expanded size of the tensor ({s}) isn't allowed in a "
                               f"leading, non-existing dimension {j}")
    target = list(size)
    for i, old in enumerate(shape):
        s = size[lead + i]
        if s == -1:
            target[lead + i] = old
        elif old != 1 and s != old:
            raise RuntimeError(
                f"The expanded size of the tensor ({s}) must match the existing size ({old}) "
                f"at non-singleton dimension {lead + i}.  Target sizes: {size}.  Tensor sizes: "
                f"{list(shape)}")
    return target


def storage_order(t: torch.Tensor) -> List[int]:
    """t's dims from outermost to innermost in memory (ties keep the logical order)."""
    if t.is_contiguous():
        return list(range(t.dim()))
    return sorted(range(t.dim()), key=lambda d: -t.stride(d))


def outer_strides(data: torch.Tensor, shape: Sequence[int], axis: int,
                  elem_dtype: dtypes.DType) -> List[int]:
    """Strides of the logical tensor, in elements, that describe the storage like a plain
    tensor's strides would: dims ordered in memory like `data`'s (a transposed MXTensor
    reports transposed strides), broadcast dims (stride 0 in `data`) stride 0, and a gap where
    `data` has one (a strided slice is not contiguous, as for a plain tensor; .contiguous()
    then compacts it). Along the block axis one byte holds codes_per_group / bytes_per_group
    codes.
    """
    if len(shape) == 0:
        return []
    strides, running = [0] * len(shape), 1
    dense = data.is_contiguous() or data.numel() == 0
    real = [d for d in reversed(storage_order(data))  # innermost first, broadcast dims left out
            if not (data.stride(d) == 0 and data.size(d) != 1)]
    for i, d in enumerate(real):
        strides[d] = running
        extent = shape[d]
        outer = next((e for e in real[i + 1:] if data.size(e) > 1), None)
        if not dense and outer is not None and data.size(d) > 1:
            step, span = data.stride(outer), data.stride(d) * data.size(d)
            if step > span:  # a gap between consecutive steps of the outer dim
                codes, nbytes = ((elem_dtype.codes_per_group, elem_dtype.bytes_per_group)
                                 if d == axis else (1, 1))
                extent = max(extent, ceil_div(step * codes, data.stride(d) * nbytes))
        running = running * extent
    return strides

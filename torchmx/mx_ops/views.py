"""Views and indexing: the scale bytes and packed codes are rearranged, never requantized; the
block axis follows the data. A rearrangement that would cut a block or a packing group runs on
the dequantized tensor instead (plain result). Bad arguments raise torch's own errors.
"""

from typing import List, Optional

import torch

from ..mx_tensor import MIXED_SCALE_MODES, MXTensor
from ..numerics.packing import packed_length
from . import layout
from ._registry import implements
from ._util import bind, mx_or_dequantized, run_dequantized, same_format

aten = torch.ops.aten


def _aligned(index, t: MXTensor) -> bool:
    return layout.aligned(index, t.elem_dtype, t.block_size)


# ------------------------------------------------------------------------------ reshapes

def reshaped(t: MXTensor, new_shape) -> Optional[MXTensor]:
    """`t` with logical shape new_shape (same numel) as an MXTensor, or None."""
    new_shape = list(new_shape)
    if t.numel() == 0:  # nothing to keep: fresh empty storage, blocks along the last dim
        axis = max(len(new_shape) - 1, 0)
        data_shape, scale_shape = layout.storage_shapes(new_shape, axis, t.elem_dtype,
                                                        t.block_size)
        return t._replace(t._scale_e8m0.new_empty(scale_shape), t._data.new_empty(data_shape),
                          block_dim=axis, shape=new_shape)
    axis = layout.view_block_dim(t.shape, t.block_dim, new_shape, t.elem_dtype, t.block_size)
    if axis is None:
        return None
    data_shape, scale_shape = layout.storage_shapes(new_shape, axis, t.elem_dtype, t.block_size)
    # reshape: a view of the storage where its layout allows, else a copy (never a requantization)
    return t._replace(t._scale_e8m0.reshape(scale_shape), t._data.reshape(data_shape),
                      block_dim=axis, shape=new_shape)


@implements(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
            aten._reshape_alias.default)
def _view(func, args, kwargs):
    t = args[0]
    size = layout.infer_size(args[1], t.numel())
    return mx_or_dequantized(reshaped(t, size), func, args, kwargs)


@implements(aten.view.dtype)
def _view_dtype(func, args, kwargs):
    """Bit reinterpretation applies to the logical (dequantized) tensor."""
    return run_dequantized(func, args, kwargs)


@implements(aten.unsqueeze.default)
def _unsqueeze(func, args, kwargs):
    t = args[0]
    shape = list(t.shape)
    shape.insert(layout.normalize_dim(args[1], t.dim() + 1), 1)
    return mx_or_dequantized(reshaped(t, shape), func, args, kwargs)


@implements(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(func, args, kwargs):
    t = args[0]
    if len(args) < 2:
        dims = range(t.dim())
    else:
        dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
    drop = {layout.normalize_dim(d, t.dim()) for d in dims}
    shape = [s for i, s in enumerate(t.shape) if not (i in drop and s == 1)]
    return mx_or_dequantized(reshaped(t, shape), func, args, kwargs)


# ------------------------------------------------------------------------------ permutations

def permuted(t: MXTensor, dims: List[int]) -> MXTensor:
    """t.permute(dims) (dims already valid and non-negative)."""
    if t.dim() == 0:
        return t._replace(t._scale_e8m0.view_as(t._scale_e8m0), t._data.view_as(t._data))
    return t._replace(t._scale_e8m0.permute(dims), t._data.permute(dims),
                      block_dim=dims.index(t.block_dim), shape=[t.shape[d] for d in dims])


@implements(aten.permute.default)
def _permute(func, args, kwargs):
    t = args[0]
    dims = [layout.normalize_dim(d, t.dim()) for d in args[1]]
    if len(dims) != t.dim() or len(set(dims)) != len(dims):
        return run_dequantized(func, args, kwargs)  # torch's own error
    return permuted(t, dims)


@implements(aten.transpose.int)
def _transpose(func, args, kwargs):
    t = args[0]
    a, b = layout.normalize_dim(args[1], t.dim()), layout.normalize_dim(args[2], t.dim())
    dims = list(range(t.dim()))
    if t.dim():
        dims[a], dims[b] = dims[b], dims[a]
    return permuted(t, dims)


@implements(aten.t.default)
def _t(func, args, kwargs):
    t = args[0]
    if t.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {t.dim()}D")
    return permuted(t, list(range(t.dim()))[::-1])


@implements(aten.expand.default)
def _expand(func, args, kwargs):
    """Broadcast dims need no new storage. Expanding the block axis itself (from length 1)
    is exact for one-byte formats (every block repeats the one scale and code); packed
    formats dequantize."""
    t = args[0]
    size = layout.expanded_size(t.shape, args[1])
    if t.dim() == 0:
        if not size:
            return permuted(t, [])
        t = reshaped(t, [1])
    axis = t.block_dim + len(size) - t.dim()
    if size[axis] != t.shape[t.block_dim] and t.elem_dtype.codes_per_group != 1:
        return run_dequantized(func, args, kwargs)
    data_size, scale_size = layout.storage_shapes(size, axis, t.elem_dtype, t.block_size)
    return t._replace(t._scale_e8m0.expand(scale_size), t._data.expand(data_size),
                      block_dim=axis, shape=size)


# ------------------------------------------------------------------------------ indexing

def sliced(t: MXTensor, dim: int, start, end, step=1) -> Optional[MXTensor]:
    """t[dim, start:end:step] (dim valid and non-negative, step > 0) as an MXTensor, or None
    when it would cut a block."""
    size = t.shape[dim]
    start, end = layout.clamp_range(start, end, size)
    shape = list(t.shape)
    shape[dim] = layout.ceil_div(end - start, step)
    if dim != t.block_dim:
        return t._replace(aten.slice.Tensor(t._scale_e8m0, dim, start, end, step),
                          aten.slice.Tensor(t._data, dim, start, end, step), shape=shape)
    if step != 1 or not _aligned(start, t) or not (_aligned(end, t) or end == size):
        return None
    data = aten.slice.Tensor(t._data, dim, packed_length(start, t.elem_dtype),
                             packed_length(end, t.elem_dtype))
    scale = aten.slice.Tensor(t._scale_e8m0, dim, start // t.block_size,
                              layout.ceil_div(end, t.block_size))
    return t._replace(scale, data, shape=shape)


@implements(aten.slice.Tensor)
def _slice(func, args, kwargs):
    v = bind(func, args, kwargs)
    t = v["self"]
    dim = layout.normalize_dim(v["dim"], t.dim())
    layout.check_slice_step(v["step"])
    out = None if t.dim() == 0 else sliced(t, dim, v["start"], v["end"], v["step"])
    return mx_or_dequantized(out, func, args, kwargs)


def selected(t: MXTensor, dim: int, index) -> Optional[MXTensor]:
    """t.select(dim, index) (dim valid and non-negative) as an MXTensor, or None when dim is
    the block axis."""
    if t.dim() == 0 or dim == t.block_dim:
        return None
    if not -t.shape[dim] <= index < t.shape[dim]:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(t.shape)} at dimension {dim}")
    shape = [s for i, s in enumerate(t.shape) if i != dim]
    return t._replace(t._scale_e8m0.select(dim, index), t._data.select(dim, index),
                      block_dim=t.block_dim - (dim < t.block_dim), shape=shape)


@implements(aten.select.int)
def _select(func, args, kwargs):
    t = args[0]
    out = selected(t, layout.normalize_dim(args[1], t.dim()), args[2])
    return mx_or_dequantized(out, func, args, kwargs)


@implements(aten.index_select.default)
def _index_select(func, args, kwargs):
    v = bind(func, args, kwargs)
    t, index = v["self"], v["index"]
    if not isinstance(t, MXTensor) or t.dim() == 0:
        return run_dequantized(func, args, kwargs)
    dim = layout.normalize_dim(v["dim"], t.dim())
    if dim == t.block_dim:
        return run_dequantized(func, args, kwargs)
    shape = list(t.shape)
    shape[dim] = index.numel()
    return t._replace(func(t._scale_e8m0, dim, index), func(t._data, dim, index), shape=shape)


def _pieces(func, args, kwargs, pieces):
    """The pieces if every one could stay MX, else func on the dequantized tensor."""
    complete = not any(p is None for p in pieces)
    return mx_or_dequantized(pieces if complete else None, func, args, kwargs)


@implements(aten.split.Tensor, aten.split_with_sizes.default)
def _split(func, args, kwargs):
    v = bind(func, args, kwargs)
    t = v["self"]
    dim = layout.normalize_dim(v["dim"], t.dim())
    if t.dim() == 0:
        return run_dequantized(func, args, kwargs)
    lengths = layout.split_lengths(t.shape[dim], v.get("split_size"), v.get("split_sizes"), dim)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return _pieces(func, args, kwargs, [sliced(t, dim, s, s + n) for s, n in zip(starts, lengths)])


@implements(aten.unbind.int)
def _unbind(func, args, kwargs):
    v = bind(func, args, kwargs)
    t = v["self"]
    dim = layout.normalize_dim(v["dim"], t.dim())
    if t.dim() == 0:
        return run_dequantized(func, args, kwargs)
    return _pieces(func, args, kwargs, [selected(t, dim, i) for i in range(t.shape[dim])])


def concatenated(tensors, dim) -> Optional[MXTensor]:
    """torch.cat of MXTensors as an MXTensor, or None: every tensor must share format, block
    size, block dim, logical dtype and its other dims, and along the block axis every tensor
    but the last must end on a block and packing-group boundary."""
    first = tensors[0]
    if not all(isinstance(t, MXTensor) for t in tensors) or first.dim() == 0:
        return None
    dim = layout.normalize_dim(dim, first.dim())
    for t in tensors:
        same = (same_format(t, first) and t.dtype == first.dtype and t.dim() == first.dim()
                and all(t.shape[i] == first.shape[i] for i in range(t.dim()) if i != dim))
        if not same:
            return None
    if dim == first.block_dim and not all(_aligned(t.shape[dim], t) for t in tensors[:-1]):
        return None
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    modes = {t.scale_mode for t in tensors}
    return first._replace(torch.cat([t._scale_e8m0 for t in tensors], dim),
                          torch.cat([t._data for t in tensors], dim), shape=shape,
                          scale_mode=modes.pop() if len(modes) == 1 else MIXED_SCALE_MODES)


@implements(aten.cat.default)
def _cat(func, args, kwargs):
    v = bind(func, args, kwargs)
    return mx_or_dequantized(concatenated(list(v["tensors"]), v["dim"]), func, args, kwargs)


@implements(aten.stack.default)
def _stack(func, args, kwargs):
    v = bind(func, args, kwargs)
    tensors = list(v["tensors"])
    if tensors and all(isinstance(t, MXTensor) for t in tensors):
        dim = layout.normalize_dim(v["dim"], tensors[0].dim() + 1)
        expanded = []
        for t in tensors:
            shape = list(t.shape)
            shape.insert(dim, 1)
            expanded.append(reshaped(t, shape))
        if all(e is not None for e in expanded):
            out = concatenated(expanded, dim)
            if out is not None:
                return out
    return run_dequantized(func, args, kwargs)

"""The op table of MXTensor: which aten ops keep MX storage, and the policy for every other op.

1. Storage ops (detach, clone, `.to`, pin_memory, copy_, *_like): exact by construction.
2. Views and indexing (view/reshape/flatten/unflatten, t/transpose/permute, expand,
   (un)squeeze, slice/narrow/select/index_select/split/unbind, cat/stack) move the scale bytes
   and packed codes without requantizing; the block axis follows the data. A rearrangement that
   would cut a block or a packing group dequantizes instead (plain result; docs/mx_tensor.md).
3. Matmuls (mm, bmm, addmm, baddbmm, mv, dot, addmv, linear, matmul): the exact dequantized
   operands in fp32, fp32 accumulation, one rounding to the logical dtype. An MX operand whose
   blocks do not run along the reduction dim warns once (MXLayoutWarning), or raises
   ValueError under `strict_matmul()`.
4. Any other op on the allow-list runs on the dequantized tensors (each MX argument rounded to
   its logical dtype) and returns plain tensors. Any op off the list raises TypeError; every op
   that would write into an MXTensor raises ValueError (except copy_ from an identical layout).
"""

import contextlib
import math
import warnings

import torch
from torch.utils._pytree import tree_map_only

from .mx_tensor import MIXED_SCALE_MODES, MXTensor, _stored_shape, dequantize, implements
from .numerics.arguments import HIGH_PRECISION_DTYPES
from .numerics.packing import packed_length

__all__ = [
    "MXLayoutWarning",
    "set_strict_matmul",
    "strict_matmul",
    "allow_dequantize_fallback",
    "DEQUANTIZE_FALLBACK_OPS",
    "dequantize_fallback",
]

aten = torch.ops.aten


# ------------------------------------------------------------------------------ helpers

def _bind(func, args, kwargs) -> dict:
    """The op's arguments by schema name, defaults filled in."""
    values = {}
    for i, argument in enumerate(func._schema.arguments):
        if i < len(args):
            values[argument.name] = args[i]
        elif argument.name in kwargs:
            values[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = argument.default_value
    return values


def _dim(dim, ndim) -> int:
    return dim % max(ndim, 1)


def _aligned(index, tensor: MXTensor) -> bool:
    """True when `index` along the block axis starts a block and a packing group."""
    return index % tensor._block_size == 0 and index % tensor._elem_dtype.codes_per_group == 0


def _logical(x):
    return dequantize(x, x.dtype) if isinstance(x, MXTensor) else x


def _run_dequantized(func, args, kwargs):
    """Run `func` with every MXTensor argument dequantized to its logical dtype."""
    args, kwargs = tree_map_only(MXTensor, _logical, (args, kwargs))
    return func(*args, **kwargs)


def _mx_or_dequantized(out, func, args, kwargs):
    """`out` when the op could keep MX storage (not None), else the op on dequantized tensors."""
    return _run_dequantized(func, args, kwargs) if out is None else out


# ------------------------------------------------------------------------------ storage ops

@implements(aten.detach.default, aten.alias.default)
def _alias(func, args, kwargs):
    t = args[0]
    return t._replace(func(t._scale_e8m0), func(t._data))


@implements(aten.clone.default)
def _clone(func, args, kwargs):
    t, memory_format = args[0], kwargs.get("memory_format")
    if t.dim() == 0:
        memory_format = None
    return t._replace(t._scale_e8m0.clone(memory_format=memory_format),
                      t._data.clone(memory_format=memory_format))


@implements(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    """`.to(device)` moves the storage; `.to(dtype)` relabels the logical dtype (fp32, bf16,
    fp16), which is exact: the MX values are exact in fp32. Any other dtype dequantizes."""
    t, dtype = args[0], kwargs.get("dtype")
    if dtype is not None and dtype not in HIGH_PRECISION_DTYPES:
        return func(dequantize(t, torch.float32), *args[1:], **kwargs)
    move = {k: v for k, v in kwargs.items() if k != "dtype"}
    if t.dim() == 0:
        move.pop("memory_format", None)
    return t._replace(func(t._scale_e8m0, **move), func(t._data, **move), orig_dtype=dtype)


@implements(aten._pin_memory.default)
def _pin_memory(func, args, kwargs):
    t = args[0]
    return t._replace(func(t._scale_e8m0, *args[1:], **kwargs), func(t._data, *args[1:], **kwargs))


@implements(aten.is_pinned.default)
def _is_pinned(func, args, kwargs):
    t = args[0]
    return func(t._data, *args[1:], **kwargs) and func(t._scale_e8m0, *args[1:], **kwargs)


def _same_layout(a: MXTensor, b: MXTensor) -> bool:
    return (a._elem_dtype == b._elem_dtype and a._block_size == b._block_size
            and a._block_dim == b._block_dim and a.shape == b.shape)


@implements(aten.copy_.default)
def _copy_(func, args, kwargs):
    """Into a plain tensor: the exact values, rounded once. Into an MXTensor: only from an
    MXTensor of the same format, block size, block dim and shape (anything else requantizes)."""
    dst, src = args[0], args[1]
    if not isinstance(dst, MXTensor):
        target = dst.dtype if dst.dtype in HIGH_PRECISION_DTYPES else torch.float32
        return func(dst, dequantize(src, target), *args[2:], **kwargs)
    if not (isinstance(src, MXTensor) and _same_layout(dst, src)):
        raise TypeError(
            "copy_ into an MXTensor needs an MXTensor source with the same elem_dtype, "
            "block_size, block_dim and shape (anything else would requantize); got "
            f"{_describe(src)} into {_describe(dst)}")
    func(dst._data, src._data, *args[2:], **kwargs)
    func(dst._scale_e8m0, src._scale_e8m0, *args[2:], **kwargs)
    dst._scale_mode = src._scale_mode
    return dst


_LIKE_OPS = (aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like, aten.rand_like,
             aten.randn_like, aten.randint_like, aten.new_empty, aten.new_zeros, aten.new_ones,
             aten.new_full, aten.new_empty_strided)


@implements(*_LIKE_OPS)
def _like(func, args, kwargs):
    """*_like and new_* read only the logical metadata: they return plain tensors."""

    def placeholder(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    args, kwargs = tree_map_only(MXTensor, placeholder, (args, kwargs))
    return func(*args, **kwargs)


def _describe(x) -> str:
    if isinstance(x, MXTensor):
        return (f"MXTensor({x._elem_dtype.name}, block_size={x._block_size}, "
                f"block_dim={x._block_dim}, shape={tuple(x.shape)})")
    if isinstance(x, torch.Tensor):
        return f"Tensor(shape={tuple(x.shape)}, dtype={x.dtype})"
    return type(x).__name__


# ------------------------------------------------------------------------------ views

def _view_block_dim(t: MXTensor, new_shape):
    """Where the block axis lands when `t` is viewed with `new_shape`, or None when the blocks
    cannot follow (the view would mix elements of different blocks into one block).

    The elements after the block axis must keep their count (a suffix of new_shape whose
    product equals that of the old suffix). The block axis then keeps its length n, or, when
    n and its new length m are whole blocks and whole packing groups, merges with or splits
    off outer dims (blocks stay aligned in the flattened index).
    """
    old, axis = _stored_shape(t.shape), t._block_dim
    new = _stored_shape(new_shape)
    n, inner = old[axis], math.prod(old[axis + 1:])
    candidates, suffix = [], 1
    for d in reversed(range(len(new))):
        if suffix == inner:
            candidates.append(d)
        suffix = suffix * new[d]
    for d in candidates:
        if new[d] == n:
            return d
    if _aligned(n, t):
        for d in candidates:
            if _aligned(new[d], t):
                return d
    return None


def _reshaped(t: MXTensor, new_shape):
    """`t` with logical shape new_shape (same numel) as an MXTensor, or None."""
    new_shape = list(new_shape)
    if t.numel() == 0:  # nothing to keep: fresh empty storage, blocks along the last dim
        axis = max(len(new_shape) - 1, 0)
        data_shape, scale_shape = _stored_shape(new_shape), _stored_shape(new_shape)
        data_shape[axis] = packed_length(data_shape[axis], t._elem_dtype)
        scale_shape[axis] = -(-scale_shape[axis] // t._block_size)
        return t._replace(t._scale_e8m0.new_empty(scale_shape), t._data.new_empty(data_shape),
                          block_dim=axis, shape=new_shape)
    axis = _view_block_dim(t, new_shape)
    if axis is None:
        return None
    data_shape, scale_shape = _stored_shape(new_shape), _stored_shape(new_shape)
    m = data_shape[axis]
    data_shape[axis] = packed_length(m, t._elem_dtype)
    scale_shape[axis] = -(-m // t._block_size)
    # reshape: a view of the storage where its layout allows, else a copy (never a requantization)
    return t._replace(t._scale_e8m0.reshape(scale_shape), t._data.reshape(data_shape),
                      block_dim=axis, shape=new_shape)


def _infer_size(size, numel):
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = numel // known if known else 0
    return size


@implements(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
            aten._reshape_alias.default)
def _view(func, args, kwargs):
    t, size = args[0], _infer_size(args[1], args[0].numel())
    return _mx_or_dequantized(_reshaped(t, size), func, args, kwargs)


@implements(aten.view.dtype)
def _view_dtype(func, args, kwargs):
    """Bit reinterpretation applies to the logical (dequantized) tensor."""
    return _run_dequantized(func, args, kwargs)


@implements(aten.unsqueeze.default)
def _unsqueeze(func, args, kwargs):
    t, dim = args[0], args[1]
    shape = list(t.shape)
    shape.insert(dim % (t.dim() + 1), 1)
    return _mx_or_dequantized(_reshaped(t, shape), func, args, kwargs)


@implements(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(func, args, kwargs):
    t = args[0]
    if t.dim() == 0:
        dims = []
    elif len(args) < 2:
        dims = range(t.dim())
    else:
        dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
    drop = {_dim(d, t.dim()) for d in dims}
    shape = [s for i, s in enumerate(t.shape) if not (i in drop and s == 1)]
    return _mx_or_dequantized(_reshaped(t, shape), func, args, kwargs)


def _permuted(t: MXTensor, dims) -> MXTensor:
    if t.dim() == 0:
        return t._replace(t._scale_e8m0.view_as(t._scale_e8m0), t._data.view_as(t._data))
    dims = [_dim(d, t.dim()) for d in dims]
    shape = [t.shape[d] for d in dims]
    return t._replace(t._scale_e8m0.permute(dims), t._data.permute(dims),
                      block_dim=dims.index(t._block_dim), shape=shape)


@implements(aten.permute.default)
def _permute(func, args, kwargs):
    return _permuted(args[0], args[1])


@implements(aten.transpose.int)
def _transpose(func, args, kwargs):
    t = args[0]
    dims = list(range(t.dim()))
    if t.dim():
        a, b = _dim(args[1], t.dim()), _dim(args[2], t.dim())
        dims[a], dims[b] = dims[b], dims[a]
    return _permuted(t, dims)


@implements(aten.t.default)
def _t(func, args, kwargs):
    t = args[0]
    if t.dim() > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dims, got {t.dim()} dims")
    return _permuted(t, list(range(t.dim()))[::-1])


@implements(aten.expand.default)
def _expand(func, args, kwargs):
    """Broadcast dims need no new storage. Expanding the block axis itself (from length 1)
    is exact for one-byte formats (every block repeats the one scale and code); packed
    formats dequantize."""
    t, size = args[0], list(args[1])
    if t.dim() == 0:
        if not size:
            return _permuted(t, [])
        t = _reshaped(t, [1])
    lead = len(size) - t.dim()
    if lead < 0:
        return _run_dequantized(func, args, kwargs)  # torch's own error
    data_size, scale_size = list(size), list(size)
    for i in range(t.dim()):
        j = lead + i
        if size[j] == -1:
            size[j] = t.shape[i]
        if i != t._block_dim:
            data_size[j] = scale_size[j] = size[j]
        elif size[j] == t.shape[i]:
            data_size[j], scale_size[j] = t._data.shape[i], t._scale_e8m0.shape[i]
        elif t._elem_dtype.codes_per_group == 1 and t.shape[i] == 1:
            data_size[j], scale_size[j] = size[j], -(-size[j] // t._block_size)
        else:
            return _run_dequantized(func, args, kwargs)
    return t._replace(t._scale_e8m0.expand(scale_size), t._data.expand(data_size),
                      block_dim=t._block_dim + lead, shape=size)


# ------------------------------------------------------------------------------ indexing

def _clamp_range(start, end, size):
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start, end = min(max(start, 0), size), min(max(end, 0), size)
    return start, max(end, start)


def _sliced(t: MXTensor, dim, start, end, step=1):
    """t[dim, start:end:step] as an MXTensor, or None when it would cut a block."""
    if t.dim() == 0:
        return None
    dim = _dim(dim, t.dim())
    size = t.shape[dim]
    start, end = _clamp_range(start, end, size)
    shape = list(t.shape)
    shape[dim] = -(-(end - start) // step)
    if dim != t._block_dim:
        return t._replace(aten.slice.Tensor(t._scale_e8m0, dim, start, end, step),
                          aten.slice.Tensor(t._data, dim, start, end, step), shape=shape)
    if step != 1 or not _aligned(start, t) or not (_aligned(end, t) or end == size):
        return None
    fmt, block = t._elem_dtype, t._block_size
    data = aten.slice.Tensor(t._data, dim, packed_length(start, fmt), packed_length(end, fmt))
    scale = aten.slice.Tensor(t._scale_e8m0, dim, start // block, -(-end // block))
    return t._replace(scale, data, shape=shape)


@implements(aten.slice.Tensor)
def _slice(func, args, kwargs):
    v = _bind(func, args, kwargs)
    out = _sliced(v["self"], v["dim"], v["start"], v["end"], v["step"])
    return _mx_or_dequantized(out, func, args, kwargs)


def _selected(t: MXTensor, dim, index):
    """t.select(dim, index) as an MXTensor, or None when dim is the block axis."""
    if t.dim() == 0:
        return None
    dim = _dim(dim, t.dim())
    if dim == t._block_dim:
        return None
    shape = [s for i, s in enumerate(t.shape) if i != dim]
    return t._replace(t._scale_e8m0.select(dim, index), t._data.select(dim, index),
                      block_dim=t._block_dim - (dim < t._block_dim), shape=shape)


@implements(aten.select.int)
def _select(func, args, kwargs):
    return _mx_or_dequantized(_selected(args[0], args[1], args[2]), func, args, kwargs)


@implements(aten.index_select.default)
def _index_select(func, args, kwargs):
    v = _bind(func, args, kwargs)
    t, index = v["self"], v["index"]
    if not isinstance(t, MXTensor) or t.dim() == 0 or _dim(v["dim"], t.dim()) == t._block_dim:
        return _run_dequantized(func, args, kwargs)
    dim = _dim(v["dim"], t.dim())
    shape = list(t.shape)
    shape[dim] = index.numel()
    return t._replace(func(t._scale_e8m0, dim, index), func(t._data, dim, index), shape=shape)


def _pieces(func, args, kwargs, pieces):
    """The pieces if every one could stay MX, else func on the dequantized tensor."""
    complete = not any(p is None for p in pieces)
    return _mx_or_dequantized(pieces if complete else None, func, args, kwargs)


@implements(aten.split.Tensor, aten.split_with_sizes.default)
def _split(func, args, kwargs):
    v = _bind(func, args, kwargs)
    t = v["self"]
    if t.dim() == 0:
        return _run_dequantized(func, args, kwargs)
    dim = _dim(v["dim"], t.dim())
    size = t.shape[dim]
    if "split_sizes" in v:
        lengths = list(v["split_sizes"])
    else:
        step = v["split_size"]
        lengths = [min(step, size - s) for s in range(0, size, step)] if step else [size]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    pieces = [_sliced(t, dim, s, s + n) for s, n in zip(starts, lengths)]
    return _pieces(func, args, kwargs, pieces)


@implements(aten.unbind.int)
def _unbind(func, args, kwargs):
    v = _bind(func, args, kwargs)
    t = v["self"]
    if t.dim() == 0:
        return _run_dequantized(func, args, kwargs)
    dim = _dim(v["dim"], t.dim())
    return _pieces(func, args, kwargs, [_selected(t, dim, i) for i in range(t.shape[dim])])


def _concatenated(tensors, dim):
    """torch.cat of MXTensors as an MXTensor, or None: every tensor must share format, block
    size, block dim and logical dtype, and along the block axis every tensor but the last must
    end on a block and packing-group boundary."""
    first = tensors[0]
    if not all(isinstance(t, MXTensor) for t in tensors) or first.dim() == 0:
        return None
    dim = _dim(dim, first.dim())
    for t in tensors:
        same = (t._elem_dtype == first._elem_dtype and t._block_size == first._block_size
                and t._block_dim == first._block_dim and t.dtype == first.dtype
                and t.dim() == first.dim()
                and all(t.shape[i] == first.shape[i] for i in range(t.dim()) if i != dim))
        if not same:
            return None
    if dim == first._block_dim and not all(_aligned(t.shape[dim], t) for t in tensors[:-1]):
        return None
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    modes = {t._scale_mode for t in tensors}
    return first._replace(torch.cat([t._scale_e8m0 for t in tensors], dim),
                          torch.cat([t._data for t in tensors], dim), shape=shape,
                          scale_mode=modes.pop() if len(modes) == 1 else MIXED_SCALE_MODES)


@implements(aten.cat.default)
def _cat(func, args, kwargs):
    v = _bind(func, args, kwargs)
    return _mx_or_dequantized(_concatenated(list(v["tensors"]), v["dim"]), func, args, kwargs)


@implements(aten.stack.default)
def _stack(func, args, kwargs):
    v = _bind(func, args, kwargs)
    tensors = list(v["tensors"])
    if tensors and all(isinstance(t, MXTensor) for t in tensors):
        dim = v["dim"] % (tensors[0].dim() + 1)
        expanded = []
        for t in tensors:
            shape = list(t.shape)
            shape.insert(dim, 1)
            expanded.append(_reshaped(t, shape))
        out = _concatenated(expanded, dim)
        if out is not None:
            return out
    return _run_dequantized(func, args, kwargs)


# ------------------------------------------------------------------------------ matmuls

class MXLayoutWarning(UserWarning):
    """An MX operand of a matmul has its blocks off the reduction dim: exact, but MX hardware
    could not run it."""


_strict = False
_warned = False


def set_strict_matmul(enabled: bool) -> bool:
    """Make matmuls whose MX operands are not blocked along the reduction dim raise ValueError
    (True) instead of warning once (False, the default). Returns the previous setting.
    Under torch.compile the check runs while tracing."""
    global _strict
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous, _strict = _strict, enabled
    return previous


@contextlib.contextmanager
def strict_matmul(enabled: bool = True):
    """Context manager form of set_strict_matmul."""
    previous = set_strict_matmul(enabled)
    try:
        yield
    finally:
        set_strict_matmul(previous)


def _check_reduction_layout(func, name, operand, reduction_dim):
    global _warned
    if not isinstance(operand, MXTensor) or operand.dim() == 0:
        return
    reduction_dim = _dim(reduction_dim, operand.dim())
    if operand._block_dim == reduction_dim:
        return
    message = (
        f"{func.overloadpacket.__name__}: operand {name!r} is an MXTensor with blocks along dim "
        f"{operand._block_dim}, not along its reduction dim {reduction_dim}. The result is exact "
        f"(fp32 product of the dequantized operands), but MX hardware could not run this "
        f"matmul; quantize it with block_dim={reduction_dim - operand.dim()} for that.")
    if _strict:
        raise ValueError(message + " (strict_matmul is on)")
    if not _warned:
        _warned = True
        warnings.warn(message + " This warning is shown once.", MXLayoutWarning, stacklevel=4)


# op -> {argument name: reduction dim of that operand (None: not a matmul operand, e.g. bias)}
_MATMULS = {
    aten.mm.default: {"self": 1, "mat2": 0},
    aten.bmm.default: {"self": 2, "mat2": 1},
    aten.addmm.default: {"self": None, "mat1": 1, "mat2": 0},
    aten.baddbmm.default: {"self": None, "batch1": 2, "batch2": 1},
    aten.mv.default: {"self": 1, "vec": 0},
    aten.addmv.default: {"self": None, "mat": 1, "vec": 0},
    aten.dot.default: {"self": 0, "tensor": 0},
    aten.linear.default: {"input": -1, "weight": -1, "bias": None},
    aten.matmul.default: {"self": -1, "other": None},
}


@implements(*_MATMULS)
def _matmul(func, args, kwargs):
    v = _bind(func, args, kwargs)
    operands = _MATMULS[func]
    tensors = {k: v[k] for k in operands if isinstance(v.get(k), torch.Tensor)}
    dtypes_seen = {t.dtype for t in tensors.values()}
    if len(dtypes_seen) != 1 or not dtypes_seen <= set(HIGH_PRECISION_DTYPES):
        raise ValueError(  # not TypeError: `a @ b` would replace its message with its own
            f"{func.overloadpacket.__name__}: MX matmul operands must share one logical dtype "
            f"among {', '.join(map(str, HIGH_PRECISION_DTYPES))}; got "
            + ", ".join(f"{k}: {_describe(t)}" for k, t in tensors.items()))
    if func is aten.matmul.default:  # a 1-d right operand reduces along its only dim
        other = v["other"]
        operands = {"self": -1, "other": -2 if other.dim() >= 2 else 0}
    for name, reduction_dim in operands.items():
        if reduction_dim is not None and name in tensors:
            _check_reduction_layout(func, name, tensors[name], reduction_dim)
    exact = {k: dequantize(t, torch.float32) if isinstance(t, MXTensor) else t.float()
             for k, t in tensors.items()}
    call_args, call_kwargs = [], {}
    for argument in func._schema.arguments:
        if argument.name in v:
            value = exact.get(argument.name, v[argument.name])
            if argument.kwarg_only:
                call_kwargs[argument.name] = value
            else:
                call_args.append(value)
    return func(*call_args, **call_kwargs).to(dtypes_seen.pop())


# ------------------------------------------------------------------------------ fallback

# Ops that run on the dequantized tensors (MX arguments rounded to their logical dtype).
DEQUANTIZE_FALLBACK_OPS = {
    # elementwise
    aten.abs, aten.neg, aten.sign, aten.sgn, aten.signbit, aten.reciprocal, aten.sqrt, aten.rsqrt,
    aten.exp, aten.exp2, aten.expm1, aten.log, aten.log2, aten.log10, aten.log1p, aten.sin,
    aten.cos, aten.tan, aten.tanh, aten.sigmoid, aten.erf, aten.relu, aten.gelu, aten.silu,
    aten.mish, aten.elu, aten.leaky_relu, aten.hardtanh, aten.softplus, aten.floor, aten.ceil,
    aten.round, aten.trunc, aten.frac, aten.pow, aten.clamp, aten.clamp_min, aten.clamp_max,
    aten.nan_to_num, aten.isnan, aten.isinf, aten.isfinite, aten.isposinf, aten.isneginf,
    aten.add, aten.sub, aten.rsub, aten.mul, aten.div, aten.remainder, aten.fmod, aten.maximum,
    aten.minimum, aten.floor_divide, aten.fmax, aten.fmin, aten.atan2, aten.hypot, aten.copysign,
    aten.lerp, aten.addcmul, aten.addcdiv, aten.where, aten.masked_fill, aten.eq, aten.ne,
    aten.lt, aten.le, aten.gt, aten.ge, aten.logical_not, aten.logical_and, aten.logical_or,
    aten.logical_xor, aten.equal, aten.isclose, aten.allclose, aten._local_scalar_dense,
    # reductions and sorting
    aten.sum, aten.mean, aten.prod, aten.amax, aten.amin, aten.max, aten.min, aten.argmax,
    aten.argmin, aten.aminmax, aten.var, aten.var_mean, aten.std, aten.std_mean,
    aten.linalg_vector_norm, aten.norm, aten.logsumexp, aten.cumsum, aten.cumprod, aten.all,
    aten.any, aten.count_nonzero, aten.sort, aten.topk, aten.kthvalue, aten.median,
    # indexing and copies (not views)
    aten.index, aten.gather, aten.take, aten.masked_select, aten.nonzero, aten.flip, aten.roll,
    aten.repeat, aten.repeat_interleave, aten.tril, aten.triu, aten.constant_pad_nd,
    # neural-network ops and the backward ops that may receive MX gradients (NoopFwToMXBw)
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.native_group_norm,
    aten._fused_rms_norm, aten.embedding, aten.convolution, aten.native_dropout,
    aten.nll_loss_forward, aten.mse_loss, aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_cudnn_attention, aten.threshold_backward, aten.gelu_backward,
    aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.native_layer_norm_backward, aten.nll_loss_backward,
    aten.mse_loss_backward, aten.embedding_dense_backward, aten.convolution_backward,
}


def allow_dequantize_fallback(*ops) -> None:
    """Add aten ops (overload packets such as torch.ops.aten.erfinv, or single overloads) to
    the ops that run on dequantized MXTensors."""
    for op in ops:
        if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(f"ops must be torch.ops.aten ops, got {type(op).__name__}")
        DEQUANTIZE_FALLBACK_OPS.add(op)


def _refuse_writes(func, args, kwargs):
    for i, argument in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        written = argument.alias_info is not None and argument.alias_info.is_write
        if written and isinstance(value, MXTensor):
            # ValueError, not TypeError: `x += 1` would turn a TypeError into a silent `x = x + 1`
            raise ValueError(
                f"{func}: cannot write into an MXTensor (it would need requantization); "
                "dequantize it, or build a new one with MXTensor.to_mx")


def _allowed(func) -> bool:
    """On the allow-list: the overload, its packet, or (for in-place ops such as add_, which
    only write into plain tensors here) its functional packet."""
    packet = func.overloadpacket
    name = packet.__name__
    functional = getattr(aten, name[:-1], None) if name.endswith("_") else None
    return any(op in DEQUANTIZE_FALLBACK_OPS for op in (func, packet, functional) if op is not None)


def dequantize_fallback(func, args, kwargs):
    """Ops off the table: run allow-listed ones on the dequantized tensors, refuse the rest."""
    _refuse_writes(func, args, kwargs)
    if not _allowed(func):
        raise TypeError(
            f"MXTensor does not implement {func}. Call .dequantize() first, or allow the op to "
            f"run on dequantized values with torchmx.mx_tensor.allow_dequantize_fallback("
            f"torch.ops.aten.{func.overloadpacket.__name__})")
    return _run_dequantized(func, args, kwargs)

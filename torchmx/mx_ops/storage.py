"""Storage ops: exact by construction (the scale bytes and packed codes are moved, never
requantized).

Conversions read the exact MX values: `.to(fp32/bf16/fp16)` relabels the logical dtype (an
MXTensor whose values are `dequantize(dtype)`), `.to()` any other dtype and `copy_` into a
plain tensor convert the exact values once (docs/mx_tensor.md, "Conversions").
"""

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._pytree import tree_map_only

from ..mx_tensor import MXTensor, dequantize
from ..numerics.arguments import HIGH_PRECISION_DTYPES
from ._registry import implements
from ._util import describe, same_format

aten = torch.ops.aten


def map_storage(t: MXTensor, fn, **replace) -> MXTensor:
    """t with `fn` applied to both storage tensors (and metadata replaced as given)."""
    return t._replace(fn(t._scale_e8m0), fn(t._data), **replace)


@implements(aten.detach.default, aten.alias.default)
def _alias(func, args, kwargs):
    return map_storage(args[0], func)


@implements(aten.clone.default)
def _clone(func, args, kwargs):
    t, memory_format = args[0], kwargs.get("memory_format")
    if t.dim() == 0:  # stored as (1,): every memory format is the same
        memory_format = None
    return map_storage(t, lambda s: s.clone(memory_format=memory_format))


@implements(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    """`.to(device)` moves the storage; `.to(dtype)` relabels the logical dtype (fp32, bf16,
    fp16), which is exact: the MX values are exact in fp32. Any other dtype converts the exact
    values (plain result)."""
    t, dtype = args[0], kwargs.get("dtype")
    if dtype is not None and dtype not in HIGH_PRECISION_DTYPES:
        return func(dequantize(t, torch.float32), *args[1:], **kwargs)
    move = {k: v for k, v in kwargs.items() if k != "dtype"}
    if t.dim() == 0:
        move.pop("memory_format", None)
    return map_storage(t, lambda s: func(s, **move), orig_dtype=dtype)


@implements(aten._pin_memory.default)
def _pin_memory(func, args, kwargs):
    return map_storage(args[0], lambda s: func(s, *args[1:], **kwargs))


@implements(aten.is_pinned.default)
def _is_pinned(func, args, kwargs):
    t = args[0]
    return func(t._data, *args[1:], **kwargs) and func(t._scale_e8m0, *args[1:], **kwargs)


@implements(aten.copy_.default)
def _copy_(func, args, kwargs):
    """Into a plain tensor: the exact values, converted once. Into an MXTensor: only from an
    MXTensor of the same format, block size, block dim and shape (anything else would
    requantize): ValueError, like every other write into an MXTensor."""
    dst, src = args[0], args[1]
    if not isinstance(dst, MXTensor):
        target = dst.dtype if dst.dtype in HIGH_PRECISION_DTYPES else torch.float32
        return func(dst, dequantize(src, target), *args[2:], **kwargs)
    if not (isinstance(src, MXTensor) and same_format(dst, src) and dst.shape == src.shape):
        raise ValueError(
            "copy_ into an MXTensor (also `x_mx[i] = value`) needs an MXTensor source with the "
            "same elem_dtype, block_size, block_dim and shape (anything else would requantize; "
            f"build a new MXTensor with MXTensor.to_mx); got {describe(src)} into {describe(dst)}")
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

    def placeholder(t):  # a plain tensor of t's shape, dtype and memory order
        if is_non_overlapping_and_dense_or_false(t):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
        return torch.empty_permuted(t.shape, order, dtype=t.dtype, device=t.device)

    args, kwargs = tree_map_only(MXTensor, placeholder, (args, kwargs))
    return func(*args, **kwargs)

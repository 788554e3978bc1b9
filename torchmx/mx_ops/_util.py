"""Helpers shared by the handlers: arguments by schema name, running an op on the dequantized
tensors, describing operands in messages."""

import torch
from torch.utils._pytree import tree_map_only

from ..mx_tensor import MXTensor, dequantize


def bind(func, args, kwargs) -> dict:
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


def logical(x):
    """An MXTensor's values in its logical dtype (plain tensors and other values unchanged)."""
    return dequantize(x, x.dtype) if isinstance(x, MXTensor) else x


def run_dequantized(func, args, kwargs):
    """Run `func` with every MXTensor argument dequantized to its logical dtype."""
    args, kwargs = tree_map_only(MXTensor, logical, (args, kwargs))
    return func(*args, **kwargs)


def mx_or_dequantized(out, func, args, kwargs):
    """`out` when the op could keep MX storage (not None), else the op on dequantized tensors."""
    return run_dequantized(func, args, kwargs) if out is None else out


def describe(x) -> str:
    if isinstance(x, MXTensor):
        return (f"MXTensor({x.elem_dtype.name}, block_size={x.block_size}, "
                f"block_dim={x.block_dim}, shape={tuple(x.shape)}, dtype={x.dtype})")
    if isinstance(x, torch.Tensor):
        return f"Tensor(shape={tuple(x.shape)}, dtype={x.dtype})"
    return type(x).__name__


def same_format(a: MXTensor, b: MXTensor) -> bool:
    """Same element format, block size and block axis (so the storage bytes mean the same)."""
    return (a.elem_dtype == b.elem_dtype and a.block_size == b.block_size
            and a.block_dim == b.block_dim)

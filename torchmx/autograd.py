"""Differentiable casts to and from MX (torchmx 0.1.0's names).

- `ToMXConstrFunc`: quantize in forward; straight-through backward (identity, or "clipped":
  zero gradient where the input saturated).
- `FromMXConstrFunc`: dequantize in forward; identity backward.
- `NoopFwToMXBw`: identity in forward; quantizes the gradient to MX in backward.

Every argument is validated in forward (ValueError/TypeError naming it), so a mistake never
waits for the backward pass.
"""

from typing import Optional, Union

import torch

from . import mx_tensor as _mx
from .numerics import arguments as args
from .numerics.reference import effective_block_size
from .numerics.scale import scale_value


def resolve_seed(seed: Union[int, torch.Generator, None], rounding) -> Optional[int]:
    """seed as the op takes it: an int (a torch.Generator draws one, as the op would draw one
    from the default generator when seed is None), or None."""
    if seed is not None and not isinstance(seed, torch.Generator) and not args.is_int(seed):
        raise TypeError(f"seed must be an int in [0, 2**63), a torch.Generator or None, got "
                        f"{type(seed).__name__}")
    if isinstance(seed, torch.Generator) or (seed is not None and rounding == "stochastic"):
        return args.resolve_seed(seed, rounding)  # draws from a Generator; checks an int's range
    return seed


def check_quantize_arguments(data_hp, elem_dtype, block_size, scale_mode, rounding, block_dim):
    """The quantization arguments, validated: (format name, block axis). block_dim None is the
    last dim."""
    if isinstance(data_hp, _mx.MXTensor):
        raise TypeError("data_hp is already an MXTensor; call .dequantize() first to requantize")
    args.check_high_precision_input(data_hp)
    name = args.check_elem_dtype(elem_dtype).name
    args.check_block_size(block_size)
    args.check_scale_mode(scale_mode)
    args.check_rounding(rounding)
    axis = args.normalize_block_dim(-1 if block_dim is None else block_dim, data_hp.dim())
    return name, axis


def check_ste(ste) -> str:
    if ste not in _mx.STE_MODES:
        raise ValueError(f"ste must be one of {', '.join(_mx.STE_MODES)}; got {ste!r}")
    return ste


def check_dequantize_dtype(target_dtype) -> torch.dtype:
    if not isinstance(target_dtype, torch.dtype):
        raise TypeError(f"target_dtype must be a torch.dtype, one of "
                        f"{', '.join(map(str, args.HIGH_PRECISION_DTYPES))}; got {target_dtype!r}")
    return args.check_target_dtype(target_dtype)


def saturated(data_hp: torch.Tensor, tensor: "_mx.MXTensor") -> torch.Tensor:
    """Bool mask of the elements of data_hp whose magnitude exceeds their block's largest
    representable value (elem max * scale), i.e. the elements quantization clamped."""
    axis, n = tensor._block_dim, tensor._block_dim_size
    limit = scale_value(tensor._scale_e8m0) * tensor._elem_dtype.max
    limit = limit.repeat_interleave(effective_block_size(tensor._block_size, n), dim=axis)
    limit = limit.narrow(axis, 0, n)
    return (data_hp.reshape(limit.shape).float().abs() > limit).reshape(data_hp.shape)


def quantize_checked(data_hp, elem_dtype, block_size, scale_mode, rounding, block_dim, seed,
                     ste) -> "_mx.MXTensor":
    """The forward of ToMXConstrFunc: every argument validated, then the MXTensor."""
    name, axis = check_quantize_arguments(data_hp, elem_dtype, block_size, scale_mode, rounding,
                                          block_dim)
    check_ste(ste)
    seed = resolve_seed(seed, rounding)
    return _mx.quantize(data_hp, name, block_size, scale_mode, rounding, axis, seed)


class ToMXConstrFunc(torch.autograd.Function):
    """Differentiable cast to MX; straight-through estimator in backward.

    apply(data_hp, elem_dtype, block_size=32, scale_mode="floor", rounding="even",
          block_dim=-1, seed=None, ste="identity")
    """

    @staticmethod
    def forward(ctx, data_hp, elem_dtype, block_size=32, scale_mode="floor", rounding="even",
                block_dim=-1, seed=None, ste="identity"):
        out = quantize_checked(data_hp, elem_dtype, block_size, scale_mode, rounding, block_dim,
                               seed, ste)
        ctx.clipped = ste == "clipped"
        if ctx.clipped:
            ctx.save_for_backward(saturated(data_hp, out))
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.clipped:
            (mask,) = ctx.saved_tensors
            grad = torch.where(mask, 0, grad)
        return grad, None, None, None, None, None, None, None


class FromMXConstrFunc(torch.autograd.Function):
    """Differentiable cast from MX to `target_dtype`; identity in backward.

    apply(tensor_mx, target_dtype)
    """

    @staticmethod
    def forward(ctx, tensor_mx, target_dtype):
        if not isinstance(tensor_mx, _mx.MXTensor):
            raise TypeError(f"tensor_mx must be an MXTensor, got {type(tensor_mx).__name__}")
        return _mx.dequantize(tensor_mx, check_dequantize_dtype(target_dtype))

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class NoopFwToMXBw(torch.autograd.Function):
    """Identity in forward; in backward the gradient is quantized to an MXTensor.

    apply(x, elem_dtype, block_size=32, block_dim=-1, scale_mode="floor", rounding="even")
    The gradient may have any layout (non-contiguous gradients are fine). A leaf's `.grad`
    is that MXTensor (torchmx 0.1.0's behaviour): see docs/mx_tensor.md for accumulating it.
    """

    @staticmethod
    def forward(ctx, x, elem_dtype, block_size=32, block_dim=-1, scale_mode="floor",
                rounding="even"):
        name, axis = check_quantize_arguments(x, elem_dtype, block_size, scale_mode, rounding,
                                              block_dim)
        ctx.config = (name, block_size, scale_mode, rounding, axis)
        return x

    @staticmethod
    def backward(ctx, grad):
        name, block_size, scale_mode, rounding, block_dim = ctx.config
        if isinstance(grad, _mx.MXTensor):
            grad = _mx.dequantize(grad, grad.dtype)
        grad_mx = _mx.quantize(grad, name, block_size, scale_mode, rounding, block_dim, None)
        return grad_mx, None, None, None, None, None

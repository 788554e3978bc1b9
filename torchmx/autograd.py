"""Differentiable casts to and from MX (torchmx 0.1.0's names).

- `ToMXConstrFunc`: quantize in forward; straight-through backward (identity, or "clipped":
  zero gradient where the input saturated).
- `FromMXConstrFunc`: dequantize in forward; identity backward.
- `NoopFwToMXBw`: identity in forward; quantizes the gradient to MX in backward.
"""

import torch

from . import dtypes
from . import mx_tensor as _mx
from .numerics.scale import scale_value


def saturated(data_hp: torch.Tensor, tensor: "_mx.MXTensor") -> torch.Tensor:
    """Bool mask of the elements of data_hp whose magnitude exceeds their block's largest
    representable value (elem max * scale), i.e. the elements quantization clamped."""
    axis, n = tensor._block_dim, tensor._block_dim_size
    limit = scale_value(tensor._scale_e8m0) * tensor._elem_dtype.max
    limit = limit.repeat_interleave(tensor._block_size, dim=axis).narrow(axis, 0, n)
    return (data_hp.reshape(limit.shape).float().abs() > limit).reshape(data_hp.shape)


class ToMXConstrFunc(torch.autograd.Function):
    """Differentiable cast to MX; straight-through estimator in backward.

    apply(data_hp, elem_dtype, block_size=32, scale_mode="floor", rounding="even",
          block_dim=-1, seed=None, ste="identity")
    """

    @staticmethod
    def forward(ctx, data_hp, elem_dtype, block_size=32, scale_mode="floor", rounding="even",
                block_dim=-1, seed=None, ste="identity"):
        if ste not in _mx.STE_MODES:
            raise ValueError(f"ste must be one of {', '.join(_mx.STE_MODES)}; got {ste!r}")
        name = dtypes.resolve(elem_dtype).name
        out = _mx.quantize(data_hp, name, block_size, scale_mode, rounding, block_dim, seed)
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
        return _mx.dequantize(tensor_mx, target_dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class NoopFwToMXBw(torch.autograd.Function):
    """Identity in forward; in backward the gradient is quantized to an MXTensor.

    apply(x, elem_dtype, block_size=32, block_dim=-1, scale_mode="floor", rounding="even")
    The gradient may have any layout (non-contiguous gradients are fine).
    """

    @staticmethod
    def forward(ctx, x, elem_dtype, block_size=32, block_dim=-1, scale_mode="floor",
                rounding="even"):
        ctx.config = (dtypes.resolve(elem_dtype).name, block_size, scale_mode, rounding, block_dim)
        return x

    @staticmethod
    def backward(ctx, grad):
        name, block_size, scale_mode, rounding, block_dim = ctx.config
        if isinstance(grad, _mx.MXTensor):
            grad = _mx.dequantize(grad, grad.dtype)
        grad_mx = _mx.quantize(grad, name, block_size, scale_mode, rounding, block_dim, None)
        return grad_mx, None, None, None, None, None

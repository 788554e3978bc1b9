"""The policy for aten ops off the table: allow-listed ops run on the dequantized tensors (each
MX argument rounded to its logical dtype) and return plain tensors; other ops raise TypeError
naming the op; any op that would write into an MXTensor raises ValueError (not TypeError,
which Python turns into a silent `x = x + 1` for `x += 1`).
"""

import torch

from ..mx_tensor import MXTensor
from ._registry import in_table, set_fallback
from ._util import run_dequantized

__all__ = ["DEQUANTIZE_FALLBACK_OPS", "allow_dequantize_fallback", "dequantize_fallback"]

aten = torch.ops.aten

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
            raise ValueError(
                f"{func}: cannot write into an MXTensor (it would need requantization); "
                "dequantize it, or build a new one with MXTensor.to_mx. (A leaf's .grad is an "
                "MXTensor when NoopFwToMXBw quantized it: replace it with x.grad = "
                "x.grad.dequantize() before accumulating, clipping or zeroing it; "
                "docs/mx_tensor.md, Autograd.)")


def _refuse_out_of_table_ops(func):
    """`out=` variants of ops the table implements (mm, cat, ...) would bypass the table."""
    if any(argument.is_out for argument in func._schema.arguments) and in_table(func):
        raise TypeError(
            f"{func}: out= is not supported with MXTensor arguments; call "
            f"torch.{func.overloadpacket.__name__}(...) without out= (it returns a new tensor) "
            "and copy the result where you need it")


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
    _refuse_out_of_table_ops(func)
    if not _allowed(func):
        raise TypeError(
            f"MXTensor does not implement {func}. Call .dequantize() first, or allow the op to "
            f"run on dequantized values with torchmx.mx_tensor.allow_dequantize_fallback("
            f"torch.ops.aten.{func.overloadpacket.__name__})")
    return run_dequantized(func, args, kwargs)


set_fallback(dequantize_fallback)

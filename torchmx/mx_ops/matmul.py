"""MX matmuls: the exact product of the dequantized operands, fp32 accumulation, one rounding.

Every matmul with an MX operand ends in one custom op, `torch.ops.torchmx.mx_matmul`:

    mx_matmul(self, other, bias=None, *, out_dtype, alpha=1.0, beta=1.0)
        = round_to(out_dtype, alpha * (self @ other) + beta * bias), computed in fp32

with torch.matmul's shape rules (1-d operands, broadcast batch dims); `bias` broadcasts to the
product; beta == 0 ignores it (NaN included), as addmm does. Being a custom op with a fake
kernel, its single rounding survives torch.compile (inductor cannot fuse the final cast into
the next elementwise op, which would drop the rounding) and export, so compiled and exported
MX models equal eager bit for bit. On MXTensor operands it dequantizes them exactly (fp32)
and calls itself on plain tensors; `torch.ops.torchmx.mx_linear` is F.linear's form of it.

Where the matmuls come from:
- `F.linear`, `torch.matmul` / `@` with an MX argument are intercepted above autograd
  (MXTensor.__torch_function__) and call the custom ops directly, so the bias is always part of
  the fp32 computation and no layout-dependent decomposition (reshape folding, bias fusion)
  can differ between eager, torch.compile and export.
- aten matmuls reaching MXTensor's dispatch (mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot,
  vdot, addr, and linear/matmul in pre-dispatch graphs) call mx_matmul on the dequantized
  operands.
An MX operand whose blocks do not run along its reduction dim warns once (strict.py).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .._eager import short_path
from .. import ops as _ops
from .._library import custom_op
from ..mx_tensor import MXTensor, dequantize, dequantize_short
from ..numerics.arguments import HIGH_PRECISION_DTYPES
from . import export, layout, strict, weight_matmul
from ._registry import implements, implements_torch_function
from ._util import bind, describe

__all__ = ["mx_matmul", "mx_linear", "exact_weight_linear"]

aten = torch.ops.aten


# ------------------------------------------------------------------------------ the custom ops

def _fp32(t: Tensor) -> Tensor:
    return t if t.dtype == torch.float32 else t.float()  # (.float() of fp32 is t itself)


def _compute(self, other, bias, alpha, beta, out_dtype):
    product = torch.matmul(_fp32(self), _fp32(other))
    if alpha != 1:
        product = product * alpha
    if bias is not None and beta != 0:
        linear_bias = bias.dim() == 1 and product.dim() > 0 and bias.shape[0] == product.shape[-1]
        if not linear_bias and torch.broadcast_shapes(bias.shape, product.shape) != product.shape:
            raise RuntimeError(f"mx_matmul: bias of shape {tuple(bias.shape)} does not broadcast "
                               f"to the product's shape {tuple(product.shape)}")
        bias = _fp32(bias)
        product.add_(bias if beta == 1 else bias * beta)  # (the product is a new tensor)
    if out_dtype != torch.float32:  # (.to(fp32) of the fp32 product is itself)
        product = product.to(out_dtype)
    return product.contiguous()


@custom_op("torchmx::mx_matmul")
def mx_matmul(self: Tensor, other: Tensor, bias: Optional[Tensor] = None, *,
              out_dtype: torch.dtype, alpha: float = 1.0, beta: float = 1.0) -> Tensor:
    """round_to(out_dtype, alpha * (self @ other) + beta * bias), computed in fp32 (torch.matmul's
    shape rules; bias broadcasts to the product; beta == 0 ignores bias). MXTensor operands
    are dequantized exactly first."""
    return _compute(self, other, bias, alpha, beta, out_dtype)


@mx_matmul.register_fake
def _mx_matmul_fake(self, other, bias=None, *, out_dtype, alpha=1.0, beta=1.0):
    return _compute(self, other, bias, alpha, beta, out_dtype)


def _linear_other(weight: Tensor) -> Tensor:
    return weight.t() if weight.dim() == 2 else weight


@custom_op("torchmx::mx_linear")
def mx_linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
              out_dtype: torch.dtype) -> Tensor:
    """F.linear as mx_matmul(input, weight.t(), bias, out_dtype=out_dtype): one rounding of the
    fp32 product plus bias."""
    return _compute(input, _linear_other(weight), bias, 1.0, 1.0, out_dtype)


@mx_linear.register_fake
def _mx_linear_fake(input, weight, bias=None, *, out_dtype):
    return _compute(input, _linear_other(weight), bias, 1.0, 1.0, out_dtype)


# ------------------------------------------------------------------------------ autograd
# Gradients use the same exact products (MX operands stay MX: the saved operands go through
# MXTensor's table), each rounded once to the dtype of the operand it belongs to.

def _call(a, b, bias=None, *, out_dtype, alpha=1.0, beta=1.0):
    return torch.ops.torchmx.mx_matmul(a, b, bias, out_dtype=out_dtype, alpha=float(alpha),
                                       beta=float(beta))


def _bias_grad(grad, bias_shape, bias_dtype, beta):
    grad = grad if beta == 1 else grad * beta
    return grad.sum_to_size(bias_shape).to(bias_dtype)


def _matmul_setup(ctx, inputs, keyword_only_inputs, output):
    self, other, bias = inputs
    ctx.save_for_backward(self, other)
    ctx.alpha, ctx.beta = keyword_only_inputs["alpha"], keyword_only_inputs["beta"]
    ctx.bias = None if bias is None else (bias.shape, bias.dtype)


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    g2 = grad.unsqueeze(-1) if b.dim() == 1 else grad
    g2 = g2.unsqueeze(-2) if a.dim() == 1 else g2
    grad_a = grad_b = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_a = _call(g2, b2.mT, out_dtype=a.dtype, alpha=ctx.alpha).sum_to_size(a2.shape)
        grad_a = grad_a.squeeze(0) if a.dim() == 1 else grad_a
    if ctx.needs_input_grad[1]:
        if b2.dim() == 2 and a2.dim() > 2:  # batch folded into M: one accumulation, as torch
            k, n = b2.shape
            grad_b = _call(a2.reshape(-1, k).mT, g2.reshape(-1, n), out_dtype=b.dtype,
                           alpha=ctx.alpha)
        else:
            grad_b = _call(a2.mT, g2, out_dtype=b.dtype, alpha=ctx.alpha).sum_to_size(b2.shape)
        grad_b = grad_b.squeeze(-1) if b.dim() == 1 else grad_b
    if ctx.bias is not None and ctx.needs_input_grad[2]:
        grad_bias = _bias_grad(grad, *ctx.bias, ctx.beta)
    return grad_a, grad_b, grad_bias


mx_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def _linear_setup(ctx, inputs, keyword_only_inputs, output):
    input, weight, bias = inputs
    ctx.save_for_backward(input, weight)
    ctx.bias = None if bias is None else (bias.shape, bias.dtype)


def _linear_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    grad_input = grad_weight = grad_bias = None
    k = input.shape[-1]
    g2 = grad.unsqueeze(-1) if weight.dim() == 1 else grad  # (..., N)
    if ctx.needs_input_grad[0]:
        w2 = weight.unsqueeze(0) if weight.dim() == 1 else weight  # (N, K)
        grad_input = _call(g2, w2, out_dtype=input.dtype)
    if ctx.needs_input_grad[1]:  # (N, M) @ (M, K): one accumulation over every row
        grad_weight = _call(g2.reshape(-1, g2.shape[-1]).mT, input.reshape(-1, k),
                            out_dtype=weight.dtype)
        grad_weight = grad_weight.reshape(weight.shape)
    if ctx.bias is not None and ctx.needs_input_grad[2]:
        grad_bias = _bias_grad(grad, *ctx.bias, 1.0)
    return grad_input, grad_weight, grad_bias


mx_linear.register_autograd(_linear_backward, setup_context=_linear_setup)


# ------------------------------------------------------------------------------ MX operands

_LOGICAL_DTYPES = set(HIGH_PRECISION_DTYPES)


def _logical_dtype(op_name: str, operands: dict) -> torch.dtype:
    """The one logical dtype (fp32, bf16 or fp16) all tensor operands share, else ValueError
    (not TypeError: `a @ b` would replace its message with its own)."""
    tensors = {k: t for k, t in operands.items() if isinstance(t, torch.Tensor)}
    seen = {t.dtype for t in tensors.values()}
    if len(seen) != 1 or not seen <= _LOGICAL_DTYPES:
        raise ValueError(
            f"{op_name}: MX matmul operands must share one logical dtype among "
            f"{', '.join(map(str, HIGH_PRECISION_DTYPES))}; got "
            + ", ".join(f"{k}: {describe(t)}" for k, t in tensors.items()))
    return seen.pop()


def _exact(op_name: str, operand_name: str, t, reduction_dim, short: bool = False):
    """An operand as the exact fp32 values (MX) or as is (plain, None), after the layout check
    (`reduction_dim` None: not a matmul factor, e.g. a bias); `short`: on the short path of
    _eager.py."""
    if not isinstance(t, MXTensor):
        return t
    if reduction_dim is not None and t.dim() > 0:
        strict.check_reduction_layout(op_name, operand_name, t.block_dim, t.dim(),
                                      layout.normalize_dim(reduction_dim, t.dim()))
    return dequantize_short(t, torch.float32) if short else dequantize(t, torch.float32)


def _other_reduction(other) -> int:
    return -2 if other.dim() >= 2 else 0


@implements(torch.ops.torchmx.mx_matmul.default)
def _mx_matmul_handler(func, args, kwargs):
    v = bind(func, args, kwargs)
    a, b, bias = v["self"], v["other"], v["bias"]
    dtype = _logical_dtype("mx_matmul", {"self": a, "other": b, "bias": bias})
    if dtype == v["out_dtype"]:
        fast = weight_matmul.route(a, b, bias, v["alpha"], v["beta"], out_dtype=dtype)
        if fast is not None:
            return fast
    a, b = _exact("matmul", "self", a, -1), _exact("matmul", "other", b, _other_reduction(b))
    return func(a, b, _exact("matmul", "bias", bias, None), out_dtype=v["out_dtype"],
                alpha=v["alpha"], beta=v["beta"])


def _linear(x, w, bias, dtype: torch.dtype, out_dtype: torch.dtype, direct: bool) -> Tensor:
    """mx_linear on MX operands of logical dtype `dtype`: the MX-weight kernels where they
    apply, else the exact product of the dequantized operands (by mx_matmul's body itself
    when `direct`, on the short path of _eager.py)."""
    if dtype == out_dtype:
        fast = weight_matmul.route_linear(x, w, bias, out_dtype=dtype)
        if fast is not None:
            return fast
    x, w = _exact("linear", "input", x, -1, direct), _exact("linear", "weight", w, -1, direct)
    bias = _exact("linear", "bias", bias, None, direct)
    if direct:
        return _compute(x, _linear_other(w), bias, 1.0, 1.0, out_dtype)
    return _call(x, _linear_other(w), bias, out_dtype=out_dtype)


def exact_weight_linear(x: Tensor, weight: MXTensor, bias: Optional[Tensor]) -> Tensor:
    """F.linear(x, weight, bias) on the short path of _eager.py for a plain x, a 2-d MX weight
    [N, K] blocked along K and a plain bias [N] or None, all of x's logical dtype, where no
    kernel takes the product (`weight_matmul.kernels_on` False): the exact product of
    the dequantized weight, computed as `_linear` computes it there."""
    with torch._C.DisableTorchFunctionSubclass():  # the weight's metadata, read directly
        return _exact_weight_linear(x, weight, bias)


def _exact_weight_linear(x, weight, bias):
    """exact_weight_linear, with MXTensor's __torch_function__ already disabled."""
    data = weight._data
    if data.is_contiguous():  # what `dequantize` does for it, without its layers
        w = _ops.dequantize_checked(data, weight._scale_e8m0, weight._elem_dtype,
                                    weight._block_size, torch.float32, 1, weight.shape[1])
    else:
        w = dequantize_short(weight, torch.float32)
    return _compute(x, w.t(), bias, 1.0, 1.0, x.dtype)


@implements(torch.ops.torchmx.mx_linear.default)
def _mx_linear_handler(func, args, kwargs):
    v = bind(func, args, kwargs)
    x, w, bias = v["input"], v["weight"], v["bias"]
    dtype = _logical_dtype("linear", {"input": x, "weight": w, "bias": bias})
    return _linear(x, w, bias, dtype, v["out_dtype"], direct=False)


# aten op -> (its operands as (argument name, reduction dim: an int, a function of the operand,
# or None for a bias or an outer product), how to call mx_matmul on the exact operands)
def _product(a, b, bias=None, alpha=1, beta=1):
    return a, b, bias, alpha, beta


_ATEN_MATMULS = {
    aten.mm.default: ((("self", 1), ("mat2", 0)), lambda v: _product(v["self"], v["mat2"])),
    aten.bmm.default: ((("self", 2), ("mat2", 1)), lambda v: _product(v["self"], v["mat2"])),
    aten.addmm.default: (
        (("self", None), ("mat1", 1), ("mat2", 0)),
        lambda v: _product(v["mat1"], v["mat2"], v["self"], v["alpha"], v["beta"])),
    aten.baddbmm.default: (
        (("self", None), ("batch1", 2), ("batch2", 1)),
        lambda v: _product(v["batch1"], v["batch2"], v["self"], v["alpha"], v["beta"])),
    aten.addbmm.default: (  # sum over the batch: (M, B*K) @ (B*K, N), one accumulation
        (("self", None), ("batch1", 2), ("batch2", 1)),
        lambda v: _product(v["batch1"].transpose(0, 1).reshape(v["batch1"].shape[1], -1),
                           v["batch2"].reshape(-1, v["batch2"].shape[-1]), v["self"], v["alpha"],
                           v["beta"])),
    aten.mv.default: ((("self", 1), ("vec", 0)), lambda v: _product(v["self"], v["vec"])),
    aten.addmv.default: (
        (("self", None), ("mat", 1), ("vec", 0)),
        lambda v: _product(v["mat"], v["vec"], v["self"], v["alpha"], v["beta"])),
    aten.dot.default: ((("self", 0), ("tensor", 0)), lambda v: _product(v["self"], v["tensor"])),
    aten.vdot.default: ((("self", 0), ("other", 0)), lambda v: _product(v["self"], v["other"])),
    aten.addr.default: (  # outer product: no reduction dim
        (("self", None), ("vec1", None), ("vec2", None)),
        lambda v: _product(v["vec1"].unsqueeze(1), v["vec2"].unsqueeze(0), v["self"], v["alpha"],
                           v["beta"])),
    aten.linear.default: (
        (("input", -1), ("weight", -1), ("bias", None)),
        lambda v: _product(v["input"], _linear_other(v["weight"]), v["bias"])),
    aten.matmul.default: ((("self", -1), ("other", _other_reduction)),
                          lambda v: _product(v["self"], v["other"])),
}


# Where the right operand can be an MX weight for weight_matmul.route (a cheap view to build).
_WEIGHT_ROUTABLE = (aten.mm.default, aten.addmm.default, aten.matmul.default)


@implements(*_ATEN_MATMULS)
def _aten_matmul(func, args, kwargs):
    v = bind(func, args, kwargs)
    operands, to_product = _ATEN_MATMULS[func]
    name = func.overloadpacket.__name__
    dtype = _logical_dtype(name, {k: v.get(k) for k, _ in operands})
    if func is aten.linear.default:
        fast = weight_matmul.route_linear(v["input"], v["weight"], v.get("bias"), out_dtype=dtype)
    elif func in _WEIGHT_ROUTABLE:
        fast = weight_matmul.route(*to_product(v), out_dtype=dtype)
    else:
        fast = None
    if fast is not None:
        return fast
    for k, reduction_dim in operands:
        if callable(reduction_dim):
            reduction_dim = reduction_dim(v[k])
        v[k] = _exact(name, k, v.get(k), reduction_dim)
    a, b, bias, alpha, beta = to_product(v)
    return _call(a, b, bias, out_dtype=dtype, alpha=alpha, beta=beta)


# ------------------------------------------------------------------------------ torch functions

def _no_out(name, kwargs):
    if kwargs.get("out") is not None:
        raise TypeError(f"{name}: out= is not supported with MXTensor arguments; call it without "
                        "out= (it returns a new tensor) and copy the result where you need it")


_PLAIN_BIAS = (type(None), torch.Tensor, torch.nn.Parameter)


@implements_torch_function(F.linear)
def _linear_function(func, args, kwargs):
    if kwargs or not 2 <= len(args) <= 3:
        v = dict(zip(("input", "weight", "bias"), args), **kwargs)
    else:  # (positional arguments, the usual call: no dict to build)
        v = {"input": args[0], "weight": args[1], "bias": args[2] if len(args) == 3 else None}
    x, w, bias = v["input"], v["weight"], v.get("bias")
    # MXTensor's metadata (requires_grad, dim, shape, dtype) without a __torch_function__ round
    # trip each
    with torch._C.DisableTorchFunctionSubclass():
        if short_path(x, w, bias):  # what mx_linear's MXTensor handler runs, without the layers
            if (type(x) is torch.Tensor and type(w) is MXTensor and type(bias) in _PLAIN_BIAS
                    and w.dim() == 2 and w._block_dim == 1 and x.dtype == w.dtype
                    and (bias is None or bias.dtype == x.dtype)
                    and not weight_matmul.kernels_on(w)):
                return _exact_weight_linear(x, w, bias)  # what _linear would compute, directly
            dtype = _logical_dtype("linear", v)
            return _linear(x, w, bias, dtype, dtype, direct=True)
    dtype = _logical_dtype("linear", v)
    try:
        return torch.ops.torchmx.mx_linear(x, w, bias, out_dtype=dtype)
    except export.Unsupported:  # an MXTensor built in an exported forward: use its parts
        pass
    return _mx_linear_handler(torch.ops.torchmx.mx_linear.default, (x, w, bias),
                              {"out_dtype": dtype})


@implements_torch_function(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def _matmul_function(func, args, kwargs):
    _no_out("matmul", kwargs)
    v = dict(zip(("input", "other"), args), **kwargs)
    dtype = _logical_dtype("matmul", v)
    try:
        return _call(v["input"], v["other"], out_dtype=dtype)
    except export.Unsupported:  # an MXTensor built in an exported forward: use its parts
        pass
    return _mx_matmul_handler(torch.ops.torchmx.mx_matmul.default, (v["input"], v["other"]),
                              {"out_dtype": dtype})


@implements_torch_function(torch.Tensor.__rmatmul__)
def _rmatmul_function(func, args, kwargs):
    return _matmul_function(func, (args[1], args[0]), {})

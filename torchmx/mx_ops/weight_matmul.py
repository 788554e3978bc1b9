"""The fast path of matmuls with an MX weight: `torch.ops.torchmx.mx_weight_linear`.

    mx_weight_linear(input, weight_scale, weight_data, elem_dtype_name, block_size,
                     in_features, bias, out_dtype)
        = mx_linear(input, W, bias, out_dtype=out_dtype)

for the MX matrix W [N, K] given by its parts: scale bytes [N, ceil(K / block_size)] and codes
[N, packed(K)] (blocks along K; any strides). On CUDA it runs torchmx/kernels/linear/dispatch.py (the
fused decode kernel for few activation rows, dequantize + cuBLAS for many); elsewhere the
reference (exact fp32 dequantization, fp32 matmul). It is internal: MXTensor's matmul handlers
call it below autograd, so it has no autograd formula of its own.

`route` is what the handlers call: the product a @ b (+ bias) when b is a 2-d MX weight
blocked along the reduction dim and the kernels take it, else None (the generic exact path).
An MX activation is dequantized first, except where kernels/linear/mx_gemm.py's GEMM, which decodes
it in its main loop, is faster (`torch.ops.torchmx.mx_mx_linear`, below).
"""

from typing import Optional

import torch
from torch import Tensor

from .._eager import short_path
from .._library import custom_op
from .. import dtypes
from .._memo import memo
from ..kernels._launch import hooks_installed
from ..kernels.linear import dispatch as kernels
from ..kernels.quantize import backends
from ..mx_tensor import MXTensor, dequantize
from ..numerics import arguments as args
from ..numerics.packing import packed_length
from . import weight_matmul_compiled

__all__ = ["mx_weight_linear", "mx_mx_linear", "route", "route_linear", "KERNEL_DEVICES",
           "kernel_linear", "bound_call", "cuda_kernels_on", "kernels_on"]

# Devices whose MX-weight matmuls run the kernels. Tests add "cpu" to run them under Triton's
# interpreter.
KERNEL_DEVICES = {"cuda"}


def cuda_kernels_on() -> bool:
    """Whether the CUDA kernels are switched on (KERNEL_DEVICES, TORCHMX_BACKEND): the cheap
    part of `_kernels_usable`, for calls that already ran them."""
    return "cuda" in KERNEL_DEVICES and not backends.FORCE_REFERENCE


def _kernels_usable(device: torch.device) -> bool:
    kind = device.type
    if kind not in KERNEL_DEVICES or backends.FORCE_REFERENCE:
        return False
    return kind != "cuda" or backends.triton_kernels() is not None


def kernels_on(t: Tensor) -> bool:
    """Whether products with an MX weight on t's device may run the kernels (`_route` may take
    them); False means every such product takes the exact generic path. `t`: the weight, or
    any tensor on its device (a plain one costs no __torch_function__ round trip)."""
    if t.is_cpu:  # (the device object is not needed to tell)
        return "cpu" in KERNEL_DEVICES and not backends.FORCE_REFERENCE
    return _kernels_usable(t.device)


_CHECKED = {}  # what _check_parts looks at, for the arguments it accepted -> the format
_MAX_CHECKED = 4096  # past this many kinds of arguments, the memo starts over


def _check_parts(input, weight_scale, weight_data, elem_dtype_name, block_size, in_features,
                 bias, out_dtype, op: str = "mx_weight_linear") -> dtypes.DType:
    """The format, after ValueError/TypeError for parts that do not describe one MX weight
    [N, in_features] blocked along K with an input [..., in_features]. The checks read only
    the arguments' values, dtypes and shapes: a kind of arguments accepted once is looked up
    (inductor runs the operator's body at every step of a compiled graph)."""
    key = (op, elem_dtype_name, type(block_size), block_size, type(in_features), in_features,
           input.dtype, input.shape[-1] if input.dim() else None, input.device,
           weight_scale.dtype, weight_scale.shape, weight_scale.device, weight_data.dtype,
           weight_data.shape, weight_data.device,
           None if bias is None else (bias.shape, bias.device), out_dtype)
    fmt = _CHECKED.get(key)
    if fmt is None:
        fmt = _check_parts_once(input, weight_scale, weight_data, elem_dtype_name, block_size,
                                in_features, bias, out_dtype, op)
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED[key] = fmt
    return fmt


def _check_parts_once(input, weight_scale, weight_data, elem_dtype_name, block_size,
                      in_features, bias, out_dtype, op: str) -> dtypes.DType:
    fmt = args.check_elem_dtype(elem_dtype_name)
    args.check_block_size(block_size)
    args.check_high_precision_input(input, "input")
    args.check_target_dtype(out_dtype, "out_dtype")
    if input.dim() == 0 or input.shape[-1] != in_features:
        raise ValueError(f"{op}: input of shape {tuple(input.shape)} does not end "
                         f"in in_features={in_features}")
    if weight_scale.dtype != torch.uint8 or weight_scale.dim() != 2:
        raise TypeError(f"{op}: weight_scale must be a 2-d uint8 tensor, got "
                        f"{weight_scale.dtype} of shape {tuple(weight_scale.shape)}")
    n = weight_scale.shape[0]
    expected = ((n, packed_length(in_features, fmt)),
                (n, -(-in_features // block_size)))
    if tuple(weight_data.shape) != expected[0] or tuple(weight_scale.shape) != expected[1]:
        raise ValueError(
            f"{op}: {fmt.name} weight parts for in_features={in_features}, "
            f"block_size={block_size} must be data {expected[0]} and scale {expected[1]}, got "
            f"{tuple(weight_data.shape)} and {tuple(weight_scale.shape)}")
    if weight_data.dtype not in (torch.uint8, fmt.storage_dtype):
        raise TypeError(f"{op}: weight_data of {fmt.name} must be "
                        f"{fmt.storage_dtype}, got {weight_data.dtype}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: bias must have shape ({n},), got "
                         f"{tuple(bias.shape)}")
    _check_devices(("input", input), ("weight_scale", weight_scale),
                   ("weight_data", weight_data), ("bias", bias))
    return fmt


def _check_devices(*named) -> None:
    """args.check_same_device of each tensor (name, tensor or None) against the first; a meta
    tensor stands in for a shape only (mx_mx_linear's input rows) and is not compared."""
    tensors = [(name, t) for name, t in named if t is not None and not t.is_meta]
    for name, t in tensors[1:]:
        args.check_same_device(t, name, tensors[0][1], tensors[0][0])


# What a call of mx_weight_linear depends on, the weight's addresses included (`_call_key`) ->
# the product kernels/linear/dispatch.py bound for it (`bound_linear`), or False where none
_BOUND = {}


def _call_key(input, weight_scale, weight_data, elem_dtype_name, block_size, in_features, bias,
              out_dtype) -> tuple:
    """Everything `_check_parts` and dispatch.linear's plan look at, with the addresses of the
    weight: one key tells a call that a bound product computes (the weight's memory read
    where it lies; no tensor is kept)."""
    return (input.shape, input.dtype, input.get_device(), input.is_contiguous(),
            input.data_ptr() & 15, weight_data.get_device(), weight_data.data_ptr(),
            weight_data.shape, weight_data.stride(), weight_data.dtype,
            weight_scale.get_device(), weight_scale.data_ptr(), weight_scale.shape,
            weight_scale.stride(), weight_scale.dtype, elem_dtype_name, type(block_size),
            block_size, type(in_features), in_features,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device(),
                                       bias.data_ptr() & 15),
            out_dtype)


def kernel_linear(input, weight_scale, weight_data, fmt: dtypes.DType, block_size: int,
                  in_features: int, bias, out_dtype: torch.dtype, key: tuple) -> Tensor:
    """dispatch.linear on checked parts (the CUDA kernels usable), whose product is then bound
    for later calls of the same `key` (`_call_key`) where it can be."""
    out = kernels.linear(input, weight_scale, weight_data, fmt, block_size, in_features, bias,
                         out_dtype)
    if key not in _BOUND and input.is_cuda and not hooks_installed():
        memo(_BOUND, key, lambda: kernels.bound_linear(
            input, weight_scale, weight_data, fmt, block_size, in_features, bias,
            out_dtype) or False)
    return out


def bound_call(key: tuple, input, bias):
    """The call's output through its bound product (`kernel_linear`), or None where there is
    none (or a Triton launch hook wants the launches)."""
    product = _BOUND.get(key)  # (run with the input's device current: bound_product)
    if not product or not cuda_kernels_on() or hooks_installed():
        return None
    return product(input.data_ptr(), None if bias is None else bias.data_ptr())


@custom_op("torchmx::mx_weight_linear")
def mx_weight_linear(input: Tensor, weight_scale: Tensor, weight_data: Tensor,
                     elem_dtype_name: str, block_size: int, in_features: int,
                     bias: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
    """F.linear(input, W, bias) rounded once to out_dtype, W [N, K] the MX matrix with blocks
    along K given by its scale bytes and codes (see the module docstring)."""
    key = _call_key(input, weight_scale, weight_data, elem_dtype_name, block_size, in_features,
                    bias, out_dtype)
    out = bound_call(key, input, bias)
    if out is not None:
        return out
    fmt = _check_parts(input, weight_scale, weight_data, elem_dtype_name, block_size,
                       in_features, bias, out_dtype)
    if _kernels_usable(input.device):
        return kernel_linear(input, weight_scale, weight_data, fmt, block_size, in_features,
                             bias, out_dtype, key)
    weight = torch.ops.torchmx.dequantize_mx(weight_data, weight_scale, elem_dtype_name,
                                             block_size, torch.float32, 1,
                                             block_dim_size=in_features)
    return torch.ops.torchmx.mx_linear(input, weight, bias, out_dtype=out_dtype)


@mx_weight_linear.register_fake
def _mx_weight_linear_fake(input, weight_scale, weight_data, elem_dtype_name, block_size,
                           in_features, bias, out_dtype):
    return input.new_empty((*input.shape[:-1], weight_scale.shape[0]), dtype=out_dtype)


@custom_op("torchmx::mx_mx_linear")
def mx_mx_linear(input_scale: Tensor, input_data: Tensor, weight_scale: Tensor,
                 weight_data: Tensor, input_dtype_name: str, weight_dtype_name: str,
                 in_features: int) -> Tensor:
    """F.linear(x, W) rounded once to bf16 for the MX matrices x [M, K] and W [N, K] (blocks of
    32 along K) given by their scale bytes and codes: kernels/linear/mx_gemm.py's GEMM where it can
    run (`mx_gemm.eligible`), else x dequantized and mx_weight_linear."""
    from ..kernels.linear import mx_gemm
    x_fmt, w_fmt = (args.check_elem_dtype(n) for n in (input_dtype_name, weight_dtype_name))
    _check_devices(("input_scale", input_scale), ("input_data", input_data),
                   ("weight_scale", weight_scale), ("weight_data", weight_data))
    K = in_features
    x = torch.empty(input_scale.shape[0], K, dtype=torch.bfloat16, device="meta")  # its shape
    _check_parts(x, weight_scale, weight_data, weight_dtype_name, 32, K, None, torch.bfloat16,
                 "mx_mx_linear")
    _check_parts(x, input_scale, input_data, input_dtype_name, 32, K, None, torch.bfloat16,
                 "mx_mx_linear")
    if mx_gemm.eligible(input_data, input_scale, x_fmt, 32, weight_data, weight_scale, w_fmt,
                        32, torch.bfloat16):
        return mx_gemm.mx_gemm(input_data, input_scale, x_fmt, weight_data, weight_scale, w_fmt)
    x = torch.ops.torchmx.dequantize_mx(input_data, input_scale, input_dtype_name, 32,
                                        torch.bfloat16, 1, block_dim_size=K)
    return torch.ops.torchmx.mx_weight_linear(x, weight_scale, weight_data, weight_dtype_name,
                                              32, K, None, torch.bfloat16)


@mx_mx_linear.register_fake
def _mx_mx_linear_fake(input_scale, input_data, weight_scale, weight_data, input_dtype_name,
                       weight_dtype_name, in_features):
    return input_scale.new_empty((input_scale.shape[0], weight_scale.shape[0]),
                                 dtype=torch.bfloat16)


def _mx_gemm_route(a: MXTensor, scale: Tensor, data: Tensor, w: MXTensor, K: int, bias,
                   out_dtype: torch.dtype) -> Optional[Tensor]:
    """a @ W.T through mx_mx_linear where kernels/linear/mx_gemm.py's GEMM is preferred for this
    product (bf16, no bias, blocks of 32, a's blocks along K; W [N, K] by scale and data);
    else None."""
    from ..kernels.linear import mx_gemm
    if (bias is not None or out_dtype != torch.bfloat16 or a.block_size != 32
            or w.block_size != 32 or a.device.type != "cuda" or not mx_gemm.usable_on(a.device)):
        return None
    x_scale = a._scale_e8m0.reshape(-1, a._scale_e8m0.shape[-1])
    x_data = a._data.reshape(-1, a._data.shape[-1])
    M, N = x_scale.shape[0], scale.shape[0]
    if not (mx_gemm.preferred(a.elem_dtype, w.elem_dtype, M, N, a.device)
            and mx_gemm.eligible(x_data, x_scale, a.elem_dtype, 32, data, scale, w.elem_dtype,
                                 32, torch.bfloat16)):
        return None
    out = torch.ops.torchmx.mx_mx_linear(x_scale, x_data, scale, data, a.elem_dtype.name,
                                         w.elem_dtype.name, K)
    return out.reshape(*a.shape[:-1], N)


def route(a, b, bias=None, alpha=1, beta=1, *, out_dtype: torch.dtype) -> Optional[Tensor]:
    """alpha * (a @ b) + beta * bias through mx_weight_linear when that applies: b a 2-d
    MXTensor [K, N] blocked along K, alpha = beta = 1 (see `_route`). Otherwise None."""
    if alpha != 1 or (bias is not None and beta != 1):
        return None
    return _route(a, b, 0, bias, out_dtype)


def route_linear(x, weight, bias=None, *, out_dtype: torch.dtype) -> Optional[Tensor]:
    """F.linear(x, weight, bias) through mx_weight_linear when that applies: weight a 2-d
    MXTensor [N, K] blocked along K (see `_route`). Otherwise None."""
    return _route(x, weight, 1, bias, out_dtype)


def _route(a, w, k_dim: int, bias, out_dtype: torch.dtype) -> Optional[Tensor]:
    """The product of `a` [..., K] and the MX weight `w` (K along `k_dim`) plus a 1-d bias,
    when w is blocked along K on a kernel device, `a` is plain or blocked along its last dim,
    all share the logical dtype out_dtype, and the kernels take the format. Else None."""
    if not isinstance(w, MXTensor) or w.dim() != 2 or w.block_dim != k_dim:
        return None
    if not _kernels_usable(w.device) or a.dim() == 0 or isinstance(bias, MXTensor):
        return None
    if (bias is not None and bias.dim() != 1) or a.dtype != out_dtype or w.dtype != out_dtype:
        return None
    device = w._data.get_device()
    if a.get_device() != device or (bias is not None and bias.get_device() != device):
        return None  # the exact path reports the devices' mismatch as torch would
    if not kernels.supported(w.elem_dtype, w.block_size, out_dtype):
        return None
    scale, data = w._scale_e8m0, w._data
    if k_dim == 0:
        scale, data = scale.t(), data.t()
    if isinstance(a, MXTensor):
        if a.block_dim != a.dim() - 1:
            return None
        fast = _mx_gemm_route(a, scale, data, w, w.shape[k_dim], bias, out_dtype)
        if fast is not None:
            return fast
        a = dequantize(a, out_dtype)
    K = w.shape[k_dim]
    if short_path():  # the operator's body, its parts known consistent (one MXTensor's)
        if a.shape[-1] != K or (bias is not None and bias.shape[0] != scale.shape[0]):
            return None  # the exact path reports the mismatch as torch would
        key = _call_key(a, scale, data, w.elem_dtype.name, w.block_size, K, bias, out_dtype)
        out = bound_call(key, a, bias)
        if out is not None:
            return out
        return kernel_linear(a, scale, data, w.elem_dtype, w.block_size, K, bias, out_dtype, key)
    op = torch.ops.torchmx.mx_weight_linear
    # the launches inlined by inductor, where the input is on the current device: a backend
    # that runs the graph as it is (aot_eager) launches them with no switch of device
    if (a.is_cuda and _compiling_not_exporting() and weight_matmul_compiled.defined()
            and a.get_device() == torch.cuda.current_device()):
        op = torch.ops.torchmx.mx_weight_linear_triton
    return op(a, scale, data, w.elem_dtype.name, w.block_size, K, bias, out_dtype)


def _compiling_not_exporting() -> bool:
    """torch.compile traces the call (its graph capture or, for MXTensor's handlers, the
    dispatch that AOT autograd traces: a tracing context is open, which torch 2.11 does not
    flag as compiling), torch.export does not."""
    return ((torch.compiler.is_compiling() or _tracing_context() is not None)
            and not torch.compiler.is_exporting())


_tracing_context = torch._guards.TracingContext.try_get

"""The torch.library custom ops `torchmx::quantize_mx` and `torchmx::dequantize_mx`.

They keep torchmx 0.1.0's positional signatures; every new option is keyword-only with the
same name and default as in `MXTensor.to_mx` and the configs. The op bodies validate their
arguments and dispatch by device to the fastest backend proven bit-identical to the reference
numerics: the C kernels on CPU, the Triton kernels on CUDA, the reference anywhere else (or
when a backend is unavailable). TORCHMX_BACKEND=reference, set before torchmx is imported,
forces the reference.
"""

from typing import Optional, Tuple

import torch

from . import cpu_kernels, dtypes
from ._library import custom_op
from ._memo import memo
from .kernels.quantize import backends
from .kernels._launch import hooks_installed
from .kernels.quantize.backends import backend_for, triton_kernels
from .numerics import arguments as args
from .numerics.packing import packed_length
from .numerics.reference import (
    check_dequantize_arguments,
    dequantize_mx_reference,
    quantize_mx_reference,
)

__all__ = ["quantize_mx", "dequantize_mx", "backend_for"]


# The kinds of arguments the op bodies accepted (what their checks read: values, dtypes,
# shapes, devices) -> what the checks returned. Inductor runs an op's body at every step of a
# compiled graph; a kind checked once is looked up.
_ACCEPTED = {}
_MAX_ACCEPTED = 4096  # past this many kinds, the memo starts over


def _accepted(key, check, *arguments):
    result = _ACCEPTED.get(key)
    if result is None:
        result = check(*arguments)
        if len(_ACCEPTED) >= _MAX_ACCEPTED:
            _ACCEPTED.clear()
        _ACCEPTED[key] = result
    return result


# CUDA calls whose plan is one kernel launch on the call's tensors, after their first call:
# (everything the checks and the plan look at: the device, the tensors' shapes, strides,
# dtypes and alignments, the arguments as given) -> the plan's call bound to the device (run
# with that device current), or False where there is none (the Triton backend's BOUND_CALLS,
# dropped with its plans). A later call of the same kind is one lookup, its outputs'
# allocations and the launch.
def _bound_call(key: tuple):
    backend = triton_kernels()
    call = None if backend is None else backend.BOUND_CALLS.get(key)
    if call and not backends.FORCE_REFERENCE and not hooks_installed():
        return call
    return None


def _bind(key: tuple, kind: str, tensor: torch.Tensor, *arguments) -> None:
    if backend_for(tensor.device) != "triton":
        return
    backend = triton_kernels()
    table = backend.BOUND_CALLS
    if table.get(key) is None:
        call = backend.device_call(kind, tensor, *arguments)
        if call is not None:  # (None: the plan's call is not bound yet)
            memo(table, key, lambda: call)


def _validate_quantize(data_hp, elem_dtype_name, block_size, scale_mode, rounding, block_dim):
    elem_dtype = dtypes.from_name(elem_dtype_name)
    args.check_high_precision_input(data_hp)
    args.check_block_size(block_size)
    args.check_scale_mode(scale_mode)
    args.check_rounding(rounding)
    return elem_dtype, args.normalize_block_dim(block_dim, data_hp.dim())


@custom_op("torchmx::quantize_mx")
def quantize_mx(
    data_hp: torch.Tensor,
    elem_dtype_name: str,
    block_size: int,
    *,
    scale_mode: str = "floor",
    rounding: str = "even",
    block_dim: int = -1,
    seed: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize a fp32/bf16/fp16 tensor to MX: returns (scale_u8, data_lp).

    scale_u8 has data_hp's shape with the block axis reduced to ceil(n / block_size); data_lp
    holds the codes packed along the block axis (fp4: 2 per byte, low nibble first; fp6: 4 in 3
    bytes; others 1 byte, int8 as torch.int8). A 0-d input is treated as a 1-element vector.
    Stochastic rounding without a seed draws one from torch's default generator.
    """
    bound_key = None
    if data_hp.is_cuda and rounding != "stochastic":
        bound_key = (data_hp.get_device(), "quantize", data_hp.shape, data_hp.stride(),
                     data_hp.dtype, data_hp.data_ptr() & 15, elem_dtype_name, type(block_size),
                     block_size, scale_mode, rounding, type(block_dim), block_dim)
        call = _bound_call(bound_key)
        if call is not None:
            return call(data_hp)
    key = ("quantize", data_hp.dtype, data_hp.dim(), elem_dtype_name, type(block_size),
           block_size, scale_mode, rounding, type(block_dim), block_dim)
    accepted = _ACCEPTED.get(key)
    if accepted is None:
        accepted = _accepted(key, _validate_quantize, data_hp, elem_dtype_name, block_size,
                             scale_mode, rounding, block_dim)
    seed = args.resolve_seed(seed, rounding) if rounding == "stochastic" else None
    out = quantize_checked(data_hp, accepted[0], block_size, scale_mode, rounding, accepted[1],
                           seed)
    if bound_key is not None:
        _bind(bound_key, "quantize", data_hp, accepted[0], block_size, scale_mode, rounding,
              accepted[1], seed)
    return out


def _cpu_kernels_on() -> bool:
    return not backends.FORCE_REFERENCE and cpu_kernels.available()


def quantize_checked(data_hp: torch.Tensor, elem_dtype: dtypes.DType, block_size: int,
                     scale_mode: str, rounding: str, axis: int, seed: Optional[int]
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """quantize_mx's body after its checks (the format resolved, the block axis non-negative,
    the seed drawn): the backend of data_hp's device. For callers whose arguments are known
    valid (MXTensor.to_mx's own checks)."""
    if data_hp.is_cpu and _cpu_kernels_on():
        return cpu_kernels.quantize(data_hp, elem_dtype, block_size, scale_mode, rounding, axis,
                                    seed)
    if backend_for(data_hp.device) == "triton":
        return triton_kernels().quantize(
            data_hp, elem_dtype, block_size, scale_mode, rounding, axis, seed)
    return quantize_mx_reference(data_hp, elem_dtype, block_size, scale_mode=scale_mode,
                                 rounding=rounding, block_dim=axis, seed=seed)


@quantize_mx.register_fake
def _quantize_mx_fake(data_hp, elem_dtype_name, block_size, *, scale_mode="floor",
                      rounding="even", block_dim=-1, seed=None):
    elem_dtype, axis = _validate_quantize(
        data_hp, elem_dtype_name, block_size, scale_mode, rounding, block_dim)
    shape = [1] if data_hp.dim() == 0 else list(data_hp.shape)
    n = shape[axis]
    scale_shape, data_shape = list(shape), list(shape)
    scale_shape[axis] = -(-n // block_size)  # ceil, with no n + block_size - 1 to overflow
    data_shape[axis] = packed_length(n, elem_dtype)
    scale = data_hp.new_empty(scale_shape, dtype=torch.uint8)
    return scale, data_hp.new_empty(data_shape, dtype=elem_dtype.storage_dtype)


@custom_op("torchmx::dequantize_mx")
def dequantize_mx(
    data_lp: torch.Tensor,
    shared_exp_e8m0: torch.Tensor,
    elem_dtype_name: str,
    block_size: int,
    target_dtype: torch.dtype = torch.float32,
    block_dim: int = -1,
    *,
    block_dim_size: Optional[int] = None,
) -> torch.Tensor:
    """Dequantize packed MX data: decode(code) * 2**(b - 127) exactly, one rounding to
    target_dtype (fp32, bf16 or fp16); scale byte 255 gives NaN.

    `block_dim_size` is the number of elements along block_dim; by default the data is taken to
    hold whole packing groups (only fp4 and fp6 can be ambiguous).
    """
    bound_key = None
    if data_lp.is_cuda:
        bound_key = (data_lp.get_device(), "dequantize", data_lp.shape, data_lp.stride(),
                     data_lp.dtype, data_lp.data_ptr() & 15, shared_exp_e8m0.shape,
                     shared_exp_e8m0.stride(), shared_exp_e8m0.dtype,
                     shared_exp_e8m0.data_ptr() & 15, shared_exp_e8m0.device, elem_dtype_name,
                     type(block_size), block_size, target_dtype, type(block_dim), block_dim,
                     type(block_dim_size), block_dim_size)
        call = _bound_call(bound_key)
        if call is not None:
            return call(data_lp, shared_exp_e8m0)
    key = ("dequantize", data_lp.dtype, data_lp.shape, data_lp.device, shared_exp_e8m0.dtype,
           shared_exp_e8m0.shape, shared_exp_e8m0.device, elem_dtype_name, type(block_size),
           block_size, target_dtype, type(block_dim), block_dim, type(block_dim_size),
           block_dim_size)
    accepted = _ACCEPTED.get(key)
    if accepted is None:
        accepted = _accepted(key, check_dequantize_arguments, data_lp, shared_exp_e8m0,
                             elem_dtype_name, block_size, target_dtype, block_dim,
                             block_dim_size)
    elem_dtype, axis, n = accepted
    out = dequantize_checked(data_lp, shared_exp_e8m0, elem_dtype, block_size, target_dtype,
                             axis, n)
    if bound_key is not None:
        _bind(bound_key, "dequantize", data_lp, shared_exp_e8m0, elem_dtype, block_size,
              target_dtype, axis, n)
    return out


def dequantize_checked(data_lp: torch.Tensor, shared_exp_e8m0: torch.Tensor,
                       elem_dtype: dtypes.DType, block_size: int, target_dtype: torch.dtype,
                       axis: int, n: int) -> torch.Tensor:
    """dequantize_mx's body after its checks (the format resolved, the block axis
    non-negative, the elements along it counted): the backend of data_lp's device. For
    callers whose parts are known consistent (an MXTensor's)."""
    if data_lp.is_cpu and _cpu_kernels_on():
        return cpu_kernels.dequantize(
            data_lp, shared_exp_e8m0, elem_dtype, block_size, target_dtype, axis, n)
    if backend_for(data_lp.device) == "triton":
        return triton_kernels().dequantize(
            data_lp, shared_exp_e8m0, elem_dtype, block_size, target_dtype, axis, n)
    return dequantize_mx_reference(data_lp, shared_exp_e8m0, elem_dtype, block_size, target_dtype,
                                   axis, block_dim_size=n)


@dequantize_mx.register_fake
def _dequantize_mx_fake(data_lp, shared_exp_e8m0, elem_dtype_name, block_size,
                        target_dtype=torch.float32, block_dim=-1, *, block_dim_size=None):
    _, axis, n = check_dequantize_arguments(
        data_lp, shared_exp_e8m0, elem_dtype_name, block_size, target_dtype, block_dim,
        block_dim_size)
    shape = list(data_lp.shape)
    shape[axis] = n
    return data_lp.new_empty(shape, dtype=target_dtype)

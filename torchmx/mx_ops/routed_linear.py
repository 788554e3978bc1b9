"""Routed (token, expert) pairs times their experts' MX weights: torchmx::mx_routed_linear.

    mx_routed_linear(input, experts, weight_scale, weight_data, elem_dtype_name, block_size,
                     bias, per_row, swiglu_alpha, swiglu_limit)

row p of the result = F.linear(input[p // per_row], W[experts[p]], bias[experts[p]]), rounded
once to input's dtype, for the 3-D MX weight W [E, N, K] (blocks along K) given by its scale
bytes [E, N, K / block_size] and codes [E, N, packed(K)], experts int [P = T * per_row] in
[0, E). An index outside [0, E) is a ValueError on CPU; on a GPU, where checking the indices
would wait for the device, the kernel gives that pair's row NaN and reads no memory outside
the weight. With swiglu_alpha and swiglu_limit, the rows are gpt-oss's interleaved gate / up
and the result is its gated activation [P, N / 2] (kernels/linear/routed_gemv.py states the
roundings). On CUDA (where
`usable` says so) one launch of that kernel; elsewhere the same computed from the routed
experts' dequantized weights (exact products, fp32 sums, the same roundings in torch ops).
An operator so that torch.compile and CUDA graphs see one opaque call.
"""

from typing import Optional

import torch
from torch import Tensor

from .._library import custom_op
from .._memo import memo
from ..numerics import arguments as args
from ..numerics.packing import packed_length
from .weight_matmul import _kernels_usable

__all__ = ["mx_routed_linear", "usable", "usable_on"]


def usable_on(device: torch.device) -> bool:
    """Whether the routed kernels run on `device` at all (read at every call: the backend and
    the kernels' devices can change in a process)."""
    return _kernels_usable(device)


# what routed_eligible depends on (shapes, strides, dtypes, device, format, pairs) -> its answer
_ELIGIBLE = {}


def usable(input: Tensor, weight_scale: Tensor, weight_data: Tensor, elem_dtype_name: str,
           block_size: int, pairs: int) -> bool:
    """Whether mx_routed_linear runs the routed kernels for these operands."""
    if not _kernels_usable(input.device):
        return False
    key = (input.shape, input.stride(), input.dtype, input.device, weight_scale.shape,
           weight_scale.stride(), weight_data.shape, weight_data.stride(), weight_data.dtype,
           elem_dtype_name, block_size, pairs)
    from ..kernels.linear import dispatch
    return memo(_ELIGIBLE, key, lambda: dispatch.routed_eligible(
        input, weight_scale, weight_data, args.check_elem_dtype(elem_dtype_name), block_size,
        pairs))


def _gate(h: Tensor, alpha: float, limit: float) -> Tensor:
    """transformers' GptOssExperts._apply_gate on interleaved gate / up rows."""
    gate, up = h[..., ::2], h[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def _check_routing(input: Tensor, experts: Tensor, weight_scale: Tensor, weight_data: Tensor,
                   fmt, block_size: int, bias: Optional[Tensor], per_row: int) -> None:
    """Shapes and dtypes that keep every read of the kernel inside its operands (host-side
    metadata only: no device work)."""
    if experts.dtype.is_floating_point or experts.dtype.is_complex or experts.dtype == torch.bool:
        raise TypeError(f"mx_routed_linear: experts must hold integers, got {experts.dtype}")
    if not isinstance(per_row, int) or per_row < 1:
        raise ValueError(f"mx_routed_linear: per_row must be a positive int, got {per_row!r}")
    if experts.numel() != input.shape[0] * per_row:
        raise ValueError(f"mx_routed_linear: experts must hold input rows x per_row = "
                         f"{input.shape[0]} x {per_row} indices, got {experts.numel()}")
    E, N, blocks_k = weight_scale.shape
    if weight_data.shape[:2] != (E, N):
        raise ValueError(f"mx_routed_linear: weight_data {tuple(weight_data.shape)} and "
                         f"weight_scale {tuple(weight_scale.shape)} disagree on experts and rows")
    if blocks_k != -(-input.shape[1] // block_size):
        raise ValueError(f"mx_routed_linear: input has {input.shape[1]} columns, the weight "
                         f"{blocks_k} blocks of {block_size}")
    if weight_data.dtype != torch.uint8 or weight_data.shape[2] != packed_length(
            input.shape[1], fmt):
        raise ValueError(f"mx_routed_linear: weight_data must hold uint8 codes [E, N, "
                         f"{packed_length(input.shape[1], fmt)}], got {weight_data.dtype} "
                         f"{tuple(weight_data.shape)}")
    if bias is not None and tuple(bias.shape) != (E, N):
        raise ValueError(f"mx_routed_linear: bias must be [{E}, {N}], got {tuple(bias.shape)}")


@custom_op("torchmx::mx_routed_linear")
def mx_routed_linear(input: Tensor, experts: Tensor, weight_scale: Tensor, weight_data: Tensor,
                     elem_dtype_name: str, block_size: int, bias: Optional[Tensor],
                     per_row: int, swiglu_alpha: Optional[float],
                     swiglu_limit: Optional[float]) -> Tensor:
    """See the module docstring."""
    fmt = args.check_elem_dtype(elem_dtype_name)
    if weight_scale.dim() != 3 or weight_data.dim() != 3 or input.dim() != 2:
        raise ValueError(f"mx_routed_linear: expected input [T, K] and 3-D weight parts, got "
                         f"{tuple(input.shape)}, {tuple(weight_scale.shape)} and "
                         f"{tuple(weight_data.shape)}")
    if (swiglu_alpha is None) != (swiglu_limit is None):
        raise ValueError("mx_routed_linear: swiglu_alpha and swiglu_limit go together")
    _check_routing(input, experts, weight_scale, weight_data, fmt, block_size, bias, per_row)
    swiglu = None if swiglu_alpha is None else (float(swiglu_alpha), float(swiglu_limit))
    flat = experts.reshape(-1)
    if usable(input, weight_scale, weight_data, elem_dtype_name, block_size, flat.numel()):
        from ..kernels.linear import dispatch
        return dispatch.routed_linear(input, flat, weight_scale, weight_data, fmt, block_size,
                                      bias, per_row, swiglu)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= weight_scale.shape[0]):
        raise ValueError(f"mx_routed_linear: experts must lie in [0, {weight_scale.shape[0]}), "
                         f"got values from {int(flat.min())} to {int(flat.max())}")
    K = input.shape[1]
    weight = torch.ops.torchmx.dequantize_mx(weight_data[flat], weight_scale[flat],
                                             elem_dtype_name, block_size, torch.float32, 2,
                                             block_dim_size=K)
    rows = input[torch.arange(flat.numel(), device=input.device) // per_row].float()
    out = torch.bmm(weight, rows[:, :, None])[:, :, 0]
    if bias is not None:
        out = out + bias[flat].to(input.dtype).float()
    out = out.to(input.dtype)
    return out if swiglu is None else _gate(out, *swiglu)


@mx_routed_linear.register_fake
def _mx_routed_linear_fake(input, experts, weight_scale, weight_data, elem_dtype_name,
                           block_size, bias, per_row, swiglu_alpha, swiglu_limit):
    n = weight_scale.shape[1] // (1 if swiglu_alpha is None else 2)
    return input.new_empty((experts.numel(), n))

"""MXLinear: a trainable drop-in for nn.Linear with MX quantization-aware training (QAT).

Forward: the input (per `activations_config`) and the weight (per `weights_config`) are
quantized with blocks along K and dequantized exactly, then multiplied in high precision
(the exact product of the MX operands, as an MX GEMM computes it). Backward: straight-through
(the gradient of F.linear at the quantized operands); with `grad_config` the operands of the
two backward GEMMs are quantized along their reduction dims (QLinearGradConfig).
"""

import sys
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .._eager import short_path
from ..config import QLinearConfig
from ..kernels._launch import hooks_installed
from ..kernels.quantize.backends import backend_for, triton_kernels
from ..mx_tensor import MXTensor
from ..numerics import arguments as args
from . import arguments
from .functional import fake_quantize

__all__ = ["MXLinear", "mx_linear"]


def check_qconfig(qconfig) -> QLinearConfig:
    if not isinstance(qconfig, QLinearConfig):
        raise TypeError(f"qconfig must be a torchmx.config.QLinearConfig, got {type(qconfig).__name__}")
    return qconfig


def check_linear(linear, arg: str = "linear") -> nn.Linear:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{arg} must be a torch.nn.Linear, got {type(linear).__name__}")
    return linear


class _MXLinearFunction(torch.autograd.Function):
    """y = fq(x) @ fq(w)^T + b; backward per qconfig.grad_config (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, qconfig):
        x_q = fake_quantize(x, qconfig.activations_config, -1)
        gathered = _gathered_mx(weight)
        w_q = (fake_quantize(weight, qconfig.weights_config, -1) if gathered is None
               else _dequantized_weight(weight, gathered))
        grad = qconfig.grad_config
        # Backward requantizes the high-precision operand when its role has a config, else it
        # reuses the forward's quantized operand (straight-through).
        x_saved = x if grad is not None and grad.wgrad_input_config is not None else x_q
        w_saved = weight if grad is not None and grad.dgrad_weight_config is not None else w_q
        if gathered is not None:  # FSDP2 frees and re-gathers it: keep no copy
            w_saved = weight
        ctx.save_for_backward(x_saved, w_saved)
        ctx.grad_config = grad
        # w_q has the weight's dtype (an MXTensor weight's own would cost a __torch_function__)
        ctx.dtypes = (x.dtype, w_q.dtype, None if bias is None else bias.dtype)
        return _product(x_q, w_q, bias)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        gathered = _gathered_mx(weight)
        if gathered is not None:
            weight = _dequantized_weight(weight, gathered)
        x_dtype, weight_dtype, bias_dtype = ctx.dtypes
        cfg = ctx.grad_config
        g = grad_output.reshape(-1, grad_output.shape[-1])  # (tokens M, out_features N)
        dtype = g.dtype
        grad_x = grad_w = grad_b = None
        needs = ctx.needs_input_grad
        if needs[0]:  # dgrad: (M, N) @ (N, K), reduces over N
            g_d = _requantized(g, cfg and cfg.dgrad_grad_output_config, -1)
            w_d = _requantized(weight, cfg and cfg.dgrad_weight_config, 0)
            grad_x = _cast((g_d @ _cast(w_d, dtype)).reshape(*grad_output.shape[:-1], -1),
                           x_dtype)
        if needs[1]:  # wgrad: (N, M) @ (M, K), reduces over the tokens M
            x2 = x.reshape(-1, x.shape[-1])
            g_w = _requantized(g, cfg and cfg.wgrad_grad_output_config, 0)
            x_w = _requantized(x2, cfg and cfg.wgrad_input_config, 0)
            grad_w = _cast(g_w.t() @ _cast(x_w, dtype), weight_dtype)
        if bias_dtype is not None and needs[2]:
            grad_b = _cast(g.sum(0), bias_dtype)
        return grad_x, grad_w, grad_b, None


# The backward runs at every step of every layer: these two skip calls that would change
# nothing (no config for the role; the dtype already right), a host-time matter only.
def _requantized(t: torch.Tensor, config, block_dim: int) -> torch.Tensor:
    return t if config is None else fake_quantize(t, config, block_dim)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _gathered_mx(weight) -> Optional[MXTensor]:
    """The MXTensor FSDP2 all-gathered as this weight (torchmx.distributed.MXAllGatherWeight,
    already quantized per weights_config): the weight itself or, with tensor parallelism, the
    DTensor's local tensor; None for any other weight."""
    if isinstance(weight, MXTensor):
        return weight
    # a DTensor only exists once torch.distributed.tensor is imported (torchmx does not)
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(weight, dtensor.DTensor) \
            and isinstance(weight._local_tensor, MXTensor):
        return weight._local_tensor
    return None


def _dequantized_weight(weight, gathered: MXTensor) -> torch.Tensor:
    """The gathered weight's values (`gathered` from _gathered_mx), a DTensor of the same
    placements where the weight is one."""
    if gathered is weight:
        return _dequantized(weight)
    return type(weight).from_local(_dequantized(gathered), weight.device_mesh, weight.placements,
                                   run_check=False, shape=weight.shape, stride=weight.stride())


def _dequantized(weight: MXTensor) -> torch.Tensor:
    """weight.dequantize(); in eager mode on CUDA, a gathered weight's rows (blocks along
    in_features) straight through the Triton backend's dequantize plan, made once per weight
    object and kept on it: FSDP2 gathers every step into the same unsharded parameter, and the
    operator layer's checks and plan lookup would repeat, at every forward and backward, what
    the gather settled (shapes, dtypes, format). After its first call the plan is bound
    (DequantizePlan.bound: its kernel launched on the tensors' addresses, with their device
    made current), called while no Triton launch hook is installed."""
    if not short_path():  # traced (torch.compile, export, modes): the operator
        return weight.dequantize()
    data, scale = weight._data, weight._scale_e8m0
    where = (data.get_device(), data.data_ptr() & 15, scale.data_ptr() & 15)
    cached = weight.__dict__.get("_torchmx_dequantize")
    if cached is not None and cached[1] == where:  # the plan was made for this device, alignment
        plan, _, bound = cached
        if bound and not hooks_installed():
            return bound(data, scale)
        out = plan(data, scale)
        if bound is None:  # bound once, after the plan's first call
            weight.__dict__["_torchmx_dequantize"] = (plan, where,
                                                      plan.bound(data, scale) or False)
        return out
    if data.is_cuda and data.dim() == 2 and weight._block_dim == 1 \
            and backend_for(data.device) == "triton":
        plan = triton_kernels().DequantizePlan(data, scale, weight._elem_dtype,
                                               weight._block_size, weight.dtype, 1,
                                               weight.shape[1])
        weight.__dict__["_torchmx_dequantize"] = (plan, where, None)
        return plan(data, scale)
    return weight.dequantize()


def _product(x_q, w_q, bias):
    """F.linear(x_q, w_q, bias). On CPU outside autocast it runs as torch.ops.torchmx.mx_linear
    (fp32 sums, one rounding), the op MXInferenceLinear's CPU forward ends in: a packed layer
    then sums the same products in the same order and gives the QAT output bit for bit (F.linear's
    addmm starts the BLAS's sums from the bias, so once K spans several BLAS K blocks, from
    K = 256 on CPU, the bias is added before the last blocks: 1 ulp apart). Elsewhere, and
    for operands of mixed dtypes (F.linear's error), F.linear as nn.Linear runs it."""
    dtypes = {x_q.dtype, w_q.dtype} | ({bias.dtype} if bias is not None else set())
    if x_q.device.type == "cpu" and not torch.is_autocast_enabled("cpu") and len(dtypes) == 1:
        return torch.ops.torchmx.mx_linear(x_q, w_q, bias, out_dtype=x_q.dtype)
    return F.linear(x_q, w_q, bias)


def mx_linear(x: torch.Tensor, weight: torch.Tensor, bias, qconfig: QLinearConfig) -> torch.Tensor:
    """F.linear with MX quantization-aware forward and backward (see MXLinear)."""
    check_qconfig(qconfig)
    args.check_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"mx_linear: weight must be 2-d (out_features, in_features), got shape "
                         f"{tuple(weight.shape)}")
    if bias is not None:
        args.check_tensor(bias, "bias")
    arguments.check_linear_input("mx_linear", x, weight.shape[-1])
    return _MXLinearFunction.apply(x, weight, bias, qconfig)


class MXLinear(nn.Linear):
    """nn.Linear whose forward and (optionally) backward GEMMs see MX-quantized operands.

    The parameters stay in high precision (the optimizer's master weights); only the GEMM
    operands are quantized. Build one like nn.Linear plus `qconfig=`, or swap an existing layer
    with `MXLinear.from_float(linear, qconfig)` (the parameters are shared, not copied, so an
    optimizer built before the swap keeps working). `to_float()` gives the nn.Linear back.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, qconfig: QLinearConfig):
        arguments.check_features("MXLinear", in_features=in_features, out_features=out_features)
        arguments.check_bias_flag("MXLinear", bias)
        arguments.check_dtype("MXLinear", dtype)
        arguments.check_device("MXLinear", device)
        check_qconfig(qconfig)
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.qconfig = qconfig

    @classmethod
    def from_float(cls, linear: nn.Linear, qconfig: QLinearConfig) -> "MXLinear":
        check_linear(linear)
        check_qconfig(qconfig)
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                      qconfig=qconfig)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def to_float(self) -> nn.Linear:
        """A plain nn.Linear sharing this layer's parameters."""
        with torch.device("meta"):
            linear = nn.Linear(self.in_features, self.out_features, self.bias is not None)
        linear.weight = self.weight
        linear.bias = self.bias
        linear.train(self.training)
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        arguments.check_linear_input(
            lambda: f"MXLinear(in_features={self.in_features}, out_features={self.out_features})",
            x, self.in_features)
        return _MXLinearFunction.apply(x, self.weight, self.bias, self.qconfig)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {describe_qconfig(self.qconfig)}"


def describe_qconfig(qconfig: QLinearConfig) -> str:
    """A short text form: weights=float4_e2m1/32, activations=float8_e4m3/32, grads=..."""

    def short(cfg):
        if cfg is None:
            return "none"
        text = f"{cfg.elem_dtype_name}/{cfg.block_size}"
        if cfg.scale_mode != "floor":
            text += f"/{cfg.scale_mode}"
        if cfg.rounding != "even":
            text += f"/{cfg.rounding}"
        return text

    parts = [f"weights={short(qconfig.weights_config)}",
             f"activations={short(qconfig.activations_config)}"]
    grad = qconfig.grad_config
    if grad is not None:
        roles = [grad.dgrad_grad_output_config, grad.dgrad_weight_config,
                 grad.wgrad_grad_output_config, grad.wgrad_input_config]
        if all(r == roles[0] for r in roles):
            parts.append(f"grads={short(roles[0])}")
        else:
            parts.append("grads=(" + ", ".join(short(r) for r in roles) + ")")
    return ", ".join(parts)

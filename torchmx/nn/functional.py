"""Functional helpers shared by the MX layers (no autograd of their own)."""

from typing import Optional

import torch

from .._eager import short_path
from ..config import MXConfig
from ..kernels.quantize.backends import backend_for, triton_kernels
from ..numerics import arguments as args
from .arguments import check_mx_config


def fake_quantize(x: torch.Tensor, config: Optional[MXConfig], block_dim: int = -1) -> torch.Tensor:
    """The MX values of `x` (quantized per `config` with blocks along `block_dim`), exact in
    fp32 and rounded once to x's dtype. MX values of every built-in format are exact in bf16 and
    fp32, so that rounding only matters for fp16 outputs. `config=None` returns `x` unchanged.

    Calls the custom ops (plain tensors in and out), so it traces into any graph. In eager
    mode on CUDA, blocks along the last dim of a contiguous x take one fused Triton pass
    instead (the same bits; QAT runs this on every activation, so its host time counts).
    """
    check_mx_config(config)
    args.check_tensor(x, "x")
    if config is None:
        return x
    if (type(x) is torch.Tensor and x.is_cuda and block_dim in (-1, x.dim() - 1) and short_path(x)
            and x.dtype in args.HIGH_PRECISION_DTYPES and backend_for(x.device) == "triton"):
        kernels = triton_kernels()
        if kernels.fake_quantize_supported(x, config.block_size, config.rounding):
            return kernels.fake_quantize_rows(x, config.elem_dtype, config.block_size,
                                              config.scale_mode, config.rounding)
    n = 1 if x.dim() == 0 else x.shape[block_dim]
    scale, data = config.quantize(x, block_dim)
    # The element count is only needed where the codes end in a partial packing group; left
    # out, a DTensor sharded along the blocks dequantizes shard by shard (sharding_rules.py).
    out = torch.ops.torchmx.dequantize_mx(
        data, scale, config.elem_dtype_name, config.block_size, x.dtype, block_dim,
        block_dim_size=n if n % config.elem_dtype.codes_per_group else None)
    return out.reshape(x.shape)

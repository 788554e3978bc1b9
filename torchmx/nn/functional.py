"""Functional helpers shared by the MX layers (no autograd of their own)."""

from typing import Optional

import torch

from ..config import MXConfig
from ..numerics import arguments as args
from .arguments import check_mx_config


def fake_quantize(x: torch.Tensor, config: Optional[MXConfig], block_dim: int = -1) -> torch.Tensor:
    """The MX values of `x` (quantized per `config` with blocks along `block_dim`), exact in
    fp32 and rounded once to x's dtype. MX values of every built-in format are exact in bf16 and
    fp32, so that rounding only matters for fp16 outputs. `config=None` returns `x` unchanged.

    Calls the custom ops directly (plain tensors in and out), so it traces into any graph.
    """
    check_mx_config(config)
    args.check_tensor(x, "x")
    if config is None:
        return x
    n = 1 if x.dim() == 0 else x.shape[block_dim]
    scale, data = config.quantize(x, block_dim)
    out = torch.ops.torchmx.dequantize_mx(data, scale, config.elem_dtype_name, config.block_size,
                                          x.dtype, block_dim, block_dim_size=n)
    return out.reshape(x.shape)

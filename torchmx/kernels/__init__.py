"""GPU kernels (Triton) and vendor scale layouts for MX tensors.

- `quantize_mx_rowwise_colwise`: one pass over a matrix producing both its row-wise (blocks
  along dim -1) and column-wise (blocks along dim -2) MX copies, as training needs.
- `layouts`: exporters of the E8M0 scales (and fp4 data) to the layouts that vendor GEMMs read
  (NVIDIA cuBLAS/CUTLASS "to_blocked", AMD aiter shuffles), with exact inverses, and the
  prepacked weight layouts of the linear kernels.
- `quantize`: the Triton quantize / dequantize kernels behind torch.ops.torchmx.quantize_mx /
  dequantize_mx (imported lazily; need Triton) and the choice of backend by device.
- `linear`: the MX-weight linear kernels and the dispatch that picks one for a product.
- `_common`, `_launch`, `_tl_numerics`: what the kernel modules share.
"""

from typing import Tuple, Union

import torch

from .. import dtypes
from ..numerics import arguments as args
from . import layouts
from .quantize.backends import backend_for

__all__ = ["quantize_mx_rowwise_colwise", "layouts"]


def quantize_mx_rowwise_colwise(
    data_hp: torch.Tensor,
    elem_dtype: Union[dtypes.DType, str],
    block_size: int = 32,
    *,
    scale_mode: str = "floor",
    rounding: str = "even",
    seed: Union[int, torch.Generator, None] = None,
) -> Tuple[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]:
    """((scale_r, data_r), (scale_c, data_c)) of a tensor with at least 2 dims: exactly
    `torch.ops.torchmx.quantize_mx(data_hp, ..., block_dim=-1)` and `(..., block_dim=-2)` with
    the same seed, computed on CUDA in one read of the input.

    Stochastic rounding without a seed draws one from torch's default generator and uses it
    for both copies (an element gets the same random number in both).
    """
    fmt = args.check_elem_dtype(elem_dtype)
    args.check_high_precision_input(data_hp)
    args.check_block_size(block_size)
    args.check_scale_mode(scale_mode)
    args.check_rounding(rounding)
    if data_hp.dim() < 2:
        raise ValueError(f"data_hp must have at least 2 dims for row-wise and column-wise "
                         f"copies, got shape {tuple(data_hp.shape)}")
    seed = args.resolve_seed(seed, rounding)
    from .quantize import triton_backend
    if backend_for(data_hp.device) == "triton":
        return triton_backend.quantize_rowwise_colwise(data_hp, fmt, block_size, scale_mode,
                                                       rounding, seed)
    op = torch.ops.torchmx.quantize_mx
    return tuple(op(data_hp, fmt.name, block_size, scale_mode=scale_mode, rounding=rounding,
                    block_dim=dim, seed=seed) for dim in (-1, -2))

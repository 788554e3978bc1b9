"""DTensor sharding rules for torchmx's operators, so that MXLinear QAT runs under PyTorch's
own tensor parallelism (`parallelize_module` with ColwiseParallel / RowwiseParallel).

An MXLinear forward on DTensors calls `torchmx::quantize_mx` and `torchmx::dequantize_mx`
(fake quantize of the input and the weight) and, on CPU, `torchmx::mx_linear` (the product);
DTensor runs each on the local shards when the placements below allow it, and otherwise
redistributes to one that does (replicating, at worst: still exact, only slower).

- quantize / dequantize: any dim but the block dim may be sharded (the blocks stay whole);
  the block dim only where every shard holds whole blocks and whole packing groups
  (row-wise: in_features / ranks a multiple of lcm(block size, codes per group)).
- mx_linear: replicated; column-wise (weight and bias rows sharded, output columns sharded);
  row-wise (input's last dim and weight columns sharded, partial sums all-reduced: the same
  exact products, fp32 sums in another order); batch dims sharded with the weight replicated.
"""

import math

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

from .. import dtypes
from ..mx_ops import matmul as _matmul  # noqa: F401  (defines torchmx::mx_linear)
from .. import ops as _ops  # noqa: F401  (defines torchmx::quantize_mx / dequantize_mx)

__all__ = []

_torchmx = torch.ops.torchmx


def _whole_blocks(spec, axis: int, elements: int, block_size: int, elem_dtype_name: str) -> bool:
    """Whether splitting `elements` along `axis` over the mesh leaves whole blocks and whole
    packing groups on every rank."""
    fmt = dtypes.from_name(elem_dtype_name)
    ranks = math.prod(spec.mesh.shape)
    return elements % (ranks * math.lcm(block_size, fmt.codes_per_group)) == 0


@register_sharding(_torchmx.quantize_mx.default)
def _quantize_sharding(x, elem_dtype_name, block_size, *, scale_mode="floor", rounding="even",
                       block_dim=-1, seed=None):
    axis = block_dim % max(len(x.shape), 1)
    rules = [([Replicate(), Replicate()], [Replicate()])]
    for d in range(len(x.shape)):
        if d != axis or _whole_blocks(x, d, x.shape[d], block_size, elem_dtype_name):
            rules.append(([Shard(d), Shard(d)], [Shard(d)]))
    return rules


@register_sharding(_torchmx.dequantize_mx.default)
def _dequantize_sharding(data, scale, elem_dtype_name, block_size, target_dtype=None,
                         block_dim=-1, *, block_dim_size=None):
    axis = block_dim % len(data.shape)
    rules = [([Replicate()], [Replicate(), Replicate()])]
    for d in range(len(data.shape)):
        # along the block dim each shard must hold whole blocks and groups, and the local call
        # must count its elements itself (a block_dim_size would be the whole tensor's)
        if d != axis or (block_dim_size is None and _whole_blocks(
                data, d, scale.shape[d] * block_size, block_size, elem_dtype_name)):
            rules.append(([Shard(d)], [Shard(d), Shard(d)]))
    return rules


@register_sharding(_torchmx.mx_linear.default)
def _mx_linear_sharding(x, weight, bias=None, *, out_dtype):
    last = len(x.shape) - 1
    b = (lambda placement: None) if bias is None else (lambda placement: placement)
    rules = [
        ([Replicate()], [Replicate(), Replicate(), b(Replicate())]),
        ([Shard(last)], [Replicate(), Shard(0), b(Shard(0))]),  # column-wise
        ([Partial()], [Shard(last), Shard(1), b(Partial())]),  # row-wise
    ]
    for d in range(last):  # batch dims
        rules.append(([Shard(d)], [Shard(d), Replicate(), b(Replicate())]))
    return rules

"""torchmx with PyTorch's distributed engines (docs/distributed.md).

- FSDP2 (`fully_shard`) QAT: `enable_mx_all_gather(model)` before `fully_shard` makes every
  MXLinear's weight all-gather as MX bytes (`MXAllGatherWeight`) instead of high precision.
- FSDP2 for MXInferenceLinear: `prepare_fsdp_inference_(model)` before `fully_shard` keeps
  each packed weight in one uint8 Parameter that FSDP2 shards by rows and gathers as bytes.
- Tensor parallel for MXInferenceLinear: `parallelize_mx_inference_linear` shards the packed
  weight column-wise or row-wise as DTensors (scales with their data, K-blocks whole).
- Tensor parallel MXLinear QAT: PyTorch's own `parallelize_module` (ColwiseParallel,
  RowwiseParallel) once this module is imported (it registers the torchmx ops' DTensor
  sharding rules, `sharding_rules`).
- `torch.distributed.checkpoint` saves and loads both kinds of sharded models (N ranks to M).

Importing this module imports torch.distributed; `import torchmx` does not.
"""

import math
from typing import List

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate, Shard

from ..nn.mx_linear import MXLinear
from . import sharding_rules  # noqa: F401  (DTensor rules of the torchmx ops: MXLinear TP)
from .all_gather_weight import MXAllGatherWeight, plain_state_dict
from .fsdp_inference import MXShardedInferenceLinear, prepare_fsdp_inference_
from .tensor_parallel import MXParallelInferenceLinear, parallelize_mx_inference_linear

__all__ = ["MXAllGatherWeight", "enable_mx_all_gather", "MXShardedInferenceLinear",
           "prepare_fsdp_inference_", "MXParallelInferenceLinear",
           "parallelize_mx_inference_linear"]


def enable_mx_all_gather(model: nn.Module) -> List[str]:
    """Wrap the weight of every MXLinear in `model` in MXAllGatherWeight (in place) and return
    the layers' names.

    Call it before `fully_shard` and before building the optimizer (the weights become new
    Parameter objects holding the same values); with tensor parallelism, after
    `parallelize_module`: a DTensor weight keeps its placements and its local shard is wrapped.
    Layers whose backward requantizes the high-precision weight (`grad_config.dgrad_weight_config`
    set) keep gathering it in high precision and are left out, and so are tensor-parallel
    weights whose shards would split blocks (sharded along in_features into pieces that are not
    whole blocks and packing groups, or unevenly). The layers' state dicts hold the plain
    high-precision weights (a checkpoint needs neither torchmx nor this wrapper to be read).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ValueError("model: call enable_mx_all_gather before fully_shard (FSDP2 already "
                         "holds the weights it would wrap)")
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, MXLinear):
            continue
        weight = module.weight
        local = weight._local_tensor if isinstance(weight, DTensor) else weight
        if isinstance(local, MXAllGatherWeight):
            continue
        grad = module.qconfig.grad_config
        if grad is not None and grad.dgrad_weight_config is not None:
            continue
        config = module.qconfig.weights_config
        if isinstance(weight, DTensor) and not _whole_blocks_per_shard(weight, config):
            continue
        wrapped = MXAllGatherWeight(local.detach(), config)
        if isinstance(weight, DTensor):
            wrapped = DTensor.from_local(wrapped, weight.device_mesh, weight.placements,
                                         run_check=False, shape=weight.shape,
                                         stride=weight.stride())
        module.weight = nn.Parameter(wrapped, requires_grad=weight.requires_grad)
        module.register_state_dict_post_hook(plain_state_dict)
        names.append(name)
    return names


def _whole_blocks_per_shard(weight: DTensor, config) -> bool:
    """Whether every tensor-parallel shard of `weight` [out_features, in_features] holds whole
    MX blocks (and packing groups) of the whole weight's rows: replicated or sharded by rows,
    or sharded evenly along in_features into whole blocks."""
    ranks = 1  # the shards along in_features
    for mesh_dim, placement in enumerate(weight.placements):
        if isinstance(placement, Replicate) or (type(placement) is Shard
                                                and placement.dim in (0, -2)):
            continue
        if type(placement) is not Shard:  # Partial, strided shards: not whole rows
            return False
        ranks *= weight.device_mesh.size(mesh_dim)
    whole = math.lcm(config.block_size, config.elem_dtype.codes_per_group)
    return weight.shape[1] % (ranks * whole) == 0

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

from typing import List

from torch import nn

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
    Parameter objects holding the same values). Layers whose backward requantizes the
    high-precision weight (`grad_config.dgrad_weight_config` set) keep gathering it in high
    precision and are left out. The layers' state dicts hold the plain high-precision weights
    (a checkpoint needs neither torchmx nor this wrapper to be read).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, MXLinear) or isinstance(module.weight, MXAllGatherWeight):
            continue
        grad = module.qconfig.grad_config
        if grad is not None and grad.dgrad_weight_config is not None:
            continue
        weight = module.weight
        module.weight = nn.Parameter(
            MXAllGatherWeight(weight.detach(), module.qconfig.weights_config),
            requires_grad=weight.requires_grad)
        module.register_state_dict_post_hook(plain_state_dict)
        names.append(name)
    return names

"""FSDP2 for packed inference weights: MXShardedInferenceLinear keeps an MXInferenceLinear's
codes and scales in one uint8 Parameter, `weight_packed` [out_features, codes bytes + scale
bytes], which `fully_shard` shards by rows (each rank holds 1/N of the weight bytes) and
all-gathers as bytes before each forward: the gathered weight is the packed weight itself, so
the outputs equal the unsharded layer's bit for bit.

The state dict keeps MXInferenceLinear's entries (`weight_data`, `weight_scale`: views of the
packed parameter, DTensors under FSDP2), so checkpoints of both layers are interchangeable.
"""

from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from ..mx_tensor import MXTensor
from ..nn.inference_linear import MXInferenceLinear
from ..numerics.packing import packed_length

__all__ = ["MXShardedInferenceLinear", "prepare_fsdp_inference_"]


class MXShardedInferenceLinear(MXInferenceLinear):
    """An MXInferenceLinear whose packed weight is one uint8 Parameter (`weight_packed`), for
    `fully_shard`. Build it with `from_layer` or `prepare_fsdp_inference_`; no `prepack()`."""

    @property
    def weight_data(self) -> torch.Tensor:
        return self.weight_packed[:, :self._data_bytes]

    @property
    def weight_scale(self) -> torch.Tensor:
        return self.weight_packed[:, self._data_bytes:]

    @classmethod
    def from_layer(cls, layer: MXInferenceLinear) -> "MXShardedInferenceLinear":
        if not isinstance(layer, MXInferenceLinear) or isinstance(layer, cls):
            raise TypeError(f"layer must be an MXInferenceLinear, got {type(layer).__name__}")
        if layer.prepacked:
            raise ValueError(f"{layer._describe()} is prepacked; FSDP2 gathers the standard "
                             "layout only (build the layer without prepack())")
        with torch.device("meta"):
            new = cls(layer.in_features, layer.out_features, layer.bias is not None,
                      dtype=layer.weight_dtype, qconfig=layer.qconfig)
        del new._buffers["weight_data"], new._buffers["weight_scale"]
        new._data_bytes = packed_length(layer.in_features, layer.qconfig.weights_config.elem_dtype)
        new.weight_packed = nn.Parameter(
            torch.cat([layer.weight_data, layer.weight_scale], dim=1), requires_grad=False)
        new.bias = layer.bias
        new._weight_dtype = layer.weight_dtype
        new.register_state_dict_post_hook(_split_packed)
        new.register_load_state_dict_pre_hook(_join_packed)
        new.train(layer.training)
        return new

    def prepack(self):
        raise ValueError(f"{self._describe()}: prepack() is not available for a weight that "
                         "FSDP2 gathers (the gathered bytes are the standard layout)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As MXInferenceLinear's, on the weight FSDP2 gathered before this call."""
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        cfg = self.qconfig.weights_config
        data = self.weight_data.contiguous()
        if cfg.elem_dtype.kind == "int":
            data = data.view(torch.int8)
        weight = MXTensor(self.weight_scale.contiguous(), data, cfg.elem_dtype_name,
                          cfg.block_size, x.dtype, block_dim=1, scale_mode=cfg.scale_mode,
                          shape=(self.out_features, self.in_features))
        if self.qconfig.activations_config is not None:
            x = self.qconfig.activations_config.to_mx(x, -1)
        return F.linear(x, weight, bias)


def _split_packed(module, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook: `weight_packed` as MXInferenceLinear's two entries (views)."""
    packed = state_dict.pop(prefix + "weight_packed")
    state_dict[prefix + "weight_data"] = packed[:, :module._data_bytes]
    state_dict[prefix + "weight_scale"] = packed[:, module._data_bytes:]


def _join_packed(module, state_dict, prefix, local_metadata, strict, missing, unexpected,
                 errors) -> None:
    """Load pre-hook: MXInferenceLinear's two entries as `weight_packed`."""
    data, scale = state_dict.get(prefix + "weight_data"), state_dict.get(prefix + "weight_scale")
    if data is not None and scale is not None:
        del state_dict[prefix + "weight_data"], state_dict[prefix + "weight_scale"]
        state_dict[prefix + "weight_packed"] = torch.cat([data, scale], dim=1)


def prepare_fsdp_inference_(model: nn.Module) -> List[str]:
    """Replace every MXInferenceLinear of `model` by an MXShardedInferenceLinear (in place,
    before `fully_shard`); returns their names."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names = []
    for name, module in list(model.named_modules()):
        if type(module) is MXInferenceLinear:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, MXShardedInferenceLinear.from_layer(module))
            names.append(name)
    return names

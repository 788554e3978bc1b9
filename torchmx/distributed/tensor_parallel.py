"""Tensor parallel MXInferenceLinear: each rank holds one shard of the packed weight.

- column-wise: rows of the weight (out_features) split across the mesh; codes, scales and bias
  rows together. Each rank computes its output columns exactly as the whole layer would
  (same products, same sums): the gathered output is bit-identical.
- row-wise: columns (in_features) split across the mesh in whole blocks (and whole packing
  groups), codes and scales together. Each rank multiplies its slice of the input (quantized
  in the same blocks as the whole input) by its columns in fp32; the partial sums are
  all-reduced in fp32, the bias added, and the result rounded once to the input's dtype: the
  exact products and fp32 sums of the whole layer, summed in another order.

The layer's state dict holds DTensors (Shard(0) column-wise; Shard(1) for the weight and a
replicated bias row-wise), so `torch.distributed.checkpoint` saves it on N ranks and loads it
on M, into a sharded or a plain model.
"""

import math
from typing import Dict

import torch
from torch._prims_common import make_contiguous_strides_for
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from ..nn.inference_linear import MXInferenceLinear
from ..numerics.packing import packed_length

__all__ = ["MXParallelInferenceLinear", "parallelize_mx_inference_linear"]

STYLES = ("colwise", "rowwise")
# all_gather_single is the newer name (torch 2.13 deprecates all_gather_tensor)
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_WEIGHT_BUFFERS = ("weight_data", "weight_scale")


class MXParallelInferenceLinear(MXInferenceLinear):
    """This rank's shard of an MXInferenceLinear (`in_features` / `out_features` are the
    shard's). Build it with `parallelize_mx_inference_linear` or `from_layer`.

    Column-wise, forward returns this rank's output columns (`gather_output=True`: all of
    them). Row-wise, forward takes this rank's slice of the input's last dim
    (`input_is_sharded=True`, what a column-wise layer before it returns) or the whole input,
    and returns the whole output on every rank.
    """

    @classmethod
    def from_layer(cls, layer: MXInferenceLinear, mesh: DeviceMesh, style: str, *,
                   gather_output: bool = False, input_is_sharded: bool = False
                   ) -> "MXParallelInferenceLinear":
        if not isinstance(layer, MXInferenceLinear):
            raise TypeError(f"layer must be an MXInferenceLinear, got {type(layer).__name__}")
        if not isinstance(mesh, DeviceMesh) or mesh.ndim != 1:
            raise TypeError(f"mesh must be a 1-d DeviceMesh, got {mesh!r}")
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {style!r}")
        ranks, rank = mesh.size(), mesh.get_local_rank()
        cfg = layer.qconfig.weights_config
        fmt, block = cfg.elem_dtype, cfg.block_size
        out_features, in_features = layer.out_features, layer.in_features
        if style == "colwise":
            if out_features % ranks:
                raise ValueError(f"{layer._describe()}: column-wise sharding needs out_features "
                                 f"divisible by the mesh size {ranks}")
            rows = out_features // ranks
            data = layer.weight_data.narrow(0, rank * rows, rows)
            scale = layer.weight_scale.narrow(0, rank * rows, rows)
            bias = None if layer.bias is None else layer.bias.detach().narrow(0, rank * rows, rows)
            out_features = rows
        else:
            cols = in_features // ranks
            whole = math.lcm(block, fmt.codes_per_group)  # whole blocks and packing groups
            if in_features % ranks or cols % whole:
                raise ValueError(
                    f"{layer._describe()}: row-wise sharding needs in_features divisible by the "
                    f"mesh size {ranks} into whole blocks of {block} (and whole packing groups "
                    f"of {fmt.codes_per_group} codes for {fmt.name}): in_features a multiple "
                    f"of {ranks} * lcm({block}, {fmt.codes_per_group}) such as {ranks * whole}")
            nbytes = packed_length(cols, fmt)
            data = layer.weight_data.narrow(1, rank * nbytes, nbytes)
            scale = layer.weight_scale.narrow(1, rank * (cols // block), cols // block)
            bias = None if layer.bias is None else layer.bias.detach()
            in_features = cols
        with torch.device("meta"):
            new = cls(in_features, out_features, layer.bias is not None,
                      dtype=layer.weight_dtype, qconfig=layer.qconfig)
        new.weight_data = data.contiguous()
        new.weight_scale = scale.contiguous()
        if bias is not None:
            new.bias = nn.Parameter(bias.clone(), requires_grad=layer.bias.requires_grad)
        new._weight_dtype = layer.weight_dtype
        new.mesh, new.style = mesh, style
        new.gather_output, new.input_is_sharded = gather_output, input_is_sharded
        new.register_state_dict_post_hook(_as_dtensors)
        new.register_load_state_dict_pre_hook(_to_local)
        new.train(layer.training)
        return new

    def placements(self, name: str):
        """The DTensor placement of a state-dict entry: weight_data, weight_scale or bias."""
        if self.style == "colwise":
            return (Shard(0),)
        return (Shard(1),) if name in _WEIGHT_BUFFERS else (Replicate(),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "colwise":
            y = super().forward(x)
            if self.gather_output:
                y = _all_gather(y.contiguous(), y.dim() - 1, self.mesh)
            return y
        if not self.input_is_sharded:
            rank = self.mesh.get_local_rank()
            x = x.narrow(-1, rank * self.in_features, self.in_features)
        partial = self._weight_mx(torch.float32)
        x32 = x.float()
        if self.qconfig.activations_config is not None:
            x32 = self.qconfig.activations_config.to_mx(x32, -1)
        y = funcol.all_reduce(F.linear(x32, partial), "sum", self.mesh)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.style}, mesh size {self.mesh.size()}"


def _global_shape(module: MXParallelInferenceLinear, name: str, local: torch.Tensor):
    shape = list(local.shape)
    dim = module.placements(name)[0]
    if isinstance(dim, Shard):
        shape[dim.dim] *= module.mesh.size()
    return shape


def _as_dtensors(module, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook: the shards as DTensors (sharing this layer's storage)."""
    for name in (*_WEIGHT_BUFFERS, "bias"):
        local = state_dict.get(prefix + name)
        if local is not None:
            shape = torch.Size(_global_shape(module, name, local))
            state_dict[prefix + name] = DTensor.from_local(
                local, module.mesh, module.placements(name), run_check=False, shape=shape,
                stride=make_contiguous_strides_for(shape))


def _to_local(module, state_dict, prefix, local_metadata, strict, missing, unexpected,
              errors) -> None:
    """Load pre-hook: this rank's shard of each entry, from a DTensor (any placement) or from
    the whole tensor."""
    for name in (*_WEIGHT_BUFFERS, "bias"):
        value = state_dict.get(prefix + name)
        if value is None:
            continue
        mine = getattr(module, name)
        if isinstance(value, DTensor):
            if value.placements == module.placements(name) and value.device_mesh == module.mesh:
                state_dict[prefix + name] = value.to_local()
                continue
            value = value.full_tensor()
        if list(value.shape) == _global_shape(module, name, mine):
            placement = module.placements(name)[0]
            if isinstance(placement, Shard):
                d, n = placement.dim, mine.shape[placement.dim]
                value = value.narrow(d, module.mesh.get_local_rank() * n, n)
            state_dict[prefix + name] = value


def parallelize_mx_inference_linear(model: nn.Module, mesh: DeviceMesh,
                                    plan: Dict[str, str], **options) -> nn.Module:
    """Replace each MXInferenceLinear named in `plan` ({module name: "colwise" or "rowwise"})
    by its MXParallelInferenceLinear shard (in place; `options` as in `from_layer`) and return
    the model. Every rank must call it with the same model (the same weights)."""
    if not isinstance(plan, dict) or not plan:
        raise TypeError(f"plan must be a non-empty dict of module name -> style, got {plan!r}")
    modules = dict(model.named_modules())
    for name, style in plan.items():
        layer = modules.get(name)
        if not isinstance(layer, MXInferenceLinear):
            raise ValueError(f"plan names {name!r}, which is not an MXInferenceLinear of the "
                             f"model (got {type(layer).__name__})")
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        setattr(parent, child, MXParallelInferenceLinear.from_layer(layer, mesh, style,
                                                                    **options))
    return model

"""MXAllGatherWeight: a high-precision master weight that FSDP2 all-gathers as MX bytes.

FSDP2 (`torch.distributed.fsdp.fully_shard`) shards a parameter along dim 0 and, before each
forward, all-gathers the shards. When the local shard defines `fsdp_pre_all_gather` /
`fsdp_post_all_gather`, FSDP2 gathers what the first returns and rebuilds the parameter with
the second. An MXLinear weight wrapped in MXAllGatherWeight quantizes its shard of rows
(blocks along in_features, so no block straddles two shards) once between writes and sends its
codes and scales (uint8, in the layer group's one collective); the gathered parameter is an
MXTensor over the gathered bytes (no copy), bit-identical to quantizing the full weight with
the layer's `weights_config`, and MXLinear's forward uses it as its quantized weight. The
gradient stays in high precision, so the reduce-scatter does too.

Everything else (the optimizer step, state dicts, `.to()`) sees the high-precision tensor:
ops run on it and keep the wrapper where FSDP2 needs the local shard to stay one (views,
slices, copies, `new_zeros`).
"""

import inspect
from typing import Optional

import torch
from torch.utils._pytree import tree_map_only

from .. import dtypes
from .._eager import short_path
from ..config import MXConfig
from ..kernels.quantize.backends import backend_for, triton_kernels
from ..mx_tensor import MXTensor
from ..numerics.packing import packed_length

__all__ = ["MXAllGatherWeight"]

aten = torch.ops.aten

# Ops whose result is still this weight (another view or copy of it): FSDP2 builds the local
# shard with them (chunk -> split, narrow -> slice, new_zeros, copy_, view, as_strided) and
# moves or pins it (_to_copy, _pin_memory); nn.Parameter detaches.
_KEEP_WRAPPER = {
    aten.detach.default, aten.alias.default, aten.view.default, aten._unsafe_view.default,
    aten.slice.Tensor, aten.split.Tensor, aten.split_with_sizes.default, aten.as_strided.default,
    aten.new_zeros.default, aten.new_empty.default, aten.empty_like.default,
    aten.clone.default, aten._to_copy.default, aten._pin_memory.default,
}


class _PreAllGatherHook:
    """`weight.fsdp_pre_all_gather`. FSDP2 calls inspect.signature on that hook at every
    all-gather (224 times per step of a 16-layer Llama); for a bound method inspect builds a
    new Signature each time (the function's without `self`; bench_distributed.py
    --python-profile shows its cost), this object hands over the one it keeps."""

    __slots__ = ("weight",)
    __signature__ = inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in ("mesh", "outer_size", "outer_stride", "module", "mp_policy")])

    def __init__(self, weight: "MXAllGatherWeight"):
        self.weight = weight

    def __call__(self, mesh, outer_size, outer_stride, module, mp_policy):
        return self.weight._pre_all_gather(mesh, outer_size, outer_stride, module, mp_policy)


class MXAllGatherWeight(torch.Tensor):
    """A high-precision tensor (`.hp`) that FSDP2 all-gathers quantized per `config`
    (an MXConfig; blocks along the last dim)."""

    hp: torch.Tensor
    config: MXConfig

    @staticmethod
    def __new__(cls, hp: torch.Tensor, config: MXConfig):
        return torch.Tensor._make_wrapper_subclass(
            cls, hp.shape, strides=hp.stride(), storage_offset=hp.storage_offset(),
            dtype=hp.dtype, device=hp.device, layout=hp.layout, requires_grad=hp.requires_grad)

    def __init__(self, hp: torch.Tensor, config: MXConfig):
        if not isinstance(config, MXConfig):
            raise TypeError(f"config must be a torchmx.MXConfig, got {type(config).__name__}")
        if isinstance(hp, MXAllGatherWeight):
            hp = hp.hp
        self.hp = hp
        self.config = config

    def __repr__(self):
        return f"MXAllGatherWeight({self.hp}, config={self.config})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        wrappers = []  # the wrappers among the arguments, unwrapped by _unwrap
        args = _unwrap(args, wrappers)
        kwargs = _unwrap(kwargs, wrappers) if kwargs else {}
        if func._schema.is_mutable:  # a write (optimizer step, load): quantize anew
            for t in wrappers:
                t._gathered = None
        out = func(*args, **kwargs)
        if out is None:  # the optimizer's in-place foreach ops: nothing to rewrap
            return None
        inputs = {id(t.hp): t for t in wrappers}
        config = wrappers[0].config
        keep = func in _KEEP_WRAPPER

        def rewrap(t):
            if id(t) in inputs:  # an in-place op returns the tensor it wrote: the wrapper
                return inputs[id(t)]
            return cls(t, config) if keep else t

        if isinstance(out, torch.Tensor):
            return rewrap(out)
        return tree_map_only(torch.Tensor, rewrap, out)

    # torch.compile traces through the wrapper
    def __tensor_flatten__(self):
        return ["hp"], self.config

    @staticmethod
    def __tensor_unflatten__(inner_tensors, config, outer_size, outer_stride):
        return MXAllGatherWeight(inner_tensors["hp"], config)

    # ---------------------------------------------------------------- FSDP2 all-gather hooks

    def _pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """This rank's rows, quantized: (codes, scales), both uint8 [rows, bytes per row].

        FSDP2 packs every input of a layer group into its one all-gather buffer, so the two
        travel in the same collective; gathered, each is a contiguous [out_features, bytes]
        tensor that the MXTensor uses as is (no copy). Where FSDP2 shards the rows unevenly
        (out_features not a multiple of the mesh size) it needs every rank's input in the
        padded shard's shape: then the rows are gathered in high precision (padded with zeros)
        and quantized after the gather, as without the wrapper. So is a shard group of one
        rank (one process; HSDP with unsharded replicas), where nothing travels and FSDP2
        copies a single input."""
        hp = self.hp
        param_dtype = getattr(mp_policy, "param_dtype", None)
        dtype = hp.dtype if param_dtype is None else param_dtype
        rows = outer_size[0]
        if rows % mesh.size() != 0 or mesh.size() == 1:
            padded = -(-rows // mesh.size())
            return (torch.nn.functional.pad(hp.to(dtype), (0, 0, 0, padded - hp.shape[0])),), None
        # The backward re-gathers what the forward gathered: quantized once between writes
        # (every write to the weight goes through __torch_dispatch__, which drops this).
        cached = getattr(self, "_gathered", None)
        if cached is None or cached[0] != dtype:
            scale, data = self._quantize(hp.to(dtype))
            cached = self._gathered = (dtype, (data.view(torch.uint8), scale))
        return cached[1], dtype

    @property
    def fsdp_pre_all_gather(self):
        """FSDP2's pre-all-gather hook: `_pre_all_gather` bound to this weight (see
        _PreAllGatherHook)."""
        return _PreAllGatherHook(self)

    def _quantize(self, x: torch.Tensor):
        """(scale, data) of this shard's rows, quantized per the config with blocks along the
        last dim. In eager mode on CUDA through the Triton backend's quantize plan for this
        shard, made once and kept (the shard's shape, dtype and device stay; the operator
        layer's checks and plan lookup would repeat them at every step); elsewhere, and for
        stochastic rounding (a plan per seed), through the operator."""
        cfg = self.config
        if x.is_cuda and cfg.rounding != "stochastic" and short_path(x) \
                and backend_for(x.device) == "triton":
            key = (x.dtype, x.shape, x.stride(), x.data_ptr() & 15)
            plan = self.__dict__.get("_quantize_plan")
            if plan is None or plan[0] != key:
                plan = self._quantize_plan = (key, triton_kernels().QuantizePlan(
                    x, cfg.elem_dtype, cfg.block_size, cfg.scale_mode, cfg.rounding, x.dim() - 1,
                    None))
            return plan[1](x)
        return cfg.quantize(x, -1)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *,
                             out: Optional[torch.Tensor] = None):
        """The gathered weight: an MXTensor of the full weight over the gathered codes and
        scales themselves (the plain high-precision weight where the rows were sharded
        unevenly)."""
        if metadata is None:  # gathered in high precision (uneven rows, one rank)
            (weight,) = all_gather_outputs
            return None if out is not None else (weight, ())
        if out is not None:
            # FSDP2 gathers into the same tensors every time (it frees and re-allocates their
            # storage in place), and `out` was built over them: nothing to do.
            return None
        data, scale = all_gather_outputs
        cfg = self.config
        if cfg.elem_dtype.kind == "int":
            data = data.view(torch.int8)
        weight = MXTensor(scale, data, cfg.elem_dtype_name, cfg.block_size, metadata,
                          block_dim=1, scale_mode=cfg.scale_mode,
                          shape=(scale.shape[0], self.shape[1]))
        return weight, (data, scale)


def plain_state_dict(module, state_dict, prefix, local_metadata) -> None:
    """A state_dict post-hook: the module's MXAllGatherWeight parameters appear as their
    high-precision tensors (sharing storage; inside their DTensor under FSDP2), so checkpoints
    hold plain tensors that any PyTorch program reads."""
    from torch.distributed.tensor import DTensor

    for name, value in list(state_dict.items()):
        if not name.startswith(prefix):
            continue
        if isinstance(value, DTensor) and isinstance(value._local_tensor, MXAllGatherWeight):
            state_dict[name] = DTensor.from_local(
                value._local_tensor.hp, value.device_mesh, value.placements, run_check=False,
                shape=value.shape, stride=value.stride())
        elif isinstance(value, MXAllGatherWeight):
            state_dict[name] = value.hp


def _unwrap(value, wrappers: list):
    """`value` (an op's arguments: tensors, lists and tuples of them, dicts of keyword
    arguments, other values) with each MXAllGatherWeight replaced by its `.hp`, appended to
    `wrappers`. Written out rather than through pytree: the optimizer's foreach ops pass lists
    of every parameter, and this runs at each of them."""
    if isinstance(value, MXAllGatherWeight):
        wrappers.append(value)
        return value.hp
    kind = type(value)
    if kind is list or kind is tuple:
        items = []
        for v in value:  # the elements' common cases inline: a list holds every parameter
            item_kind = type(v)
            if item_kind is MXAllGatherWeight:
                wrappers.append(v)
                v = v.hp
            elif item_kind is list or item_kind is tuple or item_kind is dict \
                    or isinstance(v, MXAllGatherWeight):
                v = _unwrap(v, wrappers)
            items.append(v)
        return kind(items)
    if kind is dict:
        return {k: _unwrap(v, wrappers) for k, v in value.items()}
    return value


def gathered_bytes_per_row(in_features: int, config: MXConfig) -> int:
    """Bytes one weight row takes in the MX all-gather: its packed codes and its scales."""
    return (packed_length(in_features, dtypes.from_name(config.elem_dtype_name))
            + -(-in_features // config.block_size))

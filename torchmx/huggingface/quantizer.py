"""TorchMXHfQuantizer: how transformers' from_pretrained builds a torchmx model.

Before the weights load (the model is on the meta device), every nn.Linear whose packed weight
(`<name>.weight_data`) is in the checkpoint becomes an MXInferenceLinear with that layer's own
config (its `_extra_state`), so a saved torchmx model loads as it was saved, mixed configs
included; so does every gpt-oss experts module whose weights the checkpoint holds in the
mxfp4 layout (`...experts.gate_up_proj_blocks`: torchmx.huggingface.gpt_oss). While the
weights load, each other selected nn.Linear weight (a full-precision checkpoint) is quantized
as soon as it is read and its layer swapped, and so is each gpt-oss experts projection when
the weights are MXFP4 in blocks of 32 (gpt_oss.load_projection): one full-precision weight at
a time, never a second copy of the model.
"""

import os
from typing import Dict, Iterable, Optional

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING, register_quantizer
from transformers.quantizers.base import HfQuantizer
from transformers.quantizers.quantizers_utils import should_convert_module

from ..config import QLinearConfig
from ..nn import MXInferenceLinear, extra_state
from ..nn import attention as mx_attention
from . import gpt_oss
from .config import QUANT_METHOD, TorchMXConfig

__all__ = ["TorchMXHfQuantizer", "checkpoint_keys", "checkpoint_mx_layers"]

_DATA, _EXTRA = ".weight_data", "._extra_state"


def checkpoint_keys(checkpoint_files: Optional[Iterable[str]]):
    """(every tensor name, {name: tensor} of the `_extra_state` entries) of checkpoint files
    (safetensors, or torch files of a state dict); no other tensor is read."""
    keys, states = set(), {}
    for path in checkpoint_files or ():
        path = os.fspath(path)
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                names = set(f.keys())
                states.update({k: f.get_tensor(k) for k in names if k.endswith(_EXTRA)})
        else:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            names = set(state)
            states.update({k: v for k, v in state.items() if k.endswith(_EXTRA)})
        keys |= names
    return keys, states


def checkpoint_mx_layers(keys, states) -> Dict[str, QLinearConfig]:
    """{layer name: its QLinearConfig} of the MX layers among checkpoint_keys(...)'s
    (`keys`, `states`): each `<layer>.weight_data` with the config of its `_extra_state`."""
    layers = {}
    for key in keys:
        if not key.endswith(_DATA):
            continue
        name = key[: -len(_DATA)]
        if name + _EXTRA not in states:
            raise ValueError(f"the checkpoint's {key} is an MX weight without {name}{_EXTRA} "
                             "(its format is unknown)")
        try:
            state = extra_state.decode(states[name + _EXTRA])
            layers[name] = QLinearConfig.load_from_dict(state["qconfig"])
        except (TypeError, ValueError, KeyError) as error:
            raise ValueError(f"the checkpoint's {name}{_EXTRA}: not a torchmx layer config "
                             f"({type(error).__name__}: {error})") from None
    return layers


def _checkpoint_name(name: str, layers: dict, prefix: str) -> Optional[str]:
    """The checkpoint's name for the model's module `name`: the same, or with the base model
    prefix added or removed (a base model loaded from a checkpoint of a model with a head, or
    the other way round)."""
    for candidate in (name, f"{prefix}.{name}", name.removeprefix(f"{prefix}.")):
        if candidate in layers:
            return candidate
    return None


def _swap(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, layer)


class _QuantizeLinear(ConversionOps):
    """Quantizes one nn.Linear weight as it loads and puts the MXInferenceLinear in its place."""

    def __init__(self, hf_quantizer: "TorchMXHfQuantizer"):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict, model=None, full_layer_name=None, missing_keys=None, **kwargs):
        _, value = next(iter(input_dict.items()))
        value = value[0] if isinstance(value, list) else value
        name, _, tensor_name = full_layer_name.rpartition(".")
        if missing_keys is not None:
            missing_keys.discard(full_layer_name)
        if tensor_name in gpt_oss.PROJECTIONS:  # a gpt-oss experts projection [E, K, N]
            gpt_oss.load_projection(model, name, tensor_name, value)
            return {}
        linear = model.get_submodule(name)
        with torch.device("meta"):
            source = nn.Linear(linear.in_features, linear.out_features, bias=False)
        source.weight = nn.Parameter(value.to(linear.weight.dtype), requires_grad=False)
        source.bias = linear.bias  # the loaded bias, or the meta one loading assigns later
        layer = MXInferenceLinear.from_float(source, self.hf_quantizer.quantization_config.qconfig)
        layer.train(linear.training)
        layer._is_hf_initialized = True
        _swap(model, name, layer)
        return {}


class TorchMXHfQuantizer(HfQuantizer):
    """transformers' quantizer for TorchMXConfig (quant_method "torchmx"); see the module
    docstring."""

    requires_calibration = False
    quantization_config: TorchMXConfig

    def __init__(self, quantization_config: TorchMXConfig, **kwargs):
        if not isinstance(quantization_config, TorchMXConfig):
            raise TypeError("quantization_config must be a torchmx.TorchMXConfig, got "
                            f"{type(quantization_config).__name__}")
        super().__init__(quantization_config, **kwargs)
        self.modules_to_not_convert = []

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        config = self.quantization_config
        self.modules_to_not_convert = self.get_modules_to_not_convert(
            model, config.modules_to_not_convert, model._keep_in_fp32_modules)
        config.modules_to_not_convert = sorted(self.modules_to_not_convert)
        keys, states = checkpoint_keys(checkpoint_files)
        gpt_oss.swap_for_checkpoint(model, keys)  # gpt-oss experts in the mxfp4 layout
        layers = checkpoint_mx_layers(keys, states)
        for name, module in list(model.named_modules()):
            source = _checkpoint_name(name, layers, model.base_model_prefix)
            if isinstance(module, nn.Linear) and source is not None:
                _swap(model, name, MXInferenceLinear.from_float(module, layers[source]))
        return model

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        if self.pre_quantized:
            return False
        name, _, tensor_name = param_name.rpartition(".")
        module = model.get_submodule(name)
        if not should_convert_module(name, self.modules_to_not_convert):
            return False
        if gpt_oss.is_gpt_oss_experts(module):
            return (tensor_name in gpt_oss.PROJECTIONS
                    and gpt_oss.holds_experts_format(self.quantization_config.weights))
        return tensor_name == "weight" and isinstance(module, nn.Linear)

    def get_quantize_ops(self):
        return _QuantizeLinear(self)

    def _process_model_after_weight_loading(self, model, **kwargs):
        empty = [name for name, module in model.named_modules()
                 if any(t.is_meta for t in module.buffers(recurse=False))
                 and isinstance(module, (MXInferenceLinear, gpt_oss.MXGptOssExperts))]
        if empty:
            raise ValueError(f"the checkpoint has no packed weight for the MX layers "
                             f"{', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}")
        mx_attention.restore_attention(model)  # quantize_llm_'s attention matmuls, if saved
        return model

    def is_serializable(self) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


if QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
    register_quantizer(QUANT_METHOD)(TorchMXHfQuantizer)

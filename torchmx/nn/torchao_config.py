"""Configs for `torchao.quantization.quantize_(model, config)` (this module imports torchao,
the optional extra `pip install 'torchmx[torchao]'`).

    from torchao.quantization import quantize_
    from torchmx.quant_api import MXWeightOnlyConfig, MXDynamicActivationMXWeightConfig
    quantize_(model, MXWeightOnlyConfig(weight_dtype="mxfp4"))
    quantize_(model, MXDynamicActivationMXWeightConfig(activation_dtype=torch.float8_e4m3fn,
                                                       weight_dtype="mxfp4"))
    quantize_(model, MXInferenceLinearConfig(qconfig))     # the nested form: a QLinearConfig

The flat configs are named and spelled as torchao names its own (`weight_dtype`,
`activation_dtype`: a torch dtype, a format name or alias, or a torchmx DType). torchao calls
the registered handler on every module its `filter_fn` accepts (by default every nn.Linear,
the output head included, as torchmx's own quantize_linear_ does) and puts the returned module
in its place. The swap is a module swap (no torchao tensor subclass), so the model then runs
eagerly, under torch.compile, and saves like any torchmx model.
"""

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

try:
    from torchao.core.config import AOBaseConfig
    from torchao.quantization.transform_module import register_quantize_module_handler
except ImportError as error:
    raise ImportError("torchmx's torchao configs need torchao: pip install 'torchmx[torchao]' "
                      f"({error})") from error

from ..config import MXConfig, QLinearConfig, as_linear_config
from .inference_linear import MXInferenceLinear
from .mx_linear import MXLinear

__all__ = ["MXInferenceLinearConfig", "MXQATConfig", "MXWeightOnlyConfig",
           "MXDynamicActivationMXWeightConfig"]


@dataclass
class MXInferenceLinearConfig(AOBaseConfig):
    """quantize_ swaps each selected nn.Linear (or MXLinear) for MXInferenceLinear(qconfig).
    `qconfig`: a QLinearConfig, or an MXConfig / format name for the weights."""

    qconfig: Any

    def __post_init__(self):
        self.qconfig = as_linear_config(self.qconfig)


@dataclass
class MXQATConfig(AOBaseConfig):
    """quantize_ swaps each selected nn.Linear for MXLinear(qconfig) (parameters shared)."""

    qconfig: Any

    def __post_init__(self):
        self.qconfig = as_linear_config(self.qconfig)


@dataclass
class MXWeightOnlyConfig(AOBaseConfig):
    """MX weights, activations in high precision: quantize_ swaps each selected nn.Linear for
    MXInferenceLinear. `weight_dtype`: a torch dtype (torch.float8_e4m3fn, torch.float8_e5m2,
    torch.float4_e2m1fn_x2, torch.int8), a format name or alias ("mxfp4", "float6_e2m3"), or a
    torchmx DType."""

    weight_dtype: Any = torch.float8_e4m3fn
    block_size: int = 32
    scale_mode: str = "floor"
    rounding: str = "even"

    def __post_init__(self):
        self.qconfig  # building the nested config validates every field

    @property
    def qconfig(self) -> QLinearConfig:
        return QLinearConfig(MXConfig(self.weight_dtype, self.block_size, self.scale_mode,
                                      self.rounding))


@dataclass
class MXDynamicActivationMXWeightConfig(AOBaseConfig):
    """MX weights and MX activations quantized on the fly, both with blocks of `block_size`
    along K: quantize_ swaps each selected nn.Linear for MXInferenceLinear. The dtypes as in
    MXWeightOnlyConfig (defaults MXFP8 E4M3, as torchao's config of this name)."""

    activation_dtype: Any = torch.float8_e4m3fn
    weight_dtype: Any = torch.float8_e4m3fn
    block_size: int = 32
    scale_mode: str = "floor"
    rounding: str = "even"

    def __post_init__(self):
        self.qconfig  # building the nested config validates every field

    @property
    def qconfig(self) -> QLinearConfig:
        def mx(dtype):
            return MXConfig(dtype, self.block_size, self.scale_mode, self.rounding)

        return QLinearConfig(mx(self.weight_dtype), mx(self.activation_dtype))


def _check_not_the_root(config) -> None:
    """ValueError where quantize_ was given the layer itself: it drops a swapped root module
    and would leave the layer unquantized without a word (transformers' TorchAoConfig calls
    quantize_ so, on each nn.Linear). torchao's tree walk holds the module's name in
    `cur_fqn`; "" is the model it was given."""
    caller = sys._getframe(2)
    if (caller.f_code.co_name == "_replace_with_custom_fn_if_matches_filter"
            and caller.f_locals.get("cur_fqn") == ""):
        raise ValueError(
            f"torchmx's {type(config).__name__} swaps modules, and quantize_ cannot swap the "
            "module it is given (here an nn.Linear itself, as transformers' TorchAoConfig "
            "passes each layer): it would stay unquantized. With transformers, use "
            "from_pretrained(..., quantization_config=torchmx.TorchMXConfig(weights=...)); for "
            "one layer, MXInferenceLinear.from_float(linear, qconfig)")


def _to_inference_linear(module: nn.Module, config) -> nn.Module:
    if not isinstance(module, nn.Linear):  # a custom filter_fn may select anything
        return module
    _check_not_the_root(config)
    return MXInferenceLinear.from_float(module, config.qconfig)


for _config in (MXInferenceLinearConfig, MXWeightOnlyConfig, MXDynamicActivationMXWeightConfig):
    register_quantize_module_handler(_config)(_to_inference_linear)


@register_quantize_module_handler(MXQATConfig)
def _to_mx_linear(module: nn.Module, config: MXQATConfig) -> nn.Module:
    if type(module) is not nn.Linear:
        return module
    _check_not_the_root(config)
    return MXLinear.from_float(module, config.qconfig)

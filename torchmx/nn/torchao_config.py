"""Configs for `torchao.quantization.quantize_(model, config)` (this module imports torchao).

    from torchao.quantization import quantize_
    from torchmx.quant_api import MXInferenceLinearConfig
    quantize_(model, MXInferenceLinearConfig(qconfig))     # nn.Linear -> MXInferenceLinear

torchao calls the registered handler on every module its `filter_fn` accepts (by default every
nn.Linear, the output head included) and puts the returned module in its place. The swap is a
module swap (no torchao tensor subclass), so the model then runs eagerly, under torch.compile,
and saves like any torchmx model.
"""

from dataclasses import dataclass

from torch import nn
from torchao.core.config import AOBaseConfig
from torchao.quantization.transform_module import register_quantize_module_handler

from ..config import QLinearConfig
from .inference_linear import MXInferenceLinear
from .mx_linear import MXLinear, check_qconfig

__all__ = ["MXInferenceLinearConfig", "MXQATConfig"]


@dataclass
class MXInferenceLinearConfig(AOBaseConfig):
    """quantize_ swaps each selected nn.Linear (or MXLinear) for MXInferenceLinear(qconfig)."""

    qconfig: QLinearConfig

    def __post_init__(self):
        check_qconfig(self.qconfig)


@dataclass
class MXQATConfig(AOBaseConfig):
    """quantize_ swaps each selected nn.Linear for MXLinear(qconfig) (parameters shared)."""

    qconfig: QLinearConfig

    def __post_init__(self):
        check_qconfig(self.qconfig)


@register_quantize_module_handler(MXInferenceLinearConfig)
def _to_inference_linear(module: nn.Module, config: MXInferenceLinearConfig) -> nn.Module:
    if not isinstance(module, nn.Linear):  # a custom filter_fn may select anything
        return module
    return MXInferenceLinear.from_float(module, config.qconfig)


@register_quantize_module_handler(MXQATConfig)
def _to_mx_linear(module: nn.Module, config: MXQATConfig) -> nn.Module:
    if type(module) is not nn.Linear:
        return module
    return MXLinear.from_float(module, config.qconfig)

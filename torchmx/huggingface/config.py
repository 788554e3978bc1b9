"""TorchMXConfig: the transformers quantization config of the "torchmx" method.

    model = AutoModelForCausalLM.from_pretrained(
        path, quantization_config=TorchMXConfig(weights="mxfp4", activations=None))

Its to_dict() is what `save_pretrained` writes under "quantization_config" in config.json;
transformers rebuilds it with from_dict() when the saved model is loaded.
"""

from typing import List, Optional

from transformers.quantizers.auto import (AUTO_QUANTIZATION_CONFIG_MAPPING,
                                          register_quantization_config)
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..config import MXConfig, QLinearConfig

__all__ = ["QUANT_METHOD", "TorchMXConfig"]

QUANT_METHOD = "torchmx"


def _mx_config(value, arg: str) -> MXConfig:
    """An MXConfig from a format (name, alias, DType, torch dtype), an MXConfig or its dict."""
    if isinstance(value, MXConfig):
        return value
    if isinstance(value, dict):
        try:
            return MXConfig.load_from_dict(value)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{arg}: {error}") from None
    try:
        return MXConfig(value)
    except TypeError:
        raise TypeError(f"{arg} must be a format name (e.g. 'mxfp4', 'float8_e4m3'), a torchmx "
                        f"DType, a torch dtype, an MXConfig or its dict, got "
                        f"{type(value).__name__}") from None


class TorchMXConfig(QuantizationConfigMixin):
    """Quantize a transformers model's linear layers to MX while it loads (torchmx's quantizer).

    `weights`: the weights' format (a name such as "mxfp4", "mxfp8", "float6_e3m2", "int8", a
    torchmx DType, a torch dtype, or an MXConfig for the block size, scale mode and rounding);
    blocks of 32 along in_features by default.
    `activations`: None (weight-only: activations stay in the model's dtype) or a format as
    for `weights`, quantizing each layer's input on the fly.
    `modules_to_not_convert`: module names or patterns kept in full precision
    (transformers' rules: a prefix up to a module boundary, a regex, or a suffix); None keeps
    the output head and the modules tied to the input embeddings, as other quantizers do.
    The list the model was quantized with is what `save_pretrained` writes.
    """

    def __init__(self, weights="mxfp4", activations=None,
                 modules_to_not_convert: Optional[List[str]] = None, **kwargs):
        quant_method = kwargs.pop("quant_method", QUANT_METHOD)
        if quant_method != QUANT_METHOD:
            raise ValueError(f"quant_method must be {QUANT_METHOD!r}, got {quant_method!r}")
        if kwargs:
            raise TypeError(f"TorchMXConfig got unexpected arguments {sorted(kwargs)}; it takes "
                            "weights, activations and modules_to_not_convert")
        self.quant_method = QUANT_METHOD
        self.weights = _mx_config(weights, "weights")
        self.activations = None if activations is None else _mx_config(activations, "activations")
        if modules_to_not_convert is not None and (
                not isinstance(modules_to_not_convert, (list, tuple))
                or not all(isinstance(name, str) for name in modules_to_not_convert)):
            raise TypeError("modules_to_not_convert must be a list of module names or patterns "
                            f"(str) or None, got {modules_to_not_convert!r}")
        self.modules_to_not_convert = (None if modules_to_not_convert is None
                                       else list(modules_to_not_convert))

    @property
    def qconfig(self) -> QLinearConfig:
        """The QLinearConfig of the layers quantized while loading."""
        return QLinearConfig(self.weights, self.activations)

    def to_dict(self) -> dict:
        return {"quant_method": QUANT_METHOD, "weights": self.weights.to_dict(),
                "activations": None if self.activations is None else self.activations.to_dict(),
                "modules_to_not_convert": self.modules_to_not_convert}

    def __eq__(self, other) -> bool:
        return isinstance(other, TorchMXConfig) and self.to_dict() == other.to_dict()


if QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
    register_quantization_config(QUANT_METHOD)(TorchMXConfig)

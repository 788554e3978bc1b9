"""MX layers: MXLinear (quantization-aware training), MXInferenceLinear (packed weights), and
the MX attention function for transformers models (torchmx.nn.attention)."""

from .inference_linear import MXInferenceLinear, prepack_weights
from .mx_linear import MXLinear, mx_linear

__all__ = ["MXLinear", "MXInferenceLinear", "mx_linear", "prepack_weights"]

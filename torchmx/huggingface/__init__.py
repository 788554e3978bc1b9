"""torchmx in Hugging Face transformers (importing this package imports transformers).

- `TorchMXConfig`: the quantization config of the "torchmx" method, registered with
  transformers' external-quantizer hooks together with `TorchMXHfQuantizer` when this package
  is imported (`torchmx.TorchMXConfig` imports it).
- `torchmx.huggingface.gpt_oss`: gpt-oss MoE experts in MXFP4 as MXTensors.

Docs: docs/huggingface.md.
"""

from .config import QUANT_METHOD, TorchMXConfig
from .quantizer import TorchMXHfQuantizer

__all__ = ["QUANT_METHOD", "TorchMXConfig", "TorchMXHfQuantizer"]

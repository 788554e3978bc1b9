"""torchmx: OCP Microscaling (MX) formats for PyTorch.

`from torchmx import dtypes` gives the element formats; importing torchmx registers the custom
ops `torch.ops.torchmx.quantize_mx` and `torch.ops.torchmx.dequantize_mx`.
"""

from . import dtypes, numerics, ops

__version__ = "0.2.0"

__all__ = ["dtypes", "numerics", "ops", "__version__"]

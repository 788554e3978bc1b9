"""torchmx: OCP Microscaling (MX) formats for PyTorch.

`from torchmx import MXTensor, dtypes` gives the tensor subclass and the element formats;
importing torchmx registers the custom ops `torch.ops.torchmx.quantize_mx` and
`torch.ops.torchmx.dequantize_mx` and MXTensor's op table (aten_ops).
"""

from . import dtypes, numerics, ops
from . import mx_tensor, aten_ops  # mx_tensor first: it imports the op table at its end
from .mx_tensor import MXTensor

__version__ = "0.2.0"

__all__ = ["MXTensor", "dtypes", "numerics", "ops", "__version__"]

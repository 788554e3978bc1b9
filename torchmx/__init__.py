"""torchmx: OCP Microscaling (MX) formats for PyTorch."""

from . import dtypes, numerics

__version__ = "0.2.0"

"""Which backend runs the quantize / dequantize ops on a device: the C kernels on CPU, the
Triton kernels on CUDA, the reference numerics anywhere else or when a backend is unavailable
(TORCHMX_BACKEND=reference, read once when torchmx is imported, forces the reference)."""

import functools
import os

import torch

from ... import cpu_kernels

__all__ = ["backend_for", "triton_kernels", "FORCE_REFERENCE"]

# Whether every op runs the reference numerics (TORCHMX_BACKEND=reference at import). Read here
# once, not at every call; tests set this attribute.
FORCE_REFERENCE = os.environ.get("TORCHMX_BACKEND") == "reference"


@functools.lru_cache(maxsize=None)
def triton_kernels():
    """The Triton backend module, or None when Triton (or the module) is not available."""
    try:
        from . import triton_backend
    except ImportError:
        return None
    return triton_backend if triton_backend.available() else None


def backend_for(device: torch.device) -> str:
    """Name of the backend the ops use on `device`: "cpu", "triton" or "reference"."""
    if FORCE_REFERENCE:
        return "reference"
    kind = device.type
    if kind == "cpu":
        return "cpu" if cpu_kernels.available() else "reference"
    if kind == "cuda" and triton_kernels() is not None:
        return "triton"
    return "reference"

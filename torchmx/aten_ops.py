"""Compatibility module: MXTensor's op table lives in `torchmx/mx_ops/` (one concern per
module). The public names stay importable from here and from `torchmx.mx_tensor`."""

from .mx_ops.fallback import DEQUANTIZE_FALLBACK_OPS, allow_dequantize_fallback, dequantize_fallback
from .mx_ops.matmul import mx_linear, mx_matmul
from .mx_ops.strict import MXLayoutWarning, reset_layout_warning, set_strict_matmul, strict_matmul

__all__ = [
    "MXLayoutWarning",
    "set_strict_matmul",
    "strict_matmul",
    "reset_layout_warning",
    "allow_dequantize_fallback",
    "DEQUANTIZE_FALLBACK_OPS",
    "dequantize_fallback",
    "mx_matmul",
    "mx_linear",
]

"""torch.export of MXTensors built inside the exported forward.

torch.export's pre-dispatch trace has a proxy only for graph inputs (parameters, buffers,
user inputs) and op results. An MXTensor built inside forward (`MXTensor.to_mx`, the view of
MXInferenceLinear's packed buffers) is neither, so the trace answers any op given one with
NotImplemented, which reaches the caller as "Unable to cast NotImplemented to Tensor". The
matmul handlers (F.linear, torch.matmul, `@`) then compute the product from the operands'
parts (plain tensors), as MXTensor's dispatch would; `.dequantize()` works on the parts
already. MXTensor.__torch_function__ turns the refusal into `Unsupported`, a TypeError that
names the op (the matmul handlers catch it and use the parts).
"""

import torch

__all__ = ["Unsupported", "refused", "unsupported"]


def refused(error: RuntimeError) -> bool:
    """Whether `error` is torch.export refusing an MXTensor built inside the exported forward."""
    return torch.compiler.is_exporting() and "NotImplemented" in str(error)


class Unsupported(TypeError):
    """An op torch.export cannot trace on an MXTensor built inside the exported forward."""


def unsupported(func) -> Unsupported:
    name = getattr(func, "__name__", str(func))
    return Unsupported(
        f"torch.export: {name} on an MXTensor built inside the exported forward is not "
        "supported (torch.export cannot trace a tensor subclass created there). Inside the "
        "forward, use such an MXTensor only in F.linear, torch.matmul / @ or .dequantize(); "
        "apply views to the high-precision tensor before MXTensor.to_mx, or hold the MXTensor "
        "as a parameter or buffer of the module (docs/export.md)")

"""When a call may take the short way: straight to the implementation, below autograd and the
operator dispatcher.

Outside torch.compile / torch.export / torch.jit.trace tracing, under no TorchDispatchMode
(fake tensors, functionalization, profilers that count ops) and no torch.func transform (vmap,
grad), and with no gradient asked of its tensors, a call
through an autograd.Function and a torchmx operator computes exactly what calling the
operator's implementation computes; the layers only add host time. Everywhere else the full
path runs, so compiled and exported graphs keep the operators.
"""

import torch

__all__ = ["short_path", "untraced"]

_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_transforms = torch._C._are_functorch_transforms_active
_jit_tracing_state = torch._C._get_tracing_state


def untraced() -> bool:
    """True outside torch.compile / torch.export / torch.jit.trace tracing, TorchDispatchModes
    and torch.func transforms: what short_path asks before it looks at the tensors."""
    return not (_is_compiling() or _dispatch_modes() or _functorch_transforms()
                or _jit_tracing_state() is not None)


def short_path(*tensors) -> bool:
    """True when a call on `tensors` (None entries ignored) may skip autograd and dispatch."""
    if not untraced():
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return False
    return True

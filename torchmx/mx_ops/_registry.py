"""Which function handles an op on MXTensors (no torchmx imports: MXTensor looks handlers up
here, the handler modules register themselves here)."""

from typing import Callable, Dict

import torch

# aten OpOverload (or OpOverloadPacket: every overload) -> handler(func, args, kwargs)
OP_TABLE: Dict[object, Callable] = {}
# torch-level function intercepted above autograd (F.linear, torch.matmul, ...) ->
# handler(func, args, kwargs); see MXTensor.__torch_function__
TORCH_FUNCTIONS: Dict[Callable, Callable] = {}
_fallback = []  # [handler] for aten ops off the table (set by fallback.py)


def implements(*ops):
    """Register the decorated function as MXTensor's implementation of the given aten ops."""

    def register(handler):
        for op in ops:
            OP_TABLE[op] = handler
        return handler

    return register


def implements_torch_function(*funcs):
    """Register the decorated function for torch-level functions called with an MXTensor."""

    def register(handler):
        for func in funcs:
            TORCH_FUNCTIONS[func] = handler
        return handler

    return register


def set_fallback(handler) -> None:
    _fallback[:] = [handler]


def aten_handler(func: torch._ops.OpOverload) -> Callable:
    """The table's handler for `func` (by overload, then by packet), else the fallback."""
    return OP_TABLE.get(func) or OP_TABLE.get(func.overloadpacket) or _fallback[0]


def in_table(func: torch._ops.OpOverload) -> bool:
    """True when any overload of func's packet has a handler (e.g. mm.default for mm.out)."""
    packet = func.overloadpacket
    return packet in OP_TABLE or any(
        getattr(packet, name) in OP_TABLE for name in packet.overloads())

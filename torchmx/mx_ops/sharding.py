"""Ops that sharding frameworks (FSDP2, DTensor) call on MXTensors beyond the views and storage
ops: `as_strided` onto the tensor's own geometry (FSDP2 rebuilds every unsharded parameter
that way) is an alias. Any other `as_strided` would cut blocks or packing groups at arbitrary
element offsets: it goes to the fallback (a TypeError naming the op).
"""

import torch

from ..mx_tensor import MXTensor
from ._registry import implements
from .fallback import dequantize_fallback
from .storage import map_storage

aten = torch.ops.aten


def _same_geometry(t: MXTensor, size, stride, storage_offset) -> bool:
    return (list(size) == list(t.shape) and list(stride) == list(t.stride())
            and (storage_offset or 0) == t.storage_offset())


@implements(aten.as_strided.default)
def _as_strided(func, args, kwargs):
    t = args[0]
    size, stride = args[1], args[2]
    storage_offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    if isinstance(t, MXTensor) and _same_geometry(t, size, stride, storage_offset):
        return map_storage(t, aten.alias.default)
    return dequantize_fallback(func, args, kwargs)

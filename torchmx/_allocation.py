"""Fresh outputs for calls whose shapes were settled when they were bound (the C kernels' calls,
the bound CUDA launches): PyTorch's C allocators of contiguous tensors, the ones
torch.compile's generated code allocates with, skip `torch.empty`'s Python argument parsing
(benchmarks/bench_overhead.py's last row times the two). They also skip the fill of fresh
memory that torch.use_deterministic_algorithms can ask of torch.empty: the kernels write every
byte of these outputs, so the fill would change nothing."""

import functools
from typing import Callable, Sequence

import torch
from torch._prims_common import make_contiguous_strides_for

__all__ = ["allocator"]

try:
    from torch._C._dynamo.guards import _empty_strided_cpu, _empty_strided_cuda
    _C_ALLOCATORS = {"cpu": _empty_strided_cpu, "cuda": _empty_strided_cuda}
except ImportError:  # a PyTorch without them: torch.empty
    _C_ALLOCATORS = {}


def allocator(shape: Sequence[int], dtype: torch.dtype,
              device: torch.device) -> Callable[[], torch.Tensor]:
    """A function () -> a new contiguous tensor of `shape` and `dtype` on `device`. On CUDA it
    allocates on the current device, as torch.compile's allocator does: call it only where
    `device` is the current device (the bound calls make it so: kernels/_launch.on_device)."""
    shape = tuple(shape)
    new = _C_ALLOCATORS.get(device.type)
    if new is None:
        return functools.partial(torch.empty, shape, dtype=dtype, device=device)
    return functools.partial(new, shape, make_contiguous_strides_for(shape), dtype)

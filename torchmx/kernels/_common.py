"""What the kernel modules share: the interpreter switch, device facts looked up once, tile
and alignment helpers, and the decode constants of the formats as the kernels take them.
No Triton needed (the layouts and the dispatch import this module on machines without it).
"""

import functools
import os
from typing import Dict, Tuple

import torch

from .. import dtypes

__all__ = ["interpreting", "sm_count", "device_capability", "block_m_for", "aligned",
           "decode_constants", "packed_decode_constants", "empty"]


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty(shape, dtype=dtype, device=device) for the outputs every kernel call
    allocates. The sizes go in one by one: PyTorch's argument parser reads them faster than
    one tuple (benchmarks/bench_overhead.py's `torch.empty(*sizes)` row times the two)."""
    if not shape:
        return torch.empty((), dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def interpreting() -> bool:
    """Triton's interpreter: Triton reads the variable once, when a kernel is decorated."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def sm_count(device: torch.device) -> int:
    """The device's streaming multiprocessors (8 on a CPU, where the interpreter runs)."""
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def _capability_of(index: int) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> Tuple[int, int]:
    """A CUDA device's compute capability, looked up once per device (the kernels choose
    their paths by it on every call)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability_of(index)


def block_m_for(M: int) -> int:
    """Activation rows per tensor-core tile for M rows."""
    return 16 if M <= 16 else (32 if M <= 32 else 64)


def aligned(t: torch.Tensor, to: int = 16) -> bool:
    """The tensor's first byte lies on a `to`-byte boundary (meta tensors always do). For a
    tensor that torch.compile traces (fake or functional: no address), its offset from its
    storage's start does: inductor keeps a graph's inputs 16-byte aligned (it copies the
    misaligned ones) and allocates its own buffers aligned."""
    if t.device.type == "meta":
        return True
    if isinstance(t, _traced_types()):
        return t.storage_offset() * t.element_size() % to == 0
    return t.data_ptr() % to == 0


@functools.lru_cache(maxsize=None)
def _traced_types() -> tuple:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor
    return FakeTensor, FunctionalTensor


@functools.lru_cache(maxsize=None)
def decode_constants(fmt: dtypes.DType) -> Dict[str, object]:
    """The constexprs of the dequantize kernels' decode (_tl_numerics.decode_value)."""
    is_int = fmt.kind == "int"
    m = fmt.mantissa_bits
    lsb = 2.0 ** -m if is_int else 2.0 ** (fmt.min_exponent - m)
    return dict(IS_INT=is_int, BITS=fmt.bits, MBITS=m, BIAS=fmt.exponent_bias,
                HAS_INF=fmt.has_inf, HAS_NAN=fmt.has_nan, LSB=lsb,
                TO_VALUE=2.0 ** (127 - fmt.exponent_bias))


@functools.lru_cache(maxsize=None)
def packed_decode_constants(fmt: dtypes.DType) -> Dict[str, object]:
    """The decode constants as the linear kernels take them (no BIAS) and the codes per packed
    group (CPG)."""
    constants = {k: v for k, v in decode_constants(fmt).items() if k != "BIAS"}
    return dict(constants, CPG=fmt.codes_per_group)

"""`torch.ops.torchmx.mx_weight_linear_triton`: mx_weight_linear with its kernel launches
visible to torch.compile.

Inductor calls an ordinary custom operator through the dispatcher at every step of a compiled
graph, and the operator's body then finds its plan: more host time per one-row MX linear
than a decode kernel's GPU time (benchmarks/bench_overhead.py --mlp; docs/performance.md).
This operator is a `torch.library.triton_op`: torch.compile runs its body once, on fake
tensors, while it traces the graph; the body records its Triton launches through
`torch.library.wrap_triton`, and inductor's generated code makes them itself, as it launches
its own kernels. The launches are
the eager plan's (kernels/linear/dispatch.py `traced_linear`): the same kernels with the same
constants, so the bits are eager's.

Only plans of one launch are traced: the fused kernel and the byte GEMV without a split of K
(decode). Products with a split-K reduce, the tensor-core kernel (2..64 rows), dequantize +
cuBLAS (many rows) and symbolic shapes call mx_weight_linear inside the body, which then stays
one opaque node of the graph; so does every product off CUDA.

`_route` in weight_matmul.py calls this operator instead of mx_weight_linear while
torch.compile traces a product on the current CUDA device, but not under torch.export:
exported programs keep mx_weight_linear, which a saved program names. The operator is defined at the end of
`import torchmx` where CUDA and Triton are present (`define_where_usable`), so that a CPU
machine imports no Triton.
"""

import importlib.util
import warnings
from typing import Optional

import torch
from torch import Tensor

__all__ = ["define", "defined", "define_where_usable"]

_OP = []  # [the operator], once defined


def defined() -> bool:
    """Whether torch.ops.torchmx.mx_weight_linear_triton exists in this process."""
    return bool(_OP)


def define() -> None:
    """Defines torch.ops.torchmx.mx_weight_linear_triton (once per process; imports Triton)."""
    if _OP:
        return
    from torch._library import triton as triton_library

    from ..kernels.linear import byte_gemv, dispatch, matmul_kernels
    from . import weight_matmul

    @torch.library.triton_op("torchmx::mx_weight_linear_triton", mutates_args=())
    def mx_weight_linear_triton(input: Tensor, weight_scale: Tensor, weight_data: Tensor,
                                elem_dtype_name: str, block_size: int, in_features: int,
                                bias: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
        """mx_weight_linear's product (same arguments, same bits)."""
        out = None
        if _static(input, weight_scale, weight_data) and weight_matmul._kernels_usable(
                input.device):
            fmt = weight_matmul._check_parts(input, weight_scale, weight_data, elem_dtype_name,
                                             block_size, in_features, bias, out_dtype,
                                             "mx_weight_linear_triton")
            out = dispatch.traced_linear(input, weight_scale, weight_data, fmt, block_size,
                                         in_features, bias, out_dtype)
        if out is None:
            out = torch.ops.torchmx.mx_weight_linear(input, weight_scale, weight_data,
                                                     elem_dtype_name, block_size, in_features,
                                                     bias, out_dtype)
        return out

    # The kernels the body launches, which triton_op cannot find in its source (they are
    # reached through the plans): torch.compile's caches key compiled graphs by their sources.
    kernels = getattr(triton_library, "triton_ops_to_kernels", None)
    if kernels is not None:
        kernels["torchmx::mx_weight_linear_triton"] = [matmul_kernels.mx_weight_matmul_kernel,
                                                       byte_gemv.byte_gemv_kernel]
    _OP.append(mx_weight_linear_triton)


def _static(*tensors) -> bool:
    """No symbolic size or stride (torch.compile's dynamic shapes): plans need numbers."""
    return all(type(n) is int for t in tensors for n in (*t.shape, *t.stride()))


def define_where_usable() -> None:
    """`define` on a machine with a CUDA device and Triton (torchmx/__init__.py calls it); a
    warning, and compiled graphs that keep mx_weight_linear, where Triton does not import."""
    if not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return
    try:
        define()
    except ImportError as error:
        warnings.warn(f"torchmx: Triton does not import ({error}); torch.compile will call "
                      "the MX linear operator at every step instead of launching its kernels",
                      stacklevel=2)

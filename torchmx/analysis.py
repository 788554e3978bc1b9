"""Error metrics: what an MX format costs a tensor, measured exactly (float64 accumulation).

    >>> stats = quantization_error(weight, "float4_e2m1")
    >>> print(format_error_table(compare_formats(weight)))
"""

from dataclasses import asdict, dataclass
from typing import Iterable, List, Optional, Union

import torch

from . import dtypes
from .numerics import arguments as args
from .numerics.reference import effective_block_size


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio 10*log10(sum x^2 / sum (x - x_hat)^2), in dB.

    +inf when the approximation is exact; NaN where the reference has no finite signal.
    """
    if reference.shape != approximation.shape:
        raise ValueError(f"shapes differ: {tuple(reference.shape)} and {tuple(approximation.shape)}")
    reference, approximation = reference.double(), approximation.double()
    signal = reference.pow(2).sum()
    noise = (reference - approximation).pow(2).sum()
    if noise == 0:
        return float("inf")
    return float(10 * torch.log10(signal / noise))


@dataclass(frozen=True)
class ErrorStats:
    """How well `elem_dtype` represents a tensor (finite elements only)."""

    elem_dtype: str
    block_size: int
    scale_mode: str
    sqnr_db: float
    mse: float
    max_abs_error: float
    # Fraction of nonzero elements that quantized to zero (underflow within their block).
    flushed_fraction: float
    # Fraction of elements clamped to the format's max (possible under `floor` scales).
    saturated_fraction: float
    bits_per_element: float

    def as_dict(self) -> dict:
        return asdict(self)


def quantization_error(
    x: torch.Tensor,
    elem_dtype: Union[dtypes.DType, str],
    block_size: int = 32,
    *,
    scale_mode: str = "floor",
    rounding: str = "even",
    block_dim: int = -1,
    seed: Optional[int] = None,
) -> ErrorStats:
    """Quantize `x` with the custom ops and measure the error of its dequantization."""
    elem_dtype = dtypes.resolve(elem_dtype)
    args.check_high_precision_input(x, "x")
    args.check_block_size(block_size)  # the op's schema would take True as 1
    axis = args.normalize_block_dim(block_dim, x.dim())
    seed = args.resolve_seed(seed, args.check_rounding(rounding))
    scale, data = torch.ops.torchmx.quantize_mx(x, elem_dtype.name, block_size, scale_mode=scale_mode,
                                                rounding=rounding, block_dim=axis, seed=seed)
    n = 1 if x.dim() == 0 else x.shape[axis]
    x_hat = torch.ops.torchmx.dequantize_mx(data, scale, elem_dtype.name, block_size, torch.float32,
                                            axis, block_dim_size=n).reshape(x.shape)
    # Blocks holding NaN/Inf dequantize to NaN as a whole: measure the finite rest.
    finite = torch.isfinite(x) & torch.isfinite(x_hat)
    ref, approx = x.double()[finite], x_hat.double()[finite]
    error = (ref - approx).abs()
    nonzero = ref != 0
    # An element saturated when its block's largest code could not reach it.
    scale_axis = axis if x.dim() else 0
    block_max = (torch.exp2(scale.double() - 127) * elem_dtype.max).repeat_interleave(
        effective_block_size(block_size, n), scale_axis)
    block_max = block_max.narrow(scale_axis, 0, n).reshape(x.shape)[finite]
    saturated = (approx.abs() == block_max) & (ref.abs() > block_max)
    count = max(ref.numel(), 1)
    return ErrorStats(
        elem_dtype=elem_dtype.name,
        block_size=block_size,
        scale_mode=scale_mode,
        sqnr_db=sqnr_db(ref, approx) if ref.numel() else float("nan"),
        mse=float(error.pow(2).sum() / count),
        max_abs_error=float(error.max()) if error.numel() else 0.0,
        flushed_fraction=int(((approx == 0) & nonzero).sum()) / max(int(nonzero.sum()), 1),
        saturated_fraction=int(saturated.sum()) / count,
        bits_per_element=elem_dtype.bits + 8 / block_size,
    )


def compare_formats(
    x: torch.Tensor,
    formats: Iterable[Union[dtypes.DType, str]] = dtypes.SUPPORTED_ELEM_DTYPES,
    block_size: int = 32,
    **options,
) -> List[ErrorStats]:
    """`quantization_error` of `x` for each format."""
    return [quantization_error(x, fmt, block_size, **options) for fmt in formats]


def format_error_table(rows: Iterable[ErrorStats]) -> str:
    """A fixed-width text table of error statistics."""
    lines = [f"{'format':<12} {'block':>5} {'scale':>6} {'bits':>5} {'SQNR dB':>8} "
             f"{'max |err|':>10} {'flushed':>8} {'saturated':>9}"]
    for r in rows:
        lines.append(f"{r.elem_dtype:<12} {r.block_size:>5} {r.scale_mode:>6} {r.bits_per_element:>5.2f} "
                     f"{r.sqnr_db:>8.2f} {r.max_abs_error:>10.3g} {r.flushed_fraction:>8.2%} "
                     f"{r.saturated_fraction:>9.2%}")
    return "\n".join(lines)

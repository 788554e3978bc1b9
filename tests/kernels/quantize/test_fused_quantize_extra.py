"""The fused row-wise + column-wise quantize pass (triton_backend.quantize_rowwise_colwise) on
inputs aimed at its element encode with round half to even (_tl_quantize.codes_rne): every
bf16 and fp16 value below the format's top binade next to a fixed block maximum, fp32 values a
few ulps around every rounding midpoint and binade edge, NaN / Inf blocks with negative
elements, and extreme scales (underflowing y, subnormal block maxima). Both copies are
compared bit for bit with the reference (two calls, blocks along dim -1 and dim -2).

Runs like tests/kernels/quantize/test_triton_quantize.py: on a CUDA GPU, else through Triton's interpreter.
"""

import pytest
import torch

from formats import FORMATS, SCALE_MODES, bit_view
from torchmx import dtypes
from torchmx.kernels.quantize import triton_backend as tb
from torchmx.numerics import quantize_mx_reference

GPU = torch.cuda.is_available()  # else tests/conftest.py runs Triton's interpreter
DEVICE = "cuda" if GPU else "cpu"
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

ALL = FORMATS + (dtypes.ExMy(3, 2, bias=10), dtypes.ExMy(6, 1, bias=0))
FLOATS = [f for f in ALL if f.kind != "int"]
T = 32  # block size (both ways) and tile side


def tiled(values: torch.Tensor, anchor: float, dtype, tiles_c: int = 6) -> torch.Tensor:
    """A [32 * n, 32 * tiles_c] matrix: `anchor` on the diagonal of every 32 x 32 tile (so every
    row block and every column block holds it), `values` in the other places in order, the rest
    zeros. With |values| <= anchor, every block's scale comes from the anchor."""
    per_tile = T * T - T
    tiles = -(-values.numel() // per_tile)
    tiles_r = -(-tiles // tiles_c)
    flat = torch.zeros(tiles_r * tiles_c * per_tile, dtype=torch.float64)
    flat[:values.numel()] = values.double()
    off = ~torch.eye(T, dtype=torch.bool)
    x = torch.full((tiles_r, tiles_c, T, T), anchor, dtype=torch.float64)
    x[:, :, off] = flat.view(tiles_r, tiles_c, per_tile)
    return x.permute(0, 2, 1, 3).reshape(tiles_r * T, tiles_c * T).to(dtype)


def check(x: torch.Tensor, fmt, scale_mode: str, what: str):
    got = tb.quantize_rowwise_colwise(x.to(DEVICE), fmt, T, scale_mode, "even", None)
    for axis, (scale, data) in zip((-1, -2), got):
        es, ed = quantize_mx_reference(x, fmt, T, scale_mode=scale_mode, block_dim=axis)
        for name, e, g in (("scale", es, scale), ("data", ed, data)):
            e, g = bit_view(e.cpu()), bit_view(g.cpu())
            if not torch.equal(e, g):
                bad = (e != g).nonzero()[:4].tolist()
                raise AssertionError(f"{name} {fmt.name} {scale_mode} axis={axis} {what}: "
                                     f"{int((e != g).sum())} of {e.numel()} differ, first at {bad}")


def top(fmt) -> float:
    """The largest value of the binade 2**emax (above the format's max for most formats), so
    that floor scales give |y| = |x| for every element below it."""
    return 2.0 ** fmt.emax * 1.9921875


def every_16bit_value_below(limit: float, dtype) -> torch.Tensor:
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    v = bits.view(dtype).float()
    return v[v.abs() < limit]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_every_16bit_value_next_to_a_fixed_block_max(fmt, dtype):
    limit = top(fmt)
    if dtype == torch.float16 and limit > 65504:
        limit = 65504.0
    values = every_16bit_value_below(limit, dtype)
    x = tiled(values, limit, dtype)
    for mode in SCALE_MODES:
        check(x, fmt, mode, f"every {dtype} value")


def midpoints_and_edges(fmt) -> torch.Tensor:
    """fp32 values around every rounding midpoint and binade edge of fmt's grid (y = x)."""
    m = fmt.mantissa_bits
    grid = []
    for e in range(fmt.min_exponent, fmt.emax + 1):
        step = 2.0 ** (e - m)
        start = 0.0 if e == fmt.min_exponent else 2.0 ** e
        k = torch.arange(int(round((2.0 ** (e + 1) - start) / step)) + 1, dtype=torch.float64)
        grid.append(start + k * step)
    grid = torch.unique(torch.cat(grid))
    points = torch.cat([grid, (grid[1:] + grid[:-1]) / 2]).float()
    points = points[(points > 0) & (points < top(fmt))]
    bits = points.view(torch.int32)
    near = torch.cat([bits + d for d in range(-3, 4)]).view(torch.float32)
    near = near[(near > 0) & (near < top(fmt))]
    return torch.cat([near, -near])


@pytest.mark.parametrize("fmt", FLOATS, ids=lambda f: f.name)
def test_fp32_values_around_midpoints_and_binade_edges(fmt):
    x = tiled(midpoints_and_edges(fmt), top(fmt), torch.float32)
    for mode in SCALE_MODES:
        check(x, fmt, mode, "fp32 midpoints")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_nan_inf_blocks_signed_zeros_and_extreme_scales(fmt, dtype):
    g = torch.Generator().manual_seed(11)
    n = 4 * (T * T - T) * 6
    mags = torch.exp2(torch.randint(-140, 128, (n,), generator=g).float()) \
        * (1 + torch.rand(n, generator=g))
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    values = (mags * signs).clamp(-3.0e38, 3.0e38)
    for anchor in (3.0e38, 1.0e-38, 2.0 ** -130, 1.0):
        x = tiled(values.clamp(-abs(anchor), abs(anchor)), anchor, dtype)
        x.view(-1)[::97] = -0.0
        special = x.clone()
        special[5, 3] = float("nan")
        special[40, 70] = float("inf")
        special[90, 9] = -float("inf")
        special[40:44, 64:100] = -1.5  # negative elements in the NaN / Inf blocks
        special[2, 0:40] = -2.0
        # Side by side, 6 blocks apart: every block of either stays as it is, one launch for both.
        both = torch.cat([x, special], dim=1)
        for mode in SCALE_MODES:
            check(both, fmt, mode, f"random | NaN / Inf anchor={anchor}")

"""Parametrization shared by the tests: every format, mode and dtype the contract covers."""

import torch

from torchmx import dtypes
from torchmx.numerics import ROUNDING_MODES as ROUNDINGS
from torchmx.numerics import SCALE_MODES

FORMATS = dtypes.SUPPORTED_ELEM_DTYPES + (dtypes.ExMy(1, 2), dtypes.ExMy(3, 3), dtypes.ExMy(2, 0))
FORMAT_IDS = [f.name for f in FORMATS]
HP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def every_custom_format():
    """Every ExMy width that fits a byte with its default bias (the memory-safety sweeps)."""
    found = []
    for e in range(1, 8):
        for m in range(0, 8 - e):
            try:
                found.append(dtypes.ExMy(e, m))
            except ValueError:  # a default bias outside the exactness limits
                pass
    return found


def wide_range_input(shape, dtype, seed=0):
    """Gaussian values spread over many binades per row, with NaN, Inf, zero and tiny blocks."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    if x.dim() >= 1 and x.numel() > 0:
        spread = torch.randint(-30, 30, shape, generator=generator).double()
        x = x * torch.exp2(spread.clamp(-12, 12) if dtype == torch.float16 else spread)
    x = x.to(dtype)
    flat = x.view(-1)
    if flat.numel() >= 200:
        flat[7] = float("nan")
        flat[100] = float("-inf")
        flat[130:170] = 0.0
        flat[131] = -0.0
        flat[171:190] = torch.finfo(dtype).tiny / 8  # subnormal inputs
    return x


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """Integer view of a float tensor, so that comparisons are bitwise (NaN == NaN, -0 != 0)."""
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def every_code_every_scale(fmt):
    """(scale [256, 1], packed data [256, n], n): every code of `fmt` in one block next to every
    E8M0 byte, including 0 (2**-127) and 255 (NaN)."""
    from torchmx.numerics import pack_codes

    codes = torch.arange(1 << fmt.bits, dtype=torch.int32)
    n = codes.numel()
    scale = torch.arange(256, dtype=torch.int32).to(torch.uint8).unsqueeze(1)
    return scale, pack_codes(codes.expand(256, n), fmt), n

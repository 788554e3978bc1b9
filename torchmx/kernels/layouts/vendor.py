"""Scale (and fp4 data) layouts that vendor block-scaled GEMMs read, with exact inverses.

torchmx stores an MX tensor's E8M0 scales row-major, shaped like the data with the block axis
reduced (see docs/numerics.md). Vendor GEMMs want them rearranged; these exporters do it in
plain torch (a pad, a reshape and a permute: cheap next to a GEMM) and every one has an
inverse that returns the original bytes exactly.

NVIDIA (cuBLAS / CUTLASS block-scaled GEMMs, `torch._scaled_mm` with MX operands):
  `to_blocked(scale)`: a [rows, cols] scale matrix (rows = M or N, cols = K / 32) is zero-padded
  to whole 128 x 4 tiles; tiles are laid out row-major (tile row, then tile column), and inside
  a tile the byte of (r, c) sits at (r % 32) * 16 + (r // 32) * 4 + c: four 32-row slabs
  interleaved so that one 16-byte row holds the 4 scales of 4 rows 32 apart. Returns the flat
  byte vector of 512 bytes per tile, as torch._scaled_mm takes it. `from_blocked` inverts it.

AMD MI355X (gfx950) aiter kernels:
  `shuffle_scale_aiter(scale)`: a [m, n] scale matrix is zero-padded to a multiple of 256 rows
  and 8 columns, then each 32 x 8 tile becomes 256 contiguous bytes: with r = 16 * a + b and
  c = 4 * d + e, the byte of (r, c) moves to tile offset e * 64 + b * 4 + d * 2 + a. Tiles are
  ordered row-major; the result has the padded [m, n] shape.
  `shuffle_weight_aiter(data)`: packed fp4 (or any 1-byte) data [..., N, K_bytes], N a multiple
  of 16 and K_bytes of 32: each 16-row x 32-byte tile is stored as its two 16-byte halves in
  turn, each half as 16 rows of 16 bytes (so one 256-byte run holds one K chunk of 16 rows).
  Established from aiter's public Python (`aiter.utility.fp4_utils.e8m0_shuffle`,
  `aiter.ops.shuffle.shuffle_weight` with layout (16, 16)); not run against an MI355X here
  (docs/kernels.md). aiter pads scales with uninitialized memory; ours pads with zeros.
"""

from typing import Tuple

import torch

__all__ = [
    "to_blocked",
    "from_blocked",
    "blocked_size",
    "shuffle_scale_aiter",
    "unshuffle_scale_aiter",
    "shuffle_weight_aiter",
    "unshuffle_weight_aiter",
]

_TILE_ROWS, _TILE_COLS = 128, 4  # NVIDIA scale tile
_SLABS = 4  # 32-row slabs per NVIDIA tile
_AITER_PAD_ROWS, _AITER_PAD_COLS = 256, 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_matrix(scale, arg: str) -> torch.Tensor:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dim() < 2:
        raise ValueError(f"{arg} must have at least 2 dims [..., rows, cols], got shape "
                         f"{tuple(scale.shape)}")
    if scale.element_size() != 1:
        raise TypeError(f"{arg} must hold 1-byte elements (uint8 E8M0 scales), got {scale.dtype}")
    return scale


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x [..., r, c] zero-padded to [..., rows, cols] (returned as is when already that size)."""
    r, c = x.shape[-2:]
    if (r, c) == (rows, cols):
        return x
    out = x.new_zeros(*x.shape[:-2], rows, cols)
    out[..., :r, :c] = x
    return out


def blocked_size(rows: int, cols: int) -> int:
    """Bytes of to_blocked's output for a [rows, cols] scale matrix."""
    return _cdiv(rows, _TILE_ROWS) * _cdiv(cols, _TILE_COLS) * _TILE_ROWS * _TILE_COLS


def to_blocked(scale: torch.Tensor) -> torch.Tensor:
    """[..., rows, cols] scale bytes -> [..., blocked_size(rows, cols)] in the cuBLAS / CUTLASS
    128 x 4 block-scaled layout (zero padding); 2-d input gives the flat vector _scaled_mm takes."""
    _check_matrix(scale, "scale")
    *lead, rows, cols = scale.shape
    tiles_r, tiles_c = _cdiv(rows, _TILE_ROWS), _cdiv(cols, _TILE_COLS)
    x = _pad_to(scale, tiles_r * _TILE_ROWS, tiles_c * _TILE_COLS)
    # (tile row, slab, row in slab, tile col, col) -> (tile row, tile col, row in slab, slab, col)
    x = x.reshape(*lead, tiles_r, _SLABS, 32, tiles_c, _TILE_COLS)
    n = len(lead)
    x = x.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4)
    return x.reshape(*lead, -1)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of to_blocked: [..., blocked_size(rows, cols)] -> [..., rows, cols]."""
    if not isinstance(blocked, torch.Tensor) or blocked.dim() < 1:
        raise TypeError("blocked must be a torch.Tensor with at least 1 dim")
    size = blocked_size(rows, cols)
    if blocked.shape[-1] != size:
        raise ValueError(f"blocked has {blocked.shape[-1]} bytes in its last dim; a "
                         f"[{rows}, {cols}] scale matrix takes {size}")
    lead = list(blocked.shape[:-1])
    tiles_r, tiles_c = _cdiv(rows, _TILE_ROWS), _cdiv(cols, _TILE_COLS)
    x = blocked.reshape(*lead, tiles_r, tiles_c, 32, _SLABS, _TILE_COLS)
    n = len(lead)
    x = x.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4)
    x = x.reshape(*lead, tiles_r * _TILE_ROWS, tiles_c * _TILE_COLS)
    return x[..., :rows, :cols].contiguous()


def shuffle_scale_aiter(scale: torch.Tensor) -> torch.Tensor:
    """[m, n] scale bytes -> [m_pad, n_pad] (m_pad a multiple of 256, n_pad of 8) in the aiter
    (MI355X) scale layout; leading batch dims are kept."""
    _check_matrix(scale, "scale")
    *lead, m, n = scale.shape
    m_pad = _cdiv(m, _AITER_PAD_ROWS) * _AITER_PAD_ROWS
    n_pad = _cdiv(n, _AITER_PAD_COLS) * _AITER_PAD_COLS
    x = _pad_to(scale, m_pad, n_pad)
    # rows = (tile, a, b) with r = 16a + b; cols = (tile, d, e) with c = 4d + e
    x = x.reshape(*lead, m_pad // 32, 2, 16, n_pad // 8, 2, 4)
    k = len(lead)
    x = x.permute(*range(k), k, k + 3, k + 5, k + 2, k + 4, k + 1)  # (tile_r, tile_c, e, b, d, a)
    return x.reshape(*lead, m_pad, n_pad)


def unshuffle_scale_aiter(shuffled: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """Inverse of shuffle_scale_aiter: [m_pad, n_pad] -> the original [m, n]."""
    _check_matrix(shuffled, "shuffled")
    *lead, m_pad, n_pad = shuffled.shape
    if (m_pad, n_pad) != (_cdiv(m, _AITER_PAD_ROWS) * _AITER_PAD_ROWS,
                          _cdiv(n, _AITER_PAD_COLS) * _AITER_PAD_COLS):
        raise ValueError(f"shuffled has shape [..., {m_pad}, {n_pad}], which is not the padded "
                         f"shape of a [{m}, {n}] scale matrix")
    x = shuffled.reshape(*lead, m_pad // 32, n_pad // 8, 4, 16, 2, 2)  # (tile_r, tile_c, e, b, d, a)
    k = len(lead)
    x = x.permute(*range(k), k, k + 5, k + 3, k + 1, k + 4, k + 2)  # (tile_r, a, b, tile_c, d, e)
    return x.reshape(*lead, m_pad, n_pad)[..., :m, :n].contiguous()


def _weight_tiles(data: torch.Tensor, layout: Tuple[int, int], arg: str):
    _check_matrix(data, arg)
    rows_per_tile, half_bytes = layout
    if (not isinstance(rows_per_tile, int) or not isinstance(half_bytes, int)
            or rows_per_tile < 1 or half_bytes < 1):
        raise ValueError(f"layout must be two positive ints, got {layout!r}")
    vector = 16 // data.element_size()  # elements per 16-byte vector
    tile_cols = 2 * half_bytes
    rows, cols = data.shape[-2:]
    if rows % rows_per_tile or cols % tile_cols or tile_cols % vector:
        raise ValueError(f"{arg} of shape {tuple(data.shape)} must have rows divisible by "
                         f"{rows_per_tile} and columns divisible by {tile_cols} (layout {layout})")
    return rows_per_tile, tile_cols, vector


def shuffle_weight_aiter(data: torch.Tensor, layout: Tuple[int, int] = (16, 16)) -> torch.Tensor:
    """Packed fp4 (or fp8 / int8) weight data [..., N, K_bytes] -> the same shape in aiter's
    pre-shuffled weight layout (tiles of layout[0] rows x 2 * layout[1] columns)."""
    rows_per_tile, tile_cols, vector = _weight_tiles(data, layout, "data")
    *lead, rows, cols = data.shape
    x = data.reshape(-1, rows // rows_per_tile, rows_per_tile, cols // tile_cols,
                     tile_cols // vector, vector)
    x = x.permute(0, 1, 3, 4, 2, 5)  # (batch, tile_r, tile_c, vector index, row, element)
    return x.reshape(data.shape)


def unshuffle_weight_aiter(shuffled: torch.Tensor, layout: Tuple[int, int] = (16, 16)) -> torch.Tensor:
    """Inverse of shuffle_weight_aiter."""
    rows_per_tile, tile_cols, vector = _weight_tiles(shuffled, layout, "shuffled")
    *lead, rows, cols = shuffled.shape
    x = shuffled.reshape(-1, rows // rows_per_tile, cols // tile_cols, tile_cols // vector,
                         rows_per_tile, vector)
    x = x.permute(0, 1, 4, 2, 3, 5)  # (batch, tile_r, row, tile_c, vector index, element)
    return x.reshape(shuffled.shape)

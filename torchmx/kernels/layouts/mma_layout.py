"""The MMA layout: a copy of an MX weight whose every warp load in `mma_linear` is contiguous.

`mma_linear` (kernels/linear/mma_linear.py) reads the standard layout (codes [N, packed K], scale bytes
[N, K / 32]) in pieces: lane `4 g + t` of warp `w` loads, for each unit of a row (64 one-byte
codes in 64 bytes, 128 fp6 codes in 96 bytes), the quarter `t` of
the unit (a piece of PIECE = unit bytes / 4) of rows `16 w + g` and `16 w + g + 8` of a 64-row
tile. A warp load thus touches 8 rows, PIECE * 4 bytes of each. `pack` moves the pieces, and
nothing inside them, so that each warp load reads 32 PIECE contiguous bytes and each
64-row x one-unit chunk of W is one run (chunks of a 64-row tile follow each other along K):

    codes  [N / 64, K / unit, 4 (w), 2 (a), 8 (g), 4 (t), PIECE bytes]    64 unit bytes a chunk
    scales [N / 64, K / unit, 4 (w), 8 (g), B (blk), 2 (a)]               128 B (B 2) or 256 B (4)

Row `64 nb + 16 w + 8 a + g`, piece `t` of unit `kb`, and B = unit codes / 32 blocks a unit
(2 for one-byte codes, 4 for fp6). A piece lies in block `blk = t * B / 4`, so the two
scale bytes a lane needs per chunk (rows a = 0, 1 of its block) are adjacent. The layout is a
permutation of bytes: the kernel decodes exactly what it decodes from the standard layout.

Only blocks of 32 (the OCP MX block), N and K multiples of 64 and of a unit: `fits`. MXFP4
weights have no MMA layout: prepack() gives every MXFP4 weight that would fit one the
fp4 wgmma layout (fp4_wgmma_layout.py), whose kernel is the faster.
"""

from typing import Tuple

import torch

from ... import dtypes
from ...numerics import arguments as args
from .fast_decode import CHUNK, FAST_SCALES, UNITS

__all__ = ["CHUNK", "FORMATS", "check_pieces", "describe", "fits", "pack", "unpack", "unit"]

BLOCK = 32
FORMATS = tuple(f for f in FAST_SCALES if f != dtypes.float4_e2m1)  # mma_linear's, less fp4


def unit(fmt: dtypes.DType) -> Tuple[int, int]:
    """(codes, bytes) of a row in one unit of this format (fast_decode.UNITS)."""
    return UNITS[fmt.codes_per_group]


def describe() -> str:
    """What `fits` asks, in words (for error messages)."""
    return (f"{', '.join(f.name for f in FORMATS)} in blocks of {BLOCK}, out_features a "
            f"multiple of {CHUNK} and in_features of a unit's codes (64 one-byte or 128 fp6 "
            "codes)")


def fits(fmt: dtypes.DType, block_size: int, out_features: int, in_features: int) -> bool:
    """Whether a weight [out_features, in_features] of this format has an MMA layout: an
    mma_linear format other than fp4 in blocks of 32, out_features a non-zero multiple of 64
    and in_features of a unit's codes (64 one-byte or 128 fp6 codes)."""
    return (fmt in FORMATS and block_size == BLOCK and out_features > 0 and in_features > 0
            and out_features % CHUNK == 0 and in_features % unit(fmt)[0] == 0)


def _dims(fmt: dtypes.DType, N: int, K: int) -> Tuple[int, int, int, int]:
    """(N / 64, K / unit, piece bytes, blocks a unit)."""
    codes, nbytes = unit(fmt)
    return N // CHUNK, K // codes, nbytes // 4, codes // BLOCK


def pack(scale: torch.Tensor, data: torch.Tensor, fmt: dtypes.DType
         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Standard parts (scale bytes [N, K / 32], codes [N, packed K]) -> the MMA layout's
    (codes, scales): flat uint8 copies on data's device."""
    N, K = args.check_weight_parts(scale, data, fmt, BLOCK, fits, describe(),
                                   "mma_layout.pack")
    nb, kb, piece, blocks = _dims(fmt, N, K)
    codes = data.view(torch.uint8).reshape(nb, 4, 2, 8, kb, 4, piece)  # nb w a g | kb t | byte
    scales = scale.reshape(nb, 4, 2, 8, kb, blocks)                    # nb w a g | kb blk
    return (codes.permute(0, 4, 1, 2, 3, 5, 6).reshape(-1).contiguous(),
            scales.permute(0, 4, 1, 3, 5, 2).reshape(-1).contiguous())


def unpack(codes: torch.Tensor, scales: torch.Tensor, fmt: dtypes.DType, out_features: int,
           in_features: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack`: (scale [N, K / 32], data [N, packed K]) uint8."""
    N, K = out_features, in_features
    if (not fits(fmt, BLOCK, N, K) or codes.shape != (N * K * fmt.bytes_per_group
                                                      // fmt.codes_per_group,)
            or scales.shape != (N * K // BLOCK,)):
        raise ValueError(f"mma_layout.unpack: codes and scales must be pack's of a {fmt.name} "
                         f"weight [{out_features}, {in_features}], got shapes "
                         f"{tuple(codes.shape)} and {tuple(scales.shape)}")
    nb, kb, piece, blocks = _dims(fmt, N, K)
    data = codes.reshape(nb, kb, 4, 2, 8, 4, piece).permute(0, 2, 3, 4, 1, 5, 6)
    scale = scales.reshape(nb, kb, 4, 8, blocks, 2).permute(0, 2, 5, 3, 1, 4)
    return scale.reshape(N, K // BLOCK).contiguous(), data.reshape(N, -1).contiguous()


def check_pieces(pieces, fmt: dtypes.DType, block_size: int, N: int, K: int,
                 device: torch.device, op: str = "mma_linear") -> None:
    """ValueError unless `pieces` is (codes, scales, counters): mma_layout.pack's codes and
    scales of this weight [N, K] and int32 counters, one a 64-row tile, all contiguous 1-d
    tensors on `device`."""
    if not fits(fmt, block_size, N, K):
        raise ValueError(f"{op}: the MMA layout needs a weight of {describe()}, "
                         f"got {fmt.name} [{N}, {K}] in blocks of {block_size}")
    if not isinstance(pieces, (tuple, list)) or len(pieces) != 3:
        got = (f"a {type(pieces).__name__} of {len(pieces)}" if isinstance(pieces, (tuple, list))
               else type(pieces).__name__)
        raise ValueError(f"{op}: pieces must be (codes, scales, counters), got {got}")
    expected = [(N * K * fmt.bytes_per_group // fmt.codes_per_group, torch.uint8, 16),
                (N * K // BLOCK, torch.uint8, 1), (N // CHUNK, torch.int32, 4)]
    for name, t, (numel, dtype, alignment) in zip(("codes", "scales", "counters"), pieces,
                                                 expected):
        args.check_flat_part(t, f"{op}: the pieces' {name}", numel, dtype, device, alignment,
                             "mma_layout.pack")

"""The TMA stream layout: a copy of an MX weight that `stream_linear` reads as one run per step.

`stream_linear` (kernels/linear/stream_matmul.py) gives each 64-row tile of W [N, K] one CTA, which
streams the tile's steps (64 rows x 128 codes: 128 bytes a row for one-byte codes, 64 for fp4)
through a shared-memory ring by TMA and takes W as wgmma's A operand from registers. `pack`
lays W out so that:

- each step of each tile is one contiguous run (one TMA box), and the runs go step by step,
  every tile's step 0, then every tile's step 1, ... ("step-major"), so that the CTAs, which
  all go through K at about the same pace, read one region of memory at a time (on an H100
  faster than each tile's steps in one run of its own: benchmarks/bench_stream_linear.py):

      codes  [K / 128, N / 64, 64 rows, WORDS words of 4 bytes]   WORDS = 32 (one-byte), 16
      scales [K / 128, N / 64, 64 rows, 4 blocks]                  4 bytes a row

- within a row, word `S t + s` (t in 0..3, s in 0..S-1, S = WORDS / 4) holds the codes that lane
  `4 g + t` of the wgmma A fragment needs from that row, in wgmma's K order:

      one-byte codes (S = 8): byte 2 h + b of word (t, s) = code 16 s + 8 h + 2 t + b
      fp4 (S = 4): word (t, s) holds codes 32 s + 16 o + 8 h + 2 t + b, code (r, b) with
                   r = 2 o + h at the bits FP4_BITS[r][b] (sign, then the magnitude's bits
                   2, 1, 0)

so a lane reads its S words of a row with one 16-byte (one-byte codes: 32-byte) shared-memory
load and decodes them straight into its A registers (register r of a word: codes (r, 0) and
(r, 1), a bf16 pair adjacent in K). Word s lies in block s // 2 (one-byte codes) or s (fp4) of
its step.

One-byte codes keep their bytes: the layout permutes bytes. fp4 codes also have their bits
spread inside the word, so that the decode builds each register's pair of bf16 bit patterns
(sign at bits 15 / 31, magnitude at 8..6 / 24..22, the denormal trick of mma_linear's
decode) with one or two instructions instead of three:

      register 0: word & 0x81C081C0
      register 1: rotl(word, 10) & 0x81C081C0
      register 2: rotl(word, 13) & 0x81C081C0
      register 3: ((word & 0x001B001B) * 0x1084) & 0x81C081C0   (copies << 2, 7, 12)

Those four bit sets are disjoint and cover the word; FP4_BITS is what they read. Either way
the kernel decodes exactly the standard layout's values.

fp6 (e2m3, e3m2) rows are 96 bytes a step, which no TMA box or register layout takes in one
(their shapes are powers of two), so a row's step is two planes, each one contiguous run of
the whole weight's steps, step-major:

      codes  [K / 128, N / 64, 64 rows, 64 bytes]   plane A (the first 2/3 of the bytes)
             [K / 128, N / 64, 64 rows, 32 bytes]   plane B (the last 1/3)

Lane t's 24 bytes of a row are its eight three-byte groups s (the standard fp6 packing of
codes 16 s + 8 h + 2 t + b, code 2 h + b at bits 6 (2 h + b) of the group): bytes 0..15 at 16 t
of plane A, bytes 16..23 at 8 t of plane B. Its words A0, A1, A2 (groups 0..3) and A3, B0, B1
(groups 4..7) are the two halves of the step's K, each three words as mma_linear's fp6 decode
reads them.

A block's byte in `scales` is not its scale byte s but what the kernel multiplies its codes
by: the exponent field of its bf16 multiplier, s + fast_decode.MULTIPLIER_EXPONENT[fmt]
(the multiplier's bits are that byte times 0x00800080, one instruction), worked out here once
instead of in every call:

- s in fast_decode.FAST_SCALES and no NaN / Inf code in the block: s + MULTIPLIER_EXPONENT;
- every code of the block +-0 (its values are zero whatever the multiplier) and s not 255
  (NaN): the same, clamped to 1..254 (an all-zero block of any scale stays on the fast path);
- else 255: an Inf multiplier, which makes every product of the block Inf or NaN, so that the
  tile's sums come out Inf or NaN and its CTA recomputes the tile exactly from the standard
  layout (linear/stream_matmul.py): a NaN scale, a NaN / Inf code, a scale whose products the one
  multiply cannot give exactly.

Only blocks of 32 (the OCP MX block), out_features a multiple of 64 and in_features a multiple
of 128 with at least two steps (one for each of the kernel's two consumer warpgroups): `fits`.
"""

from typing import Tuple

import torch

from ... import dtypes
from ...numerics import arguments as args
from ...numerics.packing import pack_codes, unpack_codes
from .fast_decode import FAST_SCALES, MULTIPLIER_EXPONENT

__all__ = ["BLOCK", "CHUNK", "FORMATS", "FP4_BITS", "FP6", "FP6_PLANES", "RECOMPUTE",
           "STEP_CODES", "describe", "fits", "fp6_planes", "multiplier_exponents", "pack",
           "step_bytes", "unpack"]

BLOCK = 32
CHUNK = 64  # rows of a tile
STEP_CODES = 128  # codes of a row in one step
FORMATS = (dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.int8, dtypes.float4_e2m1,
           dtypes.float6_e2m3, dtypes.float6_e3m2)
FP6 = (dtypes.float6_e2m3, dtypes.float6_e3m2)
# fp6: a lane's bytes of a row's step in plane A (16) and plane B (8)
FP6_PLANES = (16, 8)
# fp6 codes repacked at a time by pack / unpack (as int32 codes: about 8 bytes a code)
_FP6_TILES_AT_ONCE = 16
# fp4: the word bits of code (r, b) of a word (sign, magnitude bits 2, 1, 0), where the decode
# of register r (module docstring) finds them: bits 15, 8, 7, 6 (+ 16 for b = 1) of its result.
FP4_BITS = (((15, 8, 7, 6), (31, 24, 23, 22)),  # word itself
            ((5, 30, 29, 28), (21, 14, 13, 12)),  # rotated left by 10
            ((2, 27, 26, 25), (18, 11, 10, 9)),  # rotated left by 13
            ((3, 1, 0, 4), (19, 17, 16, 20)))  # masked, times 2**2 + 2**7 + 2**12
# A block's byte in the stream scales where the kernel leaves it to the exact recomputation.
RECOMPUTE = 255
# Rows of W whose blocks multiplier_exponents looks at a time (their codes as int32)
_EXPONENT_ROWS_AT_ONCE = 1024
# TMA coordinates are 32-bit: the codes' rows (N / 64 * K / 128 steps of 64) must index in them.
_MAX_STEP_ROWS = 2 ** 31


def step_bytes(fmt: dtypes.DType) -> int:
    """Bytes of a row in one step: 128 one-byte codes, 64 bytes of fp4 pairs or 96 of fp6
    groups (both planes)."""
    return STEP_CODES * fmt.bytes_per_group // fmt.codes_per_group


def describe() -> str:
    """What `fits` asks, in words (for error messages)."""
    return (f"{', '.join(f.name for f in FORMATS)} in blocks of {BLOCK}, out_features a "
            f"multiple of {CHUNK} and in_features a multiple of {STEP_CODES}, at least "
            f"{2 * STEP_CODES}")


def fits(fmt: dtypes.DType, block_size: int, out_features: int, in_features: int) -> bool:
    """Whether a weight [out_features, in_features] of this format has a TMA stream layout."""
    return (fmt in FORMATS and block_size == BLOCK and out_features > 0
            and out_features % CHUNK == 0 and in_features % STEP_CODES == 0
            and in_features >= 2 * STEP_CODES
            and out_features * in_features // STEP_CODES < _MAX_STEP_ROWS)


def _row_step_shape(fmt: dtypes.DType) -> Tuple[int, int, int]:
    """A row's step as bytes [S (s), J, 4 (t), B]: one-byte codes (8, 2 (h), 2 (b)), fp4
    (4, 4 (2 o + h), 1): byte (s, j, t, b) goes to word (t, s), byte j B + b."""
    return (4, 4, 1) if fmt == dtypes.float4_e2m1 else (8, 2, 2)


def _move_fp4_bits(codes: torch.Tensor, spread: bool) -> torch.Tensor:
    """Flat uint8 fp4 codes, whole words of 4 bytes, with each word's codes moved from the
    standard packing (code (r, b): nibble b of byte r) to FP4_BITS (spread) or back."""
    words = codes.contiguous()
    if words.storage_offset() % 4:  # an int32 view needs whole words of its storage
        words = words.clone()
    words = words.view(torch.int32)
    moved = torch.zeros_like(words)
    for r, pair in enumerate(FP4_BITS):
        for b, bits in enumerate(pair):
            for j, bit in enumerate(bits):  # bits[j] holds the code's bit 3 - j
                packed = 8 * r + 4 * b + 3 - j
                source, target = (packed, bit) if spread else (bit, packed)
                moved |= ((words >> source) & 1) << target
    return moved.view(torch.uint8)


def fp6_planes(codes: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """An fp6 weight's stream codes (pack's, flat) as its planes A and B, views [steps x tiles x
    64 rows, 64 bytes] and [.., 32 bytes]."""
    step = CHUNK * step_bytes(FP6[0])  # bytes of a tile's step, both planes
    if codes.dim() != 1 or codes.numel() % step:
        raise ValueError(f"tma_stream_layout.fp6_planes: codes must be pack's flat fp6 codes (a "
                         f"multiple of {step} bytes), got shape {tuple(codes.shape)}")
    a_bytes = codes.numel() * FP6_PLANES[0] // sum(FP6_PLANES)
    a, b = codes.split([a_bytes, codes.numel() - a_bytes])
    return a.view(-1, 4 * FP6_PLANES[0]), b.view(-1, 4 * FP6_PLANES[1])


def _fp6_pack_tiles(data: torch.Tensor, fmt: dtypes.DType, steps: int) -> torch.Tensor:
    """Standard fp6 codes of some whole tiles [tiles * 64, 3 K / 4] -> their lanes' bytes
    [tiles, steps, 64 rows, 4 (t), 24]."""
    codes = unpack_codes(data, fmt, steps * STEP_CODES)
    codes = codes.reshape(-1, CHUNK, steps, 8, 2, 4, 2)  # tile row step | s h t b
    codes = codes.permute(0, 2, 1, 5, 3, 4, 6)  # tile step row t | s h b
    return pack_codes(codes.reshape(*codes.shape[:4], 32), fmt)


def _fp6_unpack_tiles(lanes: torch.Tensor, fmt: dtypes.DType, steps: int) -> torch.Tensor:
    """The inverse of _fp6_pack_tiles: [tiles, steps, 64, 4, 24] -> [tiles * 64, 3 K / 4]."""
    codes = unpack_codes(lanes, fmt, 32).reshape(*lanes.shape[:4], 8, 2, 2)
    codes = codes.permute(0, 2, 1, 4, 5, 3, 6)  # tile row step s h t b
    return pack_codes(codes.reshape(-1, steps * STEP_CODES), fmt)


def multiplier_exponents(scale: torch.Tensor, data: torch.Tensor, fmt: dtypes.DType
                         ) -> torch.Tensor:
    """The stream scales' byte of each block (the module docstring), uint8 [N, K / 32], from the
    standard parts (scale bytes [N, K / 32], codes [N, packed K]) of a weight of FORMATS in
    blocks of 32 (any N and K)."""
    args.check_weight_parts(scale, data, fmt, BLOCK,
                            lambda f, b, n, k: f in FORMATS and b == BLOCK and n * k > 0,
                            f"{', '.join(f.name for f in FORMATS)} in blocks of {BLOCK}",
                            "tma_stream_layout.multiplier_exponents")
    low, high = FAST_SCALES[fmt]
    # a code's bits but its sign (MXINT8's two's complement codes: all of them)
    signless = (1 << (fmt.bits - 1)) - 1 if fmt.is_float else (1 << fmt.bits) - 1
    out = torch.empty(scale.shape, dtype=torch.uint8, device=scale.device)
    for first in range(0, scale.shape[0], _EXPONENT_ROWS_AT_ONCE):
        rows = slice(first, first + _EXPONENT_ROWS_AT_ONCE)
        s = scale[rows].view(torch.uint8).to(torch.int32)
        codes = unpack_codes(data[rows].view(torch.uint8), fmt, s.shape[1] * BLOCK)
        magnitude = (codes & signless).unflatten(-1, (-1, BLOCK))
        exponent = s + MULTIPLIER_EXPONENT[fmt]
        fast = (s >= low) & (s <= high)
        if fmt.is_float:  # no NaN / Inf code (e4m3, e5m2: past the largest finite one)
            fast &= ~(magnitude > fmt.max_code).any(-1)
        zero = (magnitude == 0).all(-1) & (s != dtypes.E8M0_EXPONENT_NAN_VAL)
        out[rows] = torch.where(fast, exponent, torch.where(
            zero, exponent.clamp(1, 254), RECOMPUTE)).to(torch.uint8)
    return out


def pack(scale: torch.Tensor, data: torch.Tensor, fmt: dtypes.DType
         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Standard parts (scale bytes [N, K / 32], codes [N, packed K]) -> the TMA stream layout's
    (codes, scales): flat uint8 copies on data's device (scales: multiplier_exponents')."""
    N, K = args.check_weight_parts(scale, data, fmt, BLOCK, fits, describe(),
                                   "tma_stream_layout.pack")
    nb, steps = N // CHUNK, K // STEP_CODES
    scales = multiplier_exponents(scale, data, fmt)
    scales = scales.reshape(nb, CHUNK, steps, STEP_CODES // BLOCK).permute(2, 0, 1, 3)
    scales = scales.reshape(-1).contiguous()
    if fmt in FP6:
        planes = [torch.empty(steps, nb, CHUNK, 4, width, dtype=torch.uint8, device=data.device)
                  for width in FP6_PLANES]
        for first in range(0, nb, _FP6_TILES_AT_ONCE):
            rows = data[first * CHUNK:(first + _FP6_TILES_AT_ONCE) * CHUNK].view(torch.uint8)
            lanes = _fp6_pack_tiles(rows, fmt, steps).transpose(0, 1)  # step tile row t | byte
            for plane, part in zip(planes, lanes.split(FP6_PLANES, dim=-1)):
                plane[:, first:first + part.shape[1]] = part
        return torch.cat([plane.reshape(-1) for plane in planes]), scales
    S, J, B = _row_step_shape(fmt)
    codes = data.view(torch.uint8).reshape(nb, CHUNK, steps, S, J, 4, B)
    codes = codes.permute(2, 0, 1, 5, 3, 4, 6)  # step nb row | t s j b
    if fmt == dtypes.float4_e2m1:
        codes = _move_fp4_bits(codes.reshape(-1), spread=True)
    return codes.reshape(-1).contiguous(), scales


def unpack(codes: torch.Tensor, scales: torch.Tensor, fmt: dtypes.DType, out_features: int,
           in_features: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack`: (scale [N, K / 32], data [N, packed K]) uint8, the codes as they
    were, and each block's scale byte as far as the stream scales keep it: the same where the
    kernel decodes the block itself, unless an all-zero block's exponent was clamped (its
    values are zero at any scale); 255 (NaN) where it leaves the block to the exact
    recomputation."""
    N, K = out_features, in_features
    if (not fits(fmt, BLOCK, N, K)
            or codes.shape != (N * K * fmt.bytes_per_group // fmt.codes_per_group,)
            or scales.shape != (N * K // BLOCK,)):
        raise ValueError(f"tma_stream_layout.unpack: codes and scales must be pack's of a "
                         f"{fmt.name} weight [{out_features}, {in_features}] of {describe()}, "
                         f"got shapes {tuple(codes.shape)} and {tuple(scales.shape)}")
    nb, steps = N // CHUNK, K // STEP_CODES
    exponents = scales.reshape(steps, nb, CHUNK, STEP_CODES // BLOCK).permute(1, 2, 0, 3)
    exponents = exponents.reshape(N, K // BLOCK).to(torch.int32)
    scale = torch.where(exponents == RECOMPUTE, dtypes.E8M0_EXPONENT_NAN_VAL,
                        exponents - MULTIPLIER_EXPONENT[fmt]).to(torch.uint8)
    if fmt in FP6:
        a, b = fp6_planes(codes)
        lanes = torch.cat([a.reshape(steps, nb, CHUNK, 4, FP6_PLANES[0]),
                           b.reshape(steps, nb, CHUNK, 4, FP6_PLANES[1])], dim=-1)
        return scale, _fp6_unpack_tiles(lanes.transpose(0, 1), fmt, steps)
    S, J, B = _row_step_shape(fmt)
    if fmt == dtypes.float4_e2m1:
        codes = _move_fp4_bits(codes, spread=False)
    data = codes.reshape(steps, nb, CHUNK, 4, S, J, B).permute(1, 2, 0, 4, 5, 3, 6)
    return scale, data.reshape(N, -1).contiguous()

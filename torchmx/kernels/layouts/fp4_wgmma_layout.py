"""The fp4 wgmma layout of an MXFP4 weight: each thread's 16 bytes are its Hopper wgmma operand.

The standard layout (an MXTensor [N, K], blocks of 32 along K) stores codes [N, K / 2] (code
2i in the low nibble of byte i) and scale bytes [N, K / 32]. `preshuffle` rearranges both for
`fp4_wgmma_matmul.py`, whose kernel multiplies W (as wgmma's A operand, taken from registers)
by x^T. In wgmma's m64nNk16 A fragment, lane `4 g + t` of warp `w` holds rows `16 w + g` and
`16 w + g + 8` and columns `2 t`, `2 t + 1`, `2 t + 8`, `2 t + 9` of each 64 x 16 slice. Per
64 x 64 chunk (nb, kb) of W:

    codes  [N / 64, K / 64, 4 (w), 32 (lane), 4 (q), 4 bytes]   2 KiB a chunk
    scales [N / 64, K / 64, 4 (w), 8 (g), 4 (q)]                128 B a chunk

Word q = 2 blk + a of a lane holds the 8 codes of row 64 nb + 16 w + 8 a + g at columns
64 kb + 32 blk + 16 o + 8 b1 + 2 t + b0 (o, b1, b0 in {0, 1}): one 32-block, so one scale
(byte q of the lane's scale word, lanes 4 g .. 4 g + 3 sharing it). One 16-byte load gives a
thread exactly its 32 codes: no shared memory between the load and the tensor cores.

Inside a word the 32 code bits are permuted (`PAIR_DECODE`) so that four bf16x2 registers (the
8 codes as pairs j = 2 o + b1, halves b0) come out of four rotates and five logic ops: pair j is
the OR over its pieces of rotl(word, r) & mask. Each code lands with its sign at bit 15 and its
bits e1 e0 m at bits 8..6 of a bf16: exactly its value times 2**-126 (fp4's 0.5 becomes bf16's
subnormal 2**-127). The kernel's one bf16x2 multiply by 2**(s - 1) per pair then gives
value * 2**(s - 127), exact whenever s <= 128; otherwise it multiplies twice (`fold` False),
rounding value * 2**(s - 127) once (to inf past bf16's range, as the standard path does).

The codes are followed by PAD_CODE_BYTES zero bytes and the scales by PAD_SCALE_BYTES: the
kernel loads the next step's chunks before it knows that the current step is its last.
"""

from typing import List, Tuple

import torch

from ... import dtypes
from ...numerics.packing import pack_codes, unpack_codes

__all__ = ["PAIR_DECODE", "CHUNK", "fits", "preshuffle", "unshuffle", "fold_scales"]

CHUNK = 64  # rows and columns of W per chunk
# The kernel reads one step (at most 4 chunks) past a program's last step.
PAD_CODE_BYTES = 4 * 2048
PAD_SCALE_BYTES = 4 * 128

# bf16x2 bits of two fp4 codes: sign (15, 31) and e1 e0 m (8..6, 24..22).
BF16X2_FIELDS = 0x81C081C0
# Pair j's bf16x2 = OR of rotl(word, r) & mask over its (r, mask) pieces. Rotations 0, 4 and 10
# give whole pairs; no fourth single rotation fits the remaining bits, so pair 3 takes two
# pieces: 4 rotates and 5 logic ops for 8 codes.
PAIR_DECODE: List[List[Tuple[int, int]]] = [
    [(0, BF16X2_FIELDS)],
    [(4, BF16X2_FIELDS)],
    [(10, BF16X2_FIELDS)],
    [(6, 0x80C080C0), (14, 0x01000100)],
]


def _stored_bits() -> dict:
    """(pair j, half b0, code bit) -> its bit in the stored word (a permutation of 0..31)."""
    stored = {}
    for j, pieces in enumerate(PAIR_DECODE):
        for half in (0, 1):
            targets = {3: 15, 2: 8, 1: 7, 0: 6}  # code bit -> bf16 bit (sign, e1, e0, m)
            for code_bit, bf16_bit in targets.items():
                target = 16 * half + bf16_bit
                rotation, = [r for r, mask in pieces if (mask >> target) & 1]
                stored[(j, half, code_bit)] = (target - rotation) % 32
    assert sorted(stored.values()) == list(range(32)), "PAIR_DECODE must permute the bits"
    return stored


STORED_BIT = _stored_bits()


def fits(fmt: dtypes.DType, block_size: int, out_features: int, in_features: int) -> bool:
    """Whether a weight [out_features, in_features] of this format has an fp4 wgmma layout:
    fp4 (e2m1), blocks of 32, both dims non-zero multiples of 64."""
    return (fmt == dtypes.float4_e2m1 and block_size == 32 and out_features > 0
            and in_features > 0 and out_features % CHUNK == 0 and in_features % CHUNK == 0)


def fold_scales(scale: torch.Tensor) -> bool:
    """True when every scale byte is <= 128 (every block scale <= 2): the kernel then applies
    the scale and its decode's 2**126 in one multiply, exactly (a host sync)."""
    return scale.numel() == 0 or int(scale.max()) <= 128


# Rows of W rearranged per pass of `preshuffle`: bounds its temporaries (int32 tensors of a
# pass) for weights of any size.
PRESHUFFLE_ROWS = 1024


def _shuffle_codes(data: torch.Tensor) -> torch.Tensor:
    """Packed fp4 bytes [n, K / 2] (n a multiple of 64) -> the fp4 wgmma layout's code bytes
    [n / 64, K / 64, 4, 32, 16] (uint8)."""
    n, K = data.shape[0], 2 * data.shape[1]
    nb, kb = n // CHUNK, K // CHUNK
    c = unpack_codes(data.view(torch.uint8), dtypes.float4_e2m1, K)  # [n, K] int32
    c = c.reshape(nb, 4, 2, 8, kb, 2, 2, 2, 4, 2)        # n = (nb w a g), k = (kb blk o b1 t b0)
    c = c.permute(0, 4, 1, 3, 8, 5, 2, 6, 7, 9)          # nb kb w g t | blk a | o b1 b0
    c = c.reshape(nb, kb, 4, 8, 4, 2, 2, 4, 2)           # pair j = 2 o + b1
    words = torch.zeros(c.shape[:-2], dtype=torch.int32, device=data.device)
    for (j, half, code_bit), position in STORED_BIT.items():
        words |= ((c[..., j, half] >> code_bit) & 1) << position  # bit 31 wraps to the sign
    words = words.reshape(nb, kb, 4, 32, 4)              # lane = 4 g + t, q = 2 blk + a
    return torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)


def preshuffle(scale: torch.Tensor, data: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Standard MXFP4 parts (scale bytes [N, K / 32], codes [N, K / 2]) -> the fragment
    layout's (codes, scales), flat uint8 with their padding, on data's device."""
    N, K = data.shape[0], 2 * data.shape[1]
    if not fits(dtypes.float4_e2m1, 32, N, K) or tuple(scale.shape) != (N, K // 32):
        raise ValueError(f"preshuffle: needs MXFP4 parts of a [N, K] weight with N and K "
                         f"multiples of {CHUNK} (data [N, K / 2], scale [N, K / 32]), got "
                         f"data {tuple(data.shape)} and scale {tuple(scale.shape)}")
    codes = torch.zeros(N * K // 2 + PAD_CODE_BYTES, dtype=torch.uint8, device=data.device)
    for r0 in range(0, N, PRESHUFFLE_ROWS):  # chunks of 64-row tiles lie one after the other
        r1 = min(N, r0 + PRESHUFFLE_ROWS)
        codes[r0 * K // 2:r1 * K // 2] = _shuffle_codes(data[r0:r1]).reshape(-1)
    s = scale.reshape(N // CHUNK, 4, 2, 8, K // CHUNK, 2).permute(0, 4, 1, 3, 5, 2)  # nb kb w g | blk a
    scales = torch.zeros(N * K // 32 + PAD_SCALE_BYTES, dtype=torch.uint8, device=data.device)
    scales[:N * K // 32] = s.reshape(-1)
    return codes, scales


def unshuffle(codes: torch.Tensor, scales: torch.Tensor, out_features: int,
              in_features: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `preshuffle`: (scale [N, K / 32], data [N, K / 2]) uint8."""
    N, K = out_features, in_features
    if (not fits(dtypes.float4_e2m1, 32, N, K) or codes.shape != (N * K // 2 + PAD_CODE_BYTES,)
            or scales.shape != (N * K // 32 + PAD_SCALE_BYTES,)):
        raise ValueError(f"unshuffle: codes and scales must be preshuffle's of an MXFP4 weight "
                         f"[{out_features}, {in_features}] (both multiples of {CHUNK}), got "
                         f"shapes {tuple(codes.shape)} and {tuple(scales.shape)}")
    nb, kb = N // CHUNK, K // CHUNK
    b = codes[:N * K // 2].to(torch.int64).reshape(nb, kb, 4, 8, 4, 2, 2, 4)  # w g t blk a byte
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    c = torch.zeros(words.shape + (4, 2), dtype=torch.int64, device=codes.device)
    for (j, half, code_bit), position in STORED_BIT.items():
        c[..., j, half] |= ((words >> position) & 1) << code_bit
    c = c.reshape(nb, kb, 4, 8, 4, 2, 2, 2, 2, 2)                # nb kb w g t blk a o b1 b0
    c = c.permute(0, 2, 6, 3, 1, 5, 7, 8, 4, 9).reshape(N, K)
    data = pack_codes(c.to(torch.int32), dtypes.float4_e2m1)
    s = scales[:N * K // 32].reshape(nb, kb, 4, 8, 2, 2).permute(0, 2, 5, 3, 1, 4)
    return s.reshape(N, K // 32).contiguous(), data

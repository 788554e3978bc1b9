"""What the tensor-core kernels' one-multiply decode takes exactly, and the tile shape of
their weights (no Triton needed: the layouts import it on machines without Triton).

The Hopper kernels (mma_linear, piece / stream / mx_gemm) decode a code by placing its bits
in a bf16 (the format's value times a fixed power of two) and multiplying by one bf16
multiplier per block, 2**(s - 127) over that power of two. FAST_SCALES are the scale bytes s
for which that multiply is exact; MULTIPLIER_EXPONENT[fmt] + s is the multiplier's bf16
exponent field (its bits are (MULTIPLIER_EXPONENT[fmt] + s) * 0x00800080 as a bf16 pair), as
mma_linear._multiplier_where computes it.
"""

from ... import dtypes

__all__ = ["FAST_SCALES", "MULTIPLIER_EXPONENT", "CHUNK", "UNITS"]

CHUNK = 64  # rows of W per wgmma A tile
# Per codes a packed group (fmt.codes_per_group: 1, 2 fp4, 4 fp6): the codes and bytes of a
# row in a unit, of which each of the four lanes of a quad loads a quarter (a piece).
UNITS = {1: (64, 64), 2: (128, 64), 4: (128, 96)}

# Scale bytes s for which the decode's one multiply is exact: 2**(s - 7) (e4m3) or 2**(s - 15)
# (e5m2) is a normal bf16 (s <= 134 / 142), and the format's smallest step times 2**(s - 127)
# is at least bf16's smallest subnormal 2**-133 (e4m3: 2**-9, s >= 3; e5m2: 2**-16, s >= 10).
# e2m1 / e2m3: 2**(s - 1) is a normal bf16 for s <= 128, and every value (2 / 4 significant
# bits, steps of 2**-1 / 2**-3) times 2**(s - 127) lies on bf16's grid for every s. e3m2:
# 2**(s - 3) is normal for s <= 130; its steps of 2**-4 are on the grid for every s.
# MXINT8 (code * 2**(s - 133)): the multiplier is a normal bf16 for 7 <= s <= 254, and every
# product then is exact in bf16 (overflow only for -128 at 254, Inf as in fp32).
FAST_SCALES = {dtypes.float8_e4m3: (3, 134), dtypes.float8_e5m2: (10, 142),
               dtypes.float6_e2m3: (0, 128), dtypes.float6_e3m2: (0, 130),
               dtypes.float4_e2m1: (0, 128), dtypes.int8: (7, 254)}

# The multiplier's exponent field less s: 127 less the power of two the decode leaves on a
# code's value (e4m3's bits placed in a bf16 read as value * 2**-120, e5m2's as 2**-112, fp4's
# and e2m3's as 2**-126, e3m2's as 2**-124; an MXINT8 code converts to value * 2**6 less
# nothing: 2**(s - 133)). Over FAST_SCALES every field lies in 1..254 (a normal bf16).
MULTIPLIER_EXPONENT = {dtypes.float8_e4m3: 120, dtypes.float8_e5m2: 112,
                       dtypes.float6_e2m3: 126, dtypes.float6_e3m2: 124,
                       dtypes.float4_e2m1: 126, dtypes.int8: -6}

"""Instructions per weight code in the main loops of the MX-weight matmul kernels, read from their
SASS: the fused kernel (matmul_kernels.py), the one-row kernel of one-byte codes (byte_gemv.py)
and the tensor-core kernel for 2..64 rows of MXFP8, MXFP4 and MXINT8 weights (mma_linear.py).

    python benchmarks/sass_matmul.py

Needs Triton but no GPU: each configuration is compiled for sm_90 (Hopper) here, the cubin is
disassembled with the cuobjdump that Triton ships, and the instructions of the longest loop
are counted per weight code the loop handles (the figure docs/performance.md quotes). Unit
strides are specialized to 1 and sizes marked divisible by 16, as Triton's launcher does for
the benchmark's shapes; every tile is whole (EVEN). The tiles are the defaults for N = K = 8192
(M = 1 for the rows variant and byte_gemv, 16 for the dots and mma_linear).
"""

import collections
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from sass_tools import compile_sm90 as compile_kernel, instructions, opcode  # noqa: E402
from torchmx import dtypes  # noqa: E402
from torchmx.kernels.linear import byte_gemv, mma_linear  # noqa: E402
from torchmx.kernels.linear import dispatch as km  # noqa: E402
from torchmx.kernels.linear import matmul_kernels as mk  # noqa: E402

CASES = [  # (format, FAST, variant): at the default tiles
    (dtypes.float4_e2m1, 5, km.ROWS),
    (dtypes.float8_e4m3, 1, km.ROWS),
    (dtypes.int8, 0, km.ROWS),
    (dtypes.float6_e2m3, 0, km.ROWS),
    (dtypes.float4_e2m1, 4, km.SCALED_DOTS),
    (dtypes.float8_e4m3, 1, km.SCALED_DOTS),
]
UNIT_STRIDES = ("stride_xk", "stride_wk", "stride_sk", "stride_on")
DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "bias_ptr", "out_ptr", "ws_ptr", "K", "N", "stride_xm",
             "stride_wn", "stride_sn", "stride_om", "blocks_k", "blocks_per_split")


def compile_sm90(fmt, fast, variant, nb, block_n, num_warps=4):
    constants = dict(BLOCK=32, BLOCK_M=1 if variant == km.ROWS else 16, BLOCK_N=block_n,
                     NB=1 if variant == km.BLOCK_DOTS else nb, VARIANT=variant, SPLIT=True,
                     EVEN=True, HAS_BIAS=False, INTERPRETER=False, FAST=fast,
                     WORDS=variant == km.ROWS and (fast == 5 or fmt.codes_per_group == 4),
                     **km.packed_decode_constants(fmt), **{name: 1 for name in UNIT_STRIDES})
    pointers = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "bias_ptr": "*bf16",
                "out_ptr": "*bf16", "ws_ptr": "*fp32"}
    return compile_kernel(mk.mx_weight_matmul_kernel, constants, pointers, DIVISIBLE,
                          num_warps=num_warps, num_stages=2)


def loop_opcodes(cubin: bytes, containing: str = None):
    """Opcodes of the longest backward-branching loop of the kernel's SASS (of those with a
    `containing` opcode, when given: mma_linear's rare exact path has a loop of its own)."""
    lines = instructions(cubin)
    address = [int(re.search(r"/\*([0-9a-f]{4,})\*/", line).group(1), 16) for line in lines]
    loops = []
    for i, line in enumerate(lines):
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", line)
        if target and int(target.group(1), 16) < address[i]:
            ops = [opcode(line) for line, a in zip(lines, address)
                   if int(target.group(1), 16) <= a <= address[i]]
            if containing is None or containing in ops:
                loops.append(ops)
    return max(loops, key=len)


def instructions_per_code(fmt, fast, cfg: km.Config):
    """(loop instructions per weight code, the most frequent opcodes) at tile `cfg`."""
    nb = 1 if cfg.variant == km.BLOCK_DOTS else cfg.blocks
    kernel = compile_sm90(fmt, fast, cfg.variant, nb, cfg.block_n, cfg.num_warps)
    ops = loop_opcodes(kernel.asm["cubin"])
    threads = cfg.num_warps * 32
    common = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(5))
    return len(ops) * threads / (cfg.block_n * nb * 32), common


def _counted(kernel, codes_per_thread, containing=None):
    ops = loop_opcodes(kernel.asm["cubin"], containing)
    common = ", ".join(f"{op} {n}" for op, n in collections.Counter(ops).most_common(5))
    return len(ops) / codes_per_thread, common


def byte_gemv_per_code(fmt):
    """(loop instructions per code, the most frequent opcodes) of byte_gemv at its TILE."""
    cfg = byte_gemv.TILE
    constants = dict(BLOCK=32, BLOCK_N=cfg.block_n, PIECES=cfg.pieces, SPLIT=1, X_FP16=False,
                     EVEN_N=True, EVEN_K=True, HAS_BIAS=False, INTERPRETER=False, stride_sk=1,
                     **km.packed_decode_constants(fmt))
    pointers = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "bias_ptr": "*bf16",
                "out_ptr": "*bf16", "partials_ptr": "*fp32"}
    kernel = compile_kernel(byte_gemv.byte_gemv_kernel, constants, pointers,
                            tuple(pointers) + ("K", "N", "stride_wn", "stride_sn"),
                            num_warps=cfg.num_warps)
    codes = cfg.block_n * cfg.pieces * byte_gemv.PIECE / (cfg.num_warps * 32)
    return cfg, *_counted(kernel, codes)


def mma_per_code(fmt):
    """(loop instructions per code, the most frequent opcodes) of mma_linear at M = 16 and its
    default tile (register cap included)."""
    cfg = mma_linear.default_config(fmt, 16, 8192, 8192, 32, torch.device("cpu"))
    low, high = mma_linear.FAST_SCALES[fmt]
    constants = dict(BLOCK=32, BLOCK_M=16, V=cfg.v, U=cfg.u, SPLIT=2, AHEAD=cfg.ahead,
                     HAS_BIAS=False, E5M2=fmt == dtypes.float8_e5m2, S_MIN=low, S_MAX=high,
                     INTERPRETER=False, stride_sk=1, PIECES=False, **km.packed_decode_constants(fmt),
                     **mma_linear._unit_constants(fmt))
    pointers = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "pieces_ptr": "*u8",
                "piece_scales_ptr": "*u8", "counters_ptr": "*i32", "bias_ptr": "*bf16",
                "out_ptr": "*bf16", "partials_ptr": "*fp32"}
    kernel = compile_kernel(mma_linear.mma_linear_kernel, constants, pointers,
                            tuple(pointers) + ("M", "K", "N", "stride_xm", "stride_wn",
                                               "stride_sn", "stride_om"), num_warps=4,
                            **({} if cfg.maxnreg is None else {"maxnreg": cfg.maxnreg}))
    codes = 64 * cfg.v * mma_linear.UNITS[fmt.codes_per_group][0] * cfg.u / 128  # a thread, a step
    return cfg, *_counted(kernel, codes, "HGMMA")


def main():
    print(f"{'format':12s} {'variant':12s} {'tile':>16s} {'instructions / code':>20s}  "
          "most frequent (per thread and step)")
    cases = [(fmt, fast, km._default_config(fmt, 1 if variant == km.ROWS else 16, 8192, 256,
                                            torch.bfloat16, torch.device("cpu")))
             for fmt, fast, variant in CASES]
    for fmt, fast, cfg in cases:
        per_code, common = instructions_per_code(fmt, fast, cfg)
        name = {km.ROWS: "rows", km.BLOCK_DOTS: "block dots",
                km.SCALED_DOTS: "scaled dots"}[cfg.variant]
        tile = f"{cfg.block_n} x {cfg.blocks}, {cfg.num_warps} warps"
        print(f"{fmt.name:12s} {name:12s} {tile:>16s} {per_code:20.2f}  {common}")
    for fmt in (dtypes.float8_e4m3, dtypes.int8):
        cfg, per_code, common = byte_gemv_per_code(fmt)
        tile = f"{cfg.block_n} x {cfg.pieces}, {cfg.num_warps} warps"
        print(f"{fmt.name:12s} {'byte_gemv':12s} {tile:>16s} {per_code:20.2f}  {common}")
    for fmt in (dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.float6_e2m3, dtypes.float6_e3m2,
                dtypes.float4_e2m1, dtypes.int8):
        cfg, per_code, common = mma_per_code(fmt)
        tile = f"{64 * cfg.v} x {mma_linear.UNITS[fmt.codes_per_group][0] * cfg.u}, 4 warps"
        print(f"{fmt.name:12s} {'mma_linear':12s} {tile:>16s} {per_code:20.2f}  {common}")


if __name__ == "__main__":
    main()

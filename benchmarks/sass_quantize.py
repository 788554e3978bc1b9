"""SASS instructions per element and registers of the quantize kernels (blocks of 32, round half
to even, floor scales), at the tiles triton_backend ships.

    python benchmarks/sass_quantize.py

Needs Triton but no GPU: each kernel is compiled for sm_90 (Hopper) here and its cubin
disassembled (sass_tools.py). The whole kernel is counted (these kernels have no loop), per
element of the program's tile: the figures docs/kernels.md and docs/performance.md quote when
they compare the per-element kernels with the pair kernels (_tl_quantize_pairs).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from sass_tools import compile_sm90, instructions, resources  # noqa: E402
from torchmx import dtypes  # noqa: E402
from torchmx.kernels.quantize import _tl_quantize as tq  # noqa: E402
from torchmx.kernels.quantize import _tl_quantize_pairs as qp  # noqa: E402
from torchmx.kernels.quantize import triton_backend as tb  # noqa: E402
from torchmx.numerics.modes import Rounding, ScaleMode  # noqa: E402

BLOCK = 32
SIZES = ("R", "C", "W", "stride_b", "stride_r", "row_bytes", "blocks_c", "groups_r")
POINTER_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


def _common(fmt):
    return dict(BLOCK=BLOCK, I64=False, GRID=3, CPG=fmt.codes_per_group,
                SCALE_MODE=int(ScaleMode.FLOOR))


def rows_elements(fmt, dtype):
    """quantize_rows_thread_kernel (blocks along the last dim, one per thread)."""
    cfg = tb._DEFAULT_TUNING["quantize_rows_thread"]
    constants = dict(_common(fmt), CW=16 // (torch.finfo(dtype).bits // 8),
                     TILE_NB=cfg["row_blocks"],
                     TILE_R=cfg["blocks"] // cfg["row_blocks"], HW_FP8=0, ROUNDING=int(Rounding.EVEN),
                     **tb._format_constants(fmt))
    pointers = {"x_ptr": POINTER_TYPES[dtype], "scale_ptr": "*u8", "data_ptr": "*u8"}
    kernel = compile_sm90(tq.quantize_rows_thread_kernel, constants, pointers,
                          list(pointers) + list(SIZES), num_warps=cfg["num_warps"])
    return kernel, cfg["blocks"] * BLOCK, cfg["num_warps"]


def _pair_constants(fmt, dtype):
    half = qp.F16 if dtype == torch.float16 else qp.BF16
    c = tb._format_constants(fmt)
    return dict(_common(fmt), ENCODE=qp.encode_pairs_ptx(fmt, half), PTX=True,
                F16=dtype == torch.float16, CAP=tb._half_float_bits(float(fmt.max), dtype),
                **{k: c[k] for k in ("BITS", "MBITS", "EMIN", "EMAX", "MAX_NORMAL", "RCEIL_FRAC",
                                     "RCEIL_ZERO")})


def rows_pairs(fmt, dtype):
    """quantize_rows_pairs_kernel (the same tile on pairs)."""
    cfg = tb._DEFAULT_TUNING["quantize_rows_pairs"]
    constants = dict(_pair_constants(fmt, dtype), TILE_NB=cfg["row_blocks"],
                     TILE_R=cfg["blocks"] // cfg["row_blocks"])
    pointers = {"x_ptr": "*i32", "scale_ptr": "*u8", "data_ptr": "*u8"}
    kernel = compile_sm90(qp.quantize_rows_pairs_kernel, constants, pointers,
                          list(pointers) + list(SIZES), num_warps=cfg["num_warps"])
    return kernel, cfg["blocks"] * BLOCK, cfg["num_warps"]


def fused_pairs(fmt, dtype):
    """quantize_fused_pairs_kernel (the row + column pass on pairs)."""
    cfg = tb._DEFAULT_TUNING["quantize_fused_pairs"]
    constants = dict(_pair_constants(fmt, dtype), TILE_NBR=cfg["row_blocks"],
                     TILE_NBC=cfg["col_blocks"], VEC=cfg["vec"],
                     WORDS=fmt.codes_per_group == 4)
    pointers = {"x_ptr": "*i32", "scale_r_ptr": "*u8", "data_r_ptr": "*u8",
                "scale_c_ptr": "*i16", "data_c_ptr": "*i16"}
    kernel = compile_sm90(qp.quantize_fused_pairs_kernel, constants, pointers,
                          list(pointers) + list(SIZES), num_warps=cfg["num_warps"],
                          maxnreg=cfg["maxnreg"])
    return kernel, cfg["row_blocks"] * cfg["col_blocks"] * BLOCK * BLOCK, cfg["num_warps"]


CASES = [  # (kernel, format, input dtype)
    (rows_elements, dtypes.float4_e2m1, torch.bfloat16),
    (rows_pairs, dtypes.float4_e2m1, torch.bfloat16),
    (rows_pairs, dtypes.float4_e2m1, torch.float16),
    (rows_elements, dtypes.float6_e3m2, torch.bfloat16),
    (rows_pairs, dtypes.float6_e3m2, torch.bfloat16),
    (fused_pairs, dtypes.float4_e2m1, torch.bfloat16),
    (fused_pairs, dtypes.float4_e2m1, torch.float16),
    (fused_pairs, dtypes.float6_e3m2, torch.bfloat16),
    (fused_pairs, dtypes.float6_e3m2, torch.float16),
]


def main():
    print(f"{'kernel':16s} {'format':12s} {'input':8s} {'instructions':>12s} {'per element':>12s}"
          f" {'registers':>10s} {'spilled bytes':>14s}")
    for build, fmt, dtype in CASES:
        kernel, elements, warps = build(fmt, dtype)
        count = len(instructions(kernel.asm["cubin"]))
        registers, local = resources(kernel.asm["cubin"])
        print(f"{build.__name__:16s} {fmt.name:12s} {str(dtype)[6:]:8s} {count:12d} "
              f"{count * 32 * warps / elements:12.2f} {registers:10d} {local:14d}")


if __name__ == "__main__":
    main()

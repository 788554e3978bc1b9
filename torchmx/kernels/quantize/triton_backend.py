"""The Triton backend of the custom ops: MX quantize / dequantize on CUDA, bit-identical to the
reference numerics (tests/kernels/quantize/test_triton_quantize.py holds every option to that).

`quantize` and `dequantize` take arguments already validated by torchmx.ops and return exactly
what quantize_mx_reference / dequantize_mx_reference return (shapes, dtypes, contiguous).
`quantize_rowwise_colwise` is the fused pass behind torchmx.kernels.quantize_mx_rowwise_colwise.

Importing this module needs neither Triton nor a GPU; the kernels are imported on first use.
With TRITON_INTERPRET=1 set before Triton is imported, the same functions run on CPU tensors
through Triton's interpreter (that is how CI tests the kernels).

Dispatch: the input is seen as a strided 3-d view [B, R, C] (no copy when the strides allow);
blocks along the innermost dim use the "rows" kernel, blocks along any other dim the "cols"
kernel, which reads that dim with a stride (no transpose pass). Block sizes that split a packed
fp4/fp6 group are quantized to one code per byte and packed by a second small pass.

Plans: what `quantize` and `dequantize` launch is a pure function of the input's shape, strides,
dtype, 16-byte alignment and device and of the format options, so it is decided once per such
key (`QuantizePlan`, `DequantizePlan`, cached in `_PLANS`) and a later call allocates the
outputs and launches the kernels through kernels/_launch.Launch with the new tensors. The
decisions read TUNING and KNOBS: writing an entry of either drops every plan. Stochastic
rounding (its seed is a kernel argument) is planned afresh at every call.
"""

import fractions
import functools
import math
import os
import struct
from typing import Dict, Optional, Tuple

import torch

from ... import dtypes
from ...numerics.packing import packed_length
from ...numerics.modes import ROUNDING_BY_NAME, SCALE_MODE_BY_NAME
from ...numerics.rounding import seed_key
from ..._allocation import allocator
from .._common import decode_constants, device_capability, empty, interpreting
from ..._memo import memo
from .._launch import Launch, hooks_installed, launch, on_device

__all__ = ["available", "quantize", "dequantize", "quantize_rowwise_colwise", "QuantizePlan",
           "DequantizePlan", "fake_quantize_rows", "fake_quantize_supported", "TUNING", "KNOBS",
           "BOUND_CALLS", "device_call"]

# The kernels' SCALE_MODE / ROUNDING constexprs, by the names users pass (plain ints: what
# Triton keys its specializations by).
_SCALE_MODE = {name: int(mode) for name, mode in SCALE_MODE_BY_NAME.items()}
_ROUNDING = {name: int(rounding) for name, rounding in ROUNDING_BY_NAME.items()}

_PLANS: Dict[tuple, object] = {}  # the plans of quantize / dequantize, by what they depend on
# The quantize / dequantize operators' calls bound to their plans' kernels (`device_call`), by
# the operators' own keys of a call (torchmx/ops.py): dropped with the plans.
BOUND_CALLS: Dict[tuple, object] = {}


class _Settings(dict):
    """A settings table whose every write (an entry set or deleted) drops the cached plans,
    which were decided under the old values; entries are replaced, not edited in place."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        _PLANS.clear()
        BOUND_CALLS.clear()

    def __delitem__(self, key):
        super().__delitem__(key)
        _PLANS.clear()
        BOUND_CALLS.clear()


# Switches of the kernels' variants, read from the environment once, at import:
# TORCHMX_TRITON_HW_FP8=0 (the bit arithmetic instead of the hardware fp8 conversions),
# TORCHMX_TRITON_THREAD_ROWS=0 (no one-block-per-thread rows kernel), TORCHMX_TRITON_FP6_CHUNKS=0
# (no 8-codes-per-thread fp6 dequantize). Tests and benchmarks set entries of KNOBS instead.
KNOBS: Dict[str, bool] = _Settings(
    hw_fp8=os.environ.get("TORCHMX_TRITON_HW_FP8", "1") != "0",
    thread_rows=os.environ.get("TORCHMX_TRITON_THREAD_ROWS", "1") != "0",
    fp6_chunks=os.environ.get("TORCHMX_TRITON_FP6_CHUNKS", "1") != "0",
)

# Tile shapes, by kernel (see _rows_tile, _cols_tile, quantize_rowwise_colwise and
# docs/kernels.md); benchmarks/bench_gpu_quantize.py --sweep times alternatives.
TUNING: Dict[str, Dict[str, int]] = _Settings({
    "quantize_rows": {"elements": 4096, "columns": 128, "num_warps": 4},
    "quantize_rows_thread": {"blocks": 128, "row_blocks": 32, "num_warps": 4},
    # quantize_rows_thread's tile for bf16 / fp16 inputs of fp4 / fp6 with round half to even
    # (_tl_quantize_pairs); enabled 0: quantize_rows_thread instead.
    "quantize_rows_pairs": {"blocks": 128, "row_blocks": 32, "num_warps": 4, "enabled": 1},
    "quantize_cols": {"elements_per_thread": 64, "num_warps": 4},
    "quantize_fused": {"row_blocks": 1, "col_blocks": 2, "vec": 8, "num_warps": 1, "encode": 2,
                       "maxnreg": 168},
    # bf16 / fp16 inputs, fp4 / fp6 with round half to even; vec in words (two columns each).
    # maxnreg 128 keeps 16 warps on an SM (ptxas gave some scale modes 133 registers, 12 warps
    # and 8% less speed on an H100); enabled 0: the per-element kernel instead.
    "quantize_fused_pairs": {"row_blocks": 1, "col_blocks": 4, "vec": 4, "num_warps": 2,
                             "maxnreg": 128, "enabled": 1},
    "dequantize_rows": {"elements": 4096, "columns": 128, "num_warps": 4},
    "dequantize_fp6_rows": {"chunks": 256, "row_chunks": 128, "num_warps": 4},
    "dequantize_cols": {"elements": 8192, "columns": 256, "num_warps": 4},
})
_DEFAULT_TUNING = {kind: dict(cfg) for kind, cfg in TUNING.items()}
# Triton's interpreter (CPU tests) pays per program, not per element: large tiles there.
_INTERPRETER_TUNING: Dict[str, Dict[str, int]] = {
    "quantize_rows": {"elements": 65536, "columns": 1024, "num_warps": 4},
    "quantize_rows_thread": {"blocks": 2048, "row_blocks": 64, "num_warps": 4},
    "quantize_rows_pairs": {"blocks": 2048, "row_blocks": 64, "num_warps": 4, "enabled": 1},
    "quantize_cols": {"elements_per_thread": 256, "num_warps": 4, "blocks": 64},
    "quantize_fused": {"row_blocks": 4, "col_blocks": 16, "vec": 8, "num_warps": 4, "encode": 2},
    "quantize_fused_pairs": {"row_blocks": 4, "col_blocks": 16, "vec": 4, "num_warps": 4,
                             "enabled": 1},
    "dequantize_rows": {"elements": 65536, "columns": 1024, "num_warps": 4},
    "dequantize_fp6_rows": {"chunks": 8192, "row_chunks": 1024, "num_warps": 4},
    "dequantize_cols": {"elements": 65536, "columns": 1024, "num_warps": 4},
}
_MAX_BLOCK_P = 16384  # larger blocks fall back to the reference numerics
_I64_LIMIT = 2**31 - 2**26  # past this many elements (or offsets), index in 64 bits


def available() -> bool:
    """True when Triton imports and a CUDA device is present (never raises)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def _kernels():
    from . import _tl_dequantize, _tl_packing, _tl_quantize
    return _tl_quantize, _tl_dequantize, _tl_packing


@functools.lru_cache(maxsize=None)
def _pair_kernels():
    from . import _tl_quantize_pairs
    return _tl_quantize_pairs


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _f32_bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", value))[0]


@functools.lru_cache(maxsize=None)
def _half_float_bits(value: float, dtype: torch.dtype) -> int:
    """The bits of `value` as a bf16 or fp16 number."""
    return torch.tensor(value, dtype=dtype).view(torch.int16).item() & 0xFFFF


def _rceil_constants(fmt: dtypes.DType) -> Tuple[int, int]:
    """(RCEIL_FRAC, RCEIL_ZERO) of _tl_numerics.scale_byte: the mantissa field of max_normal M,
    and the bits of the largest fp32 amax with fp32(amax / M) <= 2**-127 (round half to even:
    amax <= M * (2**-127 + 2**-150)); (-1, -1) where that integer form does not apply."""
    m = float(fmt.max)
    if m < 1 or float(struct.unpack("<f", struct.pack("<f", m))[0]) != m \
            or math.floor(math.log2(m)) != fmt.emax:
        return -1, -1
    limit = fractions.Fraction(m) * (fractions.Fraction(1, 2**127) + fractions.Fraction(1, 2**150))
    bits = _f32_bits(float(limit))  # the double is exact (47 significant bits)
    if fractions.Fraction(struct.unpack("<f", struct.pack("<i", bits))[0]) > limit:
        bits -= 1  # the largest fp32 at or below the limit
    return _f32_bits(m) & 0x7FFFFF, bits


@functools.lru_cache(maxsize=None)
def _format_constants(fmt: dtypes.DType) -> Dict[str, object]:
    is_int = fmt.kind == "int"
    m = fmt.mantissa_bits
    rceil_frac, rceil_zero = _rceil_constants(fmt)
    return dict(
        IS_INT=is_int, BITS=fmt.bits, MBITS=m, EMIN=0 if is_int else fmt.min_exponent,
        EMAX=fmt.emax, MAX_CODE=fmt.max_code, MAX_NORMAL=float(fmt.max),
        RCEIL_FRAC=rceil_frac, RCEIL_ZERO=rceil_zero,
        # Rounding by a magic addend 2**(p + 23 - m) needs p + 23 - m <= 127 (p <= emax + 1):
        # formats with emax close to 127 take the general path.
        BIG_EMAX=(not is_int) and fmt.emax + 1 + 23 - m > 120,
    )


def _hw_fp8(fmt: dtypes.DType, device: torch.device, rounding: str = "even") -> int:
    """1 / 2 when the hardware fp8 conversions (cvt.rn.satfinite, round half to even with
    saturation: exactly encode() with rounding="even") can stand in for the bit arithmetic."""
    if device.type != "cuda" or interpreting() or rounding != "even":
        return 0
    if not KNOBS["hw_fp8"]:
        return 0
    if device_capability(device) < (8, 9):
        return 0
    return {dtypes.float8_e4m3: 1, dtypes.float8_e5m2: 2}.get(fmt, 0)


def _merge(sizes, strides):
    """(size, stride) groups of consecutive dims that index memory as one dim (size-1 dims
    dropped), outermost first."""
    groups = []
    for size, stride in zip(sizes, strides):
        if size == 1:
            continue
        if groups and groups[-1][1] == stride * size:
            groups[-1] = (groups[-1][0] * size, stride)
        else:
            groups.append((size, stride))
    return groups


def _span(x: torch.Tensor) -> int:
    """1 + the largest element offset x addresses."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(x.shape, x.stride()))


def _needs_i64(*sizes: int) -> bool:
    return max(sizes) >= _I64_LIMIT


def _view_rows(x: torch.Tensor, axis: int):
    """x as [B, R, C] with blocks along C (= x's axis, all later dims of size 1)."""
    groups = _merge(x.shape[:axis], x.stride()[:axis])
    if len(groups) > 2:
        x = x.contiguous()
        groups = _merge(x.shape[:axis], x.stride()[:axis])
    groups = [(1, 0)] * (2 - len(groups)) + groups
    (B, sb), (R, sr) = groups
    return x, (B, R, x.shape[axis]), (sb, sr, x.stride(axis))


def _view_cols(x: torch.Tensor, axis: int):
    """x as [B, R, C] with blocks along R (= x's axis) and C the merged later dims."""
    outer = _merge(x.shape[:axis], x.stride()[:axis])
    inner = _merge(x.shape[axis + 1:], x.stride()[axis + 1:])
    if len(outer) > 1 or len(inner) > 1:
        x = x.contiguous()
        outer = _merge(x.shape[:axis], x.stride()[:axis])
        inner = _merge(x.shape[axis + 1:], x.stride()[axis + 1:])
    (B, sb), = outer or [(1, 0)]
    (C, sc), = inner or [(1, 1)]
    return x, (B, x.shape[axis], C), (sb, x.stride(axis), sc)


def _tuning(kind: str) -> Dict[str, int]:
    if interpreting() and TUNING[kind] == _DEFAULT_TUNING[kind]:
        return _INTERPRETER_TUNING[kind]
    return TUNING[kind]


def _rows_tile(kind: str, block_p: int, blocks: int, rows: int):
    cfg = _tuning(kind)
    tile_nb = max(1, min(_next_pow2(blocks), cfg["columns"] // block_p))
    tile_r = max(1, min(_next_pow2(rows), cfg["elements"] // (tile_nb * block_p)))
    return tile_r, tile_nb, cfg["num_warps"]


def _thread_rows(elem_size: int, block_size: int, n: int, cpg: int, unit_stride: bool):
    """CW (elements per 16-byte load) when quantize_rows_thread_kernel applies (blocks of 8 to
    64 along a unit-stride dim that they divide; fp6, stored 32 codes at a time, with blocks of
    32 or 64), else None.

    fp32 inputs take it for fp6 only. A thread then holds 128 input bytes per block, and
    with fp8 / MXINT8 / fp4 codes quantize_rows_kernel (a block over several threads, whole
    sectors per load) is faster on an H100 (docs/kernels.md). For fp6 it is the other way
    round."""
    cw = 16 // elem_size
    if not KNOBS["thread_rows"] or not unit_stride:
        return None
    if block_size not in (8, 16, 32, 64) or block_size % cw or n % block_size:
        return None
    if (cpg == 4 and block_size % 32) or (elem_size == 4 and cpg != 4):
        return None
    return cw


def _thread_rows_tile(kind: str, blocks: int, rows: int):
    """(rows, blocks) per tile and warps of a one-block-per-thread rows kernel."""
    cfg = _tuning(kind)
    tile_nb = max(1, min(_next_pow2(blocks), cfg["row_blocks"]))
    tile_r = max(1, min(_next_pow2(rows), cfg["blocks"] // tile_nb))
    return tile_r, tile_nb, cfg["num_warps"]


def _cols_tile(kind: str, block_p: int, blocks: int, cols: int):
    """(blocks per tile, columns per tile, columns per thread, warps) of a "cols" kernel.

    Quantize keeps a whole block of rows in each thread (VEC columns wide, so that the block's
    amax is a loop, not a shuffle or a shared-memory exchange): the tile is VEC columns per
    thread times every thread of the program, one block tall. Dequantize has no reduction and
    takes "elements" per tile.
    """
    cfg = _tuning(kind)
    warps = cfg["num_warps"]
    if kind == "quantize_cols":
        vec = max(1, min(8, cfg["elements_per_thread"] // block_p))
        tile_c = max(1, min(_next_pow2(cols), vec * 32 * warps))
        tile_nb = max(1, min(_next_pow2(blocks), cfg.get("blocks", 1)))
        return tile_nb, tile_c, min(vec, tile_c), warps
    tile_c = max(1, min(_next_pow2(cols), cfg["columns"]))
    tile_nb = max(1, min(_next_pow2(blocks), cfg["elements"] // (block_p * tile_c)))
    return tile_nb, tile_c, 8, warps


def _grid(B: int, tiles_r: int, tiles_c: int):
    """(launch grid, GRID constexpr): 3-d (tiles_c, tiles_r, B) when it fits CUDA's 65535
    limit on the second and third dims, else 1-d."""
    if tiles_r <= 65535 and B <= 65535:
        return (tiles_c, tiles_r, B), 3
    return (B * tiles_r * tiles_c,), 1


def _fp6_words(cpg: int, block_size: int, n: int, data: Optional[torch.Tensor] = None) -> bool:
    """Whether fp6 rows move as aligned 32-bit words (16 codes = 3 words): blocks and rows of
    whole 16-code chunks, and (dequantize) data at a 4-byte aligned address."""
    if cpg != 4 or block_size % 16 or block_size & (block_size - 1) or n % 16:
        return False
    return data is None or data.data_ptr() % 4 == 0


def _fp6_chunks(cpg: int, block_size: int, n: int, data: torch.Tensor) -> bool:
    """Whether fp6 rows dequantize 8 codes (6 bytes, three 16-bit loads) per thread: blocks
    and rows of whole 8-code chunks and 2-byte aligned data."""
    if not KNOBS["fp6_chunks"]:
        return False
    return cpg == 4 and block_size % 8 == 0 and n % 8 == 0 and data.data_ptr() % 2 == 0


def _signed32(key: int) -> int:
    """The 32-bit key as an int32 kernel argument (the kernel reinterprets it as uint32)."""
    return key - (1 << 32) if key >= (1 << 31) else key


class _Ref:
    """A tensor argument of a planned launch that each call supplies: the call's tensor named
    `base` ("x", "scale", "target", "data", "codes", "out"), seen through as_strided(*strided)
    and view(dtype) where given."""

    __slots__ = ("base", "strided", "dtype")

    def __init__(self, base: str, strided=None, dtype: Optional[torch.dtype] = None):
        self.base, self.strided, self.dtype = base, strided, dtype

    def resolve(self, tensors: Dict[str, torch.Tensor]) -> torch.Tensor:
        t = tensors[self.base]
        if self.strided is not None:
            t = t.as_strided(*self.strided)
        return t if self.dtype is None else t.view(self.dtype)


class _Launches:
    """The kernel launches of one plan: `add` records kernel[grid](*args, **kwargs) with _Ref
    placeholders for the call's tensors; `run(tensors)` launches each through a Launch."""

    __slots__ = ("launches",)

    def __init__(self):
        self.launches = []

    def add(self, kernel, grid, *args, **kwargs) -> None:
        slots = [i for i, a in enumerate(args) if isinstance(a, _Ref)]
        fixed = [None if isinstance(a, _Ref) else a for a in args]
        self.launches.append((Launch(kernel, grid, fixed, kwargs, slots),
                              [args[i] for i in slots]))

    def run(self, tensors: Dict[str, torch.Tensor]) -> None:
        for launch_, refs in self.launches:
            launch_(*[ref.resolve(tensors) for ref in refs])


_X, _SCALE, _TARGET = _Ref("x"), _Ref("scale"), _Ref("target")


def _on_addresses(launches: _Launches, bases: tuple) -> bool:
    """Whether `launches` is one launch whose tensors are the call's tensors `bases`, in that
    order, each seen where it starts (as itself, a view of another dtype, or as_strided with
    no new offset): its arguments are then those tensors' addresses."""
    if len(launches.launches) != 1:
        return False
    refs = launches.launches[0][1]
    return [r.base for r in refs] == list(bases) and all(
        r.strided is None or len(r.strided) == 2 for r in refs)


def _bind_device_call(device_calls: dict, t: torch.Tensor, make) -> None:
    """After a plan's launches ran for `t` (on its CUDA device): device_calls[index] =
    make(index) (False where it gives none), once per device."""
    index = t.get_device()
    if index not in device_calls and not hooks_installed():
        device_calls[index] = make(index) or False


def _launch_quantize(launches: _Launches, x3, view, strides, scale, data, fmt, block_size,
                     scale_mode, rounding, key, cpg, blocks_on_c: bool, hw_fp8: int):
    """Records the quantize kernel for x3 (as _X), scale (_SCALE) and the codes (_TARGET)."""
    tq, _, _ = _kernels()
    B, R, C = view
    block_p = _next_pow2(block_size)
    n = C if blocks_on_c else R
    blocks = _cdiv(n, block_size)
    groups = _cdiv(n, cpg)
    i64 = _needs_i64(_span(x3), x3.numel(), data.numel(), scale.numel(), B * R * C)
    common = dict(BLOCK=block_size, BLOCK_P=block_p, I64=i64, CPG=cpg, HW_FP8=hw_fp8,
                  SCALE_MODE=_SCALE_MODE[scale_mode],
                  ROUNDING=_ROUNDING[rounding], **_format_constants(fmt))
    cw = _thread_rows(x3.element_size(), block_size, C, cpg,
                      strides[2] == 1 or C == 1) if blocks_on_c else None
    if cw is not None and cpg == fmt.codes_per_group \
            and _pairs_apply(x3, view, strides, fmt, rounding, "quantize_rows_pairs"):
        _quantize_rows_pairs(launches, x3, view, strides, scale, data, fmt, block_size,
                             scale_mode)
    elif cw is not None:
        common.pop("BLOCK_P")
        tile_r, tile_nb, warps = _thread_rows_tile("quantize_rows_thread", blocks, B * R)
        tiles_r, tiles_c = _cdiv(R, tile_r), _cdiv(blocks, tile_nb)
        grid, grid_kind = _grid(B, tiles_r, tiles_c)
        launches.add(tq.quantize_rows_thread_kernel, grid,
            _X, _SCALE, _TARGET, R, C, strides[0], strides[1], tiles_r, tiles_c, blocks,
            groups * (3 if cpg == 4 else 1), _signed32(key), CW=cw, TILE_R=tile_r,
            TILE_NB=tile_nb, GRID=grid_kind, num_warps=warps, **common)
    elif blocks_on_c:
        common["WORDS"] = _fp6_words(cpg, block_size, C)
        tile_r, tile_nb, warps = _rows_tile("quantize_rows", block_p, blocks, B * R)
        tiles_r, tiles_c = _cdiv(R, tile_r), _cdiv(blocks, tile_nb)
        grid, grid_kind = _grid(B, tiles_r, tiles_c)
        launches.add(tq.quantize_rows_kernel, grid,
            _X, _SCALE, _TARGET, R, C, *strides, tiles_r, tiles_c, blocks, groups, _signed32(key),
            TILE_R=tile_r, TILE_NB=tile_nb, GRID=grid_kind, num_warps=warps, **common)
    else:
        tile_nb, tile_c, vec, warps = _cols_tile("quantize_cols", block_p, blocks, C)
        tiles_r, tiles_c = _cdiv(blocks, tile_nb), _cdiv(C, tile_c)
        grid, grid_kind = _grid(B, tiles_r, tiles_c)
        launches.add(tq.quantize_cols_kernel, grid,
            _X, _SCALE, _TARGET, R, C, *strides, tiles_r, tiles_c, blocks, groups, _signed32(key),
            TILE_NB=tile_nb, TILE_C=tile_c, VEC=vec, GRID=grid_kind, num_warps=warps, **common)


def _pack(launches: _Launches, codes: _Ref, out: _Ref, fmt: dtypes.DType, outer: int, n: int,
          inner: int, unpack: bool = False) -> None:
    """Records the pass that packs one-byte codes into `out` (or unpacks, `unpack`)."""
    _, _, tp = _kernels()
    groups = _cdiv(n, fmt.codes_per_group)
    total = outer * groups * inner
    tile = 1024
    kernel = tp.unpack_kernel if unpack else tp.pack_kernel
    launches.add(kernel, (_cdiv(total, tile),), codes, out, n, inner, groups, total,
                 BITS=fmt.bits, CPG=fmt.codes_per_group, BPG=fmt.bytes_per_group, TILE=tile,
                 num_warps=4)


def _output_shapes(shape, axis, n, block_size, fmt):
    scale_shape, data_shape = list(shape), list(shape)
    scale_shape[axis] = _cdiv(n, block_size)
    data_shape[axis] = packed_length(n, fmt)
    return scale_shape, data_shape


def quantize(data_hp: torch.Tensor, elem_dtype: dtypes.DType, block_size: int, scale_mode: str,
             rounding: str, axis: int, seed: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as numerics.quantize_mx_reference, for validated arguments."""
    x = data_hp.reshape(1) if data_hp.dim() == 0 else data_hp
    if rounding == "stochastic":  # the seed is a kernel argument: no plan to keep
        return QuantizePlan(x, elem_dtype, block_size, scale_mode, rounding, axis, seed)(x)
    return _quantize_plan(x, elem_dtype, block_size, scale_mode, rounding, axis)(x)


def _quantize_plan(x, elem_dtype, block_size, scale_mode, rounding, axis) -> "QuantizePlan":
    key = ("quantize", x.shape, x.stride(), x.dtype, x.data_ptr() & 15, x.device, elem_dtype,
           block_size, scale_mode, rounding, axis)  # what QuantizePlan decides by
    return memo(_PLANS, key, lambda: QuantizePlan(x, elem_dtype, block_size, scale_mode,
                                                     rounding, axis, None))


def device_call(kind: str, t: torch.Tensor, *arguments):
    """The call of the plan of `quantize(t, *arguments)` or `dequantize(t, *arguments)`
    (`kind`) bound to t's device (the plans' `device_calls`: `f(t)` or `f(t, scale)`, the
    tensors like those); False where the plan has none (not one launch on the call's tensors,
    stochastic rounding, no bound call on this device), None where it is not bound yet (no
    call of it has run on this device)."""
    if kind == "quantize":
        elem_dtype, block_size, scale_mode, rounding, axis, _ = arguments
        if rounding == "stochastic":
            return False
        x = t.reshape(1) if t.dim() == 0 else t
        plan = _quantize_plan(x, elem_dtype, block_size, scale_mode, rounding, axis)
    else:
        plan = _dequantize_plan(t, *arguments)
    calls = plan.device_calls
    return False if calls is None else calls.get(t.get_device())


class QuantizePlan:
    """quantize's launches for inputs like `x` (same shape, strides, dtype, 16-byte alignment
    and device) and these options, decided once: a call allocates the outputs (and the
    one-byte codes where a second pass packs them) and launches."""

    def __init__(self, x: torch.Tensor, fmt: dtypes.DType, block_size: int, scale_mode: str,
                 rounding: str, axis: int, seed: Optional[int]):
        shape = list(x.shape)
        n = shape[axis]
        self.scale_shape, self.data_shape = _output_shapes(shape, axis, n, block_size, fmt)
        self.storage, self.shape = fmt.storage_dtype, shape
        self.reference = None  # the options of the reference numerics, where it runs instead
        self.launches = None  # no kernel for an empty input
        # CUDA device index -> this plan's call bound to that device's compiled kernel
        # (`_device_call`), for a plan of one launch on the call's tensors' addresses; else None
        self.device_calls = None
        if x.numel() == 0:
            return
        if _next_pow2(block_size) > _MAX_BLOCK_P:
            self.reference = (fmt, block_size, scale_mode, rounding, axis, seed)
            return
        key = seed_key(seed or 0) if rounding == "stochastic" else 0
        cpg = fmt.codes_per_group
        self.direct = block_size % cpg == 0
        inner = math.prod(shape[axis + 1:])
        hw_fp8 = _hw_fp8(fmt, x.device, rounding)
        if inner == 1:
            x3, view, strides = _view_rows(x, axis)
        else:
            x3, view, strides = _view_cols(x, axis)
        self.copy = x3 is not x  # the strides needed a contiguous copy
        scale, data = self._outputs(x)
        target = self._target(x, data)
        self.launches = _Launches()
        _launch_quantize(self.launches, x3, view, strides, scale, target, fmt, block_size,
                         scale_mode, rounding, key, cpg if self.direct else 1, inner == 1, hw_fp8)
        if not self.direct:
            _pack(self.launches, _TARGET, _Ref("data"), fmt, math.prod(shape[:axis]), n, inner)
        if x.is_cuda and rounding != "stochastic" and self.direct and not self.copy \
                and _on_addresses(self.launches, ("x", "scale", "target")):
            self.device_calls = {}

    def _outputs(self, x: torch.Tensor):
        device = x.device
        return (empty(self.scale_shape, torch.uint8, device),
                empty(self.data_shape, self.storage, device))

    def _target(self, x: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
        """Where the first pass writes its codes: the output, or one byte per code to pack."""
        if self.direct:  # (fp4 and fp6 codes are bytes already: no view to make)
            return data if data.dtype == torch.uint8 else data.view(torch.uint8)
        return empty(self.shape, torch.uint8, x.device)

    def __call__(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.device_calls is not None:
            index = x.get_device()
            call = self.device_calls.get(index)
            if call and not hooks_installed():
                return call(x)
        if self.reference is not None:
            from ...numerics.reference import quantize_mx_reference
            fmt, block_size, scale_mode, rounding, axis, seed = self.reference
            return quantize_mx_reference(x, fmt, block_size, scale_mode=scale_mode,
                                         rounding=rounding, block_dim=axis, seed=seed)
        scale, data = self._outputs(x)
        if self.launches is not None:
            self.launches.run({"x": x.contiguous() if self.copy else x, "scale": scale,
                               "target": self._target(x, data), "data": data})
            if self.device_calls is not None:
                _bind_device_call(self.device_calls, x, self._device_call)
        return scale, data

    def _device_call(self, index: int):
        """This plan's call on the compiled kernel of CUDA device `index` (Launch.direct, the
        tensors passed as addresses: no argument table or views per call), or None."""
        launch_ = self.launches.launches[0][0]
        call = launch_.direct({}, launch_.slots, index)
        if call is None:
            return None
        device, stream = torch.device("cuda", index), torch._C._cuda_getCurrentRawStream
        new_scale = allocator(self.scale_shape, torch.uint8, device)
        new_data = allocator(self.data_shape, self.storage, device)

        def quantize(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            scale, data = new_scale(), new_data()
            call(stream(index), x.data_ptr(), scale.data_ptr(), data.data_ptr())
            return scale, data
        return on_device(index, quantize)


def dequantize(data_lp: torch.Tensor, scale_u8: torch.Tensor, elem_dtype: dtypes.DType,
               block_size: int, target_dtype: torch.dtype, axis: int, n: int) -> torch.Tensor:
    """Same contract as numerics.dequantize_mx_reference, for validated arguments."""
    return _dequantize_plan(data_lp, scale_u8, elem_dtype, block_size, target_dtype, axis,
                            n)(data_lp, scale_u8)


def _dequantize_plan(data_lp, scale_u8, elem_dtype, block_size, target_dtype, axis,
                     n) -> "DequantizePlan":
    key = ("dequantize", data_lp.shape, data_lp.stride(), data_lp.dtype, data_lp.data_ptr() & 15,
           scale_u8.shape, scale_u8.stride(), scale_u8.data_ptr() & 15, data_lp.device,
           elem_dtype, block_size, target_dtype, axis, n)  # what DequantizePlan decides by
    return memo(_PLANS, key, lambda: DequantizePlan(data_lp, scale_u8, elem_dtype, block_size,
                                                       target_dtype, axis, n))


class DequantizePlan:
    """dequantize's launches for data and scales like these (same shapes, strides, dtypes,
    16-byte alignments and device) and these options, decided once: a call allocates the output
    (and the one-byte codes where a first pass unpacks them) and launches."""

    def __init__(self, data_lp: torch.Tensor, scale_u8: torch.Tensor, fmt: dtypes.DType,
                 block_size: int, target_dtype: torch.dtype, axis: int, n: int):
        data = data_lp.contiguous().view(torch.uint8)
        scale = scale_u8.contiguous()
        shape = list(data.shape)
        shape[axis] = n
        self.shape, self.dtype = shape, target_dtype
        self.reference = None  # the options of the reference numerics, where it runs instead
        self.launches = None  # no kernel for an empty output
        self.unpack = False
        self.device_calls = None  # as QuantizePlan's: `bound` per CUDA device index
        if math.prod(shape) == 0:
            return
        if _next_pow2(block_size) > _MAX_BLOCK_P:
            self.reference = (fmt, block_size, target_dtype, axis, n)
            return
        td = _kernels()[1]
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        cpg = fmt.codes_per_group
        launches = self.launches = _Launches()
        source = _Ref("data")
        if block_size % cpg:
            self.unpack = True
            _pack(launches, source, _Ref("codes"), fmt, outer, n, inner, unpack=True)
            source, cpg = _Ref("codes"), 1  # one byte per code, `shape` of them
        out = _Ref("out")
        block_p = _next_pow2(block_size)
        blocks, groups = _cdiv(n, block_size), _cdiv(n, cpg)
        i64 = _needs_i64(math.prod(shape), math.prod(shape) if self.unpack else data.numel(),
                         scale.numel())
        common = dict(BLOCK=block_size, BLOCK_P=block_p, I64=i64, CPG=cpg,
                      HW_FP8=_hw_fp8(fmt, data.device), SOFT_BF16=interpreting(),
                      **decode_constants(fmt))
        if inner == 1 and _fp6_chunks(cpg, block_size, n, data):
            cfg = _tuning("dequantize_fp6_rows")
            tile_ch = max(1, min(_next_pow2(n // 8), cfg["row_chunks"]))
            tile_r = max(1, min(_next_pow2(outer), cfg["chunks"] // tile_ch))
            tiles_r, tiles_c = _cdiv(outer, tile_r), _cdiv(n // 8, tile_ch)
            grid, grid_kind = _grid(1, tiles_r, tiles_c)
            constants = {k: v for k, v in decode_constants(fmt).items() if k != "BIAS"}
            launches.add(td.dequantize_fp6_rows_kernel, grid,
                source, _SCALE, out, outer, n, tiles_r, tiles_c, blocks, n // 8 * 6,
                BLOCK=block_size, TILE_R=tile_r, TILE_CH=tile_ch, I64=i64, GRID=grid_kind,
                SOFT_BF16=interpreting(), num_warps=cfg["num_warps"], **constants)
        elif inner == 1:
            common["WORDS"] = _fp6_words(cpg, block_size, n, data)
            tile_r, tile_nb, warps = _rows_tile("dequantize_rows", block_p, blocks, outer)
            tiles_r, tiles_c = _cdiv(outer, tile_r), _cdiv(blocks, tile_nb)
            grid, grid_kind = _grid(1, tiles_r, tiles_c)
            launches.add(td.dequantize_rows_kernel, grid,
                source, _SCALE, out, outer, n, tiles_r, tiles_c, blocks, groups,
                TILE_R=tile_r, TILE_NB=tile_nb, GRID=grid_kind, num_warps=warps, **common)
        else:
            tile_nb, tile_c, _, warps = _cols_tile("dequantize_cols", block_p, blocks, inner)
            tiles_r, tiles_c = _cdiv(blocks, tile_nb), _cdiv(inner, tile_c)
            grid, grid_kind = _grid(outer, tiles_r, tiles_c)
            launches.add(td.dequantize_cols_kernel, grid,
                source, _SCALE, out, n, inner, tiles_r, tiles_c, blocks, groups,
                TILE_NB=tile_nb, TILE_C=tile_c, GRID=grid_kind, num_warps=warps, **common)
        if data_lp.is_cuda and data_lp.is_contiguous() and scale_u8.is_contiguous() \
                and _on_addresses(launches, ("data", "scale", "out")):
            self.device_calls = {}

    def __call__(self, data_lp: torch.Tensor, scale_u8: torch.Tensor) -> torch.Tensor:
        if self.device_calls is not None:
            index = data_lp.get_device()
            call = self.device_calls.get(index)
            if call and not hooks_installed():
                return call(data_lp, scale_u8)
        if self.reference is not None:
            from ...numerics.reference import dequantize_mx_reference
            fmt, block_size, target_dtype, axis, n = self.reference
            return dequantize_mx_reference(data_lp, scale_u8, fmt, block_size, target_dtype,
                                           axis, block_dim_size=n)
        device = data_lp.device
        out = empty(self.shape, self.dtype, device)
        if self.launches is not None:
            data = data_lp.contiguous()
            tensors = {"data": data if data.dtype == torch.uint8 else data.view(torch.uint8),
                       "scale": scale_u8.contiguous(), "out": out}
            if self.unpack:
                tensors["codes"] = empty(self.shape, torch.uint8, device)
            self.launches.run(tensors)
            if self.device_calls is not None:
                _bind_device_call(self.device_calls, data_lp,
                                  lambda _: self.bound(data_lp, scale_u8))
        return out

    def bound(self, data_lp: torch.Tensor, scale_u8: torch.Tensor):
        """`f(data, scale) -> out`, this plan's call on contiguous data and scales like these
        (the caller keeps to that, and to their 16-byte alignments, as for the plan itself)
        with its one kernel launched through Launch.direct on their addresses: no argument
        table, views or launch bookkeeping per call. For a caller that dequantizes the same
        tensors again and again (MXLinear's FSDP2-gathered weight: forward and backward,
        every step). It runs with the tensors' device current (`on_device`). None where the
        plan is not one launch over (data, scale, out), where Launch.direct gives none (the
        interpreter, a launch hook, no call yet on the tensors' device) or where data and
        scales are on different devices."""
        if self.reference is not None or self.launches is None or self.unpack \
                or not _on_addresses(self.launches, ("data", "scale", "out")) \
                or not (data_lp.is_contiguous() and scale_u8.is_contiguous()):
            return None
        launch_ = self.launches.launches[0][0]
        index = data_lp.get_device()
        if index < 0 or scale_u8.get_device() != index:
            return None
        call = launch_.direct({}, launch_.slots, index)
        if call is None:
            return None
        new_out = allocator(self.shape, self.dtype, data_lp.device)
        stream = torch._C._cuda_getCurrentRawStream

        def dequantize(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            out = new_out()
            call(stream(index), data.data_ptr(), scale.data_ptr(), out.data_ptr())
            return out
        return on_device(index, dequantize)


def fused_supported(fmt: dtypes.DType, block_size: int) -> bool:
    """Whether one fused pass handles this format and block size (else two passes run)."""
    return (block_size & (block_size - 1)) == 0 and block_size % fmt.codes_per_group == 0 \
        and block_size <= 128


def quantize_rowwise_colwise(x: torch.Tensor, elem_dtype: dtypes.DType, block_size: int,
                             scale_mode: str, rounding: str, seed: Optional[int]):
    """((scale_r, data_r), (scale_c, data_c)): blocks along dim -1 and along dim -2 of x
    (dim >= 2, validated), from one read of x when fused_supported(), else two passes."""
    fmt = elem_dtype
    axis_r, axis_c = x.dim() - 1, x.dim() - 2
    if not fused_supported(fmt, block_size) or x.numel() == 0:
        return (quantize(x, fmt, block_size, scale_mode, rounding, axis_r, seed),
                quantize(x, fmt, block_size, scale_mode, rounding, axis_c, seed))
    shape = list(x.shape)
    sr_shape, dr_shape = _output_shapes(shape, axis_r, shape[-1], block_size, fmt)
    sc_shape, dc_shape = _output_shapes(shape, axis_c, shape[-2], block_size, fmt)
    dev = x.device
    scale_r = torch.empty(sr_shape, dtype=torch.uint8, device=dev)
    data_r = torch.empty(dr_shape, dtype=fmt.storage_dtype, device=dev)
    scale_c = torch.empty(sc_shape, dtype=torch.uint8, device=dev)
    data_c = torch.empty(dc_shape, dtype=fmt.storage_dtype, device=dev)
    x3, (B, R, C), strides = _view_cols(x, axis_c)
    cpg = fmt.codes_per_group
    if _pairs_apply(x3, (B, R, C), strides, fmt, rounding, "quantize_fused_pairs"):
        _quantize_fused_pairs(x3, (B, R, C), strides, fmt, block_size, scale_mode, scale_r,
                              data_r, scale_c, data_c)
        return (scale_r, data_r), (scale_c, data_c)
    key = seed_key(seed or 0) if rounding == "stochastic" else 0
    cfg = _tuning("quantize_fused")
    blocks_r, blocks_c = _cdiv(R, block_size), _cdiv(C, block_size)
    warps = cfg["num_warps"]
    # A tile of whole blocks both ways; `vec` columns per thread (at least a packed group).
    vec = min(block_size, max(cpg, cfg["vec"]))
    nbr = max(1, min(_next_pow2(blocks_r), cfg["row_blocks"]))
    nbc = max(1, min(_next_pow2(blocks_c), cfg["col_blocks"]))
    tiles_r, tiles_c = _cdiv(blocks_r, nbr), _cdiv(blocks_c, nbc)
    tq = _kernels()[0]
    i64 = _needs_i64(_span(x3), x.numel(), data_r.numel(), data_c.numel())
    grid, grid_kind = _grid(B, tiles_r, tiles_c)
    hw_fp8 = _hw_fp8(fmt, dev, rounding)
    consts = _format_constants(fmt)
    # Float codes with round half to even by _codes_rne (`encode` 2; its magic needs inputs
    # of at most 20 significant bits, 1 is the form for fp32), else (0) by _codes. `maxnreg`
    # applies with encode 2: ptxas gives those kernels 220-235 registers without it (8 warps
    # per SM); at 168 (12 warps, a few spills) they ran faster on an H100.
    enc = cfg.get("encode", 2)
    if (rounding != "even" or consts["IS_INT"] or hw_fp8 or consts["BIG_EMAX"]
            or consts["EMIN"] > 0):
        enc = 0
    elif x.dtype not in (torch.bfloat16, torch.float16):
        enc = min(enc, 1)
    registers = {"maxnreg": cfg["maxnreg"]} if enc == 2 and cfg.get("maxnreg") else {}
    launch(tq.quantize_fused_kernel, grid,
        x3, scale_r, data_r.view(torch.uint8), scale_c, data_c.view(torch.uint8), R, C, *strides,
        tiles_r, tiles_c, blocks_r, blocks_c, _cdiv(R, cpg), _cdiv(C, cpg), _signed32(key),
        BLOCK=block_size, TILE_NBR=nbr, TILE_NBC=nbc, VEC=vec, I64=i64, GRID=grid_kind, CPG=cpg,
        WORDS=_fp6_words(cpg, block_size, C), ENC=enc,
        HW_FP8=hw_fp8, SCALE_MODE=_SCALE_MODE[scale_mode],
        ROUNDING=_ROUNDING[rounding], num_warps=warps, **registers, **consts)
    return (scale_r, data_r), (scale_c, data_c)


def _pairs_apply(x3: torch.Tensor, shape, strides, fmt: dtypes.DType, rounding: str,
                 kind: str) -> bool:
    """Whether kernel `kind` (quantize_rows_pairs, quantize_fused_pairs) may run on pairs of
    16-bit values (_tl_quantize_pairs): enabled in TUNING, bf16 or fp16 input, a format it is
    exact for from that input, round half to even, x readable as aligned int32 words (unit
    stride along an even number of columns, even strides, a 4-byte aligned start), and a GPU
    with the PTX it needs (add.rn.bf16x2, min.u16x2: sm_90) or the interpreter."""
    if not _tuning(kind)["enabled"] or rounding != "even":
        return False
    if not interpreting() and device_capability(x3.device) < (9, 0):
        return False
    pairs = _pair_kernels()
    half = {torch.bfloat16: pairs.BF16, torch.float16: pairs.F16}.get(x3.dtype)
    if half is None or not pairs.pairs_supported(fmt, half):
        return False
    C = shape[2]
    return (C % 2 == 0 and strides[2] == 1 and strides[0] % 2 == 0
            and strides[1] % 2 == 0 and x3.data_ptr() % 4 == 0)


def _pair_launch(x3, shape, strides, fmt: dtypes.DType, block_size: int, scale_mode: str):
    """(x as int32 words (a _Ref to "x"), their strides in words, the constexprs both pair
    kernels take)."""
    pairs = _pair_kernels()
    ptx = not interpreting()
    consts = _format_constants(fmt)
    f16 = x3.dtype == torch.float16
    cap = _half_float_bits(float(fmt.max), x3.dtype)
    words = _Ref("x", (tuple(shape), tuple(strides)), torch.int32)
    return words, (strides[0] // 2, strides[1] // 2), dict(
        ENCODE=pairs.encode_pairs_ptx(fmt, pairs.F16 if f16 else pairs.BF16) if ptx else "",
        PTX=ptx, F16=f16, BLOCK=block_size, CPG=fmt.codes_per_group, CAP=cap,
        SCALE_MODE=_SCALE_MODE[scale_mode], BITS=consts["BITS"], MBITS=consts["MBITS"],
        EMIN=consts["EMIN"], EMAX=consts["EMAX"], MAX_NORMAL=consts["MAX_NORMAL"],
        RCEIL_FRAC=consts["RCEIL_FRAC"], RCEIL_ZERO=consts["RCEIL_ZERO"])


def _quantize_rows_pairs(launches: _Launches, x3, shape, strides, scale, data, fmt,
                         block_size, scale_mode):
    B, R, C = shape
    blocks = C // block_size
    tile_r, tile_nb, warps = _thread_rows_tile("quantize_rows_pairs", blocks, B * R)
    tiles_r, tiles_c = _cdiv(R, tile_r), _cdiv(blocks, tile_nb)
    grid, grid_kind = _grid(B, tiles_r, tiles_c)
    words, (stride_b, stride_r), consts = _pair_launch(x3, shape, strides, fmt, block_size,
                                                      scale_mode)
    launches.add(_pair_kernels().quantize_rows_pairs_kernel, grid,
        words, _SCALE, _TARGET, R, stride_b, stride_r, tiles_r, tiles_c, blocks,
        packed_length(C, fmt), TILE_R=tile_r, TILE_NB=tile_nb,
        I64=_needs_i64(_span(x3), x3.numel(), data.numel(), scale.numel()), GRID=grid_kind,
        num_warps=warps, **consts)


def _quantize_fused_pairs(x3, shape, strides, fmt, block_size, scale_mode, scale_r, data_r,
                          scale_c, data_c):
    B, R, C = shape
    cpg = fmt.codes_per_group
    cfg = _tuning("quantize_fused_pairs")
    blocks_r, blocks_c = _cdiv(R, block_size), _cdiv(C, block_size)
    nbr = max(1, min(_next_pow2(blocks_r), cfg["row_blocks"]))
    nbc = max(1, min(_next_pow2(blocks_c), cfg["col_blocks"]))
    tiles_r, tiles_c = _cdiv(blocks_r, nbr), _cdiv(blocks_c, nbc)
    grid, grid_kind = _grid(B, tiles_r, tiles_c)
    words, (stride_b, stride_r), consts = _pair_launch(x3, shape, strides, fmt, block_size,
                                                      scale_mode)
    launch(_pair_kernels().quantize_fused_pairs_kernel, grid,
        words.resolve({"x": x3}), scale_r, data_r.view(torch.uint8), scale_c.view(torch.int16),
        data_c.view(torch.uint8).view(torch.int16), R, C // 2, stride_b, stride_r,
        tiles_r, tiles_c, blocks_r, blocks_c, _cdiv(R, cpg), packed_length(C, fmt),
        TILE_NBR=nbr, TILE_NBC=nbc, VEC=min(cfg["vec"], block_size // 2),
        I64=_needs_i64(_span(x3), x3.numel(), data_r.numel(), data_c.numel()),
        GRID=grid_kind, WORDS=_fp6_words(cpg, block_size, C), num_warps=cfg["num_warps"],
        **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}), **consts)


# ------------------------------------------------------------------ fake quantize (QAT forward)

def fake_quantize_supported(x: torch.Tensor, block_size: int, rounding: str) -> bool:
    """Whether `fake_quantize_rows` takes x: contiguous, blocks along the last dim, any
    rounding but stochastic."""
    return (x.dim() >= 1 and x.is_contiguous() and rounding != "stochastic"
            and _next_pow2(block_size) <= _MAX_BLOCK_P)


def fake_quantize_rows(x: torch.Tensor, elem_dtype: dtypes.DType, block_size: int,
                       scale_mode: str, rounding: str) -> torch.Tensor:
    """dequantize(quantize(x)) with blocks along the last dim, in x's dtype and shape, from
    one kernel (fake_quantize_rows_kernel) whose launch is decided once per shape, dtype,
    device, alignment and options (a later call allocates the output and launches). For
    arguments validated by the caller and `fake_quantize_supported`."""
    key = ("fake_quantize", x.shape, x.dtype, x.device, x.data_ptr() % 16 == 0, elem_dtype,
           block_size, scale_mode, rounding)
    plan = memo(_PLANS, key,
                   lambda: _fake_quantize_plan(x, elem_dtype, block_size, scale_mode, rounding))
    out = torch.empty_like(x)
    if out.numel():
        plan(x, out)
    return out


def _fake_quantize_plan(x, fmt, block_size, scale_mode, rounding):
    from .._launch import Launch

    C = x.shape[-1]
    R = x.numel() // C if C else 0
    block_p = _next_pow2(block_size)
    blocks = _cdiv(C, block_size)
    tile_r, tile_nb, warps = _rows_tile("quantize_rows", block_p, blocks, R)
    tiles_r, tiles_c = _cdiv(R, tile_r), _cdiv(blocks, tile_nb)
    grid, grid_kind = _grid(1, tiles_r, tiles_c)
    consts = _format_constants(fmt)
    decode = decode_constants(fmt)
    return Launch(
        _kernels()[0].fake_quantize_rows_kernel, grid, (x, x, R, C, tiles_r, tiles_c),
        dict(BLOCK=block_size, BLOCK_P=block_p, TILE_R=tile_r, TILE_NB=tile_nb,
             I64=_needs_i64(x.numel()), GRID=grid_kind,
             HW_ENCODE=_hw_fp8(fmt, x.device, rounding), HW_DECODE=_hw_fp8(fmt, x.device),
             SCALE_MODE=_SCALE_MODE[scale_mode], ROUNDING=_ROUNDING[rounding],
             SOFT_BF16=interpreting(), num_warps=warps, **consts,
             BIAS=decode["BIAS"], HAS_INF=decode["HAS_INF"], HAS_NAN=decode["HAS_NAN"],
             LSB=decode["LSB"], TO_VALUE=decode["TO_VALUE"]),
        slots=(0, 1))

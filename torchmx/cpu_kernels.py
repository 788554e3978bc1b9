"""CPU fast path: the C kernels of torchmx/csrc/mx_cpu.c, compiled on first use.

The C file has no dependency; it is built with the system C compiler (TORCHMX_CPU_CFLAGS adds
flags) into a cache folder (TORCHMX_CACHE_DIR, default ~/.cache/torchmx) and called through
ctypes, which releases the GIL, so rows are split across `torch.get_num_threads()` Python
threads. Without a compiler, `available()` is False and the custom ops fall back to the
reference numerics (with a warning). Dequantize reads a (scale byte x code) table that the
reference numerics compute, so its arithmetic is the reference's by construction; tests hold
both kernels bit-exact to it.
"""

import concurrent.futures
import ctypes
import functools
import hashlib
import math
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from typing import Optional, Tuple

import torch

from . import dtypes
from ._allocation import allocator
from ._memo import memo
from .numerics import decode
from .numerics.packing import packed_length
from .numerics.reference import round_to_target
from .numerics.modes import ROUNDING_BY_NAME, SCALE_MODE_BY_NAME
from .numerics.rounding import seed_key
from .numerics.scale import scale_value

_SOURCE = pathlib.Path(__file__).parent / "csrc" / "mx_cpu.c"
_FLAGS = ["-O3", "-march=native", "-std=c99", "-shared", "-fPIC", "-fno-semantic-interposition",
          "-ffp-contract=off"]
_INPUT_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_MIN_ELEMENTS_PER_THREAD = 1 << 16


class _Format(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in
                ("is_int", "bits", "mantissa_bits", "min_exponent", "emax", "max_code")]
    _fields_ += [("max_normal", ctypes.c_float), ("codes_per_group", ctypes.c_int32),
                 ("bytes_per_group", ctypes.c_int32)]


def _flags():
    """The compiler flags: _FLAGS, then TORCHMX_CPU_CFLAGS (extra flags, e.g. the sanitizers of
    tests/kernels/quantize/test_memory_safety.py; space-separated)."""
    return _FLAGS + os.environ.get("TORCHMX_CPU_CFLAGS", "").split()


def _compile(target: pathlib.Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # atomic rename: safe in parallel
        built = pathlib.Path(tmp) / target.name
        subprocess.run([compiler, *_flags(), str(_SOURCE), "-o", str(built), "-lm"],
                       check=True, capture_output=True, text=True)
        os.replace(built, target)


# /proc/cpuinfo lines that say which instructions -march=native may use (x86; ARM).
_CPU_KEYS = ("model name", "flags", "CPU implementer", "CPU part", "Features")


def _cpu_description(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The first processor's model and feature flags (elsewhere, what `platform` says): part of
    the cache key, so that a cache folder shared by different CPUs (a home directory on a mixed
    cluster) never hands one CPU a library built with -march=native for another (SIGILL)."""
    try:
        first = pathlib.Path(cpuinfo).read_text(errors="replace").split("\n\n", 1)[0]
    except OSError:
        first = ""
    lines = [line for line in first.splitlines() if line.split(":", 1)[0].strip() in _CPU_KEYS]
    return "\n".join(lines) or f"{platform.machine()} {platform.processor()}"


def _library_path(cpu: str) -> pathlib.Path:
    """Cache file of the library built from this source with these flags for this CPU."""
    key = _SOURCE.read_bytes() + " ".join(_flags()).encode() + sys.platform.encode() + cpu.encode()
    digest = hashlib.sha256(key).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("TORCHMX_CACHE_DIR", pathlib.Path.home() / ".cache" / "torchmx"))
    return cache / f"mx_cpu_{digest}.so"


@functools.lru_cache(maxsize=None)
def _library() -> Optional[ctypes.CDLL]:
    path = _library_path(_cpu_description())
    try:
        if not path.exists():
            _compile(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        warnings.warn(f"torchmx: CPU kernels unavailable, using the slower reference ({detail})")
        return None
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.mx_quantize_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ctypes.POINTER(_Format), i64,
                                     i32, i32, ctypes.c_uint32, ptr, ptr, ptr, ptr]
    lib.mx_dequantize_rows.argtypes = [ptr, ptr, i64, i64, i64, i64, ctypes.POINTER(_Format), i64,
                                       ptr, i64, i32, ptr, ptr]
    return lib


# TORCHMX_CPU_BACKEND=reference turns the C kernels off; read once, when torchmx is imported.
_TURNED_OFF = os.environ.get("TORCHMX_CPU_BACKEND") == "reference"


def available() -> bool:
    """True when the C kernels compiled and loaded."""
    return not _TURNED_OFF and _library() is not None


@functools.lru_cache(maxsize=None)
def _entry_points() -> Tuple:
    """(quantize, dequantize): the C functions, looked up once."""
    lib = _library()
    return lib.mx_quantize_rows, lib.mx_dequantize_rows


_HUGE_PAGE = 1 << 21
_CPU = torch.device("cpu")
_MADV_HUGEPAGE = 14


@functools.lru_cache(maxsize=1)
def _madvise():
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _new_output(shape, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty, with transparent huge pages asked for on large outputs (Linux).

    A fresh multi-MB output is mostly page faults on first touch; 2 MB pages make them 512x
    fewer (what PyTorch's THP_MEM_ALLOC_ENABLE does for every allocation).
    """
    out = torch.empty(shape, dtype=dtype)
    if out.numel() * out.element_size() < 3 * _HUGE_PAGE:
        return out
    begin = (out.data_ptr() + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
    end = (out.data_ptr() + out.numel() * out.element_size()) & ~(_HUGE_PAGE - 1)
    if sys.platform == "linux" and end - begin >= 2 * _HUGE_PAGE and _madvise() is not None:
        _madvise()(begin, end - begin, _MADV_HUGEPAGE)  # advice only: failure changes nothing
    return out


_FORMATS = {}  # format name -> its _Format passed by reference (names identify formats)


def _format(elem_dtype: dtypes.DType):
    """ctypes.byref of the C description of `elem_dtype`, built once per format."""
    fmt = _FORMATS.get(elem_dtype.name)
    if fmt is None:
        struct = _Format(elem_dtype.kind == "int", elem_dtype.bits, elem_dtype.mantissa_bits,
                         elem_dtype.min_exponent, elem_dtype.emax, elem_dtype.max_code,
                         elem_dtype.max, elem_dtype.codes_per_group, elem_dtype.bytes_per_group)
        fmt = _FORMATS[elem_dtype.name] = (struct, ctypes.byref(struct))
    return fmt[1]


_TABLES = {}  # (format name, target dtype) -> _dequantize_table


def _table(elem_dtype: dtypes.DType, target_dtype: torch.dtype) -> torch.Tensor:
    key = (elem_dtype.name, target_dtype)
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = _dequantize_table(elem_dtype, target_dtype)
    return table


def _dequantize_table(elem_dtype: dtypes.DType, target_dtype: torch.dtype) -> torch.Tensor:
    """table[b, code] = decode(code) * 2**(b - 127) rounded once to target_dtype, by the reference."""
    codes = torch.arange(1 << elem_dtype.bits, dtype=torch.int32)
    if elem_dtype.kind == "int":
        codes = codes.to(torch.uint8).view(torch.int8)
    values = decode(codes, elem_dtype)
    scales = scale_value(torch.arange(256, dtype=torch.int32).to(torch.uint8))
    return round_to_target(scales[:, None] * values[None, :], target_dtype).contiguous()


@functools.lru_cache(maxsize=1)
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1)


_KEPT_SCRATCH = 1 << 16  # elements per row up to which a thread keeps its buffers


class _Scratch(threading.local):
    """Per-thread work buffers of the C kernels, grown as needed and kept: a fresh pair per
    call costs more host time than a small call's arithmetic."""
    size = 0  # elements per row the kept buffers hold
    kept = long = None  # (values, codes) tensors: kept, and the last call's long rows'
    addresses = (0, 0)  # of the kept buffers

    def get(self, n: int) -> Tuple[int, int]:
        """Addresses of >= 2n fp32 values and >= n bytes, valid until this thread's next call."""
        if n <= self.size:
            return self.addresses
        values = torch.empty(2 * n, dtype=torch.float32)
        codes = torch.empty(n, dtype=torch.uint8)
        if n > _KEPT_SCRATCH:  # long rows: not kept for the life of the thread
            self.long = values, codes
            return values.data_ptr(), codes.data_ptr()
        self.kept, self.size = (values, codes), n
        self.addresses = values.data_ptr(), codes.data_ptr()
        return self.addresses


_scratch = _Scratch()


def _row_chunks(rows: int, elements_per_row: int) -> int:
    """How many chunks of rows a call's work may be split into across threads (1: too little
    work to gain from threads)."""
    work = rows * max(elements_per_row, 1)
    if work < 2 * _MIN_ELEMENTS_PER_THREAD:
        return 1
    return min(rows, work // _MIN_ELEMENTS_PER_THREAD)


def _run_rows(rows: int, most_chunks: int, call) -> None:
    """call(begin, end) over at most `most_chunks` chunks of rows, in parallel on up to
    torch.get_num_threads() threads."""
    chunks = min(torch.get_num_threads(), most_chunks)
    if chunks <= 1:
        call(0, rows)
        return
    bounds = [rows * i // chunks for i in range(chunks + 1)]
    futures = [_pool().submit(call, bounds[i], bounds[i + 1]) for i in range(chunks)]
    for future in futures:
        future.result()


def _split(shape, axis) -> Tuple[int, int, int]:
    if axis == len(shape) - 1:
        return math.prod(shape[:axis]), shape[axis], 1
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _allocator(shape, dtype: torch.dtype):
    """A function () -> a new output of this shape and dtype: PyTorch's C allocator
    (_allocation.py), or _new_output for an output large enough to want huge pages."""
    if math.prod(shape) * dtype.itemsize < 3 * _HUGE_PAGE:
        return allocator(shape, dtype, _CPU)
    return functools.partial(_new_output, shape, dtype)


_NO_SEED_KEY = ctypes.c_uint32(seed_key(0))


class _QuantizeCall:
    """What quantize works out for one kind of call (input shape and dtype, format, block size,
    modes, axis), once: the outputs' shapes, the row split, and the C function's arguments
    other than the addresses and the seed, as ctypes objects (ctypes passes them as they are,
    where it converts a Python int at every call)."""

    def __init__(self, shape, dtype: torch.dtype, elem_dtype: dtypes.DType, block_size: int,
                 scale_mode: str, rounding: str, axis: int):
        outer, n, inner = _split(shape, axis)
        scale_shape, data_shape = list(shape), list(shape)
        scale_shape[axis], data_shape[axis] = -(-n // block_size), packed_length(n, elem_dtype)
        self.new_scale = _allocator(tuple(scale_shape), torch.uint8)
        self.new_data = _allocator(tuple(data_shape), elem_dtype.storage_dtype)
        self.rows, self.n, self.empty = outer * inner, n, math.prod(shape) == 0
        self.chunks = _row_chunks(self.rows, n)
        self.quantize_rows = _entry_points()[0]
        i64 = ctypes.c_int64
        # mx_quantize_rows(src, in_dtype, n, inner, row_begin, row_end, format, block_size,
        #                  scale_mode, rounding, seed_key, scale_out, data_out, scratch, codes)
        self.head = (ctypes.c_int(_INPUT_CODES[dtype]), i64(n), i64(inner))
        self.middle = (_format(elem_dtype), i64(block_size),
                       ctypes.c_int(SCALE_MODE_BY_NAME[scale_mode]),  # the enums of mx_cpu.c
                       ctypes.c_int(ROUNDING_BY_NAME[rounding]))
        self.whole = self.head + (i64(0), i64(self.rows)) + self.middle

    def __call__(self, x: torch.Tensor, seed: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(scale, data) of the contiguous input x."""
        scale, data = self.new_scale(), self.new_data()
        if self.empty:
            return scale, data
        key = _NO_SEED_KEY if seed is None else seed_key(seed)
        if self.chunks == 1:
            values, codes = _scratch.get(self.n)
            self.quantize_rows(x.data_ptr(), *self.whole, key, scale.data_ptr(), data.data_ptr(),
                               values, codes)
            return scale, data
        addresses = x.data_ptr(), scale.data_ptr(), data.data_ptr()

        def call(begin, end):
            values, codes = _scratch.get(self.n)
            self.quantize_rows(addresses[0], *self.head, begin, end, *self.middle, key,
                               addresses[1], addresses[2], values, codes)

        _run_rows(self.rows, self.chunks, call)
        return scale, data


class _DequantizeCall:
    """What dequantize works out for one kind of call (data shape, format, block size, target
    dtype, axis, elements along it), once: the output's shape, the row split, the value table
    and the C function's other arguments as ctypes objects."""

    def __init__(self, shape, elem_dtype: dtypes.DType, block_size: int,
                 target_dtype: torch.dtype, axis: int, n: int):
        outer, _, inner = _split(shape, axis)
        out_shape = list(shape)
        out_shape[axis] = n
        self.new_out = _allocator(tuple(out_shape), target_dtype)
        self.rows, self.n, self.empty = outer * inner, n, math.prod(out_shape) == 0
        self.chunks = _row_chunks(self.rows, n)
        self.dequantize_rows = _entry_points()[1]
        self.table = table = _table(elem_dtype, target_dtype)  # kept: the C side reads it
        i64 = ctypes.c_int64
        # mx_dequantize_rows(data, scale, n, inner, row_begin, row_end, format, block_size,
        #                    table, table_codes, element_bytes, out, codes)
        self.head = (i64(n), i64(inner))
        self.middle = (_format(elem_dtype), i64(block_size), ctypes.c_void_p(table.data_ptr()),
                       i64(table.shape[1]), ctypes.c_int(table.element_size()))
        self.whole = self.head + (i64(0), i64(self.rows)) + self.middle

    def __call__(self, data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The values of the contiguous data and scale."""
        out = self.new_out()
        if self.chunks == 1 and not self.empty:
            self.dequantize_rows(data.data_ptr(), scale.data_ptr(), *self.whole, out.data_ptr(),
                                 _scratch.get(self.n)[1])
            return out
        if self.empty:
            return out
        addresses = data.data_ptr(), scale.data_ptr(), out.data_ptr()

        def call(begin, end):
            self.dequantize_rows(addresses[0], addresses[1], *self.head, begin, end,
                                 *self.middle, addresses[2], _scratch.get(self.n)[1])

        _run_rows(self.rows, self.chunks, call)
        return out


_QUANTIZE_CALLS, _DEQUANTIZE_CALLS = {}, {}  # kind of call -> _QuantizeCall / _DequantizeCall


def quantize(data_hp: torch.Tensor, elem_dtype: dtypes.DType, block_size: int, scale_mode: str,
             rounding: str, axis: int, seed: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as numerics.quantize_mx_reference, for validated arguments on CPU."""
    x = data_hp.reshape(1) if data_hp.dim() == 0 else data_hp.contiguous()
    key = (x.shape, x.dtype, elem_dtype.name, block_size, scale_mode, rounding, axis)
    call = _QUANTIZE_CALLS.get(key)
    if call is None:
        call = memo(_QUANTIZE_CALLS, key, lambda: _QuantizeCall(
            x.shape, x.dtype, elem_dtype, block_size, scale_mode, rounding, axis))
    return call(x, seed)


def dequantize(data_lp: torch.Tensor, scale_u8: torch.Tensor, elem_dtype: dtypes.DType,
               block_size: int, target_dtype: torch.dtype, axis: int, n: int) -> torch.Tensor:
    """Same contract as numerics.dequantize_mx_reference, for validated arguments on CPU."""
    key = (data_lp.shape, elem_dtype.name, block_size, target_dtype, axis, n)
    call = _DEQUANTIZE_CALLS.get(key)
    if call is None:
        call = memo(_DEQUANTIZE_CALLS, key, lambda: _DequantizeCall(
            data_lp.shape, elem_dtype, block_size, target_dtype, axis, n))
    return call(data_lp.contiguous(), scale_u8.contiguous())

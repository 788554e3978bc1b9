"""x [M, K] @ W.T for 1..64 activation rows and an MXFP4, MXFP6 (e2m3 / e3m2), MXFP8 (e4m3 /
e5m2) or MXINT8 weight W [N, K] in the TMA stream layout (tma_stream_layout.py), on Hopper (sm_90): one
wave of CTAs, each streaming its 64-row tile of W over all of K, or over a part of K where the
tiles alone are too few for the SMs (split-K).

Few-row products are bound by reading W once. The split-K kernels (mma_linear,
fp4_wgmma_matmul) give each tile several programs of several waves; this kernel gives each
tile one CTA (N / 64 CTAs: 128 for N = 8192) that keeps the SM's memory pipe full on its own,
or `split_k` CTAs of one part of K each where that fills the SMs better (N = 4096: 2 a tile,
N = 1024: 8), written in Gluon (Triton's explicit-layout dialect, _gl_stream.py) because
Triton's language cannot express its warp roles:

- a loader warp brings each step's W codes (one contiguous run of the TMA stream layout; fp6: one
  run in each of its two planes), x^T [M padded to MP, 128 codes a sub-step] and the blocks'
  multiplier exponents (the stream scales) into a STAGES-slot shared-memory ring by TMA (rows
  of x past M read as zeros); the CTAs go through K at about the same pace, so together they
  read one region of the step-major layout at a time;
- two consumer warpgroups take the ring's slots in turn. Each lane loads its words of a row
  (one 16- or 32-byte shared-memory load; fp6: 16 bytes of plane A, 8 of plane B), decodes
  them into exactly its wgmma A registers (value * 2**(s - 127) in bf16: mma_linear's decode
  for one-byte codes and fp6, one for the TMA stream layout's spread fp4 bits, each times its
  block's multiplier, one instruction from its byte in the stream scales) and runs wgmma (W
  from registers, x^T from shared memory, "swap AB": out^T = W x^T) into its own fp32
  accumulator, each sub-step in two halves of K (the first half's wgmma runs while the
  second half is decoded);
- the two accumulators are added inside the CTA (through shared memory). With split-K each
  CTA stores that fp32 partial and counts its arrival on the tile's counter; the last to
  arrive adds the tile's partials in part order (so the sum does not depend on which CTA
  came last) and resets the counter to zero for the next call;
- the bias is added in fp32 and the sum rounded once to the output dtype.

Each call is launched with programmatic dependent launch (PDL, sm_90): back-to-back calls, as
in a decode step, overlap. A call lets the next kernel on the stream start on the SMs its
CTAs leave (`griddepcontrol.launch_dependents`, at its start), and each call first asks L2
for its first few sub-steps of W and scales, then waits for the kernel before it
(`griddepcontrol.wait`) before its first TMA load and before any store: x is the previous
kernel's output, its output buffer may have been that kernel's scratch, and even W may have
just been written (prepack, a weight update). An L2 prefetch cannot read anything stale, as
L2 is where the GPU's memory is coherent. After a kernel launched without PDL nothing
overlaps (the wait returns at once); the gain is in the ramp and tail of back-to-back calls.

The counters (int32, one a tile, zero between calls: prepack's copy keeps its own) make
concurrent calls on one weight on two streams race when K is split, as for the fragment and
MMA-layout kernels.

Numerics are those of kernels/linear/dispatch.py: exact bf16 products, fp32 sums, one rounding (the
order of the fp32 sums depends on the split, so on the GPU's SM count; runs on one GPU give
the same bits). A block the decode cannot take exactly (a scale byte outside
fast_decode.FAST_SCALES with a nonzero code, a NaN scale, an e4m3 NaN code, an e5m2 Inf or NaN
code) is marked in the stream scales when the layout is packed (tma_stream_layout: an Inf
multiplier, so its products are Inf or NaN); a tile whose sums end up NaN or Inf, from such a
block or otherwise (x, overflow), is recomputed from the standard layout (by its last CTA,
where K is split) with exact fp32 decodes and fp32 FMA sums, which gives the contract's
result, NaN and Inf included. Ordinary weights never take that path, nor do blocks of zeros
at any scale.

Gluon kernels do not run under Triton's interpreter: on the CPU the tests compile the kernel
for sm_90 (and check that ptxas keeps the wgmmas asynchronous) and check the layout; the bits
are checked on an H100.
"""

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ... import dtypes
from ...numerics import arguments as args
from ..layouts import tma_stream_layout
from .._common import (aligned, device_capability, empty, interpreting,
                       packed_decode_constants, sm_count)

__all__ = ["MAX_PREFETCH", "MAX_SPLIT", "USE_PDL", "StreamConfig", "available", "check_parts",
           "default_config", "eligible", "fills_waves", "kernel_arguments", "split_k",
           "stream_linear", "StreamPlan", "usable_on", "wave_fill"]

# Ring slots and sub-steps a slot by codes a packed group (1: one-byte codes, 2: fp4, 4: fp6),
# from H100 sweeps at N = K = 8192 and 1, 16 and 64 rows (benchmarks/bench_stream_linear.py,
# docs/performance.md); fewer slots where they do not fit in shared memory (fp4 and fp6 at 64
# rows).
_PREFERRED = {1: (4, 2), 2: (6, 2), 4: (6, 2)}
# Slots of one sub-step each, where K's steps do not go in pairs: of the same sweeps' rings of
# one sub-step, (8, 1) is the fastest for MXFP4 at 1, 16 and 64 rows and for every format at
# 64, and within noise of (6, 1) elsewhere (one-byte codes at 1 and 16 rows, e2m3 at 1).
_ONE_SUB_STAGES = 8
# Sub-steps of W (and scales) a CTA asks L2 for before its wait (PDL): of 0, 2, 4 and 8
# (benchmarks/bench_stream_linear.py --parts pdl), 4 is the fastest
# or within noise of it for e4m3, MXFP4 and MXFP6 at 1, 16 and 64 rows (H100, N = K = 8192,
# back-to-back calls: docs/performance.md).
_PREFETCH = 4
# The most sub-steps StreamConfig may prefetch: the loader's prefetches are unrolled.
MAX_PREFETCH = 16
# Whether default_config's calls are launched with PDL (the module docstring): set False to
# launch them as usual (for a side-by-side measurement, or a CUDA stack without PDL).
USE_PDL = True
# sm_90's shared memory a CTA (227 KiB), less room for the barriers and Gluon's scratch.
_SHARED_BYTES = 227 * 1024 - 2048
# At most this many CTAs share a tile's K: the most the H100 timings below cover (N = 1024).
MAX_SPLIT = 8
# One CTA an SM: the kernel pays off only where its CTAs (the tiles, times split_k) fill enough
# of their waves of SMs. By codes a packed group (1: one-byte codes, 2: MXFP4, 4: MXFP6), from
# H100 timings against the fp4 wgmma and MMA-layout kernels (benchmarks/bench_stream_linear.py's
# wave-policy table, docs/performance.md): with 97% of a wave (N = 8192; N = 4096 and 1024
# split 2 and 8 ways: 128 CTAs on 132 SMs) it wins for every format at 16 rows (e4m3 at N =
# 4096, K = 14336: even); at N = 14336 (224 tiles, 85% of two waves) it wins for MXFP4 and
# MXFP6 rows but not for e4m3.
MIN_WAVE_FILL = {1: 0.9, 2: 0.8, 4: 0.8}
# One MXFP4 row: the one-row kernel on the standard layout beat it at N = 14336 and wherever K
# is split, not at N = 8192: one row takes it only unsplit, filling this much of its waves.
# (One MXFP6 row takes it wherever several do: it beat the MMA-layout kernel at every shape.)
ONE_ROW_MIN_FILL = 0.9


@dataclass(frozen=True)
class StreamConfig:
    """`stages` ring slots (even: each slot always serves the same consumer warpgroup), each
    holding `sub` sub-steps of 128 codes of the tile's 64 rows; `split` CTAs a tile, each
    taking an even share of the tile's slots (split-K). `pdl`: launched with programmatic
    dependent launch (the module docstring), each CTA asking L2 for its first `prefetch`
    sub-steps of W and scales (0..MAX_PREFETCH) before it waits for the previous kernel (no
    prefetch without pdl)."""
    stages: int
    sub: int
    split: int = 1
    pdl: bool = True
    prefetch: int = _PREFETCH

    def __post_init__(self):
        if (self.stages < 2 or self.stages % 2 or self.sub not in (1, 2)
                or not 1 <= self.split <= MAX_SPLIT or not 0 <= self.prefetch <= MAX_PREFETCH):
            raise ValueError(f"StreamConfig: stages must be an even number >= 2, sub 1 or 2, "
                             f"split 1..{MAX_SPLIT} and prefetch 0..{MAX_PREFETCH}, got {self}")


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether this Triton has Gluon with its Hopper TMA and wgmma API (Triton 3.6)."""
    try:
        from . import _gl_stream  # noqa: F401
    except (ImportError, AttributeError):
        return False
    return True


def usable_on(device: torch.device) -> bool:
    """An sm_90 GPU, Gluon, and not Triton's interpreter (which cannot run Gluon)."""
    return (device.type == "cuda" and not interpreting() and device_capability(device) == (9, 0)
            and available())


def split_k(N: int, K: int, device: torch.device) -> int:
    """CTAs a tile for a weight [N, K] on `device`: as many as one wave of the SMs holds for
    all N / 64 tiles (N = 4096 on 132 SMs: 2; N = 1024: 8; N >= 64 * SMs: 1), at most
    MAX_SPLIT, and few enough that each takes at least 4 of the tile's K / 128 steps (two ring
    slots of any config)."""
    tiles = N // tma_stream_layout.CHUNK
    if tiles == 0:
        return 1
    return max(1, min(sm_count(device) // tiles, MAX_SPLIT, K // tma_stream_layout.STEP_CODES // 4))


def wave_fill(N: int, K: int, device: torch.device) -> float:
    """The share of their waves of SMs (one CTA an SM) that the kernel's CTAs (W's N / 64
    tiles, times split_k) fill on `device`: 128 CTAs on 132 SMs 0.97, 224 0.85 (two waves);
    0 for no tile."""
    ctas, sms = N // tma_stream_layout.CHUNK * split_k(N, K, device), sm_count(device)
    return ctas / (sms * -(-ctas // sms)) if ctas > 0 else 0.0


def fills_waves(fmt: dtypes.DType, N: int, K: int, device: torch.device,
                rows: Optional[int] = None) -> bool:
    """Whether the stream kernel is the fastest few-row kernel for a weight [N, K] of this
    format on `device`: its CTAs fill MIN_WAVE_FILL of their waves (for one MXFP4 activation
    row, also ONE_ROW_MIN_FILL, with K not split). `rows` None: for several rows (what
    prepack() asks)."""
    if fmt not in tma_stream_layout.FORMATS:
        raise ValueError(f"stream_matmul.fills_waves: the stream kernel takes "
                         f"{', '.join(f.name for f in tma_stream_layout.FORMATS)} weights, got "
                         f"{fmt.name}")
    need = MIN_WAVE_FILL[fmt.codes_per_group]
    if rows == 1 and fmt == dtypes.float4_e2m1:
        if split_k(N, K, device) > 1:
            return False
        need = max(need, ONE_ROW_MIN_FILL)
    return wave_fill(N, K, device) >= need


def _rows_padded(M: int) -> int:
    """wgmma's N: the activation rows padded (TMA reads the rows past M as zeros). Up to 8
    rows, n8 tiles halve x's shared-memory traffic of n16 ones (with n16 tiles MXFP4 at 1..7
    rows is slower than at 8 on an H100)."""
    return 8 if M <= 8 else (16 if M <= 16 else (32 if M <= 32 else 64))


def _slot_bytes(fmt: dtypes.DType, MP: int, sub: int) -> int:
    """W codes, x^T (bf16) and scale bytes of a slot."""
    return sub * (64 * tma_stream_layout.step_bytes(fmt) + MP * tma_stream_layout.STEP_CODES * 2
                  + 64 * tma_stream_layout.STEP_CODES // tma_stream_layout.BLOCK)


def default_config(fmt: dtypes.DType, M: int, K: int, split: int = 1) -> StreamConfig:
    """`_PREFERRED`'s ring for the format where K has an even number of steps (at least four),
    else `_ONE_SUB_STAGES` slots of one sub-step; as many of its slots as shared memory holds
    beside the fp32 partial [64, MP]; `split` CTAs a tile (split_k's); launched with PDL (unless
    USE_PDL is False), asking L2 for `_PREFETCH` sub-steps first."""
    if fmt not in tma_stream_layout.FORMATS or not 1 <= M <= 64:
        raise ValueError(f"stream_matmul.default_config: takes "
                         f"{', '.join(f.name for f in tma_stream_layout.FORMATS)} weights and 1..64 "
                         f"rows, got {fmt.name} and M={M}")
    stages, sub = _PREFERRED[fmt.codes_per_group]
    steps = K // tma_stream_layout.STEP_CODES
    if steps % 2 or steps < 4:
        stages, sub = _ONE_SUB_STAGES, 1
    MP = _rows_padded(M)
    while stages > 2 and stages * _slot_bytes(fmt, MP, sub) + 64 * MP * 4 > _SHARED_BYTES:
        stages -= 2
    return StreamConfig(stages, sub, split, pdl=USE_PDL)


def eligible(x: torch.Tensor, fmt: dtypes.DType, N: int, K: int) -> bool:
    """Whether `stream_linear` takes x with a weight [N, K] of this format: 1..64 contiguous
    bf16 rows [M, K], 16-byte aligned (TMA), a weight that has a TMA stream layout
    (tma_stream_layout.fits, blocks of 32), on an sm_90 GPU with Gluon."""
    return (x.dim() == 2 and 1 <= x.shape[0] <= 64 and x.shape[1] == K
            and x.dtype == torch.bfloat16 and x.is_contiguous() and aligned(x)
            and tma_stream_layout.fits(fmt, tma_stream_layout.BLOCK, N, K) and usable_on(x.device))


def check_parts(codes: torch.Tensor, scales: torch.Tensor, counters: Optional[torch.Tensor],
                fmt: dtypes.DType, N: int, K: int, device: torch.device,
                op: str = "stream_linear") -> None:
    """ValueError unless (codes, scales) are tma_stream_layout.pack's of a weight [N, K] of this
    format, contiguous 1-d uint8 tensors on `device`, 16-byte aligned (TMA), and counters (if
    given) the split-K counters: a contiguous int32 tensor of N / 64 zeros."""
    if not tma_stream_layout.fits(fmt, tma_stream_layout.BLOCK, N, K):
        raise ValueError(f"{op}: the TMA stream layout needs a weight of {tma_stream_layout.describe()}, "
                         f"got {fmt.name} [{N}, {K}]")
    args.check_flat_part(codes, f"{op}: the stream codes", N * K // tma_stream_layout.STEP_CODES
                         * tma_stream_layout.step_bytes(fmt), torch.uint8, device, 16,
                         "tma_stream_layout.pack")
    args.check_flat_part(scales, f"{op}: the stream scales", N * K // tma_stream_layout.BLOCK,
                         torch.uint8, device, 16, "tma_stream_layout.pack")
    if counters is not None:
        args.check_flat_part(counters, f"{op}: the stream counters", N // tma_stream_layout.CHUNK,
                             torch.int32, device, 4, "torch.zeros")


def stream_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                  w_scale: torch.Tensor, w_data: torch.Tensor, fmt: dtypes.DType,
                  bias: Optional[torch.Tensor], out_dtype: torch.dtype,
                  config: Optional[StreamConfig] = None,
                  counters: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] @ W.T + bias (contiguous, [N]), rounded once to out_dtype, for the weight W [N,
    K] given in the TMA stream layout (codes, scales: tma_stream_layout.pack's) and in the standard one
    (w_scale [N, K / 32], w_data [N, packed K], unit stride along K: read only to recompute a
    tile exactly). `config` None: default_config with split_k's split. `counters`: the split-K
    counters (int32 [N / 64], zero, left zero), or None for fresh zeros where K is split."""
    from ._gl_stream import stream_linear_kernel
    N = w_data.shape[0] if w_data.dim() == 2 else 0
    K = x.shape[-1]
    if not eligible(x, fmt, N, K):
        raise ValueError(f"stream_linear: needs 1..64 contiguous, 16-byte aligned bf16 rows and "
                         f"a weight of {tma_stream_layout.describe()} on an sm_90 GPU with Gluon, "
                         f"got x {x.dtype} {tuple(x.shape)} on {x.device} and a {fmt.name} "
                         f"weight [{N}, {K}]")
    if w_data.stride(-1) != 1 or w_scale.stride(-1) != 1 or tuple(w_scale.shape) != (N, K // 32):
        raise ValueError(f"stream_linear: the standard parts must have unit stride along K and "
                         f"scale bytes [{N}, {K // 32}], got data strides {w_data.stride()}, "
                         f"scale {tuple(w_scale.shape)} with strides {w_scale.stride()}")
    check_parts(codes, scales, counters, fmt, N, K, x.device)
    out = torch.empty((x.shape[0], N), dtype=out_dtype, device=x.device)
    grid, arguments, constants = kernel_arguments(x, codes, scales, w_scale, w_data, fmt, bias,
                                                  out, config, counters)
    with torch.cuda.device_of(x):  # (Triton launches on the current device)
        stream_linear_kernel[grid](*arguments, **constants)
    return out


def _checked_config(fmt: dtypes.DType, M: int, N: int, K: int, device: torch.device,
                    config: Optional[StreamConfig]) -> StreamConfig:
    cfg = config or default_config(fmt, M, K, split_k(N, K, device))
    steps = K // tma_stream_layout.STEP_CODES
    if steps % cfg.sub or steps // cfg.sub < 2 * cfg.split:
        raise ValueError(f"stream_linear: config {cfg} needs K / 128 = {steps} to be a multiple "
                         f"of sub with at least two slots' worth a part")
    if cfg.stages * _slot_bytes(fmt, _rows_padded(M), cfg.sub) + 64 * _rows_padded(M) * 4 > \
            _SHARED_BYTES:
        raise ValueError(f"stream_linear: config {cfg} needs more shared memory than sm_90 has "
                         f"at {_rows_padded(M)} padded rows")
    return cfg


def _weight_descriptors(codes, scales, fmt: dtypes.DType, cfg: StreamConfig):
    """(plane A's, plane B's and the stream scales' TMA descriptors, the planes, the scales
    viewed a step a row): what depends only on the weight and the config."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    sb = tma_stream_layout.STEP_CODES // tma_stream_layout.BLOCK * 64  # scale bytes of a step
    scales2 = scales.view(-1, sb)
    if fmt in tma_stream_layout.FP6:  # planes A and B: 64 and 32 bytes a row's step
        planes = tma_stream_layout.fp6_planes(codes)
    else:  # plane A only (the kernel reads no plane B)
        planes = (codes.view(-1, tma_stream_layout.step_bytes(fmt)),) * 2
    w_boxes = [[64, plane.shape[1]] for plane in planes]  # a tile's sub-step
    w_descriptors = tuple(
        TensorDescriptor(plane, list(plane.shape), [box[1], 1], box,
                         gl.NVMMASharedLayout.get_default_for(box, gl.uint8))
        for plane, box in zip(planes, w_boxes))
    s_descriptor = TensorDescriptor(scales2, list(scales2.shape), [sb, 1], [1, sb],
                                    gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                         element_bitwidth=8, rank=2))
    return w_descriptors, s_descriptor, planes


def _x_layout(M: int, cfg: StreamConfig):
    """x^T's TMA box (MP padded rows, a slot's sub-steps of codes) and its shared layout."""
    from triton.experimental.gluon import language as gl
    x_box = [_rows_padded(M), tma_stream_layout.STEP_CODES * cfg.sub]
    return x_box, gl.NVMMASharedLayout.get_default_for(x_box, gl.bfloat16)


def _constants(fmt: dtypes.DType, M: int, cfg: StreamConfig, has_bias: bool) -> dict:
    return dict(MP=_rows_padded(M), STAGES=cfg.stages, SUB=cfg.sub, SPLIT=cfg.split,
                PDL=cfg.pdl, PREFETCH=cfg.prefetch if cfg.pdl else 0, launch_pdl=cfg.pdl,
                HAS_BIAS=has_bias, E5M2=fmt == dtypes.float8_e5m2, num_warps=4,
                **packed_decode_constants(fmt))


def kernel_arguments(x, codes, scales, w_scale, w_data, fmt: dtypes.DType, bias, out,
                     config: Optional[StreamConfig] = None, counters=None):
    """(grid, arguments, constexprs) of stream_linear_kernel for these operands (checked by
    the caller): TMA descriptors of the stream codes, x and the stream scales, then the
    standard parts, bias, out and, where K is split, the fp32 partials [split, N, MP] and the
    counters (fresh zeros for None). The tests compile the kernel for sm_90 from these on the
    CPU."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    (M, K), N = x.shape, out.shape[1]
    cfg = _checked_config(fmt, M, N, K, x.device, config)
    MP = _rows_padded(M)
    w_descriptors, s_descriptor, planes = _weight_descriptors(codes, scales, fmt, cfg)
    x_box, x_layout = _x_layout(M, cfg)
    descriptors = w_descriptors + (TensorDescriptor(x, [M, K], [K, 1], x_box, x_layout),
                                   s_descriptor)
    partials = out  # not read without split-K
    if cfg.split > 1:
        partials = torch.empty(cfg.split * N * MP, dtype=torch.float32, device=x.device)
        if counters is None:
            counters = torch.zeros(N // tma_stream_layout.CHUNK, dtype=torch.int32, device=x.device)
    arguments = (*descriptors, planes[0], planes[1], scales, x, w_data.view(torch.uint8), w_scale,
                 bias if bias is not None else out, out, partials,
                 counters if counters is not None else out, M, K, x.stride(0), w_data.stride(0),
                 w_scale.stride(0), out.stride(0))
    constants = _constants(fmt, M, cfg, bias is not None)
    return (N // tma_stream_layout.CHUNK * cfg.split,), arguments, constants


class StreamPlan:
    """stream_linear for one weight (its stream parts, standard parts and split-K counters)
    and one kind of input (M contiguous, 16-byte aligned bf16 rows; a bias or none, and its
    16-byte alignment; the output dtype), decided once: the config, the grid and the weight's TMA descriptors are
    built here; a call builds x's descriptor, allocates the output (and the split-K partials)
    and launches the compiled kernel (kernels/_launch.Launch). The caller checks what
    `stream_linear` checks, once (MXInferenceLinear: when it makes the plan)."""

    _X, _X_PTR, _BIAS, _OUT, _PARTIALS = 2, 7, 10, 11, 12  # their places in the arguments

    def __init__(self, M: int, codes, scales, w_scale, w_data, fmt: dtypes.DType,
                 has_bias: bool, out_dtype: torch.dtype, counters: torch.Tensor,
                 config: Optional[StreamConfig] = None):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        from ._gl_stream import stream_linear_kernel
        from .._launch import Launch
        N, K = w_data.shape[0], w_scale.shape[1] * tma_stream_layout.BLOCK
        device = w_data.device
        cfg = _checked_config(fmt, M, N, K, device, config)
        self.M, self.N, self.K, self.out_dtype, self.device = M, N, K, out_dtype, device
        self.partials = cfg.split * N * _rows_padded(M) if cfg.split > 1 else 0
        w_descriptors, s_descriptor, planes = _weight_descriptors(codes, scales, fmt, cfg)
        self.x_box, self.x_layout = _x_layout(M, cfg)
        self._descriptor = TensorDescriptor
        arguments = (*w_descriptors, None, s_descriptor, planes[0], planes[1], scales, None,
                     w_data.view(torch.uint8), w_scale, None, None, None,
                     counters, M, K, K, w_data.stride(0),
                     w_scale.stride(0), N)
        self.launch = Launch(stream_linear_kernel, (N // tma_stream_layout.CHUNK * cfg.split,),
                             arguments, _constants(fmt, M, cfg, has_bias),
                             (self._X, self._X_PTR, self._BIAS, self._OUT, self._PARTIALS),
                             keyed=False)

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x [M, K] contiguous, 16-byte aligned bf16; bias [N] contiguous or None (as the
        plan was made)."""
        out = empty((self.M, self.N), self.out_dtype, self.device)
        partials = (empty((self.partials,), torch.float32, self.device)
                    if self.partials else out)
        x_descriptor = self._descriptor(x, [self.M, self.K], [self.K, 1], self.x_box,
                                        self.x_layout)
        self.launch(x_descriptor, x, bias if bias is not None else out, out, partials)
        return out

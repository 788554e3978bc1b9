"""x [M, K] bf16 @ W.T for an MXFP4 weight W [N, K] in the fp4 wgmma layout, on Hopper (sm_90).

The weight comes from `fp4_wgmma_layout.preshuffle`: each thread's 16 bytes per 64 x 64 chunk of
W are the codes of its wgmma A-operand registers, so the kernel loads them straight into
registers, decodes 8 codes with 4 rotates, 5 logic ops and 4 bf16x2 multiplies (the multiply
applies the block scale: exact, see fp4_wgmma_layout), and feeds wgmma with no shared-memory
staging of W. It computes out^T = W x^T ("swap AB": the activation rows, at most 64, are wgmma's
N dimension, and x^T goes through shared memory). Products are exact (bf16 x bf16), sums are
fp32, and the result (plus bias, in fp32) is rounded once: the contract of kernels/linear/dispatch.py.

K is split across SPLIT programs per tile of 64 V rows. Each writes its fp32 partial; the last to
arrive (an atomic counter per tile, which it resets to 0 for the next call) adds the partials in
a fixed order and rounds once, so results do not depend on arrival order. The counters make a
call non-reentrant for one weight: two calls on one weight must not run concurrently on
different streams.

Triton details that keep W in registers (the ttgir has no convert_layout for it):
- Each lane loads its 4 code words of a 64 x 64 chunk ([4 (warp), V, U, 32 (lane)] pointers,
  one 16-byte load) and its scale word in one inline-PTX call with one output per word, joined
  as the last dim: Triton's layout for [4, V, U, 32, 4] is then, after the permute in
  `_decode_tile`, exactly the dot-operand layout, whatever order layout propagation gives a
  thread's registers.
- The decode is inline PTX on one int32 word returning 8 bf16 halves (pack=1): packing several
  words per call would group registers in whatever order layout propagation chose.
- W is loaded through inline PTX, out of reach of Triton's software pipeliner, which would
  otherwise stage it through shared memory with cp.async. The loads are plain (coherent)
  `ld.global`, not `ld.global.nc`: ptxas may not move a coherent load past the loop's
  `bar.sync`, so the loads of step i + AHEAD stay at the top of step i and are in flight
  during its decode and dots (ptxas moved non-coherent ones to the end of the loop body, where
  they hid nothing). One step ahead, a program's last step reads into the storage's padding;
  two steps ahead (AHEAD = 2, the default up to 16 rows), the loads past its range are
  predicated off.
Under Triton's interpreter (CPU tests) the loads are masked tl.loads and `_decode_reference`
decodes the same bit program with fp32 arithmetic.
"""

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .._tl_numerics import to_output
from ..layouts.fp4_wgmma_layout import CHUNK
from .._common import block_m_for, device_capability, interpreting, sm_count
from .._launch import launch

__all__ = ["Fp4WgmmaConfig", "default_config", "fp4_wgmma_linear", "store_out", "store_split",
           "usable_on"]

_DECODE = """{
.reg .b32 t4, t6, t10, t14, p0, p1, p2, p3;
shf.l.wrap.b32 t4, $8, $8, 4;
shf.l.wrap.b32 t10, $8, $8, 10;
shf.l.wrap.b32 t6, $8, $8, 6;
shf.l.wrap.b32 t14, $8, $8, 14;
and.b32 p0, $8, 0x81C081C0;
and.b32 p1, t4, 0x81C081C0;
and.b32 p2, t10, 0x81C081C0;
and.b32 t6, t6, 0x80C080C0;
and.b32 t14, t14, 0x01000100;
or.b32 p3, t6, t14;
"""
# $9: the bf16x2 multiplier of the word's block (`_multiplier`).
_ONE_MULTIPLY = "".join(f"mul.rn.bf16x2 p{j}, p{j}, $9;\n" for j in range(4))
_TWO_MULTIPLIES = ".reg .b32 c126;\nmov.b32 c126, 0x7E807E80;\n" + "".join(  # 2**126, 2**126
    f"mul.rn.bf16x2 p{j}, p{j}, c126;\nmul.rn.bf16x2 p{j}, p{j}, $9;\n" for j in range(4))
_SPLIT_HALVES = "".join(f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, p{j};\n" for j in range(4)) + "}"
DECODE_FOLDED = tl.constexpr(_DECODE + _ONE_MULTIPLY + _SPLIT_HALVES)
DECODE_TWO_MULTIPLIES = tl.constexpr(_DECODE + _TWO_MULTIPLIES + _SPLIT_HALVES)
_DECODE_CONSTRAINTS = tl.constexpr("=h,=h,=h,=h,=h,=h,=h,=h,r,r")
# A lane's 4 code words and its scale word, where $7 != 0 (else the outputs are undefined).
_LOAD_STEP = tl.constexpr(
    "{ .reg .pred p; setp.ne.b32 p, $7, 0; "
    "@p ld.global.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$5]; "
    "@p ld.global.L1::no_allocate.u32 $4, [$6]; }")


@triton.jit
def _multiplier(s, FOLD: tl.constexpr):
    """bf16x2 bits (int32) of the block multiplier of scale bytes s: FOLD, 2**(s - 1) (the
    decode's 2**-126 folded in; s <= 128); else 2**(s - 127), after a first multiply by
    2**126 (s = 0: the subnormal 2**-127; s = 255: NaN)."""
    if FOLD:
        m = s * 0x00800080 + 0x3F003F00
    else:
        m = tl.where(s == 0, 0x00400040, s * 0x00800080)
        m = tl.where(s == 255, 0x7FC07FC0, m)
    return m


@triton.jit
def _rotl(w, r: tl.constexpr):
    if r == 0:
        return w
    else:
        return ((w << r) | (w >> (32 - r))) & 0xFFFFFFFF


@triton.jit
def _half_value(bits, scale):
    """A code placed as bf16 bits (sign 15, e1 e0 at 8..7, m at 6; int64) times `scale`, in
    fp32 (exact). Rebuilt from the fields: the interpreter flushes bf16 subnormals."""
    e = (bits >> 7) & 3
    m = ((bits >> 6) & 1).to(tl.float32)
    magnitude = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * tl.exp2((e - 1).to(tl.float32)))
    return tl.where(((bits >> 15) & 1) == 1, -magnitude, magnitude) * scale


@triton.jit
def _decode_reference(word, s):
    """The interpreter's decode: the bit program of fp4_wgmma_layout.PAIR_DECODE on int64 words
    and scale bytes s, giving the 8 values (fp32) in the order of `_decode_asm`."""
    p0 = word & 0x81C081C0
    p1 = _rotl(word, 4) & 0x81C081C0
    p2 = _rotl(word, 10) & 0x81C081C0
    p3 = (_rotl(word, 6) & 0x80C080C0) | (_rotl(word, 14) & 0x01000100)
    scale = tl.where(s == 255, float("nan"), tl.exp2((s - 127).to(tl.float32)))
    return (_half_value(p0 & 0xFFFF, scale), _half_value((p0 >> 16) & 0xFFFF, scale),
            _half_value(p1 & 0xFFFF, scale), _half_value((p1 >> 16) & 0xFFFF, scale),
            _half_value(p2 & 0xFFFF, scale), _half_value((p2 >> 16) & 0xFFFF, scale),
            _half_value(p3 & 0xFFFF, scale), _half_value((p3 >> 16) & 0xFFFF, scale))


@triton.jit
def _decode_asm(word, multiplier, FOLD: tl.constexpr):
    """int32 words and their multipliers -> 8 bf16 tensors: value 2 j + b0 is pair j, half b0."""
    if FOLD:
        return tl.inline_asm_elementwise(DECODE_FOLDED, _DECODE_CONSTRAINTS, [word, multiplier],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(DECODE_TWO_MULTIPLIES, _DECODE_CONSTRAINTS,
                                         [word, multiplier], dtype=(tl.bfloat16,) * 8,
                                         is_pure=True, pack=1)


@triton.jit
def _pointers(codes_ptr, scales_ptr, nb, kb, KB, V: tl.constexpr, U: tl.constexpr):
    """int32 pointers [4 (warp), V, U, 32 (lane)] to each lane's 4 code words and to its scale
    word in W's chunks (nb .. nb + V) x (kb .. kb + U); a lane's scale word holds the bytes of
    its 4 code words."""
    iw = tl.arange(0, 4)[:, None, None, None]
    iv = tl.arange(0, V)[None, :, None, None]
    iu = tl.arange(0, U)[None, None, :, None]
    lane = tl.arange(0, 32)[None, None, None, :]
    chunk = ((nb + iv) * KB + kb + iu) * 4 + iw
    words = codes_ptr.to(tl.pointer_type(tl.int32)) + chunk * 128 + lane * 4
    scale_words = scales_ptr.to(tl.pointer_type(tl.int32)) + chunk * 8 + lane // 4
    return words, scale_words


@triton.jit
def _load(words_ptr, scale_words_ptr, cond, INTERPRETER: tl.constexpr):
    """Where the scalar cond holds: each lane's code words [4, V, U, 32, 4 (word q)] and scale
    words [4, V, U, 32]; else undefined values."""
    if INTERPRETER:
        q = tl.arange(0, 4)[None, None, None, None, :]
        return (tl.load(words_ptr[:, :, :, :, None] + q, mask=cond, other=0),
                tl.load(scale_words_ptr, mask=cond, other=0))
    else:
        c = tl.zeros(words_ptr.shape, tl.int32) + cond.to(tl.int32)
        w0, w1, w2, w3, scale_words = tl.inline_asm_elementwise(
            _LOAD_STEP, "=r,=r,=r,=r,=r,l,l,r", [words_ptr, scale_words_ptr, c],
            dtype=(tl.int32,) * 5, is_pure=False, pack=1)
        # join(join(w0, w2), join(w1, w3))[..., i, j] is word 2 i + j
        words = tl.join(tl.join(w0, w2), tl.join(w1, w3)).reshape(w0.shape + (4,))
        return words, scale_words


@triton.jit
def _decode_tile(words, scale_words, V: tl.constexpr, U: tl.constexpr, FOLD: tl.constexpr,
                 INTERPRETER: tl.constexpr):
    """W's tile [64 V, 64 U] from the loaded words: bf16 (fp32 in the interpreter)."""
    # words: [4 (warp), V, U, 32 (lane), 4 (word q)]
    q = tl.arange(0, 4)[None, None, None, None, :]
    s = (scale_words[:, :, :, :, None] >> (8 * q)) & 0xFF
    if INTERPRETER:
        v = _decode_reference(words.to(tl.int64) & 0xFFFFFFFF, s)
    else:
        v = _decode_asm(words, _multiplier(s, FOLD), FOLD)
    # v[2 j + b0], pair j = 2 o + b1
    tile = tl.join(tl.join(tl.join(v[0], v[1]), tl.join(v[2], v[3])),
                   tl.join(tl.join(v[4], v[5]), tl.join(v[6], v[7])))
    tile = tile.reshape(4, V, U, 8, 4, 2, 2, 2, 2, 2)  # w V U g t blk a | b0 b1 o
    tile = tl.permute(tile, [1, 0, 6, 3, 2, 5, 9, 8, 4, 7])  # rows (V w a g), cols (U blk o b1 t b0)
    return tile.reshape(64 * V, 64 * U)


@triton.jit
def _dot(w, x, acc, INTERPRETER: tl.constexpr):
    if INTERPRETER:
        return acc + tl.dot(w, tl.trans(x).to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(w, tl.trans(x), acc)


@triton.jit
def store_out(acc, bias_ptr, out_ptr, rows, cols, stride_om, mask, HAS_BIAS: tl.constexpr,
              INTERPRETER: tl.constexpr):
    """out[rows, cols] = acc^T (+ bias[cols]), fp32 rounded once to out's dtype: the epilogue
    of the kernels that compute out^T = W x^T (acc [W rows, activation rows])."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols).to(tl.float32)
    tl.store(out_ptr + rows * stride_om + cols,
             to_output(acc, out_ptr.dtype.element_ty, INTERPRETER), mask=mask)


@triton.jit
def store_split(acc, partials_ptr, counters_ptr, bias_ptr, out_ptr, tile, part, part_rows, rows,
                cols, N, stride_om, mask, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                INTERPRETER: tl.constexpr):
    """Program `part` of the SPLIT that share K for `tile` stores its fp32 partial (acc, as for
    store_out) at partials[part, rows, cols] (part_rows rows a part, N columns) and counts its
    arrival; the last of the tile to arrive adds the partials in part order (so the result does
    not depend on arrival order), stores out as store_out does, and resets the tile's counter
    to 0 for the next call."""
    tl.store(partials_ptr + (part * part_rows + rows) * N + cols, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
    arrived = tl.atomic_add(counters_ptr + tile, 1, sem="acq_rel")
    if arrived == SPLIT - 1:
        tl.debug_barrier()
        acc = tl.load(partials_ptr + rows * N + cols, mask=mask, other=0.0, cache_modifier=".cg")
        for j in tl.static_range(1, SPLIT):
            acc += tl.load(partials_ptr + (j * part_rows + rows) * N + cols, mask=mask, other=0.0,
                           cache_modifier=".cg")
        store_out(acc, bias_ptr, out_ptr, rows, cols, stride_om, mask, HAS_BIAS, INTERPRETER)
        tl.store(counters_ptr + tile, 0)


@triton.jit
def split_steps(pid_k, steps, SPLIT: tl.constexpr):
    """(first step, step count) of program pid_k's part of K: the `steps` shared out over the
    SPLIT programs of a tile as evenly as they go."""
    first = pid_k * steps // SPLIT
    return first, (pid_k + 1) * steps // SPLIT - first


@triton.jit
def fp4_wgmma_matmul_kernel(
    x_ptr, codes_ptr, scales_ptr, bias_ptr, out_ptr, partials_ptr, counters_ptr,
    M, N, K, steps, stride_xm, stride_om,
    BLOCK_M: tl.constexpr, V: tl.constexpr, U: tl.constexpr, SPLIT: tl.constexpr,
    FOLD: tl.constexpr, HAS_BIAS: tl.constexpr, NONEMPTY: tl.constexpr, AHEAD: tl.constexpr,
    INTERPRETER: tl.constexpr,
):
    """Program (tile of 64 V rows of W, part of K): out[m, n] for all m < M <= BLOCK_M. N is a
    multiple of 64 V, K of 64 U; the `steps` = K / (64 U) steps are shared out over the SPLIT
    programs of a tile as evenly as they go (SPLIT <= steps)."""
    BLOCK_N: tl.constexpr = 64 * V
    BLOCK_K: tl.constexpr = 64 * U
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    first, count = split_steps(pid_k, steps, SPLIT)
    if NONEMPTY:
        # Without it the loop's zero-trip path makes ptxas serialize the wgmmas of a V = 1 tile
        # (a wait after each); with it they overlap the next decode, at more registers.
        tl.assume(count > 0)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    offs_k = first * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    words_ptr, scale_words_ptr = _pointers(codes_ptr, scales_ptr, pid_n * V, first * U, K // 64,
                                           V, U)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    if AHEAD == 1:
        always = tl.full([], 1, tl.int32) > 0
        words, scale_words = _load(words_ptr, scale_words_ptr, always, INTERPRETER)
        for _ in range(count):
            # the next step's words (past this program's range at its last step: the storage is
            # padded for it), in flight during this step's decode and dots
            words_ptr += U * 512
            scale_words_ptr += U * 32
            next_words, next_scale_words = _load(words_ptr, scale_words_ptr, always, INTERPRETER)
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            w = _decode_tile(words, scale_words, V, U, FOLD, INTERPRETER)
            acc = _dot(w, x, acc, INTERPRETER)
            x_ptrs += BLOCK_K
            words, scale_words = next_words, next_scale_words
    else:
        # two steps ahead: the words of step i + 2 are loaded at the top of step i (none past
        # this program's range)
        words, scale_words = _load(words_ptr, scale_words_ptr, count > 0, INTERPRETER)
        words_ptr += U * 512
        scale_words_ptr += U * 32
        words1, scale_words1 = _load(words_ptr, scale_words_ptr, count > 1, INTERPRETER)
        for i in range(count):
            words_ptr += U * 512
            scale_words_ptr += U * 32
            words2, scale_words2 = _load(words_ptr, scale_words_ptr, i + 2 < count, INTERPRETER)
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            w = _decode_tile(words, scale_words, V, U, FOLD, INTERPRETER)
            acc = _dot(w, x, acc, INTERPRETER)
            x_ptrs += BLOCK_K
            words, scale_words = words1, scale_words1
            words1, scale_words1 = words2, scale_words2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = offs_m[None, :]
    cols = offs_n[:, None]
    mask = (rows < M) & (cols < N)
    if SPLIT > 1:
        store_split(acc, partials_ptr, counters_ptr, bias_ptr, out_ptr, pid_n, pid_k, BLOCK_M,
                    rows, cols, N, stride_om, mask, SPLIT, HAS_BIAS, INTERPRETER)
    else:
        store_out(acc, bias_ptr, out_ptr, rows, cols, stride_om, mask, HAS_BIAS, INTERPRETER)


@dataclass(frozen=True)
class Fp4WgmmaConfig:
    """Launch parameters: activation rows per program (16, 32 or 64), a tile of 64 V rows x
    64 U columns of W per step, K split over `split` programs, W's words loaded `ahead` (1 or
    2) steps before their decode, and a cap on registers per thread (`maxnreg`, None: ptxas
    chooses) that keeps enough programs on each SM."""
    block_m: int
    v: int
    u: int
    split: int
    num_warps: int = 4
    num_stages: int = 3
    nonempty: bool = False
    ahead: int = 1
    maxnreg: Optional[int] = None

    def __post_init__(self):
        if self.block_m not in (16, 32, 64):
            raise ValueError(f"Fp4WgmmaConfig: block_m must be 16, 32 or 64, got {self.block_m!r}")
        check_tile(self)


def check_tile(config) -> None:
    """The checks shared by this kernel's and mma_linear's configs: v and u in 1, 2, 4; split a
    positive int; ahead 1 or 2; maxnreg None or an int in 16..255."""
    owner = type(config).__name__
    for name in ("v", "u"):
        if getattr(config, name) not in (1, 2, 4):
            raise ValueError(f"{owner}: {name} must be 1, 2 or 4, got {getattr(config, name)!r}")
    if not isinstance(config.split, int) or config.split < 1:
        raise ValueError(f"{owner}: split must be a positive int, got {config.split!r}")
    if config.ahead not in (1, 2):
        raise ValueError(f"{owner}: ahead must be 1 or 2, got {config.ahead!r}")
    if config.maxnreg is not None and (not isinstance(config.maxnreg, int)
                                       or not 16 <= config.maxnreg <= 255):
        raise ValueError(f"{owner}: maxnreg must be None or an int in 16..255, got "
                         f"{config.maxnreg!r}")


def usable_on(device: torch.device) -> bool:
    """wgmma and bf16x2 multiplies need sm_90 (Hopper), and on another GPU Triton would pick a
    dot layout that the loads here (and in mma_linear.py) do not match; on the CPU only Triton's
    interpreter runs."""
    if device.type != "cuda":
        return device.type == "cpu" and interpreting()
    return device_capability(device) == (9, 0)


# Programs per SM for 16, 32 and 64 activation rows (tiles of 64, 128 and 128 rows of W); 16
# rows load two steps ahead, at 95 registers a thread: 5 programs fit on a SM.
_PROGRAMS_PER_SM = {16: 5, 32: 3, 64: 2}


def default_config(M: int, N: int, K: int, device: torch.device) -> Fp4WgmmaConfig:
    """From N = K = 8192 sweeps on an H100 (benchmarks/bench_gpu_matmul.py --sweep and
    interleaved A/B timings): up to 16 rows, 64-row tiles of W loaded two steps ahead, with K
    split so that about 5 programs share each SM; above, 128-row tiles (the wgmma bookkeeping
    amortized over twice the rows) loaded one step ahead at 2 or 3 a SM, and for 64 rows two
    warpgroups of 64 rows each."""
    block_m = block_m_for(M)
    v = 1 if block_m == 16 or N % 128 else 2
    u = 2 if K % 128 == 0 else 1
    steps = K // (64 * u)
    tiles = N // (64 * v)
    programs = _PROGRAMS_PER_SM[block_m] * sm_count(device)
    split = max(1, min(steps, round(programs / tiles)))
    # 32 rows: ptxas takes 178 registers a thread, which leaves 2 programs a SM, not 3
    maxnreg = 168 if block_m == 32 else None
    return Fp4WgmmaConfig(block_m, v, u, split, num_warps=8 if block_m == 64 and v == 2 else 4,
                          ahead=2 if block_m == 16 else 1, maxnreg=maxnreg)


def fp4_wgmma_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                    counters: torch.Tensor, N: int, fold: bool, bias: Optional[torch.Tensor],
                    config: Optional[Fp4WgmmaConfig] = None) -> torch.Tensor:
    """x [M, K] bf16 (1 <= M <= 64, contiguous) @ W.T + bias, rounded once to bf16, for W
    [N, K] given by the fp4 wgmma layout's `codes` and `scales` (fp4_wgmma_layout.preshuffle),
    its int32 split counters [N / 64] (zero between calls) and `fold`
    (fp4_wgmma_layout.fold_scales)."""
    M, K = x.shape
    cfg = config or default_config(M, N, K, x.device)
    if not (1 <= M <= cfg.block_m and N % (CHUNK * cfg.v) == 0 and K % (CHUNK * cfg.u) == 0):
        raise ValueError(f"fp4_wgmma_linear: config {cfg} does not fit M={M}, N={N}, K={K}")
    if x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError("fp4_wgmma_linear: x must be a contiguous bf16 matrix")
    if bias is not None and not bias.is_contiguous():
        raise ValueError("fp4_wgmma_linear: bias must be contiguous")
    steps = K // (CHUNK * cfg.u)
    split = min(cfg.split, steps)
    interpreter = interpreting()
    out = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    partials = (torch.empty((split, cfg.block_m, N), dtype=torch.float32, device=x.device)
                if split > 1 else out)
    grid = (N // (CHUNK * cfg.v), split)
    launch(fp4_wgmma_matmul_kernel, grid,
        x, codes, scales, bias if bias is not None else out, out, partials, counters,
        M, N, K, steps, x.stride(0), out.stride(0),
        BLOCK_M=cfg.block_m, V=cfg.v, U=cfg.u, SPLIT=split, FOLD=fold,
        HAS_BIAS=bias is not None, NONEMPTY=cfg.nonempty and not interpreter, AHEAD=cfg.ahead,
        INTERPRETER=interpreter, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({} if cfg.maxnreg is None or interpreter else {"maxnreg": cfg.maxnreg}))
    return out

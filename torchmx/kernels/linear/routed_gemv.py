"""Routed (token, expert) pairs of a mixture of experts times their experts' MX weights, in one
launch: out[p, n] = sum_k x[p // PER_ROW, k] * W[experts[p], n, k] + bias[experts[p], n].

W is a 3-D MX tensor [E, N, K] with blocks along K (experts on dim 0: gpt-oss's
`{gate_up,down}_proj_{blocks,scales}`, codes [E, N, packed(K)] and scale bytes [E, N, K /
BLOCK]), read in place at each pair's expert's offset. A program takes one pair (axis 0) and
BLOCK_N weight rows (axis 1): matmul_kernels.row_times_blocks, the rows variant of the fused
MX-weight kernel, on that expert's rows. Pairs run along axis 0 so that the programs of one
tile of rows for every pair are scheduled together: pairs routed to the same expert read its
tile at the same time, from L2 after the first.

Products are exact and sums fp32, rounded once with the bias (the contract of
kernels/linear/dispatch.py). SWIGLU: the rounded rows are gpt-oss's interleaved gate (even
rows) and up (odd rows), and the program writes the gated activation instead, [P, N / 2],
with the operations and roundings of transformers' `GptOssExperts._apply_gate` in the
output dtype: gate = min(gate, limit), up = clamp(up, -limit, limit), then
((up + 1) * (gate * sigmoid(gate * alpha))), each operation computed in fp32 and rounded.
The sigmoid is 1 / (1 + exp(-t)) in fp32, which may differ from PyTorch's by an fp32 ulp
before its rounding.
"""

import triton
import triton.language as tl

from .._tl_numerics import to_output
from .matmul_kernels import row_times_blocks

__all__ = ["routed_rows_kernel"]


@triton.jit
def _rounded(value, dtype: tl.constexpr, INTERPRETER: tl.constexpr):
    """fp32 `value` rounded once to `dtype`, back in fp32."""
    return to_output(value, dtype, INTERPRETER).to(tl.float32)


@triton.jit
def _swiglu(h, alpha, limit, dtype: tl.constexpr, INTERPRETER: tl.constexpr):
    """[BLOCK_N] rounded rows (gate, up interleaved) -> [BLOCK_N // 2] gated values, fp32
    holding `dtype` values. Comparisons keep a NaN (as torch.clamp does)."""
    gate, up = tl.split(h.reshape(h.shape[0] // 2, 2))
    gate = tl.where(gate > limit, limit, gate)
    up = tl.where(up > limit, limit, tl.where(up < -limit, -limit, up))
    t = _rounded(gate * alpha, dtype, INTERPRETER)
    sig = _rounded(1.0 / (1.0 + tl.exp(-t)), dtype, INTERPRETER)
    glu = _rounded(gate * sig, dtype, INTERPRETER)
    return (_rounded(up + 1.0, dtype, INTERPRETER) * glu)


@triton.jit
def routed_rows_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, experts_ptr,
    N, K, blocks_k, PER_ROW, E, alpha, limit,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    stride_be, stride_om,
    BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr, EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, WORDS: tl.constexpr, FAST: tl.constexpr,
    CPG: tl.constexpr, INTERPRETER: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
    MBITS: tl.constexpr, HAS_INF: tl.constexpr, HAS_NAN: tl.constexpr, LSB: tl.constexpr,
    TO_VALUE: tl.constexpr,
):
    """Program (pair p, tile of BLOCK_N rows): row p of out from row p // PER_ROW of x and the
    expert experts[p] (NaN where experts[p] is not in [0, E)). EVEN, WORDS, FAST and the format constants: as the rows variant of
    matmul_kernels.mx_weight_matmul_kernel takes them (one expert's [N, K])."""
    pair = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    expert = tl.load(experts_ptr + pair).to(tl.int64)
    # An expert index outside [0, E) reads expert 0 and makes its row NaN: never memory
    # outside the weight, and no host sync to check the indices first.
    valid = (expert >= 0) & (expert < E)
    expert = tl.where(valid, expert, 0)
    out = row_times_blocks(w_ptr + expert * stride_we, s_ptr + expert * stride_se,
                           x_ptr + (pair // PER_ROW).to(tl.int64) * stride_xm, offs_n, N, K, 0,
                           blocks_k, blocks_k, stride_wn, stride_wk, stride_sn, stride_sk,
                           stride_xk, BLOCK, BLOCK_N, NB, CPG, EVEN, WORDS, FAST, IS_INT, BITS,
                           MBITS, HAS_INF, HAS_NAN, LSB, TO_VALUE, INTERPRETER)
    if HAS_BIAS:
        out += tl.load(bias_ptr + expert * stride_be + offs_n, mask=offs_n < N,
                       other=0.0).to(tl.float32)
    out = tl.where(valid, out, float("nan"))
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    row = out_ptr + pair.to(tl.int64) * stride_om
    if SWIGLU:
        gated = _swiglu(_rounded(out, dtype, INTERPRETER), alpha, limit, dtype, INTERPRETER)
        cols = tl.program_id(1) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(row + cols, to_output(gated, dtype, INTERPRETER), mask=cols < N // 2)
    else:
        tl.store(row + offs_n, to_output(out, dtype, INTERPRETER), mask=offs_n < N)

"""tests/support/triton_interpreter.py's reduce over whole slices gives the bits of the interpreter's own
reduce (one element at a time), for the combine functions kernels use and ones whose order of
combines shows (not associative), over every axis, with and without keep_dims."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("the interpreter is off (a GPU runs the kernels)", allow_module_level=True)

import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import ReduceOps  # noqa: E402

from triton_interpreter import reduce_by_slices  # noqa: E402


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _half_then_add(a, b):  # not associative: the order of combines shows in the bits
    return a * 0.5 + b


@triton.jit
def _max_and_index(a, i, b, j):  # two tensors reduced together (a tuple)
    take = b > a
    return tl.where(take, b, a), tl.where(take, j, i)


@triton.jit
def _constant(a, b):  # a combine that ignores its tensors
    return 7


@triton.jit
def _reduce_kernel(x_ptr, y_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr, WHICH: tl.constexpr,
                   AXIS: tl.constexpr, KEEP: tl.constexpr, SCALAR: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + r * C + c)
    y = tl.load(y_ptr + r * C + c)
    if WHICH == 0:
        out = tl.reduce(x.to(tl.int32, bitcast=True), AXIS, _or, keep_dims=KEEP).to(tl.float32)
    elif WHICH == 1:
        out = tl.reduce(x, AXIS, _half_then_add, keep_dims=KEEP)
    elif WHICH == 2:
        out, index = tl.reduce((x, y), AXIS, _max_and_index, keep_dims=KEEP)
        out = out + index * 1000.0
    else:
        out = tl.reduce(x.to(tl.int8), AXIS, _constant, keep_dims=KEEP).to(tl.float32)
    if SCALAR:
        tl.store(out_ptr, out)
    else:
        tl.store(out_ptr + tl.arange(0, out.numel), tl.reshape(out, (out.numel,)))


def _run(which, axis, keep, stock):
    g = torch.Generator().manual_seed(which)
    x = torch.randn(4, 8, generator=g) * 1000
    y = torch.randint(0, 50, (4, 8), generator=g).float()
    out = torch.zeros(32)
    slices = ReduceOps.generic_reduce
    if stock:
        ReduceOps.generic_reduce = ReduceOps.__dict__.get("_stock_generic_reduce", slices)
    try:
        _reduce_kernel[(1,)](x, y, out, 4, 8, which, axis, keep, axis is None and not keep)
    finally:
        ReduceOps.generic_reduce = slices
    return out


COMBINES = {"or": 0, "not-associative": 1, "tuple": 2, "constant": 3}


# (The interpreter flattens only the first of several tensors for axis None: no tuple there.)
@pytest.mark.parametrize("combine,axis", [(c, a) for c in COMBINES for a in (0, 1, None)
                                          if (c, a) != ("tuple", None)], ids=str)
@pytest.mark.parametrize("keep", [False, True])
def test_reduce_by_slices_gives_the_stock_reduce_bits(combine, axis, keep):
    which = COMBINES[combine]
    assert ReduceOps.generic_reduce is reduce_by_slices  # conftest installed it
    got, expected = _run(which, axis, keep, stock=False), _run(which, axis, keep, stock=True)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))

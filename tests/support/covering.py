"""Parameter grids for the matmul kernel tests.

A case costs about a second on either kind of machine: under Triton's interpreter (CPU, where CI
runs) it runs slowly, and on a GPU most cases change a constexpr (format, tile, block size), so
each is one more kernel compile. A test takes a covering subset of the product of its axes:
every value of each axis meets every value of each other axis in some case (all pairs), which is
where the kernels' paths meet (format x tile, tile x shape, format x shape). TORCHMX_TEST_FULL=1
runs the whole product, as it does test_triton_quantize.py's matrix.

`pairs_when_interpreted` keeps a whole product on a GPU and takes the covering subset only under
Triton's interpreter, for the tests whose product runs in full on a GPU.
"""

import itertools
import os

import torch


def _covering_subset() -> bool:
    return os.environ.get("TORCHMX_TEST_FULL") != "1"


def _product(axes):
    """Every case of the product, each a flat tuple (an axis of tuples gives several values)."""
    return [tuple(itertools.chain.from_iterable(
        value if isinstance(value, tuple) else (value,) for value in combo))
        for combo in itertools.product(*axes)]


def all_pairs(*axes):
    """The cases of a parametrize over the product of `axes` (each a list of values, or of
    tuples for axes that go together): with TORCHMX_TEST_FULL=1 all of them; else a subset
    covering every pair of values of two axes, chosen greedily
    (the case that covers the most pairs not yet covered, the first such in product order), so
    the same cases every run."""
    cases = _product(axes)
    if not _covering_subset():
        return cases
    indices = list(itertools.product(*(range(len(axis)) for axis in axes)))

    def pairs(index):
        return {(a, index[a], b, index[b])
                for a, b in itertools.combinations(range(len(axes)), 2)}

    uncovered = set().union(*(pairs(i) for i in indices))
    chosen = []
    while uncovered:
        best = max(range(len(indices)), key=lambda c: len(pairs(indices[c]) & uncovered))
        chosen.append(best)
        uncovered -= pairs(indices[best])
    return [cases[c] for c in sorted(chosen)]


def pairs_when_interpreted(*axes):
    """all_pairs(*axes) under Triton's interpreter (no CUDA GPU: tests/conftest.py runs the
    kernels on CPU there, where a case costs a second of interpretation and the pairs reach every
    meeting of two axes' code paths); the whole product on a GPU and with TORCHMX_TEST_FULL=1."""
    return _product(axes) if torch.cuda.is_available() else all_pairs(*axes)

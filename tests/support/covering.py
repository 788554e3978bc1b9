"""Parameter grids for the matmul kernel tests.

On a GPU a case costs milliseconds and a test takes the whole product of its axes. Under
Triton's interpreter (CPU, where CI runs) a case costs about a second, and a test takes a
covering subset instead: every value of each axis meets every value of each other axis in some
case (all pairs), which is where the kernels' paths meet (format x tile, tile x shape, format x
shape). The same tests run the whole product on the GPU, and under the interpreter with
TORCHMX_TEST_FULL=1 (slow), as test_triton_quantize.py's matrix does.
"""

import itertools
import os


def _covering_subset() -> bool:
    return (os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
            and os.environ.get("TORCHMX_TEST_FULL") != "1")


def all_pairs(*axes):
    """The cases of a parametrize over the product of `axes` (each a list of values, or of
    tuples for axes that go together): all of them on a GPU (or with TORCHMX_TEST_FULL=1);
    under the interpreter, a subset covering every pair of values of two axes, chosen greedily
    (the case that covers the most pairs not yet covered, the first such in product order), so
    the same cases every run."""
    cases = [tuple(itertools.chain.from_iterable(
        value if isinstance(value, tuple) else (value,) for value in combo))
        for combo in itertools.product(*axes)]
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

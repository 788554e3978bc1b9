"""The covering grids of the kernel tests (covering.py): the whole product when asked
(TORCHMX_TEST_FULL=1), else, on a GPU and under the interpreter alike, a subset that still holds
every pair of values of two axes."""

import itertools

import pytest

import covering
from covering import all_pairs, pairs_when_interpreted

AXES = [(["a", "b", "c", "d", "e", "f"], [1, 2, 3, 4], [(16, 128), (2, 8), (33, 4), (64, 12)]),
        (["x", "y", "z"], [True, False], [1, 2, 3, 4], [(5, 6), (7, 8), (9, 10), (11, 12)]),
        ([1, 2], [3])]


def _flat(combo):
    return tuple(itertools.chain.from_iterable(v if isinstance(v, tuple) else (v,)
                                               for v in combo))


@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("interpret", ["0", "1"])
def test_the_whole_product_when_asked(axes, interpret, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.setenv("TORCHMX_TEST_FULL", "1")
    assert all_pairs(*axes) == [_flat(c) for c in itertools.product(*axes)]


@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("interpret", ["0", "1"])
def test_every_pair_on_a_gpu_and_under_the_interpreter(axes, interpret, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.delenv("TORCHMX_TEST_FULL", raising=False)
    cases = all_pairs(*axes)
    product = [_flat(c) for c in itertools.product(*axes)]
    assert cases == [c for c in product if c in cases]  # a subset, in product order, no repeats
    assert cases == all_pairs(*axes)  # the same every time
    combos = [c for c in itertools.product(*axes) if _flat(c) in cases]
    for a, b in itertools.combinations(range(len(axes)), 2):
        assert {(c[a], c[b]) for c in combos} == set(itertools.product(axes[a], axes[b]))
    if len(axes) > 2:
        assert len(cases) < len(product)


@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("cuda", [False, True])
def test_pairs_when_interpreted_keep_the_product_on_a_gpu(axes, cuda, monkeypatch):
    monkeypatch.delenv("TORCHMX_TEST_FULL", raising=False)
    monkeypatch.setattr(covering.torch.cuda, "is_available", lambda: cuda)
    product = [_flat(c) for c in itertools.product(*axes)]
    assert pairs_when_interpreted(*axes) == (product if cuda else all_pairs(*axes))
    monkeypatch.setenv("TORCHMX_TEST_FULL", "1")
    assert pairs_when_interpreted(*axes) == product

"""kernels/_launch.py's key: what it must tell apart for Triton (checked against Triton's own
keys on the GPU in tests/test_gpu_short_path.py), and what it may share."""

import torch

from torchmx.kernels._launch import _key


def test_constexprs_are_keyed_by_value():
    assert _key([4], [True]) != _key([8], [True])
    assert _key([True], [True]) != _key([False], [True])


def test_ints_by_what_triton_specializes():
    assert _key([1], [False]) != _key([17], [False])  # == 1
    assert _key([16], [False]) != _key([24], [False])  # divisibility by 16
    assert _key([2**31 - 16], [False]) != _key([2**31], [False])  # i32 or i64
    assert _key([32], [False]) == _key([4096], [False])  # one specialization: shared


def test_tensors_by_dtype_and_alignment():
    base = torch.zeros(64, dtype=torch.uint8)
    aligned, unaligned = base[:32], base[1:33]
    assert base.data_ptr() % 16 == 0
    assert _key([aligned], [False]) != _key([unaligned], [False])
    assert _key([aligned], [False]) != _key([aligned.view(torch.int8)], [False])
    assert _key([aligned], [False]) == _key([torch.zeros(8, dtype=torch.uint8)], [False])


def test_floats_share_one_key_and_others_are_keyed_by_value():
    assert _key([0.5], [False]) == _key([2.0], [False])  # passed as fp32, never specialized
    assert _key([None], [False]) != _key([False], [False])

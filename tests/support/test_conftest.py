"""tests/conftest.py's per-test seeds and its gpu marker."""

import random
import zlib

import numpy
import torch


def test_each_test_starts_from_the_seed_of_its_node_id(request):
    seed = zlib.crc32(request.node.nodeid.encode())
    assert torch.equal(torch.rand(4), torch.rand(4, generator=torch.Generator().manual_seed(seed)))
    assert random.random() == random.Random(seed).random()
    assert numpy.random.random() == numpy.random.RandomState(seed).random_sample()


def test_the_gpu_marker_is_registered(pytestconfig):
    assert any(line.startswith("gpu:") for line in pytestconfig.getini("markers"))

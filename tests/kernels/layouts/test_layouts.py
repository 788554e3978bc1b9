"""Vendor scale / data layouts (torchmx/kernels/layouts/vendor.py): each exporter puts every byte where
the layout's definition says, pads with zeros, and its inverse restores the input exactly."""

import itertools

import pytest
import torch

from torchmx.kernels import layouts
from torchmx.numerics import quantize_mx_reference


def random_bytes(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)


MATRIX_SHAPES = [(1, 1), (128, 4), (129, 5), (256, 8), (300, 17), (7, 64), (1000, 3)]


@pytest.mark.parametrize("shape", MATRIX_SHAPES, ids=str)
def test_to_blocked_places_every_byte(shape):
    rows, cols = shape
    scale = random_bytes(rows, cols, seed=rows * 1000 + cols)
    blocked = layouts.to_blocked(scale)
    tiles_c = -(-cols // 4)
    assert blocked.shape == (layouts.blocked_size(rows, cols),)
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    # The cuBLAS / CUTLASS rule: tile (r // 128, c // 4) row-major, 512 bytes per tile, and
    # (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4 inside it.
    position = ((r // 128) * tiles_c + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    assert torch.equal(blocked[position], scale)
    padding = torch.ones_like(blocked, dtype=torch.bool)
    padding[position.flatten()] = False
    assert (blocked[padding] == 0).all()
    assert torch.equal(layouts.from_blocked(blocked, rows, cols), scale)


def test_to_blocked_batched_and_errors():
    scale = random_bytes(3, 2, 130, 9)
    blocked = layouts.to_blocked(scale)
    assert blocked.shape == (3, 2, layouts.blocked_size(130, 9))
    for i, j in itertools.product(range(3), range(2)):
        assert torch.equal(blocked[i, j], layouts.to_blocked(scale[i, j]))
    assert torch.equal(layouts.from_blocked(blocked, 130, 9), scale)
    with pytest.raises(ValueError, match="takes"):
        layouts.from_blocked(blocked, 131, 9 + 4)
    with pytest.raises(ValueError, match="at least 2 dims"):
        layouts.to_blocked(torch.zeros(5, dtype=torch.uint8))
    with pytest.raises(TypeError, match="1-byte"):
        layouts.to_blocked(torch.zeros(5, 5))


@pytest.mark.parametrize("shape", MATRIX_SHAPES + [(512, 16)], ids=str)
def test_aiter_scale_shuffle_places_every_byte(shape):
    m, n = shape
    scale = random_bytes(m, n, seed=m + 7 * n)
    shuffled = layouts.shuffle_scale_aiter(scale)
    m_pad, n_pad = -(-m // 256) * 256, -(-n // 8) * 8
    assert shuffled.shape == (m_pad, n_pad)
    r = torch.arange(m).unsqueeze(1)
    c = torch.arange(n).unsqueeze(0)
    # 32 x 8 tiles, row-major, 256 bytes each; r = 16a + b, c = 4d + e -> e*64 + b*4 + d*2 + a.
    a, b, d, e = (r % 32) // 16, r % 16, (c % 8) // 4, c % 4
    position = ((r // 32) * (n_pad // 8) + c // 8) * 256 + e * 64 + b * 4 + d * 2 + a
    flat = shuffled.flatten()
    assert torch.equal(flat[position], scale)
    padding = torch.ones_like(flat, dtype=torch.bool)
    padding[position.flatten()] = False
    assert (flat[padding] == 0).all()
    assert torch.equal(layouts.unshuffle_scale_aiter(shuffled, m, n), scale)
    with pytest.raises(ValueError, match="padded shape"):
        layouts.unshuffle_scale_aiter(shuffled, m + 256, n)


@pytest.mark.parametrize("shape", [(16, 32), (32, 64), (2, 48, 96), (64, 4096)], ids=str)
def test_aiter_weight_shuffle_places_every_byte(shape):
    data = random_bytes(*shape, seed=sum(shape))
    shuffled = layouts.shuffle_weight_aiter(data)
    assert shuffled.shape == data.shape and shuffled.dtype == data.dtype
    rows, cols = shape[-2:]
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    # 16 x 32-byte tiles, row-major; inside: (c % 32) // 16 first, then the row, then c % 16.
    position = ((r // 16) * (cols // 32) + c // 32) * 512 + ((c % 32) // 16) * 256 + (r % 16) * 16 + c % 16
    flat = shuffled.reshape(-1, rows * cols)
    for i in range(flat.shape[0]):
        assert torch.equal(flat[i][position], data.reshape(-1, rows, cols)[i])
    assert torch.equal(layouts.unshuffle_weight_aiter(shuffled), data)
    with pytest.raises(ValueError, match="divisible"):
        layouts.shuffle_weight_aiter(data[..., :8, :])


def test_layouts_of_real_mx_tensors_round_trip():
    x = torch.randn(300, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    scale, data = quantize_mx_reference(x, "float4_e2m1", 32)
    assert data.shape == (300, 128) and scale.shape == (300, 8)
    assert torch.equal(layouts.from_blocked(layouts.to_blocked(scale), 300, 8), scale)
    assert torch.equal(layouts.unshuffle_scale_aiter(layouts.shuffle_scale_aiter(scale), 300, 8), scale)
    w = data[:288]
    assert torch.equal(layouts.unshuffle_weight_aiter(layouts.shuffle_weight_aiter(w)), w)

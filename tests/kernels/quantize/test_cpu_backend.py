"""The C kernels (torchmx/cpu_kernels.py) equal the reference numerics bit for bit."""

import itertools
import warnings
import zlib

import pytest
import torch

from formats import FORMAT_IDS, FORMATS, HP_DTYPES, ROUNDINGS, SCALE_MODES, bit_view, every_code_every_scale, wide_range_input
from torchmx import cpu_kernels
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler on this machine")


def _check_quantize(x, fmt, block_size, scale_mode, rounding, axis, seed=1234):
    expected = quantize_mx_reference(x, fmt, block_size, scale_mode=scale_mode, rounding=rounding,
                                     block_dim=axis, seed=seed)
    got = cpu_kernels.quantize(x, fmt, block_size, scale_mode, rounding, axis % max(x.dim(), 1), seed)
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype and e.shape == g.shape
        assert torch.equal(e, g), f"{(e != g).sum()} of {e.numel()} bytes differ"
    return expected


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_quantize_every_option(fmt, scale_mode, rounding):
    for dtype, (block_size, axis) in zip(HP_DTYPES, [(32, -1), (7, 0), (1, 1)]):
        x = wide_range_input((37, 67), dtype, seed=zlib.crc32(f"{fmt.name}{scale_mode}{rounding}".encode()))
        _check_quantize(x, fmt, block_size, scale_mode, rounding, axis)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("target", HP_DTYPES)
def test_dequantize_every_code_and_scale(fmt, target):
    scale, data, n = every_code_every_scale(fmt)
    expected = dequantize_mx_reference(data, scale, fmt, n, target, block_dim_size=n)
    got = cpu_kernels.dequantize(data, scale, fmt, n, target, 1, n)
    assert torch.equal(bit_view(expected), bit_view(got))


SHAPES = [(), (0,), (5, 0), (0, 64), (1,), (31,), (97,), (3, 5, 7), (2, 129, 3), (4096,)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS[:6], ids=FORMAT_IDS[:6])
def test_shapes_and_axes(shape, fmt):
    x = wide_range_input(shape, torch.bfloat16, seed=3)
    for axis, block_size in itertools.product(range(-max(len(shape), 1), max(len(shape), 1)), (1, 3, 32)):
        scale, data = _check_quantize(x, fmt, block_size, "floor", "even", axis)
        n = 1 if x.dim() == 0 else x.shape[axis]
        expected = dequantize_mx_reference(data, scale, fmt, block_size, torch.float32, axis,
                                           block_dim_size=n)
        got = cpu_kernels.dequantize(data, scale, fmt, block_size, torch.float32,
                                     axis % max(x.dim(), 1), n)
        assert torch.equal(bit_view(expected), bit_view(got))


def test_non_contiguous_input():
    base = wide_range_input((64, 96), torch.float32, seed=5)
    for x in (base.t(), base[:, ::3], base[::2].unsqueeze(0).expand(3, -1, -1)):
        for axis in range(x.dim()):
            _check_quantize(x, FORMATS[4], 32, "rceil", "even", axis)


def test_stochastic_rounding_reproducible_and_seed_dependent():
    x = wide_range_input((16, 256), torch.float32, seed=9)
    a = cpu_kernels.quantize(x, FORMATS[4], 32, "floor", "stochastic", 1, 77)[1]
    b = cpu_kernels.quantize(x, FORMATS[4], 32, "floor", "stochastic", 1, 77)[1]
    c = cpu_kernels.quantize(x, FORMATS[4], 32, "floor", "stochastic", 1, 78)[1]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_large_tensor_uses_threads_and_matches_reference():
    x = wide_range_input((512, 1024), torch.bfloat16, seed=11)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _check_quantize(x, FORMATS[5], 32, "even", "even", 1)
        _check_quantize(x, FORMATS[2], 32, "floor", "stochastic", 0)
    finally:
        torch.set_num_threads(threads)  # later tests on this worker keep the worker's count


def test_missing_compiler_falls_back_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("TORCHMX_CACHE_DIR", str(tmp_path))
    cpu_kernels._library.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not cpu_kernels.available()
        assert any("CPU kernels unavailable" in str(w.message) for w in caught)
        from torchmx.ops import backend_for
        assert backend_for(torch.device("cpu")) == "reference"
    finally:
        monkeypatch.undo()
        cpu_kernels._library.cache_clear()
    assert cpu_kernels.available()

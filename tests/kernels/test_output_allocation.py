"""torchmx/_allocation.py: the outputs of bound calls (C kernels, bound CUDA launches) come from
PyTorch's C allocator, and must be what torch.empty would give: shape, dtype, device,
contiguous strides, no autograd, a new tensor at each call (not torch.empty's deterministic fill
of fresh memory: the kernels write all of it)."""

import pytest
import torch

from torchmx import _allocation
from torchmx._allocation import allocator

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")])]
SHAPES = [(), (0,), (0, 5), (7,), (16, 64), (3, 5, 7), (1, 1, 4096)]
DTYPES = [torch.uint8, torch.float32, torch.bfloat16, torch.float8_e4m3fn]


def check_like_torch_empty(t: torch.Tensor, shape, dtype, device) -> None:
    want = torch.empty(shape, dtype=dtype, device=device)
    assert (t.shape, t.stride(), t.dtype, t.device) == (want.shape, want.stride(), want.dtype,
                                                        want.device)
    assert t.is_contiguous() and not t.requires_grad and type(t) is torch.Tensor


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_outputs_are_what_torch_empty_gives(device, shape, dtype):
    new = allocator(list(shape), dtype, torch.device(device))  # (a list: shapes as plans hold them)
    first, second = new(), new()
    check_like_torch_empty(first, shape, dtype, device)
    check_like_torch_empty(second, shape, dtype, device)
    if first.numel():
        assert first.data_ptr() != second.data_ptr()  # a fresh tensor per call


@pytest.mark.parametrize("device", DEVICES)
def test_without_the_c_allocators_it_takes_torch_empty(monkeypatch, device):
    monkeypatch.setattr(_allocation, "_C_ALLOCATORS", {})
    new = allocator((4, 6), torch.float32, torch.device(device))
    assert new.func is torch.empty
    check_like_torch_empty(new(), (4, 6), torch.float32, device)


@pytest.mark.parametrize("device", DEVICES)
def test_the_c_allocators_are_taken(device):
    assert allocator((4, 6), torch.float32, torch.device(device)).func is not torch.empty


def test_other_devices_get_torch_empty():
    new = allocator((2, 3), torch.float16, torch.device("meta"))
    assert new.func is torch.empty
    check_like_torch_empty(new(), (2, 3), torch.float16, "meta")

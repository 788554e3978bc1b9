"""Operands and checks shared by the MX matmul tests (test_mx_weight_matmul.py,
test_mx_matmul_large.py, test_byte_gemv.py, test_mma_linear.py, test_stream_linear.py,
test_gpu_short_path.py, test_inference_linear_bound.py)."""

import contextlib

import torch

from torchmx import MXTensor
from torchmx.numerics.packing import pack_codes

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def integer_operands(fmt, M, N, K, dtype=torch.bfloat16, block_size=32, seed=0):
    """x: integers in [-4, 4]; W: integers in [-6, 6] quantized (values are multiples of 1/4
    of magnitude <= 16), so every partial sum is a multiple of 1/4 below 2**24 / 4: exact, and
    any fp32 summation order gives the same bits."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, (M, K), generator=g).to(dtype)
    w = torch.randint(-6, 7, (N, K), generator=g).to(dtype)
    return x.to(DEVICE), MXTensor.to_mx(w.to(DEVICE), fmt, block_size)


def reference(x, w, bias=None):
    """The generic exact path: fp32 dequantize, fp32 matmul, one rounding."""
    out = x.float() @ w.dequantize(torch.float32).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def one_product_per_row(fmt, codes, scales):
    """W [256, 256] whose row n holds codes[n] at column n with scale byte scales[n] (zeros
    elsewhere), and x [3, 256] of ones, minus ones and zeros: out[m, n] is one product, exact
    (or Inf / NaN) whatever the order of the sums."""
    w = MXTensor.to_mx(torch.zeros(256, 256, device=DEVICE), fmt, 32)
    n = torch.arange(256, device=DEVICE)
    all_codes = torch.zeros(256, 256, dtype=torch.int32)
    all_codes[n.cpu(), n.cpu()] = codes.to(torch.int32)
    data = pack_codes(all_codes, w.elem_dtype).view(w._data.dtype).to(DEVICE)
    scale = torch.full_like(w._scale_e8m0, 127)
    scale[n, n // 32] = scales.to(torch.uint8).to(DEVICE)
    w = w._replace(scale, data)
    x = torch.stack([torch.ones(256), -torch.ones(256), torch.zeros(256)]).to(torch.bfloat16)
    return x.to(DEVICE), w


def assert_within_fp32_accumulation(out, x, w, bias=None):
    """`out` within the error of an fp32 accumulation plus one rounding of the exact product."""
    wd = w.dequantize(torch.float32).double()
    exact = x.double() @ wd.t()
    magnitude = x.double().abs() @ wd.abs().t()
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    ulp = 2.0 ** -8 if out.dtype == torch.bfloat16 else 2.0 ** -11
    bound = magnitude * (x.shape[-1] + 2) * 2.0 ** -24 + exact.abs() * ulp
    err = (out.double() - exact).abs()
    assert not out.isnan().any()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}"


def assert_graph_replay_matches_eager(call):
    """call() captured in a CUDA graph and replayed gives the bits of an eager call."""
    expected = call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@contextlib.contextmanager
def no_host_sync():
    """A block in which any CUDA call that waits for the GPU (a host sync) raises."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")

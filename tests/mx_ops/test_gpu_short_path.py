"""On a CUDA GPU: the eager short path (_eager.short_path) of every hot entry point gives the
bits of the full path through autograd and the operators, and never synchronizes the host
(torch.cuda.set_sync_debug_mode("error") turns a synchronization into an error)."""

import pytest
import torch
import torch.nn.functional as F

import torchmx
from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig

from matmul_operands import no_host_sync

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORMATS = ("float4_e2m1", "float8_e4m3", "float8_e5m2", "float6_e2m3", "int8")


def full_path_linear(x, w_mx, bias=None):
    """F.linear through the mx_linear operator (what torch.compile and export run)."""
    return torch.ops.torchmx.mx_linear(x, w_mx, bias, out_dtype=x.dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 128])
def test_linear_short_path_is_the_operator(fmt, rows):
    torch.manual_seed(rows)
    w_mx = MXTensor.to_mx(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), fmt)
    x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    expected = full_path_linear(x, w_mx, bias)
    with torch.no_grad(), no_host_sync():
        got = F.linear(x, w_mx, bias)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_and_dequantize_short_paths(fmt):
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    with no_host_sync():
        scale, data = torch.ops.torchmx.quantize_mx(x, fmt, 32)
        x_mx = MXTensor.to_mx(x, fmt)
        values = x_mx.dequantize()
        direct = torch.ops.torchmx.dequantize_mx(data, scale, fmt, 32, torch.bfloat16)
    assert torch.equal(x_mx._scale_e8m0, scale) and torch.equal(x_mx._data.view(torch.uint8),
                                                              data.view(torch.uint8))
    assert torch.equal(values, direct)
    with_grad = MXTensor.to_mx(x.clone().requires_grad_(), fmt)  # the autograd.Function
    assert torch.equal(with_grad.dequantize(), values)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("prepack", [False, True])
@pytest.mark.parametrize("rows", [1, 16])
def test_inference_linear_short_path(fmt, prepack, rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16)
    layer = torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt), None))
    if prepack:
        layer.prepack()
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    expected = layer(x)  # the bias requires grad: the autograd.Function path
    with torch.no_grad(), no_host_sync():
        got = layer(x)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3", "float6_e2m3", "int8"])
@pytest.mark.parametrize("bias", [False, True])
def test_stream_plan_is_the_operator(fmt, bias):
    """A prepacked layer's eager call through its StreamPlan (the weight's descriptors built
    once, the compiled kernel called directly) gives the operator's bits, call after call,
    for every row count, and never synchronizes."""
    from torchmx.kernels.linear import stream_matmul
    from torchmx.nn import inference_linear
    torch.manual_seed(4)
    linear = torch.nn.Linear(1024, 4096, bias=bias, device="cuda", dtype=torch.bfloat16)
    layer = torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt), None))
    layer.prepack()
    if layer._prepacked_layout != "tma_stream":
        pytest.skip("no TMA stream layout on this GPU / Triton")
    b = None if layer.bias is None else layer.bias.detach()
    base = torch.randn(64 * 1024 + 8, device="cuda", dtype=torch.bfloat16)
    for rows, offset in [(1, 0), (2, 0), (16, 0), (16, 8), (64, 0), (1, 0), (16, 0)]:
        x = base[offset:offset + rows * 1024].view(1, rows, 1024)
        expected = torch.ops.torchmx.mx_stream_linear(
            x, layer.weight_prepacked_codes, layer.weight_prepacked_scales,
            layer.weight_prepacked_counters, layer.weight_scale, layer.weight_data, fmt, 1024, b,
            x.dtype)
        with torch.no_grad(), no_host_sync():
            got = layer(x)
        assert torch.equal(got, expected), (rows, offset)
    plans = inference_linear._STREAM_PLANS[layer][1]
    assert any(isinstance(p, stream_matmul.StreamPlan) for p in plans.values())


@pytest.mark.parametrize("fmt", FORMATS)
def test_launch_cache_tells_specializations_apart(fmt):
    """kernels/_launch.py reuses a compiled kernel only for arguments of its specialization:
    calls alternating aligned and unaligned tensors, sizes 1, 16 and others, each equal the
    reference numerics."""
    from torchmx.numerics.reference import dequantize_mx_reference, quantize_mx_reference
    from torchmx import dtypes
    torch.manual_seed(1)
    base = torch.randn(33 * 160 + 1, device="cuda", dtype=torch.bfloat16)
    for rows, offset in [(16, 0), (16, 1), (1, 0), (1, 3), (33, 0), (33, 1), (16, 0)]:
        x = base[offset:offset + rows * 160].view(rows, 160)
        scale, data = torch.ops.torchmx.quantize_mx(x, fmt, 32)
        ref_scale, ref_data = quantize_mx_reference(x.cpu(), dtypes.from_name(fmt), 32)
        assert torch.equal(scale.cpu(), ref_scale) and torch.equal(
            data.cpu().view(torch.uint8), ref_data.view(torch.uint8)), (rows, offset)
        values = torch.ops.torchmx.dequantize_mx(data, scale, fmt, 32, torch.bfloat16)
        expected = dequantize_mx_reference(ref_data, ref_scale, dtypes.from_name(fmt), 32,
                                           torch.bfloat16, 1)
        assert torch.equal(values.cpu(), expected), (rows, offset)


@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_launch_cache_across_rows(fmt):
    torch.manual_seed(2)
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    w_mx = MXTensor.to_mx(w, fmt)
    w_hat = w_mx.dequantize(torch.float32)
    base = torch.randn(70 * 512 + 8, device="cuda", dtype=torch.bfloat16)
    for rows, offset in [(1, 0), (1, 8), (2, 0), (16, 0), (16, 8), (64, 0), (65, 0), (1, 0)]:
        x = base[offset:offset + rows * 512].view(rows, 512)
        with torch.no_grad():
            got = F.linear(x, w_mx)
        expected = (x.float() @ w_hat.t()).to(torch.bfloat16)  # exact products, fp32 sums
        assert torch.allclose(got.float(), expected.float(), rtol=2**-7, atol=1e-2), (rows, offset)
        assert torch.equal(got, full_path_linear(x, w_mx)), (rows, offset)


def test_launch_keys_refine_tritons(monkeypatch):
    """Every pair of launches that kernels/_launch.py sends to one compiled kernel has one
    Triton cache key too (a sweep of formats, dtypes, shapes, axes, scale modes and linears),
    and so do all the calls of one prepared `Launch` (a linear's plan)."""
    from triton.runtime.jit import compute_cache_key

    from torchmx.kernels import _launch
    from torchmx.kernels.linear import fp4_wgmma_matmul
    from torchmx.kernels.quantize import triton_backend

    triton_keys = {}
    plan_keys = {}
    real_launch = _launch.launch
    real_call = _launch.Launch.__call__

    def triton_key_of(kernel, args, kwargs):
        _, key_cache, _, _, binder = kernel.device_caches[torch.cuda.current_device()]
        _, specialization, options = binder(*args, **kwargs)
        return compute_cache_key(key_cache, specialization, options)

    def checked_call(self, *tensors):
        args = list(self.args)
        for slot, tensor in zip(self.slots, tensors):
            args[slot] = tensor
        key = triton_key_of(self.kernel, args, self.kwargs)
        assert plan_keys.setdefault(id(self), key) == key, self.kernel.fn.__name__
        real_call(self, *tensors)

    def checked(kernel, grid, *args, **kwargs):
        if hasattr(kernel, "device_caches"):
            triton_key = triton_key_of(kernel, args, kwargs)
            names, known, defaults, constexpr = _launch._signature(kernel)
            values = list(args) + [kwargs[n] if n in kwargs else defaults[n]
                                   for n in names[len(args):]]
            ours = (kernel, _launch._key(values, constexpr),
                    tuple(sorted((k, v) for k, v in kwargs.items() if k not in known)))
            assert triton_keys.setdefault(ours, triton_key) == triton_key, kernel.fn.__name__
        return real_launch(kernel, grid, *args, **kwargs)

    for module in (_launch, fp4_wgmma_matmul, triton_backend):
        monkeypatch.setattr(module, "launch", checked)
    monkeypatch.setattr(_launch.Launch, "__call__", checked_call)
    torch.manual_seed(3)
    for fmt in FORMATS:
        for shape in [(16, 4096), (1, 64), (3, 100), (64, 8192)]:
            for dtype in (torch.bfloat16, torch.float32, torch.float16):
                x = torch.randn(shape, device="cuda", dtype=dtype)
                for axis in (-1, 0):
                    for mode in ("floor", "rceil"):
                        scale, data = torch.ops.torchmx.quantize_mx(x, fmt, 32, scale_mode=mode,
                                                                    block_dim=axis)
                        torch.ops.torchmx.dequantize_mx(data, scale, fmt, 32, dtype, axis,
                                                        block_dim_size=x.shape[axis])
        for n, k in [(1024, 1024), (256, 512), (4096, 1024)]:
            w_mx = MXTensor.to_mx(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), fmt)
            for rows in (1, 2, 16, 64, 65):
                with torch.no_grad():
                    F.linear(torch.randn(rows, k, device="cuda", dtype=torch.bfloat16), w_mx)
    torch.cuda.synchronize()
    assert len(triton_keys) > 20 and len(plan_keys) > 10


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_row_and_column_quantize_launches(fmt, dtype):
    """Every path of the one-pass row + column quantize (pairs, fused, registers capped)."""
    from torchmx.kernels import quantize_mx_rowwise_colwise
    x = torch.randn(256, 384, device="cuda", dtype=dtype)
    for _ in range(2):  # the second call takes the compiled kernel directly
        (scale_r, data_r), (scale_c, data_c) = quantize_mx_rowwise_colwise(x, fmt)
        for (scale, data), axis in (((scale_r, data_r), -1), ((scale_c, data_c), -2)):
            ref_scale, ref_data = torch.ops.torchmx.quantize_mx(x, fmt, 32, block_dim=axis)
            assert torch.equal(scale, ref_scale)
            assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8))


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3", "int8"])
def test_bound_operator_calls_follow_the_weight_memory(fmt):
    """mx_weight_linear and F.linear's short path bind a product to the weight's addresses
    (weight_matmul._BOUND): calls after the first go through it with the operator's bits; a
    new weight at the same addresses (the old one freed) gives its own product, and so does
    the compiled operator."""
    from torchmx.mx_ops import weight_matmul
    torch.manual_seed(5)
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    for step in range(3):
        w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
        w_mx = MXTensor.to_mx(w, fmt)
        expected = (x.float() @ w_mx.dequantize(torch.float32).t()).to(torch.bfloat16)
        with torch.no_grad():
            first = F.linear(x, w_mx)
            with no_host_sync():
                again = [F.linear(x, w_mx) for _ in range(2)]
                op = torch.ops.torchmx.mx_weight_linear(x, w_mx._scale_e8m0, w_mx._data, fmt, 32,
                                                        512, None, torch.bfloat16)
        assert torch.allclose(first.float(), expected.float(), rtol=2**-7, atol=1e-2), step
        assert all(torch.equal(a, first) for a in again + [op]), step
        assert any(weight_matmul._BOUND.values())
        del w, w_mx  # the next weight may take the same memory
    compiled = torch.compile(lambda a, b: F.linear(a, b))
    w_mx = MXTensor.to_mx(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16), fmt)
    with torch.no_grad():
        eager = F.linear(x, w_mx)
        assert all(torch.equal(compiled(x, w_mx), eager) for _ in range(3))

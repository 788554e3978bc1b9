"""On two CUDA GPUs: calls whose tensors lie on a GPU that is not the current one (a model
spread over GPUs by `device_map`, where `cuda:0` stays current) compute on the tensors' GPU,
on its stream, with the bits of the same call on the current GPU, and leave the current
device as it was. Triton launches on the current device; PyTorch's own operators switch to
their tensors' device, and torchmx's launches do the same (kernels/_launch.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import torchmx
from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import MXLinear, prepack_weights

from gpu_work import kernel_devices

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]

FORMATS = ("float4_e2m1", "float8_e4m3")
CURRENT, OTHER = 0, 1


def _randn(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(torch.bfloat16)


def _on(value, index):
    """A copy of a tensor or module on cuda:index (Module.to would move the module itself)."""
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(f"cuda:{index}")
    return value.to(f"cuda:{index}")


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _cpu(result):
    """The result's tensors on the CPU, floating ones as their bit patterns."""
    if isinstance(result, torch.Tensor):
        t = result.detach().cpu()
        return [t.view(_BITS[t.element_size()]) if t.is_floating_point() else t]
    return [r for part in result for r in _cpu(part)]


def _check_on_other_gpu(make_call):
    """make_call(index) -> a call on tensors of cuda:index. Runs it on the current GPU for the
    expected bits, then on the other (three times first: a call that binds would be bound),
    and checks the bits, where the work ran and that the current device stayed."""
    torch.cuda.set_device(CURRENT)
    expected = _cpu(make_call(CURRENT)())
    call = make_call(OTHER)
    for _ in range(3):
        _check_bits(_cpu(call()), expected)
        assert torch.cuda.current_device() == CURRENT
    result, devices = kernel_devices(call)
    assert devices == {OTHER}, f"GPU work on devices {devices}, the tensors are on cuda:{OTHER}"
    _check_bits(_cpu(result), expected)
    assert torch.cuda.current_device() == CURRENT


def _check_bits(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and torch.equal(g, e)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("entry", ["direct", "torch.ops"])
def test_quantize_and_dequantize(fmt, entry):
    ops = torchmx.ops if entry == "direct" else torch.ops.torchmx
    x = _randn(16, 4096)

    def make_call(index):
        x_i = _on(x, index)
        scale, data = ops.quantize_mx(x_i, fmt, 32)
        return lambda: (*ops.quantize_mx(x_i, fmt, 32),
                        ops.dequantize_mx(data, scale, fmt, 32, torch.bfloat16))
    _check_on_other_gpu(make_call)


@pytest.mark.parametrize("fmt", FORMATS)
def test_to_mx_and_dequantize(fmt):
    x = _randn(64, 512)

    def make_call(index):
        x_i = _on(x, index)

        def call():
            t = MXTensor.to_mx(x_i, fmt)
            return t._scale_e8m0, t._data, t.dequantize()
        return call
    _check_on_other_gpu(make_call)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 128])
@pytest.mark.parametrize("with_bias", [False, True])
def test_f_linear_with_an_mx_weight(fmt, rows, with_bias):
    w, x, bias = _randn(256, 1024), _randn(rows, 1024, seed=1), _randn(256, seed=2)

    def make_call(index):
        w_mx = MXTensor.to_mx(_on(w, index), fmt)
        x_i, bias_i = _on(x, index), _on(bias, index) if with_bias else None
        return lambda: F.linear(x_i, w_mx, bias_i)
    with torch.no_grad():
        _check_on_other_gpu(make_call)


def test_large_m_pipeline():
    """The dequantize of each weight chunk on a side stream behind cuBLAS (dispatch.py's
    pipelined path: M >= 4096, K >= 8192, no bias)."""
    w, x = _randn(4096, 8192), _randn(4096, 8192, seed=1)

    def make_call(index):
        w_mx = MXTensor.to_mx(_on(w, index), "float4_e2m1")
        x_i = _on(x, index)
        return lambda: F.linear(x_i, w_mx)
    with torch.no_grad():
        _check_on_other_gpu(make_call)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("prepack", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_inference_linear(fmt, rows, prepack, grad):
    linear = torch.nn.Linear(1024, 512, dtype=torch.bfloat16)
    x = _randn(rows, 1024, seed=1)

    def make_call(index):
        layer = torchmx.MXInferenceLinear.from_float(_on(linear, index),
                                                    QLinearConfig(MXConfig(fmt), None))
        if prepack:
            prepack_weights(layer)
        x_i = _on(x, index)
        return lambda: layer(x_i)
    with torch.set_grad_enabled(grad):
        _check_on_other_gpu(make_call)


@pytest.mark.parametrize("weights", FORMATS)
def test_mx_linear_training_step(weights):
    """QAT: MXFP8 activations (the MX x MX product), the straight-through backward."""
    linear = torch.nn.Linear(512, 256, dtype=torch.bfloat16)
    x = _randn(256, 512, seed=1)
    qconfig = QLinearConfig(MXConfig(weights), MXConfig("float8_e4m3"))

    def make_call(index):
        layer = MXLinear.from_float(_on(linear, index), qconfig)
        x_i = _on(x, index).requires_grad_()

        def step():
            layer.zero_grad()
            x_i.grad = None
            out = layer(x_i)
            out.float().square().sum().backward()
            return out, x_i.grad, layer.weight.grad, layer.bias.grad
        return step
    _check_on_other_gpu(make_call)


def test_layers_spread_over_two_gpus():
    """A model cut in two as device_map does: the first layer on the current GPU (its bound
    calls), the second on the other, called again and again."""
    first, second = torch.nn.Linear(512, 1024, dtype=torch.bfloat16), torch.nn.Linear(
        1024, 256, dtype=torch.bfloat16)
    qconfig = QLinearConfig(MXConfig("float4_e2m1"), None)
    x = _randn(4, 512, seed=1)
    torch.cuda.set_device(CURRENT)

    def model(devices):
        a = torchmx.MXInferenceLinear.from_float(_on(first, devices[0]), qconfig)
        b = torchmx.MXInferenceLinear.from_float(_on(second, devices[1]), qconfig)
        return lambda x: b(a(x.to(f"cuda:{devices[0]}")).to(f"cuda:{devices[1]}"))

    with torch.no_grad():
        expected = _cpu(model((CURRENT, CURRENT))(x))
        spread = model((CURRENT, OTHER))
        for _ in range(4):
            out = spread(x)
            assert out.device == torch.device("cuda", OTHER)
            _check_bits(_cpu(out), expected)
    assert torch.cuda.current_device() == CURRENT


def test_compiled_linear():
    """torch.compile's code launches the traced kernels on the device of their tensors."""
    w, x = _randn(512, 1024), _randn(1, 1024, seed=1)

    def make_call(index):
        w_mx = MXTensor.to_mx(_on(w, index), "float4_e2m1")
        x_i = _on(x, index)
        compiled = torch.compile(lambda x: F.linear(x, w_mx), fullgraph=True)
        return lambda: compiled(x_i)
    with torch.no_grad():
        _check_on_other_gpu(make_call)


@pytest.mark.parametrize("fmt", FORMATS)
def test_calls_on_the_other_gpu_are_bound(fmt):
    """The bound calls (one lookup and the launch on the tensors' addresses) serve the other
    GPU too, with its device made current for the call: quantize, dequantize, F.linear and
    MXInferenceLinear, bound after their first call there."""
    from torchmx.kernels.quantize import triton_backend
    from torchmx.mx_ops import weight_matmul
    from torchmx.nn import inference_linear

    torch.cuda.set_device(CURRENT)
    device = f"cuda:{OTHER}"
    x = _randn(16, 1024).to(device)
    w_mx = MXTensor.to_mx(_randn(256, 1024, seed=1).to(device), fmt)
    layer = torchmx.MXInferenceLinear.from_float(
        torch.nn.Linear(1024, 256, dtype=torch.bfloat16, device=device),
        QLinearConfig(MXConfig(fmt), None))
    with torch.no_grad():
        for _ in range(2):
            scale, data = torchmx.ops.quantize_mx(x, fmt, 32)
            torchmx.ops.dequantize_mx(data, scale, fmt, 32, torch.bfloat16)
            F.linear(x, w_mx)
            layer(x)
    assert torch.cuda.current_device() == CURRENT
    bound_ops = {key[1] for key, call in triton_backend.BOUND_CALLS.items()
                 if call and key[0] == OTHER and key[2] in (x.shape, data.shape)}
    assert bound_ops == {"quantize", "dequantize"}
    assert any(product and key[2] == OTHER for key, product in weight_matmul._BOUND.items())
    product, index = inference_linear._BOUND[layer][1][(x.shape, x.dtype, False)]
    assert product is not None and index == OTHER

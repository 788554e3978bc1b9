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


@pytest.mark.parametrize("options", [{}, {"backend": "aot_eager"}, {"mode": "reduce-overhead"}],
                         ids=["inductor", "aot_eager", "reduce-overhead"])
@pytest.mark.parametrize("rows", [1, 16])
def test_compiled_linear(options, rows):
    """Compiled MX linears on the other GPU: inductor's code (the traced kernels, or the
    operator), a backend that runs the graph as it is, and CUDA graphs."""
    w, x = _randn(512, 1024), _randn(rows, 1024, seed=1)

    def make_call(index):
        w_mx = MXTensor.to_mx(_on(w, index), "float4_e2m1")
        x_i = _on(x, index)
        compiled = torch.compile(lambda x: F.linear(x, w_mx), fullgraph=True, **options)
        return lambda: compiled(x_i)
    with torch.no_grad():
        _check_on_other_gpu(make_call)


def _other_gpu_calls(fmt):
    """{name: call(x)} for an input x [16, 1024] on the other GPU: quantize, dequantize (of x's
    codes), F.linear with an MX weight and MXInferenceLinear, all of their tensors there."""
    device = f"cuda:{OTHER}"
    w_mx = MXTensor.to_mx(_randn(256, 1024, seed=1).to(device), fmt)
    layer = torchmx.MXInferenceLinear.from_float(
        torch.nn.Linear(1024, 256, dtype=torch.bfloat16).to(device),
        QLinearConfig(MXConfig(fmt), None))

    def dequantize(x):
        scale, data = torchmx.ops.quantize_mx(x, fmt, 32)
        return torchmx.ops.dequantize_mx(data, scale, fmt, 32, torch.bfloat16)
    return {"quantize": lambda x: torchmx.ops.quantize_mx(x, fmt, 32), "dequantize": dequantize,
            "F.linear": lambda x: F.linear(x, w_mx), "MXInferenceLinear": layer}


@pytest.mark.parametrize("fmt", FORMATS)
def test_calls_on_the_other_gpu_are_bound(fmt):
    """The bound calls (one lookup and the launch on the tensors' addresses) serve the other
    GPU too, with its device made current for the call: quantize, dequantize, F.linear and
    MXInferenceLinear take them from their second call there on."""
    from torchmx.kernels.quantize import triton_backend
    from torchmx.mx_ops import weight_matmul
    from torchmx.nn import inference_linear

    torch.cuda.set_device(CURRENT)
    triton_backend.BOUND_CALLS.clear()
    weight_matmul._BOUND.clear()
    x = _randn(16, 1024).to(f"cuda:{OTHER}")
    calls = _other_gpu_calls(fmt)
    with torch.no_grad():
        expected = {name: _cpu(call(x)) for name, call in calls.items()}
        taken = []

        def counted(name, bound):
            return lambda *args: taken.append(name) or bound(*args)
        for key, call in list(triton_backend.BOUND_CALLS.items()):
            if call and key[0] == OTHER:
                triton_backend.BOUND_CALLS[key] = counted(key[1], call)
        for key, product in list(weight_matmul._BOUND.items()):
            if product and key[2] == OTHER:
                weight_matmul._BOUND[key] = counted("F.linear", product)
        layer = calls["MXInferenceLinear"]
        bound = inference_linear._BOUND[layer][1]
        (shape_key, (product, index)), = bound.items()
        assert index == OTHER
        bound[shape_key] = (counted("MXInferenceLinear", product), index)
        for name, call in calls.items():
            _check_bits(_cpu(call(x)), expected[name])
            assert torch.cuda.current_device() == CURRENT
    # dequantize's call quantizes first
    assert sorted(taken) == sorted(["quantize", "quantize", "dequantize", "F.linear",
                                    "MXInferenceLinear"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_calls_run_on_the_other_gpus_current_stream(fmt):
    """With a side stream current on the other GPU, whose input is written there after a long
    sleep: the general launches and the bound calls read it on that stream (on any other
    stream they would read the input before it is written)."""
    torch.cuda.set_device(CURRENT)
    device = f"cuda:{OTHER}"
    source = _randn(16, 1024).to(device)
    calls = _other_gpu_calls(fmt)
    with torch.no_grad():
        expected = {name: _cpu(call(source)) for name, call in calls.items()}
    side, previous = torch.cuda.Stream(device=device), torch.cuda.current_stream(device)
    torch.cuda.set_stream(side)  # (which makes the other GPU current)
    torch.cuda.set_device(CURRENT)
    try:
        with torch.no_grad():
            for _ in range(3):  # the first calls on this stream, then bound ones
                for name, call in calls.items():
                    x = torch.empty_like(source)
                    with torch.cuda.device(OTHER):
                        torch.cuda._sleep(20_000_000)  # (on the side stream)
                    x.copy_(source)
                    got = call(x)
                    assert torch.cuda.current_device() == CURRENT
                    _check_bits(_cpu(got), expected[name])
    finally:
        torch.cuda.set_stream(previous)
        torch.cuda.set_device(CURRENT)

"""torch.compile(fullgraph=True) and torch.export of MXTensor code: no graph breaks, no
recompiles across shapes under dynamic=True, results bit-identical to eager."""

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F

from formats import bit_view
from torchmx import MXTensor

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


pytestmark = pytest.mark.filterwarnings("ignore::torchmx.mx_tensor.MXLayoutWarning")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_same(actual, expected):
    """Bitwise equality of (nested tuples of) plain tensors and MXTensors."""
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
        return
    assert type(actual) is type(expected) and actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    if isinstance(expected, MXTensor):
        assert torch.equal(actual._data, expected._data)
        assert torch.equal(actual._scale_e8m0, expected._scale_e8m0)
        assert actual.block_dim == expected.block_dim
        actual, expected = actual.dequantize(), expected.dequantize()
    assert torch.equal(bit_view(actual), bit_view(expected))


def assert_compiles(fn, *args, backend="aot_eager", dynamic=False):
    """No graph break, and the compiled fn equals eager bit for bit."""
    explanation = torch._dynamo.explain(fn)(*args)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)
    assert_same(compiled(*args), fn(*args))
    return compiled


def quantize_all(x):
    a = MXTensor.to_mx(x, "float4_e2m1", 32, scale_mode="rceil")
    b = MXTensor.to_mx(x, "float6_e3m2", 16, block_dim=0, rounding="away")
    c = MXTensor.to_mx(x, "int8", 32, scale_mode="even")
    d = MXTensor.to_mx(x, "float8_e4m3", 32)
    return a, b, c, d.to_dtype(torch.float32), a.dequantize(), b.dequantize(torch.float16)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_to_mx_and_dequantize(device, dynamic):
    x = torch.randn(24, 70, dtype=torch.bfloat16, device=device)
    assert_compiles(quantize_all, x, dynamic=dynamic)


def matmuls(x, w, q, k_mx, bias):
    x_mx = MXTensor.to_mx(x, "float8_e4m3")
    w_mx = MXTensor.to_mx(w, "float4_e2m1")
    q_mx = MXTensor.to_mx(q, "float6_e2m3")
    return (
        F.linear(x_mx, w_mx, bias),
        x_mx @ w_mx.t(),
        torch.mm(x, w_mx.t()),
        q_mx @ k_mx.transpose(-2, -1),
        torch.bmm(q_mx[0], k_mx[0].mT),
        w_mx[:, 32:].t().contiguous(),  # views of MX returned from the graph
        x_mx.view(-1, 2, 64)[:, 1],
    )


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_matmuls(device, dynamic):
    def make(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, device=device)

    k_mx = MXTensor.to_mx(make(2, 3, 7, 64), "float8_e5m2")
    assert_compiles(matmuls, make(6, 128), make(10, 128), make(2, 3, 5, 64), k_mx, make(10),
                    dynamic=dynamic)


class MXModel(torch.nn.Module):
    """Two layers with packed MX weights; activations quantized to MXFP8 on the fly. (relu, not
    gelu: torch's own gelu differs between eager and inductor, for plain tensors too.)"""

    def __init__(self):
        super().__init__()
        w1, w2 = torch.randn(96, 64), torch.randn(16, 96)
        self.w1 = torch.nn.Parameter(MXTensor.to_mx(w1, "float4_e2m1"), requires_grad=False)
        self.w2 = torch.nn.Parameter(MXTensor.to_mx(w2, "float6_e3m2", 32), requires_grad=False)
        self.b1 = torch.nn.Parameter(torch.randn(96))

    def forward(self, x):
        h = F.relu(F.linear(MXTensor.to_mx(x, "float8_e4m3"), self.w1, self.b1))
        return F.linear(MXTensor.to_mx(h, "float8_e4m3"), self.w2)


@pytest.mark.parametrize("device", DEVICES)
def test_small_model_with_inductor(device):
    model = MXModel().to(device)
    assert isinstance(model.w1, MXTensor) and model.w1.device.type == device
    assert_compiles(model, torch.randn(8, 64, device=device), backend="inductor")


def test_dynamic_shapes_do_not_recompile():
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(MXModel(), fullgraph=True, backend=counter, dynamic=True)

    def quantize_rows(x):
        return MXTensor.to_mx(x, "float4_e2m1", 32).dequantize()

    compiled_q = torch.compile(quantize_rows, fullgraph=True, backend=counter, dynamic=True)
    for rows, cols in ((8, 64), (3, 64), (17, 64)):
        x = torch.randn(rows, cols)
        assert_same(compiled(x), compiled._orig_mod(x))
    for cols in (70, 64, 33, 100):  # the block axis' length (and its padding) varies too
        x = torch.randn(5, cols)
        assert_same(compiled_q(x), quantize_rows(x))
    assert counter.frame_count == 2


def test_backward_matches_eager():
    def loss(x, w):
        y = F.linear(MXTensor.to_mx(x, "float8_e4m3"), MXTensor.to_mx(w, "float4_e2m1", ste="clipped"))
        return (y * y).sum()

    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (8, 64), generator=generator).float()
    w = torch.randint(-9, 10, (16, 64), generator=generator).float()
    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(xs, ws).backward()
        grads.append((xs.grad, ws.grad))
    assert_same(grads[1], grads[0])


class MXWeightOnlyModel(MXModel):
    def forward(self, x):
        return F.linear(F.relu(F.linear(x, self.w1, self.b1)), self.w2)


def test_export_lowers_to_dequantize_mx():
    model = MXWeightOnlyModel()
    x = torch.randn(4, 64)
    program = torch.export.export(model, (x,))
    assert_same(program.module()(x), model(x))
    lowered = program.run_decompositions()
    targets = [str(node.target) for node in lowered.graph.nodes if node.op == "call_function"]
    assert targets.count("torchmx.dequantize_mx.default") == 2
    assert targets.count("torchmx.mx_matmul.default") == 2
    assert_same(lowered.module()(x), model(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_inductor_keeps_the_single_rounding_of_mx_matmuls(dtype):
    """The fp32 product is rounded to the logical dtype inside torchmx::mx_matmul, so inductor
    cannot fuse that cast into the next elementwise op (which would skip the rounding)."""
    generator = torch.Generator().manual_seed(0)
    w = MXTensor.to_mx(torch.randn(96, 64, generator=generator, dtype=dtype), "float4_e2m1")
    b = torch.randn(96, generator=generator, dtype=dtype)

    def f(x):
        x_mx = MXTensor.to_mx(x, "float8_e4m3")
        return ((x_mx @ w.t()) * 3, F.relu(F.linear(x_mx, w, b)) * 1.5,
                torch.mm(x, w.t()) + 1, torch.sigmoid(torch.matmul(x_mx, w.t())))

    assert_compiles(f, torch.randn(8, 64, generator=generator, dtype=dtype), backend="inductor")


class BiasLinears(torch.nn.Module):
    """F.linear with an MX weight and a large bias on 2-D, 3-D and non-contiguous 3-D inputs."""

    def __init__(self, dtype):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        w = torch.randn(64, 256, generator=generator, dtype=dtype)
        self.w = torch.nn.Parameter(MXTensor.to_mx(w, "float8_e4m3"), requires_grad=False)
        self.b = torch.nn.Parameter(torch.randn(64, generator=generator, dtype=dtype) * 50,
                                    requires_grad=False)

    def forward(self, x):  # x: (8, 16, 256)
        return (F.linear(x[0], self.w, self.b), F.linear(x, self.w, self.b),
                F.linear(x.transpose(0, 1), self.w, self.b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_linear_bias_is_added_in_fp32_on_every_path(dtype):
    """eager == inductor == export == export().run_decompositions(), and each is
    round(x @ w.T + b) with the bias added in fp32 (one rounding), whatever the input layout."""
    model = BiasLinears(dtype)
    x = torch.randn(8, 16, 256, generator=torch.Generator().manual_seed(2), dtype=dtype)
    eager = model(x)
    w, b = model.w.dequantize(torch.float32), model.b.float()
    for out, x_in in zip(eager, (x[0], x, x.transpose(0, 1))):
        assert_same(out, (x_in.float() @ w.t() + b).to(dtype))
    assert_same(torch.compile(model, fullgraph=True, backend="inductor")(x), eager)
    program = torch.export.export(model, (x,))
    assert_same(program.module()(x), eager)
    assert_same(program.run_decompositions().module()(x), eager)


def test_import_leaves_dynamo_unloaded_and_compile_still_keeps_to_mx_whole():
    """`import torchmx` does not import torch._dynamo (seconds of every process that never
    compiles); its allow_in_graph functions are registered when Dynamo is imported, so a
    fullgraph compile after the import still runs without a graph break, equal to eager."""
    import subprocess
    import sys

    from repo import ROOT

    code = """
import sys
import torch
import torchmx
assert "torch._dynamo" not in sys.modules, "import torchmx imported torch._dynamo"
from torchmx import MXTensor

def fn(x):
    return MXTensor.to_mx(x, "float4_e2m1", 32).dequantize()

x = torch.arange(64, dtype=torch.float32).reshape(2, 32) / 8
got = torch.compile(fn, fullgraph=True, backend="eager")(x)
assert torch.equal(got, fn(x))
from torch._dynamo import trace_rules
from torchmx import mx_tensor
assert all(id(f) in trace_rules._allowed_callable_ids for f in (mx_tensor._to_mx, mx_tensor._from_mx_function))
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]

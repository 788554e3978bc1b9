"""torch.ops.torchmx.mx_weight_linear_triton (torchmx/mx_ops/weight_matmul_compiled.py): the MX
linear whose Triton launches torch.compile makes itself.

On CPU its launches run under Triton's interpreter (torch.library.wrap_triton hands back the
kernel itself when nothing traces): plans of one launch give mx_weight_linear's bits through
their traced launch, and every other product falls back to mx_weight_linear. On a GPU,
torch.compile's graphs hold the kernel launch instead of the operator, write only the output
they allocate (no copy of a weight), and give eager's bits.
"""

import pytest
import torch

from torchmx import MXTensor, quantize_linear_
from torchmx.config import MXConfig, QLinearConfig
from torchmx.kernels.linear import dispatch
from torchmx.mx_ops import weight_matmul, weight_matmul_compiled

from matmul_operands import DEVICE, integer_operands, reference

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu  # the same checks run on the GPU where there is one

BF16, FP16 = torch.bfloat16, torch.float16
# (format, M, N, K, activation dtype, bias, the plan that `linear` builds for the product)
TRACED = [  # one launch: traced
    ("float4_e2m1", 1, 64, 256, BF16, False, "FusedPlan"),
    ("float4_e2m1", 2, 64, 64, FP16, True, "FusedPlan"),
    ("float8_e4m3", 1, 16, 256, BF16, True, "GemvPlan"),
]
UNTRACED = [  # a split-K second launch, or the tensor-core kernel: mx_weight_linear
    ("float4_e2m1", 3, 16, 128, FP16, True, "FusedPlan split"),
    ("int8", 1, 16, 8192, FP16, True, "GemvPlan split"),
    ("float4_e2m1", 16, 64, 256, BF16, True, "MmaPlan"),
]
FALLBACK = [  # dequantize + cuBLAS (or its CPU counterpart): no Triton plan
    ("float6_e2m3", 3, 20, 64, BF16),
    ("float8_e4m3", 70, 16, 64, BF16),
]


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """The kernels on CPU too (Triton's interpreter), as on the GPU."""
    monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})


@pytest.fixture(scope="module")
def op():
    weight_matmul_compiled.define()
    return torch.ops.torchmx.mx_weight_linear_triton


def _parts(w: MXTensor, fmt_name: str, K: int):
    return w._scale_e8m0, w._data, fmt_name, 32, K


def _plan_kind(x, w, K, bias, dtype) -> str:
    plan = dispatch._plan(x, w._scale_e8m0, w._data, w.elem_dtype, 32, K, bias, dtype)
    split = getattr(plan, "reduce", None) is not None
    return type(plan).__name__ + (" split" if split else "")


@pytest.fixture
def traced_outputs(monkeypatch):
    """What each call of dispatch.traced_linear returned (None: the operator fell back)."""
    outputs = []

    def spy(*args):
        outputs.append(traced_linear(*args))
        return outputs[-1]
    traced_linear = dispatch.traced_linear
    monkeypatch.setattr(dispatch, "traced_linear", spy)
    return outputs


@pytest.mark.parametrize("fmt,M,N,K,dtype,with_bias,kind", TRACED + UNTRACED, ids=str)
def test_traced_launches_give_the_operators_bits(kernels_on_cpu, op, traced_outputs, fmt, M, N,
                                                 K, dtype, with_bias, kind):
    x, w = integer_operands(fmt, M, N, K, dtype)
    bias = torch.randint(-8, 9, (N,)).to(dtype).to(DEVICE) if with_bias else None
    assert _plan_kind(x, w, K, bias, dtype) == kind  # the case covers what it says
    expected = torch.ops.torchmx.mx_weight_linear(x, *_parts(w, fmt, K), bias, dtype)
    out = op(x, *_parts(w, fmt, K), bias, dtype)
    traced = (fmt, M, N, K, dtype, with_bias, kind) in TRACED
    assert len(traced_outputs) == 1 and (traced_outputs[0] is not None) == traced
    assert out.dtype == dtype and torch.equal(out, expected)
    assert torch.equal(expected, reference(x, w, bias))  # exact sums: any order, same bits


@pytest.mark.parametrize("fmt,M,N,K,dtype", FALLBACK, ids=str)
def test_products_without_a_triton_plan_fall_back_to_mx_weight_linear(
        kernels_on_cpu, op, traced_outputs, fmt, M, N, K, dtype):
    x, w = integer_operands(fmt, M, N, K, dtype)
    expected = torch.ops.torchmx.mx_weight_linear(x, *_parts(w, fmt, K), None, dtype)
    assert torch.equal(op(x, *_parts(w, fmt, K), None, dtype), expected)
    assert traced_outputs == [None]


def test_batched_input_keeps_its_leading_dims(kernels_on_cpu, op):
    x, w = integer_operands("float4_e2m1", 6, 64, 256)
    x3 = x.reshape(2, 3, 256)
    out = op(x3, *_parts(w, "float4_e2m1", 256), None, BF16)
    assert out.shape == (2, 3, 64)
    assert torch.equal(out, torch.ops.torchmx.mx_weight_linear(
        x3, *_parts(w, "float4_e2m1", 256), None, BF16))


def test_symbolic_shapes_fall_back_to_mx_weight_linear(kernels_on_cpu, op, traced_outputs):
    """Under torch.compile's dynamic shapes the body sees symbolic sizes: no plan is made (and
    no argument memo is keyed by them); the graph keeps mx_weight_linear."""
    x, w = integer_operands("float4_e2m1", 5, 64, 256)
    linear = torch.compile(lambda x: op(x, *_parts(w, "float4_e2m1", 256), None, BF16),
                           backend="aot_eager", dynamic=True, fullgraph=True)
    torch._dynamo.reset()
    assert torch.equal(linear(x), torch.ops.torchmx.mx_weight_linear(
        x, *_parts(w, "float4_e2m1", 256), None, BF16))
    assert traced_outputs == []


def test_defined_only_where_cuda_and_triton_are(monkeypatch):
    """A CPU machine imports no Triton for it; a GPU machine whose Triton does not import is
    told that compiled graphs keep the operator call."""
    import importlib.util
    defined = []
    monkeypatch.setattr(weight_matmul_compiled, "define", lambda: defined.append(True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    weight_matmul_compiled.define_where_usable()
    assert defined == []

    def broken():
        raise ImportError("libtriton.so: cannot open shared object file")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(weight_matmul_compiled, "define", broken)
    with pytest.warns(UserWarning, match="Triton does not import.*libtriton"):
        weight_matmul_compiled.define_where_usable()


def test_bad_arguments_are_named(op):
    x, w = integer_operands("float8_e4m3", 1, 64, 256)
    with pytest.raises(ValueError, match="in_features"):
        op(x[:, :128], *_parts(w, "float8_e4m3", 256), None, BF16)
    with pytest.raises(ValueError, match="bias"):
        op(x, *_parts(w, "float8_e4m3", 256), torch.zeros(3, dtype=BF16, device=DEVICE), BF16)
    with pytest.raises(ValueError, match="elem_dtype"):
        op(x, w._scale_e8m0, w._data, "float9", 32, 256, None, BF16)


def test_traced_kernels_read_as_inductor_pastes_them():
    """Inductor (torch 2.11) pastes a launched kernel's source and globals into a string
    literal of the module it generates: an escaped newline there ends the literal (a
    SyntaxError at compile time). And its mutation analysis gives up on inline assembly that
    is not marked pure (then it copies every argument, the weight included, at each call)."""
    import inspect
    import re

    import triton.language as tl
    from torchmx.kernels.linear import byte_gemv, matmul_kernels
    from torchmx.kernels import _tl_numerics
    for module in (matmul_kernels, byte_gemv, _tl_numerics):  # the kernels it launches
        for name, value in vars(module).items():
            if isinstance(value, tl.constexpr) and isinstance(value.value, str):
                assert "\n" not in value.value, f"{module.__name__}.{name}"
        source = inspect.getsource(module)
        assert "\\n" not in source, module.__name__
        assert not re.search(r"is_pure=False", source), module.__name__


def test_compile_traces_take_the_operator_and_export_does_not(kernels_on_cpu, monkeypatch):
    """What `_route` asks while MXTensor's handlers run: True under torch.compile (torch 2.11
    flags only dynamo's capture as compiling, not the AOT dispatch that runs the handlers),
    False under torch.export (saved programs keep mx_weight_linear) and in eager calls."""
    asked = []
    supported = dispatch.supported

    def spy(*args):
        asked.append(weight_matmul._compiling_not_exporting())
        return supported(*args)
    monkeypatch.setattr(dispatch, "supported", spy)
    x, w = integer_operands("float4_e2m1", 1, 64, 256)

    class Linear(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.linear(x, w)
    torch._dynamo.reset()
    torch.compile(Linear(), backend="aot_eager")(x)
    assert asked and all(asked)
    asked.clear()
    torch.export.export(Linear(), (x,))
    assert asked and not any(asked)
    asked.clear()
    with torch.inference_mode(False):
        torch.nn.functional.linear(x.requires_grad_(), w)
    assert asked == [False]


# ---- torch.compile on a GPU ------------------------------------------------------------------

# (format, rows, whether inductor launches the kernels itself): 16 rows take the tensor-core
# kernel, 80 rows dequantize + cuBLAS: the operator.
COMPILED = [("float4_e2m1", 1, True), ("float8_e4m3", 1, True), ("float4_e2m1", 16, False),
            ("float4_e2m1", 80, False)]
_OUTPUTS = {"out_ptr", "ws_ptr", "partials_ptr"}  # the kernels' output and partials arguments


def _model(fmt: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.SiLU(),
                                torch.nn.Linear(256, 128, bias=False))
    model = model.to(device="cuda", dtype=BF16)
    quantize_linear_(model, QLinearConfig(MXConfig(fmt), None))
    return model


def _forward_graph(model, x):
    """The functional graph torch.compile hands its backend for model(x)."""
    from torch._dynamo.backends.common import aot_autograd
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(model, backend=aot_autograd(fw_compiler=keep))(x)
    return graphs[0]


@pytest.mark.skipif(not CUDA, reason="torch.compile of the CUDA kernels")
@pytest.mark.parametrize("fmt,rows,inlined", COMPILED, ids=str)
@torch.no_grad()
def test_compiled_graph_launches_the_kernels(fmt, rows, inlined):
    model = _model(fmt)
    x = torch.randn(rows, 512, device="cuda", dtype=BF16)
    graph = _forward_graph(model, x)
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    launches = [node for node in graph.graph.nodes if node.op == "call_function"
                and node.target is torch.ops.higher_order.triton_kernel_wrapper_functional]
    opaque = [t for t in targets if "torchmx.mx_weight_linear" in t]
    if inlined:
        assert launches and not opaque, targets
    else:
        assert not launches and len(opaque) == 2, targets
    for node in launches:  # no weight, input or bias is copied for the launch
        assert set(node.kwargs["tensors_to_clone"]) <= _OUTPUTS, node.kwargs["tensors_to_clone"]

    torch._dynamo.reset()
    compiled = torch.compile(model)
    for _ in range(2):
        assert torch.equal(compiled(x), model(x))


@pytest.mark.skipif(not CUDA, reason="torch.compile of the CUDA kernels")
@torch.no_grad()
def test_export_keeps_mx_weight_linear():
    """Saved programs name mx_weight_linear: torch.export does not take the triton_op."""
    model = _model("float4_e2m1")
    x = torch.randn(1, 512, device="cuda", dtype=BF16)
    program = torch.export.export(model, (x,))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert any("torchmx.mx_weight_linear.default" in t for t in targets), targets
    assert not any("mx_weight_linear_triton" in t or "triton_kernel_wrapper" in t
                   for t in targets), targets
    assert torch.equal(program.module()(x), model(x))

"""torch.export of MX models: MXInferenceLinear (weight-only, with MX activations, prepacked)
and models with MXTensor parameters export to programs of torchmx custom ops that equal eager
bit for bit, and survive torch.export.save -> torch.export.load in a fresh process."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from formats import bit_view
from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import MXInferenceLinear, MXLinear

ROOT = Path(__file__).resolve().parents[2]


class MXParameterModel(nn.Module):
    """A model holding an MXTensor parameter and an MXTensor buffer (no MXInferenceLinear)."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        w = torch.randn(32, 64, generator=generator)
        self.w = nn.Parameter(MXTensor.to_mx(w, "float6_e2m3"), requires_grad=False)
        self.b = nn.Parameter(torch.randn(32, generator=generator), requires_grad=False)
        v = torch.randn(64, 32, generator=generator)
        self.register_buffer("v", MXTensor.to_mx(v, "float8_e4m3", block_dim=0))

    def forward(self, x):
        return F.linear(F.relu(x), self.w, self.b) + x @ self.v


class QuantizeInForward(nn.Module):
    """MXTensors built inside forward (to_mx of the input and of a parameter) in F.linear,
    `@` and torch.matmul, blocks along K and off it."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64, generator=torch.Generator().manual_seed(4)))

    def forward(self, x):
        x_mx = MXTensor.to_mx(x, "float8_e4m3")
        return (F.linear(x_mx, MXTensor.to_mx(self.w, "float4_e2m1"), self.w[:, 0]),
                x_mx @ MXTensor.to_mx(self.w.t(), "int8", block_dim=0),
                torch.matmul(x, MXTensor.to_mx(self.w.t(), "float6_e3m2", block_dim=0)),
                x_mx.dequantize() * 2)


def packed(weights, activations=None, *, bias=True, dtype=torch.float32, shape=(48, 64)):
    torch.manual_seed(0)
    linear = nn.Linear(shape[1], shape[0], bias=bias, dtype=dtype)
    qconfig = QLinearConfig(MXConfig(weights), activations and MXConfig(activations))
    return nn.Sequential(MXInferenceLinear.from_float(linear, qconfig), nn.GELU())


def case(name):
    """(model, input) of each exported case."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 64, generator=generator)
    if name == "w4":
        return packed("float4_e2m1"), x
    if name == "w6_no_bias":
        return packed("float6_e3m2", bias=False), x
    if name == "int8_bf16_3d":
        return packed("int8", dtype=torch.bfloat16), x.bfloat16().reshape(3, 1, 64)
    if name == "w4a8":
        return packed("float4_e2m1", "float8_e4m3"), x
    if name == "w8a6_bf16":
        return packed("float8_e5m2", "float6_e2m3", dtype=torch.bfloat16), x.bfloat16()
    if name == "w4_prepacked":
        model = packed("float4_e2m1", shape=(64, 64))
        model[0].prepack()
        return model, x
    if name == "mx_parameter":
        return MXParameterModel(), x
    if name == "mxlinear_qat":
        torch.manual_seed(0)
        qconfig = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))
        return MXLinear(64, 32, qconfig=qconfig), x
    if name == "quantize_in_forward":
        return QuantizeInForward(), x
    raise AssertionError(name)


CASES = ["w4", "w6_no_bias", "int8_bf16_3d", "w4a8", "w8a6_bf16", "w4_prepacked", "mx_parameter",
         "mxlinear_qat", "quantize_in_forward"]


@functools.lru_cache(maxsize=None)
def exported(name):
    """(input, eager output, exported program) of a case, exported once for all tests."""
    model, x = case(name)
    with torch.no_grad():
        return x, model(x), torch.export.export(model, (x,))


def assert_same(actual, expected):
    """Bitwise equality of a tensor or a tuple of tensors."""
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
        return
    assert actual.dtype == expected.dtype and torch.equal(bit_view(actual), bit_view(expected))


def call_targets(program):
    return {str(node.target) for node in program.graph.nodes if node.op == "call_function"}


@pytest.mark.parametrize("name", CASES)
def test_export_equals_eager(name):
    x, eager, program = exported(name)
    with torch.no_grad():
        assert_same(program.module()(x), eager)
    torchmx_ops = {t for t in call_targets(program) if t.startswith("torchmx.")}
    expected = {
        "w4_prepacked": {"torchmx.mx_fp4_fragment_linear.default"},
        "mx_parameter": {"torchmx.mx_linear.default",  # on the MXTensor parameter
                         "torchmx.mx_matmul.default"},  # on the MXTensor buffer
        "mxlinear_qat": {"torchmx.quantize_mx.default", "torchmx.dequantize_mx.default",
                         "torchmx.mx_linear.default"},
        "w4a8": {"torchmx.quantize_mx.default", "torchmx.dequantize_mx.default",
                 "torchmx.mx_matmul.default"},
        "w8a6_bf16": {"torchmx.quantize_mx.default", "torchmx.dequantize_mx.default",
                      "torchmx.mx_matmul.default"},
        "quantize_in_forward": {"torchmx.quantize_mx.default", "torchmx.dequantize_mx.default",
                                "torchmx.mx_matmul.default"},
    }.get(name, {"torchmx.dequantize_mx.default", "torchmx.mx_matmul.default"})
    assert torchmx_ops == expected


def test_lowered_mx_parameter_program():
    """run_decompositions() turns the MXTensor parameter and buffer into their uint8 parts."""
    x, eager, program = exported("mx_parameter")
    lowered = program.run_decompositions()
    assert {k: v.dtype for k, v in lowered.state_dict.items()} == {
        "parametrizations.w.original0": torch.uint8, "parametrizations.w.original1": torch.uint8,
        "b": torch.float32,
        "parametrizations.v.original0": torch.uint8, "parametrizations.v.original1": torch.uint8}
    with torch.no_grad():
        assert torch.equal(bit_view(lowered.module()(x)), bit_view(eager))


def test_packed_program_holds_plain_tensors():
    """An MXInferenceLinear's program: the packed bytes as uint8 buffers, no MXTensor."""
    model, x = case("w4a8")
    program = torch.export.export(model, (x,))
    assert {k: v.dtype for k, v in program.state_dict.items()} == {
        "0.weight_scale": torch.uint8, "0.weight_data": torch.uint8, "0.bias": torch.float32}
    assert not any(isinstance(v, MXTensor) for v in program.state_dict.values())


class ViewInForward(nn.Module):
    def forward(self, x):
        return torch.matmul(x, MXTensor.to_mx(x, "float8_e4m3").t())


def test_other_ops_on_an_mx_tensor_built_in_forward_raise_a_clear_error():
    with pytest.raises(TypeError, match="t on an MXTensor built inside the exported forward"):
        torch.export.export(ViewInForward(), (torch.randn(3, 64),))


def test_export_with_a_dynamic_batch():
    model, x = case("w4a8")
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    x7 = torch.randn(7, 64)
    with torch.no_grad():
        assert torch.equal(bit_view(program.module()(x7)), bit_view(model(x7)))


def test_saved_programs_load_in_a_fresh_process(tmp_path):
    """torch.export.save, then torch.export.load in a new interpreter (which imports torchmx
    to register the ops): every program gives the same bits as the eager model."""
    expected = {}
    for name in CASES:
        x, eager, program = exported(name)
        torch.export.save(program, tmp_path / f"{name}.pt2")
        expected[name] = (x, eager)
    torch.export.save(exported("mx_parameter")[2].run_decompositions(),
                      tmp_path / "mx_parameter_lowered.pt2")
    expected["mx_parameter_lowered"] = expected["mx_parameter"]
    torch.save(expected, tmp_path / "expected.pt")
    script = f"""
import torch, torchmx
from formats import bit_view
expected = torch.load({str(tmp_path / "expected.pt")!r}, weights_only=True)
for name, (x, y) in expected.items():
    program = torch.export.load({str(tmp_path)!r} + "/" + name + ".pt2")
    with torch.no_grad():
        out = program.module()(x)
    out, y = (out, y) if isinstance(y, tuple) else ((out,), (y,))
    print(name, all(torch.equal(bit_view(a), bit_view(b)) for a, b in zip(out, y)))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "support")]))
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = dict(line.split() for line in result.stdout.splitlines())
    assert lines == {name: "True" for name in expected}

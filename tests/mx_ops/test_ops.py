"""The custom ops: schema, opcheck, dispatch, fake kernels, torch.compile."""

import pytest
import torch
from torch.library import opcheck

import torchmx
from formats import FORMAT_IDS, FORMATS, ROUNDINGS, SCALE_MODES, bit_view, wide_range_input
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference
from torchmx.ops import backend_for


def test_schemas_keep_torchmx_010_positional_arguments():
    assert str(torch.ops.torchmx.quantize_mx.default._schema) == (
        "torchmx::quantize_mx(Tensor data_hp, str elem_dtype_name, SymInt block_size, *, "
        'str scale_mode="floor", str rounding="even", SymInt block_dim=-1, SymInt? seed=None) '
        "-> (Tensor, Tensor)")
    assert str(torch.ops.torchmx.dequantize_mx.default._schema) == (
        "torchmx::dequantize_mx(Tensor data_lp, Tensor shared_exp_e8m0, str elem_dtype_name, "
        "SymInt block_size, ScalarType target_dtype=6, SymInt block_dim=-1, *, "
        "SymInt? block_dim_size=None) -> Tensor")


# opcheck checks the registration (schema, fake kernels, autograd and compile dispatch), which
# the format changes (shapes of the packed data) and the options only pass through: every format
# once, every scale mode and rounding among them. Their numerics: test_ops_equal_reference here,
# the whole option matrix in tests/numerics and tests/kernels/quantize/test_cpu_backend.py.
OPCHECK_CASES = [(fmt, SCALE_MODES[i % len(SCALE_MODES)], ROUNDINGS[i % len(ROUNDINGS)])
                 for i, fmt in enumerate(FORMATS)]


@pytest.mark.parametrize("fmt,scale_mode,rounding", OPCHECK_CASES,
                         ids=[f"{f.name}-{m}-{r}" for f, m, r in OPCHECK_CASES])
def test_opcheck(fmt, scale_mode, rounding):
    x = wide_range_input((4, 45), torch.bfloat16, seed=1)
    kwargs = dict(scale_mode=scale_mode, rounding=rounding, block_dim=0, seed=5)
    opcheck(torch.ops.torchmx.quantize_mx.default, (x, fmt.name, 3), kwargs)
    scale, data = torch.ops.torchmx.quantize_mx(x, fmt.name, 32, scale_mode=scale_mode,
                                                rounding=rounding, seed=5)
    opcheck(torch.ops.torchmx.dequantize_mx.default, (data, scale, fmt.name, 32, torch.float16, -1),
            dict(block_dim_size=45))


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_ops_equal_reference(fmt):
    x = wide_range_input((33, 70), torch.float32, seed=2)
    for axis in (0, 1):
        expected = quantize_mx_reference(x, fmt, 32, scale_mode="even", block_dim=axis)
        got = torch.ops.torchmx.quantize_mx(x, fmt.name, 32, scale_mode="even", block_dim=axis)
        assert all(torch.equal(e, g) for e, g in zip(expected, got))
        out = torch.ops.torchmx.dequantize_mx(got[1], got[0], fmt.name, 32, torch.bfloat16, axis,
                                              block_dim_size=x.shape[axis])
        ref = dequantize_mx_reference(got[1], got[0], fmt, 32, torch.bfloat16, axis,
                                      block_dim_size=x.shape[axis])
        assert torch.equal(bit_view(out), bit_view(ref))


def test_forced_reference_backend(monkeypatch):
    x = wide_range_input((8, 64), torch.bfloat16)
    fast = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32)
    from torchmx.kernels.quantize import backends
    monkeypatch.setattr(backends, "FORCE_REFERENCE", True)
    assert backend_for(torch.device("cpu")) == "reference"
    slow = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32)
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


def test_zero_dim_input_is_a_one_element_vector():
    scale, data = torch.ops.torchmx.quantize_mx(torch.tensor(3.0), "float6_e2m3", 32)
    assert scale.shape == (1,) and data.shape == (3,)
    out = torch.ops.torchmx.dequantize_mx(data, scale, "float6_e2m3", 32, block_dim_size=1)
    assert out.tolist() == [3.0]


def test_stochastic_without_seed_follows_torch_manual_seed():
    x = torch.randn(4, 64)
    torch.manual_seed(0)
    a = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32, rounding="stochastic")[1]
    torch.manual_seed(0)
    b = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32, rounding="stochastic")[1]
    assert torch.equal(a, b)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_matches_eager(dynamic):
    def roundtrip(x):
        scale, data = torch.ops.torchmx.quantize_mx(x, "float4_e2m1", 32, scale_mode="rceil")
        return torch.ops.torchmx.dequantize_mx(data, scale, "float4_e2m1", 32, torch.bfloat16,
                                               block_dim_size=x.shape[-1]) * 2

    compiled = torch.compile(roundtrip, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for shape in [(16, 64), (7, 96)]:
        x = wide_range_input(shape, torch.bfloat16, seed=4)
        assert torch.equal(bit_view(compiled(x)), bit_view(roundtrip(x)))


def test_version_and_public_names():
    assert torchmx.__version__ == "0.2.0"
    from torchmx import dtypes  # noqa: F401  (fails in torchmx 0.1.0 without MXTensor too)

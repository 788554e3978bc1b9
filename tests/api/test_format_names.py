"""Format names the ecosystem uses (OCP "mxfp4", torch's "float8_e4m3fn", torch dtypes) resolve
in torchmx.dtypes, so every entry point (dtypes, configs, MXTensor.to_mx, the ops, the model
API) takes them and gives the bits of the canonical name."""

import pytest
import torch
from torch import nn

from torchmx import MXTensor, dtypes
from torchmx.config import MXConfig, QLinearConfig
from torchmx.quant_api import quantize_linear_

CANONICAL = {
    "mxfp8": "float8_e4m3", "mxfp8_e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3",
    "fp8_e4m3": "float8_e4m3", "mxfp8_e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
    "mxfp6_e3m2": "float6_e3m2", "float6_e3m2fn": "float6_e3m2", "fp6_e3m2": "float6_e3m2",
    "mxfp6_e2m3": "float6_e2m3", "float6_e2m3fn": "float6_e2m3", "fp6_e2m3": "float6_e2m3",
    "mxfp4": "float4_e2m1", "mxfp4_e2m1": "float4_e2m1", "float4_e2m1fn": "float4_e2m1",
    "float4_e2m1fn_x2": "float4_e2m1", "fp4_e2m1": "float4_e2m1", "mxint8": "int8",
}
TORCH_DTYPES = {torch.float8_e4m3fn: "float8_e4m3", torch.float8_e5m2: "float8_e5m2",
                torch.int8: "int8", torch.float4_e2m1fn_x2: "float4_e2m1"}


def test_alias_table_is_the_documented_one():
    assert {alias: d.name for alias, d in dtypes.ALIASES.items()} == CANONICAL
    assert {t: d.name for t, d in dtypes.TORCH_DTYPE_TO_ELEM_DTYPE.items()} == TORCH_DTYPES
    # the torchmx 0.1.0 table keeps the canonical names only
    assert set(dtypes.STR_TO_SUPPORTED_ELEM_DTYPE) == set(CANONICAL.values()) | {"float8_e5m2"}


@pytest.mark.parametrize("alias", sorted(CANONICAL))
def test_every_alias_resolves_everywhere(alias):
    canonical = dtypes.from_name(CANONICAL[alias])
    assert dtypes.from_name(alias) is canonical and dtypes.resolve(alias) is canonical
    assert MXConfig(alias) == MXConfig(CANONICAL[alias])
    assert MXConfig(alias).to_dict()["elem_dtype_name"] == CANONICAL[alias]


@pytest.mark.parametrize("torch_dtype", list(TORCH_DTYPES), ids=str)
def test_torch_dtypes_resolve(torch_dtype):
    assert dtypes.resolve(torch_dtype).name == TORCH_DTYPES[torch_dtype]
    assert MXConfig(torch_dtype).elem_dtype_name == TORCH_DTYPES[torch_dtype]


@pytest.mark.parametrize("name, fmt", [("mxfp4", torch.float4_e2m1fn_x2),
                                       ("float8_e4m3fn", torch.float8_e4m3fn),
                                       ("mxfp6_e2m3", dtypes.float6_e2m3), ("mxint8", torch.int8)])
def test_ops_and_to_mx_give_the_canonical_bits(name, fmt):
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)) * 10
    canonical = CANONICAL[name]
    scale, data = torch.ops.torchmx.quantize_mx(x, canonical, 32)
    alias_scale, alias_data = torch.ops.torchmx.quantize_mx(x, name, 32)
    assert torch.equal(alias_scale, scale) and torch.equal(alias_data, data)
    assert torch.equal(torch.ops.torchmx.dequantize_mx(data, scale, name, 32),
                       torch.ops.torchmx.dequantize_mx(data, scale, canonical, 32))
    for given in (name, fmt):
        mx = MXTensor.to_mx(x, given)
        assert torch.equal(mx.dequantize(), MXTensor.to_mx(x, canonical).dequantize())


@pytest.mark.parametrize("qconfig", ["mxfp4", torch.float4_e2m1fn_x2, dtypes.float4_e2m1,
                                     MXConfig("float4_e2m1")], ids=str)
def test_quantize_linear_takes_a_weight_format(qconfig):
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    quantize_linear_(model, qconfig)
    assert model[0].qconfig == model[2].qconfig == QLinearConfig(MXConfig("float4_e2m1"))


@pytest.mark.parametrize("call, error, words", [
    (lambda: dtypes.from_name("mxfp6"), ValueError, "'mxfp6' is ambiguous.*'mxfp6_e2m3'.*'mxfp6_e3m2'"),
    (lambda: MXConfig("mxfp6"), ValueError, "'mxfp6' is ambiguous"),
    (lambda: dtypes.from_name("mxfp5"), ValueError,
     "unknown elem_dtype 'mxfp5'; allowed: float8_e4m3.*mxfp4"),
    (lambda: dtypes.resolve(torch.float16), ValueError,
     "elem_dtype torch.float16 is not an MX element format; allowed torch dtypes: torch.float8_e4m3fn"),
    (lambda: dtypes.resolve(torch.float8_e4m3fnuz), ValueError, "not an MX element format"),
    (lambda: MXConfig(torch.bfloat16), ValueError, "not an MX element format"),
    (lambda: MXConfig(8), TypeError, "elem_dtype_name must be a format name, a torchmx.dtypes.DType"),
    (lambda: MXTensor.to_mx(torch.ones(32), torch.float32), ValueError, "not an MX element format"),
])
def test_bad_names(call, error, words):
    with pytest.raises(error, match=words):
        call()

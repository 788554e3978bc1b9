"""The torchao configs (nested and flat, torchao-style names) and torchao as an optional extra:
`import torchmx` never imports torchao; asking for a torchao config without it says what to
install."""

import importlib
import importlib.util
import subprocess
import sys

import pytest
import torch
from torch import nn

import torchmx
from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import MXInferenceLinear
from torchmx.quant_api import quantize_linear_


def net():
    torch.manual_seed(0)
    model = nn.Module()
    model.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    model.lm_head = nn.Linear(64, 16)
    model.forward = lambda x: model.lm_head(model.body(x))
    return model


def test_import_torchmx_does_not_import_torchao():
    code = ("import sys, torchmx, torchmx.quant_api, torchmx.nn; "
            "assert 'torchao' not in sys.modules, 'torchao imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_torchao_config_without_torchao_says_what_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao... -> ImportError
    monkeypatch.delitem(sys.modules, "torchmx.nn.torchao_config", raising=False)
    monkeypatch.delattr(torchmx.nn, "torchao_config", raising=False)
    quant_api = importlib.import_module("torchmx.quant_api")
    for name in ("MXWeightOnlyConfig", "MXDynamicActivationMXWeightConfig",
                 "MXInferenceLinearConfig", "MXQATConfig"):
        with pytest.raises(ImportError, match=r"need torchao: pip install 'torchmx\[torchao\]'"):
            getattr(quant_api, name)
    with pytest.raises(ImportError, match=r"torchmx\[torchao\]"):
        quant_api.mx_dynamic_activation_mx_weights()


# The tests below need torchao (the tests above must run without it).
requires_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                      reason="needs torchao: pip install 'torchmx[torchao]'")


def config(name, *args, **kwargs):
    return getattr(importlib.import_module("torchmx.quant_api"), name)(*args, **kwargs)


@requires_torchao
@pytest.mark.parametrize("args, kwargs, nested", [
    (("MXWeightOnlyConfig",), dict(weight_dtype="mxfp4"), QLinearConfig(MXConfig("float4_e2m1"))),
    (("MXWeightOnlyConfig", torch.float8_e5m2), dict(block_size=16, scale_mode="rceil"),
     QLinearConfig(MXConfig("float8_e5m2", 16, "rceil"))),
    (("MXWeightOnlyConfig",), {}, QLinearConfig(MXConfig("float8_e4m3"))),
    (("MXDynamicActivationMXWeightConfig",), {},
     QLinearConfig(MXConfig("float8_e4m3"), MXConfig("float8_e4m3"))),
    (("MXDynamicActivationMXWeightConfig",),
     dict(activation_dtype=torch.float8_e4m3fn, weight_dtype="mxfp4", rounding="away"),
     QLinearConfig(MXConfig("float4_e2m1", rounding="away"), MXConfig("float8_e4m3", rounding="away"))),
    (("MXInferenceLinearConfig", "mxfp6_e2m3"), {}, QLinearConfig(MXConfig("float6_e2m3"))),
], ids=str)
def test_flat_configs_quantize_like_the_nested_ones(args, kwargs, nested):
    torchao_quantization = importlib.import_module("torchao.quantization")
    flat = config(*args, **kwargs)
    assert flat.qconfig == nested
    model, reference = net(), net()
    torchao_quantization.quantize_(model, flat)
    quantize_linear_(reference, nested)
    for name in ("body.0", "body.2", "lm_head"):  # lm_head included on both paths
        assert isinstance(model.get_submodule(name), MXInferenceLinear)
        assert model.get_submodule(name).qconfig == nested
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))


@requires_torchao
def test_qat_config_takes_a_format_name():
    from torchao.quantization import quantize_

    model = net()
    quantize_(model, config("MXQATConfig", "mxfp8"))
    assert type(model.lm_head) is torchmx.MXLinear
    assert model.lm_head.qconfig == QLinearConfig(MXConfig("float8_e4m3"))


@requires_torchao
@pytest.mark.parametrize("make, error, words", [
    (lambda: config("MXWeightOnlyConfig", weight_dtype="mxfp6"), ValueError, "'mxfp6' is ambiguous"),
    (lambda: config("MXWeightOnlyConfig", weight_dtype=torch.bfloat16), ValueError,
     "not an MX element format"),
    (lambda: config("MXWeightOnlyConfig", block_size=0), ValueError, "block_size must be an int >= 1"),
    (lambda: config("MXDynamicActivationMXWeightConfig", activation_dtype=None), TypeError,
     "elem_dtype_name must be"),
    (lambda: config("MXDynamicActivationMXWeightConfig", scale_mode="round"), ValueError,
     "scale_mode must be one of"),
    (lambda: config("MXInferenceLinearConfig", None), TypeError,
     "qconfig must be a torchmx.config.QLinearConfig"),
    (lambda: config("MXQATConfig", 3), TypeError, "qconfig must be a torchmx.config.QLinearConfig"),
])
def test_bad_configs(make, error, words):
    with pytest.raises(error, match=words):
        make()

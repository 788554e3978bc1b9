"""Configs: validation with clear errors, dict round trip, torchmx 0.1.0 dicts load."""

import pytest

from torchmx import dtypes
from torchmx.config import MXConfig, QAttentionConfig, QLinearConfig, QLinearGradConfig


def test_mxconfig_defaults_and_dtype():
    cfg = MXConfig("float4_e2m1")
    assert (cfg.block_size, cfg.scale_mode, cfg.rounding) == (32, "floor", "even")
    assert cfg.elem_dtype is dtypes.float4_e2m1
    assert MXConfig(dtypes.ExMy(1, 2)).elem_dtype_name == "e1m2"


def test_round_trip_nested():
    linear = QLinearConfig(MXConfig("float6_e3m2", 16, scale_mode="rceil"),
                           MXConfig("float8_e4m3"), grad_config=MXConfig("float8_e5m2", rounding="stochastic"))
    attention = QAttentionConfig(linear, *[MXConfig("int8", 64)] * 4)
    per_role = QLinearConfig(MXConfig("float4_e2m1"), grad_config=QLinearGradConfig(
        dgrad_grad_output_config=MXConfig("float8_e5m2"), wgrad_input_config=MXConfig("int8", 16)))
    for cfg in (linear, attention, per_role, QAttentionConfig(linear), QLinearConfig(MXConfig("int8"))):
        assert type(cfg).load_from_dict(cfg.to_dict()) == cfg


def test_grad_config_shorthand_is_uniform():
    e5m2 = MXConfig("float8_e5m2", rounding="stochastic")
    cfg = QLinearConfig(MXConfig("float4_e2m1"), grad_config=e5m2)
    assert cfg.grad_config == QLinearGradConfig.uniform(e5m2) == QLinearGradConfig(e5m2, e5m2, e5m2, e5m2)
    assert cfg.to_dict()["grad_config"]["wgrad_input_config"] == e5m2.to_dict()


def test_torchmx_010_dict_loads():
    old = {"weights_config": {"elem_dtype_name": "float6_e3m2", "block_size": 32},
           "activations_config": {"elem_dtype_name": "float8_e4m3", "block_size": 32}}
    cfg = QLinearConfig.load_from_dict(old)
    assert cfg.weights_config == MXConfig("float6_e3m2") and cfg.activations_config == MXConfig("float8_e4m3")


@pytest.mark.parametrize("make, error, words", [
    (lambda: MXConfig("fp4"), ValueError, "unknown elem_dtype 'fp4'"),
    (lambda: MXConfig("int8", block_size=0), ValueError, "block_size must be an int >= 1"),
    (lambda: MXConfig("int8", scale_mode="round"), ValueError, "scale_mode must be one of floor, ceil, even, rceil"),
    (lambda: MXConfig("int8", rounding="nearest"), ValueError, "rounding must be one of even, away"),
    (lambda: QLinearConfig("int8"), TypeError, "weights_config must be an MXConfig"),
    (lambda: QLinearConfig(MXConfig("int8"), grad_config="float8_e5m2"), TypeError,
     "grad_config must be a QLinearGradConfig, an MXConfig or None"),
    (lambda: QLinearGradConfig(dgrad_weight_config="int8"), TypeError,
     "dgrad_weight_config must be an MXConfig or None"),
    (lambda: QLinearGradConfig.uniform(None), TypeError, "config must be an MXConfig"),
    (lambda: QAttentionConfig(QLinearConfig(MXConfig("int8")), query_config=MXConfig("int8")),
     ValueError, "all or none of query_config"),
    (lambda: MXConfig.load_from_dict({"elem_dtype_name": "int8", "blocksize": 4}), ValueError,
     "unknown keys ['blocksize']"),
    (lambda: QLinearConfig.load_from_dict({}), ValueError,
     "QLinearConfig: missing required keys ['weights_config']"),
    (lambda: MXConfig.load_from_dict({"block_size": 32}), ValueError,
     "MXConfig: missing required keys ['elem_dtype_name']"),
    (lambda: QAttentionConfig.load_from_dict({"query_config": None}), ValueError,
     "missing required keys ['projection_config']"),
])
def test_bad_configs(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


def test_mxconfig_quantize_and_to_mx_use_its_options():
    import torch

    from torchmx import MXTensor

    cfg = MXConfig("float6_e2m3", 16, scale_mode="rceil")
    x = torch.randn(4, 48, generator=torch.Generator().manual_seed(0))
    scale, data = cfg.quantize(x, 0)
    ref_scale, ref_data = torch.ops.torchmx.quantize_mx(x, "float6_e2m3", 16, scale_mode="rceil",
                                                        block_dim=0)
    assert torch.equal(scale, ref_scale) and torch.equal(data, ref_data)
    mx = cfg.to_mx(x, -1)
    ref = MXTensor.to_mx(x, "float6_e2m3", 16, scale_mode="rceil")
    assert isinstance(mx, MXTensor) and mx.dtype == x.dtype
    assert torch.equal(mx.dequantize(), ref.dequantize())

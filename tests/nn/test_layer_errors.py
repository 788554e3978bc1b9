"""Every bad argument of the nn layers (MXLinear, MXInferenceLinear, mx_linear, fake_quantize,
mx_attention) is a ValueError or TypeError naming the layer or function, the argument and
what it allows."""

import pytest
import torch

from torchmx.config import MXConfig, QAttentionConfig, QLinearConfig
from torchmx.nn import MXInferenceLinear, MXLinear, mx_linear
from torchmx.nn.attention import mx_attention
from torchmx.nn.functional import fake_quantize

Q = QLinearConfig(MXConfig("int8"))
LAYERS = [MXLinear, MXInferenceLinear]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("kwargs, error, message", [
    ({"in_features": -1}, ValueError, "in_features must be an int >= 0, got -1"),
    ({"out_features": -4}, ValueError, "out_features must be an int >= 0, got -4"),
    ({"in_features": 64.5}, TypeError, "in_features must be an int >= 0, got float 64.5"),
    ({"out_features": "4"}, TypeError, "out_features must be an int >= 0, got str '4'"),
    ({"in_features": True}, TypeError, "in_features must be an int >= 0, got bool"),
    ({"bias": "yes"}, TypeError, "bias must be True or False, got str 'yes'"),
    ({"bias": None}, TypeError, "bias must be True or False, got NoneType"),
    ({"dtype": torch.float64}, ValueError,
     r"dtype must be None or one of torch.float32, torch.bfloat16, torch.float16, got "
     r"torch.float64"),
    ({"dtype": "float32"}, ValueError, "dtype must be None or one of"),
    ({"device": "gpu"}, ValueError, "device must be None, a torch.device, a device string"),
    ({"qconfig": None}, TypeError, "qconfig must be a torchmx.config.QLinearConfig, got NoneType"),
    ({"qconfig": MXConfig("int8")}, TypeError, "qconfig must be a torchmx.config.QLinearConfig"),
])
def test_constructor_arguments(layer, kwargs, error, message):
    arguments = {"in_features": 64, "out_features": 4, "qconfig": Q, **kwargs}
    with pytest.raises(error, match=message) as caught:
        layer(**arguments)
    if "qconfig" not in kwargs:
        assert str(caught.value).startswith(f"{layer.__name__}: ")


@pytest.mark.parametrize("layer", LAYERS, ids=lambda c: c.__name__)
def test_zero_features_are_allowed_as_in_nn_linear(layer):
    assert layer(0, 0, qconfig=Q).in_features == 0


def built(layer):
    linear = torch.nn.Linear(64, 4)
    return layer.from_float(linear, Q)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("x, error, message", [
    (torch.randn(2, 32), ValueError, r"input of shape \(2, 32\) must end in in_features=64"),
    (torch.tensor(1.0), ValueError, r"input of shape \(\) must end in in_features=64"),
    (torch.randn(2, 64, dtype=torch.float64), TypeError,
     "input must have dtype torch.float32, torch.bfloat16, torch.float16, got torch.float64"),
    (torch.ones(2, 64, dtype=torch.int64), TypeError, "input must have dtype"),
    ([[1.0] * 64], TypeError, "input must be a torch.Tensor, got list"),
], ids=["shape", "0-d", "float64", "int64", "list"])
def test_forward_input(layer, x, error, message):
    model = built(layer)
    with pytest.raises(error, match=message) as caught:
        model(x)
    assert str(caught.value).startswith(f"{layer.__name__}(in_features=64, out_features=4): ")


def test_mx_linear_function():
    x, w = torch.randn(2, 64), torch.randn(4, 64)
    with pytest.raises(TypeError, match="qconfig must be a torchmx.config.QLinearConfig, got str"):
        mx_linear(x, w, None, "int8")
    with pytest.raises(TypeError, match="weight must be a torch.Tensor, got list"):
        mx_linear(x, [[0.0] * 64], None, Q)
    with pytest.raises(ValueError, match=r"weight must be 2-d \(out_features, in_features\), "
                                         r"got shape \(\)"):
        mx_linear(x, torch.tensor(1.0), None, Q)
    with pytest.raises(TypeError, match="bias must be a torch.Tensor, got float"):
        mx_linear(x, w, 1.0, Q)
    with pytest.raises(ValueError, match=r"mx_linear: input of shape \(2, 32\) must end in "
                                         "in_features=64"):
        mx_linear(torch.randn(2, 32), w, None, Q)


def test_fake_quantize_arguments():
    with pytest.raises(TypeError, match=r'config must be a torchmx.config.MXConfig or None '
                                        r'\(e.g. MXConfig\("int8"\)\), got str'):
        fake_quantize(torch.randn(4, 32), "int8")
    with pytest.raises(TypeError, match="config must be a torchmx.config.MXConfig or None, got "
                                        "QLinearConfig"):
        fake_quantize(torch.randn(4, 32), Q)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        fake_quantize([1.0], MXConfig("int8"))


def qkv(q_shape=(1, 4, 3, 32), kv_shape=(1, 2, 3, 32)):
    return torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)


@pytest.mark.parametrize("change, error, message", [
    ({"config": "int8"}, TypeError,
     "config must be a torchmx.config.QAttentionConfig or None, got str"),
    ({"query": torch.randn(3, 32)}, ValueError,
     r"query must be 4-d \(batch, heads, length, head_dim\), got shape \(3, 32\)"),
    ({"key": torch.randn(1, 3, 3, 32)}, ValueError, "key and value must have one shape"),
    ({"query": torch.randn(1, 3, 3, 32)}, ValueError,
     r"key/value \(1, 2, 3, 32\) must match query \(1, 3, 3, 32\) .* with query's heads a "
     "multiple of theirs"),
    ({"query": torch.randn(1, 4, 3, 16)}, ValueError, r"key/value .* must match query \(1, 4, 3, 16\) in batch and head_dim"),
    ({"value": torch.randn(1, 2, 3, 32, dtype=torch.float64)}, TypeError,
     "value must have dtype"),
    ({"attention_mask": torch.zeros(2, 5)}, ValueError,
     r"attention_mask of shape \(2, 5\) must broadcast to the scores' shape \(1, 4, 3, 3\)"),
    ({"attention_mask": [[0.0]]}, TypeError, "attention_mask must be a torch.Tensor"),
    ({"scaling": "0.1"}, TypeError, "scaling must be a float, got str"),
    ({"scaling": float("nan")}, ValueError, "scaling must be finite, got nan"),
    ({"dropout": 2.0}, ValueError, r"dropout must be a float in \[0, 1\], got 2.0"),
    ({"dropout": None}, ValueError, r"dropout must be a float in \[0, 1\], got None"),
])
def test_mx_attention_arguments(change, error, message):
    query, key, value = qkv()
    arguments = {"query": query, "key": key, "value": value, "attention_mask": None,
                 "config": None, "scaling": 0.1, "causal": True, "dropout": 0.0, **change}
    if "key" in change:
        arguments["value"] = value
    with pytest.raises(error, match=f"mx_attention: {message}"):
        mx_attention(**arguments)


def test_mx_attention_still_runs_with_good_arguments():
    query, key, value = qkv()
    config = QAttentionConfig(Q, MXConfig("float8_e4m3"), MXConfig("float8_e4m3"),
                              MXConfig("float8_e4m3"), MXConfig("float8_e4m3"))
    out, probs = mx_attention(query, key, value, torch.zeros(3, 3), config, scaling=0.1,
                              causal=False)
    assert out.shape == (1, 3, 4, 32) and probs.shape == (1, 4, 3, 3)

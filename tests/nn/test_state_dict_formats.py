"""MX models in the state-dict writers people use: tensors only, bit for bit.

A model quantized with quantize_linear_ saves with safetensors' save_model, torch.save (loaded
with weights_only=True) and transformers' save_pretrained (tests/huggingface/test_hf_quantizer.py); each
layer's config travels as a uint8 tensor of JSON text. Checkpoints written before that, with a
dict extra state, still load (tests/nn/data: written by torchmx 0.2 before the change).
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import extra_state
from torchmx.quant_api import quantize_linear_

DATA = Path(__file__).parent / "data"
W8A8 = QLinearConfig(MXConfig("int8"), MXConfig("float8_e4m3"))


def build(seed: int = 0) -> nn.Module:
    """The model of tests/nn/data/dict_extra_state_v0.2.pt."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16, bias=False))
    quantize_linear_(model, "mxfp4", include="^0$")
    quantize_linear_(model, W8A8, include="^2$")
    return model


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_state_dict_holds_tensors_only():
    state = build().state_dict()
    assert all(type(v) is torch.Tensor for v in state.values())
    assert extra_state.decode(state["0._extra_state"]) == {
        "version": 1, "qconfig": QLinearConfig(MXConfig("float4_e2m1")).to_dict()}


def test_safetensors_save_model_round_trip(tmp_path):
    saved, fresh = build(seed=0), build(seed=1)
    save_model(saved, tmp_path / "m.safetensors")
    missing, unexpected = load_model(fresh, tmp_path / "m.safetensors")
    assert not missing and not unexpected
    assert_same_tensors(saved.state_dict(), fresh.state_dict())
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(saved(x), fresh(x))


def test_torch_save_weights_only_round_trip(tmp_path):
    saved = build(seed=0)
    torch.save(saved.state_dict(), tmp_path / "m.pt")
    with torch.device("meta"):
        fresh = build(seed=1)
    fresh.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True), assign=True)
    assert_same_tensors(saved.state_dict(), fresh.state_dict())


def test_checkpoint_with_dict_extra_state_still_loads():
    state = torch.load(DATA / "dict_extra_state_v0.2.pt", weights_only=True)
    assert isinstance(state["0._extra_state"], dict)  # the format this test keeps readable
    io = torch.load(DATA / "dict_extra_state_v0.2_io.pt", weights_only=True)
    model = build(seed=1)
    model.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(model(io["x"]), io["y"])
    assert torch.equal(model.state_dict()["0.weight_data"], state["0.weight_data"])


def test_config_mismatch_is_still_refused():
    state = build().state_dict()
    other = nn.Sequential(nn.Linear(64, 32))
    quantize_linear_(other, "mxfp6_e3m2")
    state = {k: v for k, v in state.items() if k.startswith("0.")}
    state["0.weight_data"] = other.state_dict()["0.weight_data"]
    with pytest.raises(ValueError, match=r"quantized with \[weights=float4_e2m1/32.*this layer "
                                         r"with \[weights=float6_e3m2/32"):
        other.load_state_dict(state)


@pytest.mark.parametrize("value, words", [
    (torch.tensor([1, 2], dtype=torch.int32), "must be 1-d uint8"),
    (torch.tensor([0xff, 0xfe], dtype=torch.uint8), "not UTF-8 JSON"),
    (extra_state.encode({"version": 7}), "unrecognized extra state"),
])
def test_bad_extra_state_tensor_names_the_layer(value, words):
    layer = build()[0]
    state = layer.state_dict()
    state["_extra_state"] = value
    with pytest.raises(ValueError, match=r"MXInferenceLinear\(in_features=64, out_features=32\): .*"
                                         + words):
        layer.load_state_dict(state)

"""MXShardedInferenceLinear in one process: the layer FSDP2 shards (2-rank runs in
tests/distributed/test_distributed.py) computes and saves exactly what MXInferenceLinear does."""

import pytest
import torch
from torch import nn

import torchmx
from formats import FORMAT_IDS, FORMATS
from torchmx.distributed import MXShardedInferenceLinear, prepare_fsdp_inference_


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_same_outputs_and_state_dict(fmt):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 16), nn.ReLU(), nn.Linear(16, 9, bias=False))
    torchmx.quantize_linear_(model, fmt.name, progress=False)
    x = torch.randn(3, 128, dtype=torch.float32)
    expected, state = model(x), model.state_dict()
    assert prepare_fsdp_inference_(model) == ["0", "2"]
    assert all(isinstance(model[i], MXShardedInferenceLinear) for i in (0, 2))
    assert torch.equal(model(x).view(torch.int32), expected.view(torch.int32))
    mine = model.state_dict()
    assert set(mine) == set(state)
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(mine[name], value), name
    with torch.no_grad():
        model[0].weight_packed.zero_()
    model.load_state_dict(state)  # MXInferenceLinear's entries load back into the packed one
    assert torch.equal(model(x).view(torch.int32), expected.view(torch.int32))


def test_refusals():
    layer = torchmx.MXInferenceLinear.from_float(nn.Linear(64, 64), torchmx.QLinearConfig(
        weights_config=torchmx.MXConfig("mxfp4")))
    sharded = MXShardedInferenceLinear.from_layer(layer)
    with pytest.raises(ValueError, match="prepack"):
        sharded.prepack()
    with pytest.raises(TypeError, match="layer must be an MXInferenceLinear"):
        MXShardedInferenceLinear.from_layer(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        prepare_fsdp_inference_(None)

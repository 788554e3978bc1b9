"""`torchmx inspect` on the MX checkpoints that exist besides torchmx's own files: safetensors
written by save_model / save_pretrained, gpt-oss's MXFP4 experts, compressed-tensors' MX
layers, and a plain full-precision file (said to be one)."""

import re
from pathlib import Path

import torch
from safetensors.torch import save_file, save_model
from torch import nn

from torchmx.inspect_checkpoint import describe
from torchmx.quant_api import quantize_linear_


def test_save_model_file(tmp_path: Path):
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    quantize_linear_(model, "mxfp8", progress=False)
    save_model(model, tmp_path / "m.safetensors")
    out = describe(tmp_path / "m.safetensors")
    assert "2 MX layers" in out and "float8_e4m3" in out and "[32, 64]" in out
    assert "8.25 bits/weight" in out and "_extra_state" not in out


def test_gpt_oss_and_compressed_tensors_layouts(tmp_path: Path):
    u8 = torch.uint8
    tensors = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.zeros(4, 128, 2, 16, dtype=u8),
        "model.layers.0.mlp.experts.gate_up_proj_scales": torch.full((4, 128, 2), 127, dtype=u8),
        "fc4.weight_packed": torch.zeros(8, 32, dtype=u8),
        "fc4.weight_scale": torch.full((8, 2), 120, dtype=u8),
        "fc6.weight_packed": torch.zeros(8, 48, dtype=u8),
        "fc6.weight_scale": torch.full((8, 2), 120, dtype=u8),
        "fc8.weight": torch.zeros(8, 64, dtype=torch.float8_e4m3fn),
        "fc8.weight_scale": torch.full((8, 2), 120, dtype=u8),
        "norm.weight": torch.ones(64),
    }
    save_file(tensors, tmp_path / "m.safetensors")
    out = describe(tmp_path / "m.safetensors")
    assert "4 MX layers" in out
    lines = out.splitlines()

    def line(name):
        return next(x for x in lines if x.startswith(name + " "))

    assert "float4_e2m1" in line("model.layers.0.mlp.experts.gate_up_proj")
    assert re.search(r"gpt-oss mxfp4 experts +\[4, 128, 64\]", line("model.layers.0.mlp.experts.gate_up_proj"))
    assert "float4_e2m1" in line("fc4") and re.search(r"compressed-tensors +\[8, 64\]", line("fc4"))
    assert "float6_e2m3" in line("fc6") and "6.25 bits/weight" in line("fc6")
    assert "float8_e4m3" in line("fc8") and "8.25 bits/weight" in line("fc8")
    assert line("norm.weight")  # listed with the other tensors
    assert "2^0" in out and "2^-7" in out  # the scale histogram counts these layouts too


def test_full_precision_file_is_said_to_be_one(tmp_path: Path):
    save_model(nn.Linear(16, 8), tmp_path / "fp.safetensors")
    out = describe(tmp_path / "fp.safetensors")
    assert "0 MX layers" in out and "a full-precision checkpoint: no MX tensors" in out

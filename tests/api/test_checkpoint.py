"""Checkpoints: state_dict and safetensors round trips are bit-exact into freshly built models
(meta device included); torch.load(weights_only=True) in a fresh process; mismatched and
corrupted checkpoints raise clear errors."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import extra_state
from torchmx.quant_api import quantize_linear_
from torchmx.serialization import load_safetensors, read_safetensors, save_safetensors

FP4 = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))
INT8 = QLinearConfig(MXConfig("int8", 16), None)
MIXED = {r"^0$": FP4, r"^2$": INT8, r"^4$": QLinearConfig(MXConfig("float6_e3m2", scale_mode="rceil"))}


def build(seed=0, device=None, dtype=torch.bfloat16, configs=MIXED):
    """nn.Sequential of three linears (K=80: partial blocks), each quantized differently."""
    with torch.device(device or "cpu"):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(80, 96), nn.GELU(), nn.Linear(96, 72, bias=False),
                              nn.GELU(), nn.Linear(72, 16)).to(dtype)
    for pattern, qconfig in configs.items():
        quantize_linear_(model, qconfig, include=pattern)
    return model


def assert_same_state(a: nn.Module, b: nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if isinstance(sa[key], torch.Tensor):
            assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key
        else:
            assert sa[key] == sb[key], key


X = torch.randn(4, 80).bfloat16()


def test_state_dict_round_trip_bit_exact(tmp_path):
    saved = build(seed=0)
    torch.save(saved.state_dict(), tmp_path / "model.pt")
    fresh = build(seed=1)
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    fresh.load_state_dict(state)
    assert_same_state(saved, fresh)
    with torch.no_grad():
        assert torch.equal(saved(X), fresh(X))


def test_weights_only_load_in_a_fresh_process(tmp_path):
    saved = build(seed=0)
    torch.save(saved.state_dict(), tmp_path / "model.pt")
    torch.save(X, tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import torch, torchmx
        from torch import nn
        from torchmx.config import MXConfig, QLinearConfig
        from torchmx.quant_api import quantize_linear_
        state = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=True)
        model = nn.Sequential(nn.Linear(80, 96), nn.GELU(), nn.Linear(96, 72, bias=False),
                              nn.GELU(), nn.Linear(72, 16)).to(torch.bfloat16)
        quantize_linear_(model, QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3")),
                         include="^0$")
        quantize_linear_(model, QLinearConfig(MXConfig("int8", 16)), include="^2$")
        quantize_linear_(model, QLinearConfig(MXConfig("float6_e3m2", scale_mode="rceil")), include="^4$")
        model.load_state_dict(state)
        with torch.no_grad():
            torch.save(model(torch.load({str(tmp_path / 'x.pt')!r}, weights_only=True)),
                       {str(tmp_path / 'y.pt')!r})
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        assert torch.equal(torch.load(tmp_path / "y.pt", weights_only=True), saved(X))


@pytest.mark.parametrize("device", [None, "meta"])
def test_safetensors_round_trip_into_fresh_model(tmp_path, device):
    saved = build(seed=0)
    path = tmp_path / "model.safetensors"
    save_safetensors(saved, path, metadata={"note": "hello"})
    fresh = build(seed=1, device=device)
    assert load_safetensors(fresh, path) == {"note": "hello"}
    assert_same_state(saved, fresh)
    with torch.no_grad():
        assert torch.equal(saved(X), fresh(X))


def test_safetensors_stores_plain_uint8_and_config(tmp_path):
    from safetensors import safe_open

    save_safetensors(build(), tmp_path / "m.safetensors")
    with safe_open(tmp_path / "m.safetensors", "pt") as f:
        assert f.get_tensor("0.weight_data").dtype == torch.uint8
        assert f.get_tensor("2.weight_data").dtype == torch.uint8  # MXINT8 codes as bytes
        assert f.get_tensor("0.weight_scale").shape == (96, 3)
        assert '"elem_dtype_name": "float6_e3m2"' in f.metadata()["torchmx.extra_state"]


def test_tied_weights_saved_once_and_stay_tied(tmp_path):
    def tied():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(32, 64), nn.Linear(64, 64), nn.Linear(64, 32, bias=False))
        model[2].weight = model[0].weight
        quantize_linear_(model, FP4, include="^1$")
        return model

    save_safetensors(tied(), tmp_path / "t.safetensors")
    fresh = tied()
    nn.init.zeros_(fresh[0].weight)
    load_safetensors(fresh, tmp_path / "t.safetensors")
    assert fresh[2].weight is fresh[0].weight and fresh[0].weight.abs().sum() > 0


@pytest.mark.parametrize("fresh, words", [
    (lambda: build(configs={r"^0$": QLinearConfig(MXConfig("float8_e4m3"))}),
     r"0.weight_data: checkpoint torch.uint8 \(96, 40\), model torch.uint8 \(96, 80\)"),
    (lambda: build(dtype=torch.float32), r"0.bias: checkpoint torch.bfloat16 \(96,\), model torch.float32"),
    (lambda: build(configs={r"^0$": FP4, r"^2$": INT8}),
     r"missing from the checkpoint: '4.weight'\n  "
     r"not in the model: '4.weight_data', '4.weight_scale', '4._extra_state'"),
    (lambda: nn.Sequential(build(), nn.Linear(2, 2)), r"missing from the checkpoint: '0.0.bias'"),
])
def test_mismatched_checkpoint(tmp_path, fresh, words):
    save_safetensors(build(), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="does not match the model:[\\s\\S]*" + words):
        load_safetensors(fresh(), tmp_path / "m.safetensors")


def test_same_shapes_different_format_is_refused(tmp_path):
    e4m3 = {r"^0$": QLinearConfig(MXConfig("float8_e4m3"))}
    e5m2 = {r"^0$": QLinearConfig(MXConfig("float8_e5m2"))}
    save_safetensors(build(configs=e4m3), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=r"checkpoint was quantized with \[weights=float8_e4m3/32"):
        load_safetensors(build(configs=e5m2), tmp_path / "m.safetensors")


def test_corrupted_checkpoints(tmp_path):
    path = tmp_path / "m.safetensors"
    save_safetensors(build(), path)
    blob = bytearray(path.read_bytes())

    flipped = tmp_path / "flipped.safetensors"
    blob[-5] ^= 0x10  # one bit in the last tensor's data
    flipped.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="corrupted: checksum mismatch for"):
        load_safetensors(build(), flipped)
    with pytest.raises(ValueError, match="corrupted: checksum mismatch for"):
        read_safetensors(flipped)  # what `torchmx inspect` reads safetensors files with
    from torchmx.inspect_checkpoint import read_state
    with pytest.raises(ValueError, match="corrupted: checksum mismatch for"):
        read_state(flipped)

    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(bytes(blob[: len(blob) // 2]))
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_safetensors(build(), truncated)

    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_safetensors(build(), garbage)

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, foreign)
    with pytest.raises(ValueError, match="not a torchmx checkpoint"):
        load_safetensors(build(), foreign)

    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_safetensors(build(), tmp_path / "missing.safetensors")


def test_save_errors(tmp_path):
    with pytest.raises(ValueError, match="is on the meta device"):
        save_safetensors(build(device="meta"), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="metadata must map str to str"):
        save_safetensors(build(), tmp_path / "m.safetensors", metadata={"torchmx.x": "1"})
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        save_safetensors({}, tmp_path / "m.safetensors")


def test_non_strict_load_into_meta_model_refuses_to_leave_meta_tensors(tmp_path):
    path = tmp_path / "m.safetensors"
    save_safetensors(build(), path)
    with torch.device("meta"):
        fresh = build()
        fresh.add_module("extra", nn.Linear(8, 8))
    with pytest.raises(ValueError, match=r"on the meta device in the model.*'extra.weight'"):
        load_safetensors(fresh, path, strict=False)
    assert fresh.extra.weight.is_meta  # nothing loaded
    real = build(seed=1)
    real.add_module("extra", nn.Linear(8, 8))
    load_safetensors(real, path, strict=False)  # not meta: the extra layer keeps its values


def test_read_safetensors_without_a_model(tmp_path):
    model = build()
    path = tmp_path / "m.safetensors"
    save_safetensors(model, path, metadata={"note": "hi"})
    tensors, extra, metadata = read_safetensors(path)
    state = model.state_dict()
    assert set(tensors) | set(extra) == set(state)
    assert all(torch.equal(tensors[k], state[k]) for k in tensors)
    assert extra["0._extra_state"] == extra_state.decode(state["0._extra_state"])
    assert metadata["note"] == "hi" and metadata["torchmx.format"] == "torchmx"

"""compressed-tensors' MX checkpoints (mxfp4-pack-quantized, mxfp6-pack-quantized,
mxfp8-quantized): tensors built here per its documented layout read bit-exactly, and tiny
models round-trip through its format bit for bit."""

import json

import pytest
import torch
from safetensors import safe_open

from torchmx import compressed_tensors as ct
from torchmx.config import MXConfig, QLinearConfig
from torchmx.mx_tensor import MXTensor
from torchmx.nn import extra_state

OUT, IN = 8, 64


def e2m1(code: int) -> float:
    """E2M1 per OCP MX: bias 1, exponent 0 subnormal."""
    e, m = code >> 1 & 3, code & 1
    value = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -value if code & 8 else value


def e2m3(code: int) -> float:
    e, m = code >> 3 & 3, code & 7
    value = m / 8 if e == 0 else (1 + m / 8) * 2.0 ** (e - 1)
    return -value if code & 32 else value


def mx_args(bits, dynamic=False):
    return {"num_bits": bits, "type": "float", "symmetric": True, "group_size": 32,
            "strategy": "group", "dynamic": dynamic, "scale_dtype": "torch.uint8"}


def config(bits, fmt, targets=("Linear",), activations=None, ignore=()):
    return {"quant_method": "compressed-tensors", "quantization_status": "compressed",
            "format": fmt, "ignore": list(ignore), "config_groups": {"group_0": {
                "targets": list(targets), "weights": mx_args(bits),
                "input_activations": activations, "format": fmt}}}


def layer_tensors(bits, seed=0):
    """(tensors of layer "fc" in compressed-tensors' layout, the values they mean)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.randint(100, 140, (OUT, IN // 32), dtype=torch.uint8, generator=g)
    factor = torch.pow(2.0, scale.float() - 127).repeat_interleave(32, 1)
    if bits == 8:
        codes = torch.randint(0, 256, (OUT, IN), dtype=torch.uint8, generator=g)
        codes[(codes & 0x7F) == 0x7F] = 0x11  # no NaN codes
        weight = codes.view(torch.float8_e4m3fn)
        return {"fc.weight": weight, "fc.weight_scale": scale}, weight.float() * factor
    if bits == 4:
        codes = torch.randint(0, 16, (OUT, IN), dtype=torch.int32, generator=g)
        packed = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8)  # element 2j low
        table = torch.tensor([e2m1(c) for c in range(16)])
    else:
        codes = torch.randint(0, 64, (OUT, IN), dtype=torch.int32, generator=g)
        c = codes.reshape(OUT, IN // 4, 4)
        word = c[..., 0] | c[..., 1] << 6 | c[..., 2] << 12 | c[..., 3] << 18
        packed = torch.stack([word, word >> 8, word >> 16], -1).reshape(OUT, -1).to(torch.uint8)
        table = torch.tensor([e2m3(c) for c in range(64)])
    return {"fc.weight_packed": packed, "fc.weight_scale": scale}, table[codes] * factor


@pytest.mark.parametrize("bits, fmt, name", [(4, "mxfp4-pack-quantized", "float4_e2m1"),
                                             (6, "mxfp6-pack-quantized", "float6_e2m3"),
                                             (8, "mxfp8-quantized", "float8_e4m3")])
def test_reads_the_documented_layout_bit_exactly(bits, fmt, name):
    tensors, values = layer_tensors(bits)
    tensors["fc.bias"] = torch.randn(OUT)
    state = ct.to_torchmx(tensors, config(bits, fmt))
    assert state["fc.bias"] is tensors["fc.bias"]
    assert extra_state.decode(state["fc._extra_state"])["qconfig"] == \
        QLinearConfig(MXConfig(name)).to_dict()
    mx = MXTensor(state["fc.weight_scale"], state["fc.weight_data"], name, 32, torch.float32,
                  block_dim=1, shape=(OUT, IN))
    assert torch.equal(mx.dequantize(), values)
    # and back: the same bytes under the same names
    back, back_config = ct.from_torchmx(state)
    assert back.keys() == tensors.keys()
    for key in tensors:
        assert back[key].dtype == tensors[key].dtype and torch.equal(
            back[key].view(torch.uint8) if back[key].dtype != torch.float32 else back[key],
            tensors[key].view(torch.uint8) if tensors[key].dtype != torch.float32 else tensors[key])
    assert back_config["format"] == fmt
    assert back_config["config_groups"]["group_0"]["weights"] == mx_args(bits)


def test_dynamic_mx_activations_and_name_targets():
    tensors, _ = layer_tensors(4)
    cfg = config(4, "mxfp4-pack-quantized", targets=["re:^f"], activations=mx_args(8, True))
    state = ct.to_torchmx(tensors, cfg)
    qconfig = QLinearConfig.load_from_dict(extra_state.decode(state["fc._extra_state"])["qconfig"])
    assert qconfig.activations_config == MXConfig("float8_e4m3", scale_mode="even")


@pytest.mark.parametrize("change, words", [
    (lambda c: c.update(quant_method="torchao"), "must be a compressed-tensors config"),
    (lambda c: c.update(quantization_status="frozen"), "only 'compressed' checkpoints"),
    (lambda c: c.update(ignore=["fc"]), "fc: has MX tensors but is in the config's ignore list"),
    (lambda c: c["config_groups"]["group_0"].update(targets=["other"]), "no config group targets it"),
    (lambda c: c["config_groups"]["group_0"]["weights"].update(group_size=16), "not an MX format"),
    (lambda c: c["config_groups"]["group_0"]["weights"].update(type="int"), "not an MX format"),
    (lambda c: c["config_groups"]["group_0"].update(input_activations=mx_args(8, False)),
     "static activation scales are not MX"),
])
def test_bad_configs(change, words):
    tensors, _ = layer_tensors(4)
    cfg = config(4, "mxfp4-pack-quantized")
    change(cfg)
    with pytest.raises(ValueError, match=words):
        ct.to_torchmx(tensors, cfg)


def test_bad_tensors():
    tensors, _ = layer_tensors(4)
    tensors["fc.weight_packed"] = tensors["fc.weight_packed"][:, :-1]
    with pytest.raises(ValueError, match=r"fc: fc.weight_packed torch.uint8 \(8, 31\)"):
        ct.to_torchmx(tensors, config(4, "mxfp4-pack-quantized"))


@pytest.mark.parametrize("qconfig, words", [
    (QLinearConfig(MXConfig("int8")), "weights in int8"),
    (QLinearConfig(MXConfig("mxfp4", 16)), "weights in float4_e2m1, blocks of 16"),
    (QLinearConfig(MXConfig("mxfp4"), MXConfig("mxfp8")), "activations with scale_mode 'floor'"),
])
def test_what_compressed_tensors_cannot_hold(qconfig, words):
    from torch import nn

    from torchmx.quant_api import quantize_linear_

    model = nn.Sequential(nn.Linear(64, 8))
    quantize_linear_(model, qconfig)
    with pytest.raises(ValueError, match="0: " + words):
        ct.from_torchmx(model.state_dict())


def mixed_llama():
    """A tiny Llama with MXFP4 MLPs, MXFP8 q/k and MXFP6 v/o projections (MXFP8 activations)."""
    transformers = pytest.importorskip("transformers")
    from torchmx.quant_api import OUTPUT_HEADS, quantize_linear_

    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    quantize_linear_(model, "mxfp4", include="mlp", exclude=OUTPUT_HEADS)
    quantize_linear_(model, "mxfp8", include="q_proj|k_proj")
    quantize_linear_(model, QLinearConfig(MXConfig("float6_e2m3"),
                                          MXConfig("float8_e4m3", scale_mode="even")),
                     include="v_proj|o_proj")
    return model


def assert_same_model(model, loaded):
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    tokens = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, loaded(tokens).logits)


def test_model_round_trip(tmp_path):
    model = mixed_llama()
    ct.save_pretrained(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert saved["format"] == "mixed-precision" and len(saved["config_groups"]) == 3
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert f.get_tensor("model.layers.0.mlp.up_proj.weight_packed").shape == (128, 32)
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("model.layers.0.self_attn.v_proj.weight_scale").shape == (32, 2)
    assert_same_model(model, ct.from_pretrained(tmp_path, dtype=torch.float32))


def test_sharded_round_trip(tmp_path):
    """max_shard_size splits the tensors into shards (each module's tensors in one) with
    transformers' index file; they load back bit for bit, also when another writer put a
    module's tensors in two shards."""
    from safetensors.torch import load_file, save_file

    model = mixed_llama()
    ct.save_pretrained(model, tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (tmp_path / "model.safetensors").exists()
    total, keys = 0, set()
    for shard in shards:
        tensors = load_file(tmp_path / shard)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        modules = {key.rpartition(".")[0] for key in tensors}
        assert size <= 40_000 or len(modules) == 1
        assert all(index["weight_map"][key] == shard for key in tensors)
        total, keys = total + size, keys | tensors.keys()
    assert keys == index["weight_map"].keys() and index["metadata"]["total_size"] == total
    assert_same_model(model, ct.from_pretrained(tmp_path, dtype=torch.float32))

    # a module split over two shards
    moved = next(key for key in index["weight_map"] if key.endswith(".weight_scale")
                 and index["weight_map"][key] != shards[-1])
    a, b = index["weight_map"][moved], shards[-1]
    first, last = load_file(tmp_path / a), load_file(tmp_path / b)
    last[moved] = first.pop(moved)
    save_file(first, tmp_path / a)
    save_file(last, tmp_path / b)
    assert_same_model(model, ct.from_pretrained(tmp_path, dtype=torch.float32))


@pytest.mark.parametrize("size", [0, -3, "5XB", "GB", None, 1.5])
def test_bad_max_shard_size(size, tmp_path):
    with pytest.raises(ValueError, match="max_shard_size"):
        ct.save_pretrained(mixed_llama(), tmp_path, max_shard_size=size)

"""transformers round trips through torchmx.TorchMXConfig (tiny models built from configs).

from_pretrained(full precision, quantization_config=TorchMXConfig(...)) quantizes each weight as
it is read; save_pretrained writes safetensors and the config; from_pretrained(saved) rebuilds
the MX layers from their packed bytes, bit for bit.
"""

import json
import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import torchmx  # noqa: E402
from torchmx import MXInferenceLinear, TorchMXConfig  # noqa: E402
from torchmx.config import MXConfig, QLinearConfig  # noqa: E402
from torchmx.huggingface import quantizer as hf_quantizer  # noqa: E402
from torchmx.quant_api import OUTPUT_HEADS, quantize_linear_, quantize_llm_  # noqa: E402

TOKENS = torch.tensor([[1, 5, 9, 2, 7, 3]])


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory):
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, tie_word_embeddings=False)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama") / "float"
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def assert_same_state(a, b):
    a, b = a.state_dict(), b.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def logits(model):
    with torch.no_grad():
        return model(TOKENS).logits


@pytest.mark.parametrize("weights, activations, dtype", [
    ("mxfp4", None, torch.float32),
    ("float6_e3m2", "float8_e4m3", torch.bfloat16),
])
def test_quantize_while_loading_save_and_reload(float_checkpoint, tmp_path, monkeypatch,
                                                weights, activations, dtype):
    convert = hf_quantizer._QuantizeLinear.convert
    calls = []

    def watched(self, input_dict, model=None, **kwargs):
        # No layer holds a full-precision weight while another one is quantized.
        loaded = [name for name, m in model.named_modules()
                  if type(m) is torch.nn.Linear and name != "lm_head" and not m.weight.is_meta]
        calls.append(loaded)
        return convert(self, input_dict, model=model, **kwargs)

    monkeypatch.setattr(hf_quantizer._QuantizeLinear, "convert", watched)
    config = TorchMXConfig(weights=weights, activations=activations)
    model = AutoModelForCausalLM.from_pretrained(float_checkpoint, quantization_config=config,
                                                 dtype=dtype)
    assert len(calls) == 14 and not any(calls)  # 2 layers x 7 linears; lm_head kept
    expected = AutoModelForCausalLM.from_pretrained(float_checkpoint, dtype=dtype)
    quantize_linear_(expected, QLinearConfig(MXConfig(weights), activations and MXConfig(activations)),
                     exclude=OUTPUT_HEADS)
    assert_same_state(model, expected)
    assert torch.equal(logits(model), logits(expected))

    model.save_pretrained(tmp_path / "mx")
    saved = json.loads((tmp_path / "mx" / "config.json").read_text())["quantization_config"]
    assert TorchMXConfig.from_dict(saved) == model.config.quantization_config
    assert saved == {**config.to_dict(), "modules_to_not_convert": ["lm_head"]}  # as resolved
    calls.clear()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "mx", dtype=dtype)
    assert calls == []  # rebuilt from the packed bytes, nothing quantized again
    assert isinstance(reloaded.model.layers[0].mlp.up_proj, MXInferenceLinear)
    assert isinstance(reloaded.config.quantization_config, TorchMXConfig)
    assert_same_state(model, reloaded)
    assert torch.equal(logits(model), logits(reloaded))


def test_quantize_llm_model_saved_with_its_layer_configs(float_checkpoint, tmp_path):
    """Mixed configs (MXFP8 projections, MXFP4 MLPs) come back from each layer's extra state."""
    model = AutoModelForCausalLM.from_pretrained(float_checkpoint, dtype=torch.float32)
    quantize_llm_(model, "mxfp8", "mxfp4", exclude=OUTPUT_HEADS)
    model.config.quantization_config = TorchMXConfig(weights="mxfp4",
                                                     modules_to_not_convert=["lm_head"])
    model.save_pretrained(tmp_path / "mixed")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "mixed", dtype=torch.float32)
    layer = reloaded.model.layers[1]
    assert layer.self_attn.q_proj.qconfig.weights_config.elem_dtype_name == "float8_e4m3"
    assert layer.mlp.down_proj.qconfig.weights_config.elem_dtype_name == "float4_e2m1"
    assert_same_state(model, reloaded)
    assert torch.equal(logits(model), logits(reloaded))


def test_quantize_llm_attention_matmuls_saved_and_restored(float_checkpoint, tmp_path):
    """quantize_llm_'s MX attention matmuls (q/k/v/probs configs) travel in config.json and are
    applied again by from_pretrained: the same modules, config and implementation, the same
    logits bit for bit; a config naming a module the model lacks is a ValueError."""
    from torchmx.config import QAttentionConfig
    from torchmx.nn import attention as mx_attention

    fp8 = MXConfig("float8_e4m3")
    attention = QAttentionConfig(QLinearConfig(fp8), fp8, MXConfig("float8_e5m2"), fp8, fp8)
    model = AutoModelForCausalLM.from_pretrained(float_checkpoint, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    quantize_llm_(model, attention, "mxfp4", exclude=[OUTPUT_HEADS, r"layers\.1\.self_attn$"])
    model.config.quantization_config = TorchMXConfig(modules_to_not_convert=["lm_head"])
    model.save_pretrained(tmp_path / "mx")
    saved = json.loads((tmp_path / "mx" / "config.json").read_text())
    assert saved[mx_attention.MODEL_CONFIG_KEY] == {"modules": ["model.layers.0.self_attn"],
                                                    "config": attention.to_dict()}
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "mx", dtype=torch.float32,
                                                    attn_implementation="sdpa")
    assert reloaded.config._attn_implementation == "torchmx_sdpa"
    layers = reloaded.model.layers
    assert getattr(layers[0].self_attn, mx_attention.CONFIG_ATTRIBUTE) == attention
    assert not hasattr(layers[1].self_attn, mx_attention.CONFIG_ATTRIBUTE)
    assert torch.equal(logits(model), logits(reloaded))

    saved[mx_attention.MODEL_CONFIG_KEY]["modules"] = ["model.layers.7.self_attn"]
    (tmp_path / "mx" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="model.layers.7.self_attn"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "mx", dtype=torch.float32)


def test_torchao_config_path_raises_a_clear_error(float_checkpoint, caplog, monkeypatch):
    pytest.importorskip("torchao")
    from transformers import TorchAoConfig

    from torchmx.quant_api import MXInferenceLinearConfig

    # transformers collects the error of each weight, logs its load report, then raises.
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    with pytest.raises(RuntimeError, match="issues during automatic conversion"):
        AutoModelForCausalLM.from_pretrained(
            float_checkpoint, quantization_config=TorchAoConfig(MXInferenceLinearConfig("mxfp4")))
    assert "use from_pretrained(..., quantization_config=torchmx.TorchMXConfig" in caplog.text


def test_config_dict_round_trip_and_names():
    config = TorchMXConfig(weights=MXConfig("mxfp8", scale_mode="rceil"), activations="mxfp4",
                           modules_to_not_convert=["lm_head", "mlp.gate"])
    assert TorchMXConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert config.qconfig == QLinearConfig(MXConfig("float8_e4m3", scale_mode="rceil"),
                                           MXConfig("float4_e2m1"))
    assert torchmx.TorchMXConfig is TorchMXConfig


@pytest.mark.parametrize("kwargs, error, words", [
    ({"weights": 3}, TypeError, "weights must be a format name"),
    ({"weights": "fp5"}, ValueError, "unknown elem_dtype 'fp5'"),
    ({"activations": {"elem_dtype_name": "mxfp8", "block": 4}}, ValueError, "activations: .*unknown keys"),
    ({"modules_to_not_convert": "lm_head"}, TypeError, "modules_to_not_convert must be a list"),
    ({"quant_method": "torchao"}, ValueError, "quant_method must be 'torchmx'"),
    ({"weight_dtype": "mxfp4"}, TypeError, r"unexpected arguments \['weight_dtype'\]"),
])
def test_bad_config_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        TorchMXConfig(**kwargs)

"""gpt-oss MXFP4 experts: the Hugging Face layout read as MXTensors without a copy, bit-exact
against transformers' own dequantization, run through transformers' GptOss model class, and
saved back byte for byte (tiny GptOss configs, CPU)."""

import pytest
import torch

pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from transformers import (AutoModelForCausalLM, GptOssConfig, GptOssForCausalLM,  # noqa: E402
                          Mxfp4Config)
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402

from torchmx.huggingface import gpt_oss  # noqa: E402

TOKENS = torch.tensor([[3, 17, 42, 5, 9, 60, 1]])
MXFP4_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def tiny_gpt_oss(seed=0):
    config = GptOssConfig(vocab_size=64, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                          max_position_embeddings=32, sliding_window=8,
                          layer_types=["sliding_attention", "full_attention"],
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(seed)
    return GptOssForCausalLM(config).eval()


def logits(model):
    with torch.no_grad():
        return model(TOKENS).logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scales", ["typical", "low to high"])
def test_experts_mx_is_transformers_dequantization_bit_for_bit(dtype, scales):
    torch.manual_seed(0)
    blocks = torch.randint(0, 256, (3, 8, 2, 16), dtype=torch.uint8)
    if scales == "typical":
        scale = torch.randint(110, 135, (3, 8, 2), dtype=torch.uint8)
    else:  # 2^-121 to 2^114 (255 is NaN in OCP MX, 2^128 for transformers)
        scale = torch.arange(48, dtype=torch.uint8).reshape(3, 8, 2) * 5 + 6
    mx = gpt_oss.experts_mx(blocks, scale, dtype)
    assert mx.shape == (3, 8, 64) and mx.dtype == dtype
    assert mx._data.data_ptr() == blocks.data_ptr() and mx._scale_e8m0 is scale  # no copy
    theirs = convert_moe_packed_tensors(blocks, scale, dtype=dtype)  # [E, K, N]
    assert torch.equal(mx.dequantize().transpose(1, 2).view(torch.int16 if dtype == torch.bfloat16
                                                              else torch.int32),
                       theirs.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))


def test_moe_block_runs_through_the_model_class():
    model = tiny_gpt_oss()
    assert gpt_oss.quantize_experts_(model) == ["model.layers.0.mlp.experts",
                                                 "model.layers.1.mlp.experts"]
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, gpt_oss.MXGptOssExperts)
    # Expert memory: the MX bytes (4.25 bits a weight) and the biases; no float weight.
    assert {name for name, _ in experts.named_parameters()} == {"gate_up_proj_bias",
                                                                "down_proj_bias"}
    weights = 4 * (64 * 192 + 96 * 64)
    assert sum(b.numel() for b in experts.buffers()) == weights // 2 + weights // 32
    # Reference: transformers' GptOssExperts holding transformers' dequantization.
    reference = tiny_gpt_oss()
    for layer, ours in zip(reference.model.layers, model.model.layers):
        for name in gpt_oss.PROJECTIONS:
            getattr(layer.mlp.experts, name).data = convert_moe_packed_tensors(
                getattr(ours.mlp.experts, f"{name}_blocks"),
                getattr(ours.mlp.experts, f"{name}_scales"), dtype=torch.float32)
    # Exact products in both; only the fp32 summation order differs.
    torch.testing.assert_close(logits(model), logits(reference), rtol=1e-5, atol=1e-5)


def test_checkpoint_round_trip_in_the_mxfp4_layout(tmp_path):
    model = tiny_gpt_oss()
    gpt_oss.quantize_experts_(model)
    model.config.quantization_config = MXFP4_CONFIG  # the layout and config of gpt-oss checkpoints
    model.save_pretrained(tmp_path / "mxfp4")
    state = model.state_dict()

    loaded = gpt_oss.from_pretrained(tmp_path / "mxfp4", dtype=torch.float32)
    assert isinstance(loaded.model.layers[1].mlp.experts, gpt_oss.MXGptOssExperts)
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert torch.equal(logits(loaded), logits(model))

    loaded.save_pretrained(tmp_path / "again")  # written back byte for byte
    with safe_open(tmp_path / "mxfp4" / "model.safetensors", "pt") as first, \
            safe_open(tmp_path / "again" / "model.safetensors", "pt") as second:
        experts = [k for k in first.keys() if ".experts." in k]
        assert len(experts) == 12 and set(experts) <= set(second.keys())
        for key in experts:
            assert torch.equal(first.get_tensor(key), second.get_tensor(key)), key

    # transformers' own mxfp4 loader reads the file torchmx wrote (dequantizing on CPU).
    theirs = AutoModelForCausalLM.from_pretrained(
        tmp_path / "mxfp4", quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32)
    ours = loaded.model.layers[0].mlp.experts
    assert torch.equal(theirs.model.layers[0].mlp.experts.gate_up_proj,
                       ours.weight("gate_up_proj", torch.float32).dequantize().transpose(1, 2))


@pytest.mark.parametrize("blocks, scales, error, words", [
    (torch.zeros(2, 4, 1, 16, dtype=torch.int8), torch.zeros(2, 4, 1, dtype=torch.uint8),
     TypeError, "must be uint8"),
    (torch.zeros(2, 4, 1, 8, dtype=torch.uint8), torch.zeros(2, 4, 1, dtype=torch.uint8),
     ValueError, r"expected blocks \[E, N, K/32, 16\]"),
    (torch.zeros(2, 4, 2, 16, dtype=torch.uint8), torch.zeros(2, 4, 1, dtype=torch.uint8),
     ValueError, r"got \(2, 4, 2, 16\) and \(2, 4, 1\)"),
])
def test_bad_layout(blocks, scales, error, words):
    with pytest.raises(error, match=words):
        gpt_oss.experts_mx(blocks, scales)


def test_pack_experts_needs_k_in_whole_blocks():
    with pytest.raises(ValueError, match=r"K a multiple of 32, got \(2, 4, 40\)"):
        gpt_oss.pack_experts(torch.zeros(2, 4, 40))


def test_torchmx_config_quantizes_full_precision_experts_while_loading(tmp_path):
    from torchmx import MXInferenceLinear, TorchMXConfig

    model = tiny_gpt_oss()
    model.save_pretrained(tmp_path / "float")
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "float", quantization_config=TorchMXConfig(weights="mxfp4"), dtype=torch.float32)
    assert isinstance(loaded.model.layers[0].self_attn.q_proj, MXInferenceLinear)
    gpt_oss.quantize_experts_(model)  # the same bytes as quantizing after loading
    for ours, theirs in zip(loaded.model.layers, model.model.layers):
        assert isinstance(ours.mlp.experts, gpt_oss.MXGptOssExperts)
        a, b = ours.mlp.experts.state_dict(), theirs.mlp.experts.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in b)
    loaded.save_pretrained(tmp_path / "mx")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "mx", dtype=torch.float32)
    assert torch.equal(logits(again), logits(loaded))


def test_expert_views_follow_the_buffers():
    import copy

    model = tiny_gpt_oss()
    gpt_oss.quantize_experts_(model)
    experts = model.model.layers[0].mlp.experts
    x = torch.randn(3, 64)
    indices, weights = torch.tensor([[0, 1], [2, 3], [1, 2]]), torch.full((3, 2), 0.5)
    with torch.no_grad():
        before = experts(x, indices, weights)
        experts.down_proj_scales.add_(1)  # in place: every down_proj weight doubles
        after = experts(x, indices, weights)
        assert torch.equal(after, copy.deepcopy(experts)(x, indices, weights))
        assert not torch.equal(after, before)

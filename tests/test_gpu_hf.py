"""On a CUDA GPU: transformers' from_pretrained with TorchMXConfig and device_map="cuda"
quantizes each weight on the GPU as it loads (the bytes of quantize_linear_ on the same GPU),
the saved model reloads onto the GPU bit for bit, and gpt-oss MXFP4 experts load there."""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from torchmx import MXInferenceLinear, TorchMXConfig  # noqa: E402
from torchmx.quant_api import OUTPUT_HEADS, quantize_linear_  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOKENS = torch.tensor([[1, 5, 9, 2, 7, 3]])


def test_quantize_while_loading_onto_the_gpu(tmp_path):
    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "float")
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "float", quantization_config=TorchMXConfig(weights="mxfp4"),
        device_map="cuda", dtype=torch.bfloat16)
    layer = model.model.layers[0].mlp.up_proj
    assert isinstance(layer, MXInferenceLinear) and layer.weight_data.is_cuda
    expected = AutoModelForCausalLM.from_pretrained(tmp_path / "float", device_map="cuda",
                                                    dtype=torch.bfloat16)
    quantize_linear_(expected, "mxfp4", exclude=OUTPUT_HEADS)
    a, b = model.state_dict(), expected.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    model.save_pretrained(tmp_path / "mx")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "mx", device_map="cuda",
                                                 dtype=torch.bfloat16)
    c = again.state_dict()
    assert all(torch.equal(a[k], c[k].to(a[k].device)) for k in a)
    with torch.no_grad():
        assert torch.equal(model(TOKENS.cuda()).logits, again(TOKENS.cuda()).logits)


def test_gpt_oss_mxfp4_checkpoint_onto_the_gpu(tmp_path):
    from transformers import GptOssConfig, GptOssForCausalLM

    from torchmx.huggingface import gpt_oss

    config = GptOssConfig(vocab_size=128, hidden_size=256, intermediate_size=256,
                          num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=64, num_local_experts=8, num_experts_per_tok=4,
                          sliding_window=16, layer_types=["full_attention"],
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = GptOssForCausalLM(config).to(torch.bfloat16).eval()
    gpt_oss.quantize_experts_(model)
    model.config.quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    model.save_pretrained(tmp_path / "gpt-oss")
    loaded = gpt_oss.from_pretrained(tmp_path / "gpt-oss", device_map="cuda", dtype=torch.bfloat16)
    experts = loaded.model.layers[0].mlp.experts
    assert isinstance(experts, gpt_oss.MXGptOssExperts) and experts.gate_up_proj_blocks.is_cuda
    assert torch.equal(experts.gate_up_proj_blocks.cpu(),
                       model.model.layers[0].mlp.experts.gate_up_proj_blocks)
    with torch.no_grad():
        out = loaded(TOKENS.cuda()).logits.float().cpu()
        ref = model(TOKENS).logits.float()
    torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())

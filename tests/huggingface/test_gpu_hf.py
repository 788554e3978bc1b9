"""On a CUDA GPU: models loaded through TorchMXConfig and gpt-oss MXFP4 checkpoints, moved to
the GPU (.to("cuda"); device_map needs accelerate), run there: the bytes move unchanged and the
logits match the CPU's within bf16 rounding (the GPU kernels sum in another order). On two
GPUs, a model spread over both by device_map, or on the GPU that is not the current one,
gives the bits of the same model on the current GPU."""

import copy

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from torchmx import MXInferenceLinear, TorchMXConfig  # noqa: E402
from torchmx.quant_api import OUTPUT_HEADS, quantize_linear_  # noqa: E402

from gpu_work import kernel_devices  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOKENS = torch.tensor([[1, 5, 9, 2, 7, 3]])


def close_logits(gpu_model, cpu_model):
    with torch.no_grad():
        out = gpu_model(TOKENS.cuda()).logits.float().cpu()
        ref = cpu_model(TOKENS).logits.float()
    torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


def test_torchmx_config_model_on_the_gpu(tmp_path):
    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "float")
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "float", quantization_config=TorchMXConfig(weights="mxfp4"),
        dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "mx")
    gpu = AutoModelForCausalLM.from_pretrained(tmp_path / "mx", dtype=torch.bfloat16).to("cuda")
    layer = gpu.model.layers[0].mlp.up_proj
    assert isinstance(layer, MXInferenceLinear) and layer.weight_data.is_cuda
    a, b = model.state_dict(), gpu.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k].cpu()) for k in a)
    close_logits(gpu, model)
    # quantizing on the GPU gives the CPU's bytes (one numerics contract for every backend)
    on_gpu = AutoModelForCausalLM.from_pretrained(tmp_path / "float", dtype=torch.bfloat16).to("cuda")
    quantize_linear_(on_gpu, "mxfp4", exclude=OUTPUT_HEADS)
    c = on_gpu.state_dict()
    assert all(torch.equal(a[k], c[k].cpu()) for k in a)


def _tiny_gpt_oss_mxfp4():
    """A one-layer bf16 gpt-oss with 8 experts, its experts quantized to MXFP4 (seed 0)."""
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
    return model


def test_gpt_oss_mxfp4_checkpoint_onto_the_gpu(tmp_path):
    from torchmx.huggingface import gpt_oss

    model = _tiny_gpt_oss_mxfp4()
    model.config.quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    model.save_pretrained(tmp_path / "gpt-oss")
    loaded = gpt_oss.from_pretrained(tmp_path / "gpt-oss", dtype=torch.bfloat16).to("cuda")
    experts = loaded.model.layers[0].mlp.experts
    assert isinstance(experts, gpt_oss.MXGptOssExperts) and experts.gate_up_proj_blocks.is_cuda
    assert torch.equal(experts.gate_up_proj_blocks.cpu(),
                       model.model.layers[0].mlp.experts.gate_up_proj_blocks)
    close_logits(loaded, model)


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _logit_bits(model, device):
    with torch.no_grad():
        return model(TOKENS.to(device)).logits.cpu().view(torch.int16)


@two_gpus
def test_torchmx_config_model_spread_over_two_gpus(tmp_path):
    """device_map puts half the layers on cuda:1 while cuda:0 stays current: their MX kernels
    run on cuda:1 and the logits are the bits of the model on one GPU."""
    pytest.importorskip("accelerate")
    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "float")
    AutoModelForCausalLM.from_pretrained(
        tmp_path / "float", quantization_config=TorchMXConfig(weights="mxfp4"),
        dtype=torch.bfloat16).save_pretrained(tmp_path / "mx")
    torch.cuda.set_device(0)
    one = AutoModelForCausalLM.from_pretrained(tmp_path / "mx", dtype=torch.bfloat16,
                                               device_map={"": 0})
    spread = AutoModelForCausalLM.from_pretrained(
        tmp_path / "mx", dtype=torch.bfloat16,
        device_map={"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0,
                    "model.layers.1": 1, "model.norm": 1, "lm_head": 1})
    layer = spread.model.layers[1].mlp.up_proj
    assert isinstance(layer, MXInferenceLinear) and layer.weight_data.device.index == 1
    expected = _logit_bits(one, "cuda:0")
    for _ in range(3):  # bound calls of the layers on cuda:0 after the first
        assert torch.equal(_logit_bits(spread, "cuda:0"), expected)
    assert torch.cuda.current_device() == 0
    # the MX layers on cuda:1 compute there (the bits alone cannot tell: with peer access, a
    # kernel launched on cuda:0 would read cuda:1's memory and give them too)
    hidden = torch.randn(1, 6, 256, dtype=torch.bfloat16, device="cuda:1")
    with torch.no_grad():
        _, devices = kernel_devices(lambda: spread.model.layers[1].mlp(hidden))
    assert devices == {1}


@two_gpus
def test_gpt_oss_experts_on_the_other_gpu():
    """The routed MXFP4 experts on cuda:1 while cuda:0 is current."""
    model = _tiny_gpt_oss_mxfp4()
    torch.cuda.set_device(0)
    expected = _logit_bits(copy.deepcopy(model).to("cuda:0"), "cuda:0")
    other = model.to("cuda:1")
    for _ in range(3):
        assert torch.equal(_logit_bits(other, "cuda:1"), expected)
    assert torch.cuda.current_device() == 0
    _, devices = kernel_devices(lambda: _logit_bits(other, "cuda:1"))
    assert devices == {1}

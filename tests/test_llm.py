"""quantize_llm_ on small random Llama and Qwen2 models (transformers, eager and sdpa), and the
MX attention function against an independent reference."""

import warnings

import pytest
import torch

pytest.importorskip("transformers")

from torchmx import MXTensor  # noqa: E402
from torchmx.analysis import sqnr_db  # noqa: E402
from torchmx.config import MXConfig, QAttentionConfig, QLinearConfig  # noqa: E402
from torchmx.models import tiny_decoder_lm  # noqa: E402
from torchmx.nn import MXInferenceLinear  # noqa: E402
from torchmx.nn.attention import CONFIG_ATTRIBUTE, mx_attention  # noqa: E402
from torchmx.quant_api import quantize_llm_  # noqa: E402

FP8, FP6, FP4 = MXConfig("float8_e4m3"), MXConfig("float6_e2m3"), MXConfig("float4_e2m1")
PROJECTIONS = QLinearConfig(FP6, FP8)
MLP = QLinearConfig(FP4, FP8)
# distinct formats per attention tensor, so a mix-up changes the bits
ATTENTION = QAttentionConfig(PROJECTIONS, query_config=FP8, key_config=MXConfig("float8_e5m2"),
                             value_config=MXConfig("int8", 16), attention_weights_config=FP6)


def fq(t, cfg, dim):
    """Reference MX values of t with blocks along dim (moved last, quantized, moved back)."""
    moved = t.movedim(dim, -1).contiguous()
    return MXTensor.to_mx(moved, cfg.elem_dtype, cfg.block_size).dequantize(torch.float32).movedim(-1, dim)


def reference_attention(q, k, v, additive_mask, scaling):
    groups = q.shape[1] // k.shape[1]
    k = torch.cat([k[:, i:i + 1].expand(-1, groups, -1, -1) for i in range(k.shape[1])], 1)
    v = torch.cat([v[:, i:i + 1].expand(-1, groups, -1, -1) for i in range(v.shape[1])], 1)
    scores = fq(q, FP8, 3) @ fq(k, ATTENTION.key_config, 3).transpose(2, 3) * scaling
    probs = torch.softmax(scores + additive_mask, dim=-1)
    out = fq(probs, FP6, 3) @ fq(v, ATTENTION.value_config, 2)
    return out.to(q.dtype).transpose(1, 2)


@pytest.mark.parametrize("mask_kind", ["none_causal", "bool", "float"])
def test_mx_attention_matches_reference(mask_kind):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 9, 32, dtype=torch.bfloat16)
    k, v = torch.randn(2, 2, 9, 32, dtype=torch.bfloat16), torch.randn(2, 2, 9, 32, dtype=torch.bfloat16)
    keep = torch.ones(9, 9, dtype=torch.bool).tril().expand(2, 1, 9, 9).clone()
    keep[1, :, :, :2] = False  # left padding of the second sequence
    keep[1, :, :2, 0] = True
    additive = torch.zeros(2, 1, 9, 9).masked_fill(~keep, torch.finfo(torch.float32).min)
    if mask_kind == "none_causal":
        keep = keep[:1].expand(2, 1, 9, 9)
        additive = additive[:1].expand(2, 1, 9, 9)
        mask = None
    else:
        mask = keep if mask_kind == "bool" else additive.to(torch.bfloat16)
    out, probs = mx_attention(q, k, v, mask, ATTENTION, scaling=32 ** -0.5,
                              causal=mask_kind == "none_causal")
    assert out.shape == (2, 9, 4, 32) and out.dtype == torch.bfloat16 and probs.shape == (2, 4, 9, 9)
    expected = reference_attention(q, k, v, additive, 32 ** -0.5)
    assert torch.equal(out, expected), (out.float() - expected.float()).abs().max()


def logits(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_quantize_llm_eager_and_sdpa(family):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    results = {}
    for implementation in ("eager", "sdpa"):
        model = tiny_decoder_lm(family, attn_implementation=implementation, dtype=torch.bfloat16)
        reference = logits(model, ids, mask)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every matmul reduces along the MX block axis
            summary = quantize_llm_(model, ATTENTION, MLP)
            quantized = logits(model, ids, mask)
        assert model.config._attn_implementation == f"torchmx_{implementation}"
        attn = model.model.layers[0].self_attn
        assert getattr(attn, CONFIG_ATTRIBUTE) is ATTENTION
        assert attn.q_proj.qconfig == PROJECTIONS and model.model.layers[1].mlp.down_proj.qconfig == MLP
        assert type(model.lm_head) is torch.nn.Linear  # excluded by default
        assert len(summary.swapped) == 2 * 7 and summary.skipped == ["lm_head"]
        assert summary.attention == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
        valid = mask.bool()
        assert sqnr_db(reference[valid].float(), quantized[valid].float()) > 12
        results[implementation] = quantized[valid]
        # decoding with the KV cache (q_len 1) runs through the same path
        generated = model.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=3, do_sample=False)
        assert generated.shape == (1, 15)
    # eager (float masks) and sdpa (bool masks or is_causal) give the same bits
    assert torch.equal(results["eager"], results["sdpa"])


def test_attention_matmuls_only_when_configured():
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 10, dtype=torch.long)
    projections_only = tiny_decoder_lm("llama", attn_implementation="sdpa")
    quantize_llm_(projections_only, QAttentionConfig(PROJECTIONS), MLP)
    assert projections_only.config._attn_implementation == "sdpa"
    full = tiny_decoder_lm("llama", attn_implementation="sdpa")
    quantize_llm_(full, ATTENTION, MLP)
    a, b = logits(projections_only, ids, mask), logits(full, ids, mask)
    assert not torch.equal(a, b) and sqnr_db(a, b) > 12


def test_excluded_attention_module_keeps_high_precision_attention():
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(1, 10, dtype=torch.long)
    model = tiny_decoder_lm("qwen2", attn_implementation="sdpa")
    summary = quantize_llm_(model, ATTENTION, MLP, exclude=[r"lm_head", r"layers\.1\."])
    assert summary.attention == ["model.layers.0.self_attn"]
    assert not hasattr(model.model.layers[1].self_attn, CONFIG_ATTRIBUTE)
    assert type(model.model.layers[1].mlp.up_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[0].mlp.up_proj, MXInferenceLinear)
    assert logits(model, ids, mask).isfinite().all()


def test_quantize_llm_errors():
    model = tiny_decoder_lm("llama", attn_implementation="sdpa")
    with pytest.raises(TypeError, match="qattention_config must be a torchmx.config.QAttentionConfig"):
        quantize_llm_(model, PROJECTIONS, MLP)
    with pytest.raises(ValueError, match="found no attention module"):
        quantize_llm_(torch.nn.Sequential(torch.nn.Linear(4, 4)), ATTENTION, MLP)
    model.config._attn_implementation_internal = "flex_attention"
    with pytest.raises(ValueError, match="supports the attention implementations 'eager', 'sdpa'"):
        quantize_llm_(model, ATTENTION, MLP)

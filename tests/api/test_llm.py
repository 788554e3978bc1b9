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
from torchmx.quant_api import OUTPUT_HEADS, quantize_llm_  # noqa: E402

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
            summary = quantize_llm_(model, ATTENTION, MLP, exclude=OUTPUT_HEADS)
            quantized = logits(model, ids, mask)
        assert model.config._attn_implementation == f"torchmx_{implementation}"
        attn = model.model.layers[0].self_attn
        assert getattr(attn, CONFIG_ATTRIBUTE) is ATTENTION
        assert attn.q_proj.qconfig == PROJECTIONS and model.model.layers[1].mlp.down_proj.qconfig == MLP
        assert type(model.lm_head) is torch.nn.Linear  # excluded on request
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


def test_quantize_llm_takes_a_linear_config_or_a_format_name():
    by_config = tiny_decoder_lm("llama", attn_implementation="sdpa")
    summary = quantize_llm_(by_config, PROJECTIONS)  # the MLP gets the projections' config
    assert summary.skipped == [] and isinstance(by_config.lm_head, MXInferenceLinear)  # default
    assert {m.qconfig for m in by_config.modules() if isinstance(m, MXInferenceLinear)} == {PROJECTIONS}
    assert by_config.config._attn_implementation == "sdpa"  # no attention matmul configs
    by_name = tiny_decoder_lm("llama", attn_implementation="sdpa")
    quantize_llm_(by_name, "mxfp8")
    assert {m.qconfig for m in by_name.modules() if isinstance(m, MXInferenceLinear)} == {
        QLinearConfig(MXConfig("float8_e4m3"))}


def test_quantize_llm_errors():
    model = tiny_decoder_lm("llama", attn_implementation="sdpa")
    with pytest.raises(TypeError, match="qattention_config must be a torchmx.config.QAttentionConfig"):
        quantize_llm_(model, 3, MLP)
    with pytest.raises(TypeError, match="qmlp_config must be a torchmx.config.QLinearConfig"):
        quantize_llm_(model, PROJECTIONS, [MLP])
    with pytest.raises(ValueError, match="found no attention module"):
        quantize_llm_(torch.nn.Sequential(torch.nn.Linear(4, 4)), ATTENTION, MLP)
    model.config._attn_implementation_internal = "flex_attention"
    with pytest.raises(ValueError, match="supports the attention implementations 'eager', 'sdpa'"):
        quantize_llm_(model, ATTENTION, MLP)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_mx_attention_under_bf16_autocast(implementation):
    """The MX attention runs in fp32 with autocast disabled: an enclosing bf16 autocast region
    neither crashes it (masking bf16 scores with the fp32 minimum) nor changes its result
    for the same q, k, v."""
    model = tiny_decoder_lm("llama", attn_implementation=implementation)
    quantize_llm_(model, QAttentionConfig(QLinearConfig(FP8), FP8, FP8, FP8, FP8), QLinearConfig(FP8))
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = model(ids).logits
        padded = model(ids, attention_mask=mask).logits
    assert out.isfinite().all() and padded[1].isfinite().all()
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 9, 32, generator=g, dtype=torch.bfloat16) for _ in range(3))
    plain = mx_attention(q, k, v, None, ATTENTION, scaling=0.2, causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = mx_attention(q, k, v, None, ATTENTION, scaling=0.2, causal=True)
    assert auto[0].dtype == torch.bfloat16
    assert torch.equal(plain[0], auto[0]) and torch.equal(plain[1], auto[1])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_excluded_attention_is_bitwise_transformers(implementation, dtype):
    """Attention modules without an MX config run exactly what transformers runs (its sdpa, or
    the model's own eager_attention_forward), bit for bit, in bf16 too."""
    import copy

    ref = tiny_decoder_lm("llama", attn_implementation=implementation, dtype=dtype)
    model = copy.deepcopy(ref)
    summary = quantize_llm_(model, ATTENTION, MLP, include=["nothing_matches"])
    assert summary.attention == [] and summary.swapped == []
    assert model.config._attn_implementation == f"torchmx_{implementation}"
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        a = ref(ids, attention_mask=mask, output_attentions=implementation == "eager")
        b = model(ids, attention_mask=mask, output_attentions=implementation == "eager")
    assert torch.equal(a.logits, b.logits)
    if implementation == "eager":
        assert all(torch.equal(x, y) for x, y in zip(a.attentions, b.attentions))


def test_mx_attention_causality_is_per_value_block():
    """v is quantized with blocks along the key sequence (attn @ v reduces over keys), so a key
    changes the scale of its 32-key block of v: outputs of queries in earlier *complete* blocks
    are unchanged by later tokens, but queries in the same, partially filled block may see a
    later token through the shared scale. KV-cache decoding is therefore not bit-identical to a
    full forward pass (see docs/guides/model_api.md)."""
    model = tiny_decoder_lm("llama", attn_implementation="sdpa")
    quantize_llm_(model, QAttentionConfig(PROJECTIONS, FP4, FP4, FP4, FP4), MLP)
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits[0]
        prefix = model(ids[:, :35]).logits[0]
        changed = ids.clone()
        changed[0, 39] = (changed[0, 39] + 7) % 256
        other = model(changed).logits[0]
        cached = model(ids[:, :-1], use_cache=True)
        step = model(ids[:, -1:], past_key_values=cached.past_key_values).logits[0, -1]
    # positions 0..31 (a complete block of v) never see the later tokens
    assert torch.equal(full[:32], prefix[:32]) and torch.equal(full[:32], other[:32])
    # positions 32..34 share their v block with tokens 35..39: their outputs depend on them
    assert not torch.equal(full[32:35], prefix[32:35])
    assert not torch.equal(full[32:35], other[32:35])
    # decoding: close to, but not bit-identical with, the full forward pass
    assert not torch.equal(full[-1], step) and sqnr_db(full[-1], step) > 10

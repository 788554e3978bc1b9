"""Quantize transformers models: a (tiny, random) Llama with MX projections, MLPs and attention
matmuls, and, when the package is installed, the real all-MiniLM-L6-v2 sentence encoder.

Run: python3 examples/quantize_transformers.py   (a few seconds on CPU)
"""

import torch

from torchmx.analysis import sqnr_db
from torchmx.config import MXConfig, QAttentionConfig, QLinearConfig
from torchmx.models import SENTENCES, load_minilm, tiny_decoder_lm
from torchmx.quant_api import OUTPUT_HEADS, quantize_linear_, quantize_llm_

FP8 = MXConfig("float8_e4m3")


def decoder() -> None:
    model = tiny_decoder_lm("llama", attn_implementation="sdpa")
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(ids).logits
    attention = QAttentionConfig(
        projection_config=QLinearConfig(MXConfig("float6_e2m3"), FP8),  # q/k/v/o projections
        query_config=FP8, key_config=FP8, value_config=FP8, attention_weights_config=FP8)
    mlp = QLinearConfig(MXConfig("float4_e2m1"), FP8)
    # every linear layer is quantized by default; OUTPUT_HEADS keeps lm_head in full precision
    summary = quantize_llm_(model, attention, mlp, exclude=OUTPUT_HEADS)
    print(summary)
    print("attention implementation:", model.config._attn_implementation)
    with torch.no_grad():
        logits = model(ids).logits
    print(f"logits SQNR vs full precision: {sqnr_db(reference, logits):.1f} dB")
    print("greedy continuation:", model.generate(ids[:1, :8], max_new_tokens=8, do_sample=False)[0, 8:].tolist())


def encoder() -> None:
    try:
        minilm = load_minilm()
    except ImportError as e:
        print("skipping all-MiniLM-L6-v2:", e)
        return
    reference = minilm.embed(SENTENCES)
    summary = quantize_linear_(minilm.model, QLinearConfig(FP8, FP8))
    cosine = (minilm.embed(SENTENCES) * reference).sum(-1)
    print(f"all-MiniLM-L6-v2, MXFP8 weights and activations: {len(summary.swapped)} layers, "
          f"sentence-embedding cosine min {cosine.min():.4f} mean {cosine.mean():.4f}")


if __name__ == "__main__":
    decoder()
    encoder()

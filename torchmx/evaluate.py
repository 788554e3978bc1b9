"""What MX costs a real model: accuracy, size and speed of a sentence encoder per MX recipe.

`evaluate_encoder(encoder, recipes)` runs the full-precision encoder once, then, for each recipe
(weights' format and activations' format, scale mode, rounding, block size):

- per-layer SQNR: each linear layer alone, quantized, on the inputs it saw in the
  full-precision run, against its full-precision output (so errors do not compound);
- end to end: the whole model quantized with `quantize_linear_`; cosine similarity of its
  sentence embeddings with the full-precision ones, and nearest-neighbour agreement (does each
  sentence keep its closest other sentence?);
- model bytes (parameters and buffers) and the median forward time on the tokenized sentence
  batch (the same work every call), after warm-up calls, with the garbage collector paused and
  a fixed thread count. Every model (full precision and each recipe's) is kept until the end
  and timed in rounds of one call each, so that a stretch of load on the machine slows all of
  them alike.
"""

import copy
import contextlib
import datetime
import gc
import os
import platform
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
    """One way to quantize the model's linear layers.

    `elem_dtype` is the weights' format and, unless `activation_dtype` names another one, the
    activations' too: `Recipe("float4_e2m1", activation_dtype="float8_e4m3")` is MXFP4 weights
    with MXFP8 activations. `weights_only=True` keeps activations in full precision."""

    elem_dtype: str
    scale_mode: str = "floor"
    rounding: str = "even"
    block_size: int = 32
    weights_only: bool = False
    activation_dtype: Optional[str] = None

    def __post_init__(self):
        if self.weights_only and self.activation_dtype is not None:
            raise ValueError(f"activation_dtype={self.activation_dtype!r} with weights_only=True: "
                             "a weights-only recipe keeps activations in full precision")

    @property
    def activations(self) -> Optional[str]:
        """The activations' format; None when they stay in full precision."""
        return None if self.weights_only else (self.activation_dtype or self.elem_dtype)

    @property
    def formats(self) -> str:
        """`fmt` when weights and activations share it, else `weights/activations`."""
        if self.activations in (None, self.elem_dtype):
            return self.elem_dtype
        return f"{self.elem_dtype}/{self.activations}"

    def qconfig(self) -> QLinearConfig:
        def mx(fmt):
            return MXConfig(fmt, self.block_size, scale_mode=self.scale_mode, rounding=self.rounding)

        return QLinearConfig(weights_config=mx(self.elem_dtype),
                             activations_config=None if self.activations is None else mx(self.activations))

    @property
    def label(self) -> str:
        return (f"{self.formats} {self.scale_mode} {self.rounding} b{self.block_size} "
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
    # The median over rounds of this model's time / the full-precision time of the same round: a
    # stretch of load that slows one round slows both of its calls, and cancels in their ratio.
    forward_vs_full_precision: float
    forward_ms_samples: List[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(out.pop("recipe"))
        out["activation_dtype"] = self.recipe.activations
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
    environment: Dict[str, str] = field(default_factory=dict)
    results: List[RecipeResult] = field(default_factory=list)
    forward_ms_samples: List[float] = field(default_factory=list)
    # How the forward passes were timed: PyTorch's thread count, warm-up calls of each model,
    # timed rounds (one call of every model each).
    timing: Dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "results"}
        out["results"] = [r.as_dict() for r in self.results]
        return out


WARM_UP_CALLS = 3


def _interleaved_ms(fns: Sequence[Callable[[], object]], repeat: int,
                    synchronize: Callable[[], None] = lambda: None) -> List[List[float]]:
    """Times (ms) of `repeat` calls of each function, called in turn, after WARM_UP_CALLS
    calls of each (the first calls of a model build caches, allocate buffers and settle the
    CPU's clocks and caches). The garbage collector is paused while timing: a collection
    landing in one call would charge that call for every earlier allocation. `synchronize`
    waits for the device (a GPU runs the calls asynchronously)."""
    for fn in fns:
        for _ in range(WARM_UP_CALLS):
            fn()
    times = [[] for _ in fns]
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            for fn, samples in zip(fns, times):
                synchronize()
                start = time.perf_counter()
                fn()
                synchronize()
                samples.append(1e3 * (time.perf_counter() - start))
    finally:
        if collecting:
            gc.enable()
    return times


@contextlib.contextmanager
def _threads(count: Optional[int]):
    """torch's intra-op thread count fixed to `count` (None: left as it is), restored after."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads(device: torch.device) -> Optional[int]:
    """The thread count the `torchmx` command times with unless told: on a CPU, PyTorch's own
    (one a core) less one core left to the rest of the machine, at least 1; None (PyTorch's
    own) on a GPU. After each operation PyTorch's threads wait for the slowest of them, so
    when every core has a thread, any other process that runs for a moment stalls them all
    (measured on a shared 2-core machine: docs/guides/cli.md)."""
    if device.type != "cpu":
        return None
    return max(1, min(torch.get_num_threads(), _usable_cpus() - 1))


def _forward(model: nn.Module, batch: dict) -> Callable[[], object]:
    """One forward pass of `model` on the tokenized `batch`, without gradients (as `embed`)."""
    def forward():
        with torch.no_grad():
            return model(**batch)
    return forward


def _cpu_name() -> str:
    """The CPU model on Linux (platform.processor() says only "x86_64" there)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> Dict[str, str]:
    """What a timing depends on: versions, the device, the date (UTC)."""
    from . import __version__

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{_cpu_name()}, {torch.get_num_threads()} threads"
    return {"torchmx": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "device": f"{device.type}: {name}",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


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


def check_block_size(model: nn.Module, block_size: int, layers: Optional[Iterable[str]] = None) -> None:
    """MX hardware needs whole blocks along K: refuse a block size that does not divide a layer
    (`layers`: names of linear layers; default every nn.Linear of the model)."""
    modules = dict(model.named_modules())
    if layers is None:
        layers = [name for name, module in modules.items() if type(module) is nn.Linear]
    for name in layers:
        if modules[name].in_features % block_size:
            raise ValueError(f"block size {block_size} does not divide in_features "
                             f"{modules[name].in_features} of layer {name}")


def evaluate_encoder(encoder, recipes: Sequence[Recipe], sentences: Sequence[str] = DEMO_SENTENCES,
                     *, model_name: str = "encoder", repeat: int = 30, threads: Optional[int] = None,
                     progress: Optional[Callable[[Iterable], Iterable]] = None,
                     log: Optional[Callable[[str], None]] = None) -> EncoderReport:
    """Measure every recipe on `encoder` (an object with `.model`, `.tokenize(sentences)` and
    `.embed(sentences)`, such as torchmx.models.MiniLM). The encoder is left unchanged.

    `repeat`: timed forward passes of each model; `threads`: torch's thread count for the whole
    evaluation (default: as it is), recorded in the report's environment; `progress` wraps the
    iterable of recipes (e.g. tqdm); `log` receives a line at the start of each phase."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be an int >= 1 or None, got {threads!r}")
    with _threads(threads):
        return _evaluate(encoder, recipes, sentences, model_name, repeat, progress, log)


def _evaluate(encoder, recipes, sentences, model_name, repeat, progress, log) -> EncoderReport:
    model = encoder.model
    for recipe in recipes:  # every mistake before the work
        recipe.qconfig()
        check_block_size(model, recipe.block_size)
    log = log or (lambda line: None)
    log(f"full-precision reference on {len(sentences)} sentences")
    batch = encoder.tokenize(sentences)
    with torch.inference_mode():
        io = _linear_io(model, lambda: model(**batch))
        reference = encoder.embed(sentences)
    device = batch["input_ids"].device
    report = EncoderReport(
        model_name=model_name, device=str(device), sentences=len(sentences),
        linear_layers=list(io), model_bytes=model_bytes(model),
        linear_bytes=_layers_bytes(model, io), forward_ms=float("nan"),
        environment=environment(device),
        timing={"threads": torch.get_num_threads(), "warm_up_calls": WARM_UP_CALLS, "rounds": repeat})
    modules = dict(model.named_modules())
    reference_neighbours = nearest_neighbours(reference)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    quantized_models = []
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
        quantized_models.append(quantized.model)
        report.results.append(RecipeResult(
            recipe=recipe,
            per_layer_sqnr_db=per_layer,
            cosine_mean=float(cosine.mean()),
            cosine_min=float(cosine.min()),
            nearest_neighbour_agreement=float(
                (nearest_neighbours(embeddings) == reference_neighbours).float().mean()),
            model_bytes=model_bytes(quantized.model),
            linear_bytes=_layers_bytes(quantized.model, io),
            forward_ms=float("nan"), forward_vs_full_precision=float("nan"),
        ))
    # Every model in each round, one call each: a stretch of load from another process (tens of
    # seconds on a shared machine) falls on all of them alike instead of on one recipe's calls.
    log(f"timing {len(quantized_models) + 1} models: {repeat} rounds of one forward pass each")
    full_precision_ms, *timed = _interleaved_ms(
        [_forward(model, batch)] + [_forward(m, batch) for m in quantized_models], repeat, synchronize)
    report.forward_ms = statistics.median(full_precision_ms)
    report.forward_ms_samples = full_precision_ms
    for result, samples in zip(report.results, timed):
        result.forward_ms = statistics.median(samples)
        result.forward_vs_full_precision = statistics.median(
            ms / full_ms for ms, full_ms in zip(samples, full_precision_ms))
        result.forward_ms_samples = samples
    return report

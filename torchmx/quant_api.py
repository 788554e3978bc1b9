"""Model-level API: swap a model's linear layers (and attention) for MX ones, in place.

- `quantize_linear_(model, qconfig)`: nn.Linear (and MXLinear) -> MXInferenceLinear.
- `prepare_qat_(model, qconfig)`: nn.Linear -> MXLinear (quantization-aware training).
- `quantize_llm_(model, qattention_config, qmlp_config=None)`: transformers decoder models: the
  q/k/v/o projections per `qattention_config.projection_config`, every other linear per
  `qmlp_config` (None: the projections' config), and, when `qattention_config` sets
  q/k/v/attention-weights configs, the two attention matmuls (torchmx.nn.attention, via
  transformers' attention registry).

A linear config may be a QLinearConfig, an MXConfig or a format name ("mxfp4", "float8_e4m3",
a torch dtype, ...) for the weights (activations then stay in high precision).

Each takes `include`/`exclude` (regexes searched in module names) and `filter_fn(module, name)`,
shows a progress bar for large models, and returns a `QuantizationSummary`. Like torchao's
`quantize_`, they quantize every linear layer by default, the output head (`lm_head`) included;
`exclude=OUTPUT_HEADS` keeps the heads in high precision. The torchao configs
(`MXInferenceLinearConfig`, `MXQATConfig`, `MXWeightOnlyConfig`,
`MXDynamicActivationMXWeightConfig`, for `torchao.quantization.quantize_`) are importable from
here; they import torchao (the `torchmx[torchao]` extra) on first use.
"""

import importlib
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Union

import torch
from torch import nn
from tqdm.auto import tqdm

from . import dtypes
from .config import MXConfig, QAttentionConfig, QLinearConfig, as_attention_config, as_linear_config
from .nn import attention as mx_attention
from .nn.inference_linear import MXInferenceLinear
from .nn.mx_linear import MXLinear, describe_qconfig

__all__ = [
    "OUTPUT_HEADS",
    "QuantizationSummary",
    "quantize_linear_",
    "prepare_qat_",
    "quantize_llm_",
    "MXInferenceLinearConfig",
    "MXQATConfig",
    "MXWeightOnlyConfig",
    "MXDynamicActivationMXWeightConfig",
    "mx_dynamic_activation_mx_weights",
]

# Output heads (modules whose last name component is one of these): pass exclude=OUTPUT_HEADS
# to keep them in high precision (they are often tied to the embeddings and are the most
# sensitive layer). Not excluded by default, so that every entry point, torchao's quantize_
# included, quantizes the same layers.
OUTPUT_HEADS = r"(^|\.)(lm_head|output|classifier|score|embed_out)$"
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_PROGRESS_MIN_LAYERS = 64  # progress=None shows a bar from this many layers on (on a terminal)

Patterns = Union[str, Iterable[str], None]
FilterFn = Callable[[nn.Module, str], bool]


@dataclass
class QuantizationSummary:
    """What a quantize call did: the modules it swapped (by name), the linear layers it left
    alone, and the model's parameter + buffer bytes before and after."""

    swapped: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    attention: List[str] = field(default_factory=list)  # attention modules with MX matmuls
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def ratio(self) -> float:
        return self.bytes_after / self.bytes_before if self.bytes_before else float("nan")

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} linear layers, skipped {len(self.skipped)}"
                 + (f" ({', '.join(self.skipped[:5])}{', ...' if len(self.skipped) > 5 else ''})"
                    if self.skipped else ""),
                 f"model bytes: {self.bytes_before:,} -> {self.bytes_after:,} ({self.ratio:.3f}x)"]
        if self.attention:
            lines.append(f"MX attention matmuls in {len(self.attention)} attention modules")
        return "\n".join(lines)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors, each tensor object counted once."""
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def model_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (each shared tensor counted once)."""
    return tensor_bytes((*model.parameters(), *model.buffers()))


def _compile_patterns(patterns: Patterns, arg: str) -> List[re.Pattern]:
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    compiled = []
    for p in patterns:
        if not isinstance(p, str):
            raise TypeError(f"{arg} must be a regex string, a list of them or None, got an item "
                            f"of type {type(p).__name__}")
        try:
            compiled.append(re.compile(p))
        except re.error as e:
            raise ValueError(f"{arg}: invalid regex {p!r}: {e}") from None
    return compiled


def _name_filter(include: Patterns, exclude: Patterns):
    """names_ok(name): name matches an include pattern (if any) and no exclude pattern."""
    include_res = _compile_patterns(include, "include")
    exclude_res = _compile_patterns(exclude, "exclude")

    def names_ok(name: str) -> bool:
        if include_res and not any(r.search(name) for r in include_res):
            return False
        return not any(r.search(name) for r in exclude_res)

    return names_ok


def _selector(include: Patterns, exclude: Patterns, filter_fn: Optional[FilterFn]):
    """select(module, name): the name filter, then filter_fn (if given)."""
    names_ok = _name_filter(include, exclude)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable(module, name) -> bool, got {type(filter_fn).__name__}")
    return lambda module, name: names_ok(name) and (filter_fn is None or bool(filter_fn(module, name)))


def _check_model(model) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def _swap_linears(model: nn.Module, candidates: Callable[[nn.Module], bool], select, make,
                  progress: Optional[bool], desc: str,
                  before_apply: Optional[Callable[[], None]] = None) -> QuantizationSummary:
    """Replace every submodule m named `name` with candidates(m) and select(m, name) by
    make(m, name), in place. A module reachable under several names is converted once.

    All replacements are built (and every check run) before the model is touched, so an error
    leaves the model as it was; `before_apply()` runs after that, just before the swaps."""
    _check_model(model)
    if candidates(model):
        raise ValueError(f"model itself is a {type(model).__name__}: these functions swap "
                         "submodules in place; convert a single layer with "
                         "MXInferenceLinear.from_float / MXLinear.from_float")
    summary = QuantizationSummary(bytes_before=model_bytes(model))
    todo = []
    for name, child in model.named_modules(remove_duplicate=False):  # every name of a shared module
        if not name or not candidates(child):
            continue
        if select(child, name):
            parent_name, _, child_name = name.rpartition(".")
            todo.append((model.get_submodule(parent_name), child_name, name, child))
        else:
            summary.skipped.append(name)
    if progress is None:  # large models only, and (disable=None) only on a terminal
        disable = None if len(todo) >= _PROGRESS_MIN_LAYERS else True
    else:
        disable = not progress
    converted = {}
    for parent, child_name, name, child in tqdm(todo, desc=desc, unit="layer", disable=disable):
        if id(child) not in converted:
            converted[id(child)] = make(child, name)
    if before_apply is not None:
        before_apply()
    for parent, child_name, name, child in todo:
        setattr(parent, child_name, converted[id(child)])
        summary.swapped.append(name)
    summary.bytes_after = model_bytes(model)
    return summary


def _is_float_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear)  # MXLinear included: QAT -> inference


LinearConfigLike = Union[QLinearConfig, MXConfig, str, dtypes.DType, torch.dtype]


def quantize_linear_(
    model: nn.Module,
    qconfig: LinearConfigLike,
    *,
    filter_fn: Optional[FilterFn] = None,
    include: Patterns = None,
    exclude: Patterns = None,
    progress: Optional[bool] = None,
) -> QuantizationSummary:
    """Swap the model's nn.Linear (and MXLinear) layers for MXInferenceLinear, in place.

    `qconfig`: a QLinearConfig, or an MXConfig / format name ("mxfp4", ...) for the weights.
    A layer named `name` is swapped when `name` matches one of `include` (regexes, searched;
    None: every layer), none of `exclude` (None: no layer excluded, the output head included;
    `OUTPUT_HEADS` keeps `lm_head` and other heads in high precision) and
    `filter_fn(module, name)` (if given) is true.
    `progress`: True/False forces the progress bar on/off; None shows it for large models.
    """
    qconfig = as_linear_config(qconfig)
    select = _selector(include, exclude, filter_fn)
    return _swap_linears(model, _is_float_linear, select,
                         lambda m, name: _pack(m, name, qconfig),
                         progress, "torchmx: quantizing linear layers")


def _forward(qconfig: QLinearConfig):
    return qconfig.weights_config, qconfig.activations_config


def _pack(module: nn.Linear, name: str, qconfig: QLinearConfig) -> MXInferenceLinear:
    """MXInferenceLinear.from_float, warning when an MXLinear trained with another forward
    config (its weights or activations format; the gradient config plays no part in packing)."""
    trained = getattr(module, "qconfig", None)
    if isinstance(module, MXLinear) and _forward(trained) != _forward(qconfig):
        warnings.warn(f"{name}: this MXLinear was trained (QAT) with [{describe_qconfig(trained)}] "
                      f"and is now packed with [{describe_qconfig(qconfig)}]; pass the training "
                      "config to quantize with what the model learned", UserWarning, stacklevel=5)
    return MXInferenceLinear.from_float(module, qconfig)


def prepare_qat_(
    model: nn.Module,
    qconfig: LinearConfigLike,
    *,
    filter_fn: Optional[FilterFn] = None,
    include: Patterns = None,
    exclude: Patterns = None,
    progress: Optional[bool] = None,
) -> QuantizationSummary:
    """Swap the model's nn.Linear layers for MXLinear (same parameters, shared), in place, for
    quantization-aware training. `qconfig` and the filters as in quantize_linear_. After
    training, `quantize_linear_(model, qconfig)` packs the weights (MXInferenceLinear)."""
    qconfig = as_linear_config(qconfig)
    select = _selector(include, exclude, filter_fn)
    return _swap_linears(model, lambda m: type(m) is nn.Linear, select,
                         lambda m, name: MXLinear.from_float(m, qconfig),
                         progress, "torchmx: preparing QAT")


def _attention_modules(model: nn.Module) -> dict:
    """name -> module for every module with q_proj, k_proj, v_proj and o_proj linear children
    (the attention blocks of Llama, Qwen2, Mistral, ... in transformers)."""
    found = {}
    for name, module in model.named_modules():
        children = [getattr(module, p, None) for p in ATTENTION_PROJECTIONS]
        if all(isinstance(c, (nn.Linear, MXInferenceLinear)) for c in children):
            found[name] = module
    return found


def _attention_implementation(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation is None or not hasattr(model, "set_attn_implementation"):
        raise TypeError("MX attention needs a transformers PreTrainedModel (with .config and "
                        f"set_attn_implementation), got {type(model).__name__}")
    return implementation


def quantize_llm_(
    model: nn.Module,
    qattention_config: Union[QAttentionConfig, LinearConfigLike],
    qmlp_config: Optional[LinearConfigLike] = None,
    *,
    filter_fn: Optional[FilterFn] = None,
    include: Patterns = None,
    exclude: Patterns = None,
    progress: Optional[bool] = None,
) -> QuantizationSummary:
    """Quantize a transformers decoder model (Llama, Qwen2 and alike) in place.

    - attention projections (q_proj, k_proj, v_proj, o_proj of each attention module) ->
      MXInferenceLinear per `qattention_config.projection_config`;
    - every other linear layer (the MLPs) -> MXInferenceLinear per `qmlp_config`;
    - if `qattention_config` has q/k/v/attention-weights configs: the attention matmuls run in
      MX (q.k^T with blocks along head_dim, probs.v with blocks along the sequence), by
      switching the model's attention implementation from "eager"/"sdpa" to
      "torchmx_eager"/"torchmx_sdpa" (registered with transformers' AttentionInterface; the
      masks stay those of the original implementation). The modules and their config are
      recorded in `model.config.torchmx_attention`, which save_pretrained writes to config.json
      and TorchMXConfig's quantizer applies again when the model loads.

    `qattention_config`: a QAttentionConfig, or a linear config (QLinearConfig, MXConfig or
    format name) for the projections alone; `qmlp_config`: a linear config (None: the
    projections' config).
    `include`/`exclude`/`filter_fn` select layers as in quantize_linear_ (`lm_head` is
    quantized unless excluded, e.g. with `exclude=OUTPUT_HEADS`); `include`/`exclude` also
    select the attention modules (by their names) whose matmuls run in MX.
    """
    qattention_config = as_attention_config(qattention_config)
    if qmlp_config is None:
        qmlp_config = qattention_config.projection_config
    qmlp_config = as_linear_config(qmlp_config, "qmlp_config")
    _check_model(model)
    select = _selector(include, exclude, filter_fn)
    attention_names_ok = _name_filter(include, exclude)
    attention = _attention_modules(model)
    if not attention:
        raise ValueError("quantize_llm_ found no attention module with q_proj, k_proj, v_proj and "
                         "o_proj linear layers (transformers Llama/Qwen2-style decoders); use "
                         "quantize_linear_ for other models")
    projections = {f"{a}.{p}" if a else p for a in attention for p in ATTENTION_PROJECTIONS}

    def make(module, name):
        qconfig = qattention_config.projection_config if name in projections else qmlp_config
        return _pack(module, name, qconfig)

    # Validate everything first: nothing below modifies the model until _swap_linears has
    # built every replacement layer (then `enable_attention` runs, then the swaps).
    mx_modules, implementation = [], None
    if qattention_config.is_qkv_quantization_enabled:
        implementation = _attention_implementation(model)
        current = {v: k for k, v in mx_attention.MX_IMPLEMENTATIONS.items()}
        if implementation not in mx_attention.MX_IMPLEMENTATIONS and implementation not in current:
            raise ValueError("MX attention supports the attention implementations "
                             f"{', '.join(map(repr, mx_attention.MX_IMPLEMENTATIONS))}; the model "
                             f"uses {implementation!r} (load it with attn_implementation=\"sdpa\" "
                             "or \"eager\")")
        mx_modules = [name for name in attention if attention_names_ok(name)]
        mx_attention.register_attention_functions()

    def enable_attention():
        for name in mx_modules:
            setattr(attention[name], mx_attention.CONFIG_ATTRIBUTE, qattention_config)
        if implementation in mx_attention.MX_IMPLEMENTATIONS:
            model.set_attn_implementation(mx_attention.MX_IMPLEMENTATIONS[implementation])
        if mx_modules:
            mx_attention.record_attention(model, mx_modules, qattention_config)

    summary = _swap_linears(model, _is_float_linear, select, make, progress,
                            "torchmx: quantizing LLM", before_apply=enable_attention)
    summary.attention = mx_modules
    return summary


# ------------------------------------------------------------------------------ torchao

_TORCHAO_NAMES = ("MXInferenceLinearConfig", "MXQATConfig", "MXWeightOnlyConfig",
                  "MXDynamicActivationMXWeightConfig")


def __getattr__(name):
    # torchao is an optional extra and takes seconds to import: only when its configs are asked for.
    if name in _TORCHAO_NAMES:
        return getattr(importlib.import_module(".nn.torchao_config", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def mx_dynamic_activation_mx_weights(
    weight_elem_dtype: Union[dtypes.DType, str] = dtypes.float6_e3m2,
    weight_block_size: int = 32,
    activation_elem_dtype: Union[dtypes.DType, str] = dtypes.float8_e4m3,
    activation_block_size: int = 32,
):
    """torchmx 0.1.0's helper for torchao.quantization.quantize_: returns an
    `MXInferenceLinearConfig` (a torchao AOBaseConfig) with these formats."""
    config_class = __getattr__("MXInferenceLinearConfig")
    return config_class(QLinearConfig(
        MXConfig(weight_elem_dtype, weight_block_size),
        MXConfig(activation_elem_dtype, activation_block_size)))

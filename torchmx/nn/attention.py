"""MX attention for transformers models, plugged in through transformers' attention registry.

transformers (5.x) attention modules call `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`
as `fn(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)` with
query (batch, heads, q_len, head_dim) and key/value (batch, kv_heads, kv_len, head_dim), and
build the attention mask with the function registered under the same name in
`ALL_MASK_ATTENTION_FUNCTIONS`. `register_attention_functions()` adds two implementations,
"torchmx_eager" and "torchmx_sdpa", which reuse the masks of "eager" and "sdpa" and compute
attention with MX matmuls when the attention module carries a QAttentionConfig (attribute
`torchmx_attention_config`, set by `quantize_llm_`):

    scores = (q as MX, blocks along head_dim) @ (k as MX, blocks along head_dim)^T * scaling
    probs  = softmax(scores + mask) in fp32 (then dropout in training)
    out    = (probs as MX, blocks along kv_len) @ (v as MX, blocks along kv_len)

Both matmuls reduce along the block axis of both operands (MX hardware can run them) and are
exact in fp32; the whole computation runs in fp32 with autocast disabled. An attention module
without a config runs exactly what transformers would run for it: "sdpa" (torchmx_sdpa) or the
model's own `eager_attention_forward` (torchmx_eager). transformers is imported only when needed.
"""

import sys
from typing import Optional

import torch
import torch.nn.functional as F

from ..config import MXConfig, QAttentionConfig
from ..mx_tensor import MXTensor
from .arguments import check_attention_inputs

__all__ = ["CONFIG_ATTRIBUTE", "MODEL_CONFIG_KEY", "MX_IMPLEMENTATIONS", "mx_attention",
           "register_attention_functions", "record_attention", "restore_attention"]

CONFIG_ATTRIBUTE = "torchmx_attention_config"
# The model config's entry (written to config.json by save_pretrained) that says which attention
# modules run their matmuls in MX and with which QAttentionConfig.
MODEL_CONFIG_KEY = "torchmx_attention"
# the transformers implementation a model uses -> the torchmx one that replaces it
MX_IMPLEMENTATIONS = {"eager": "torchmx_eager", "sdpa": "torchmx_sdpa"}
_UNSUPPORTED_KWARGS = ("softcap", "s_aux", "sinks", "position_bias")


def _to_mx(x: torch.Tensor, config: MXConfig, block_dim: int) -> MXTensor:
    """x quantized per config, relabelled to fp32 so the matmuls return fp32 (exact)."""
    return config.to_mx(x, block_dim).to(torch.float32)


def _apply_mask(scores, attention_mask, causal: bool):
    """scores with masked positions set to scores' dtype minimum (a float mask is added, as
    transformers' eager masks are; a bool mask keeps True; no mask: causal or nothing)."""
    q_len, kv_len = scores.shape[-2], scores.shape[-1]
    if attention_mask is None and causal:
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=scores.device)
        attention_mask = attention_mask.tril(kv_len - q_len)  # the queries are the last q_len keys
    if attention_mask is None:
        return scores
    if attention_mask.dtype == torch.bool:
        return scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    return scores + attention_mask


def mx_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    config: Optional[QAttentionConfig],
    *,
    scaling: float,
    causal: bool,
    dropout: float = 0.0,
    training: bool = False,
):
    """Attention with MX matmuls per `config` (None: the same computation in fp32).

    query (B, H, Lq, D); key, value (B, Hkv, Lk, D) with H a multiple of Hkv. Returns the output
    (B, Lq, H, D) in query's dtype and the attention probabilities (B, H, Lq, Lk) before their
    quantization, in query's dtype. The computation runs in fp32 with autocast disabled (an
    enclosing torch.autocast region does not change it); only the outputs take query's dtype.
    """
    check_attention_inputs(query, key, value, attention_mask, config, scaling, dropout)
    with torch.autocast(query.device.type, enabled=False):
        groups = query.shape[1] // key.shape[1]
        if groups > 1:  # grouped-query attention: each kv head serves `groups` query heads
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
        quantized = config is not None and config.is_qkv_quantization_enabled
        if quantized:
            q, k = _to_mx(query, config.query_config, -1), _to_mx(key, config.key_config, -1)
        else:
            q, k = query.float(), key.float()
        scores = torch.matmul(q, k.transpose(-2, -1)) * scaling
        scores = _apply_mask(scores, attention_mask, causal)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        probs = F.dropout(probs, p=dropout, training=training)
        if quantized:
            p = _to_mx(probs, config.attention_weights_config, -1)
            v = _to_mx(value, config.value_config, -2)
        else:
            p, v = probs, value.float()
        out = torch.matmul(p, v).to(query.dtype)
    return out.transpose(1, 2).contiguous(), probs.to(query.dtype)


def _check_kwargs(kwargs) -> None:
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"torchmx MX attention does not support {name!r} "
                                      "(supported: Llama- and Qwen2-style attention)")


def _is_causal(module, query, attention_mask, is_causal) -> bool:
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    return bool(causal) and attention_mask is None and query.shape[2] > 1


def _fallback_function(module, fallback: str):
    """The function transformers calls for `module` under the implementation `fallback`:
    "sdpa" from its registry; "eager" is each model's own `eager_attention_forward` (defined in
    the module's modeling file; it is not in the registry)."""
    if fallback == "sdpa":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise NotImplementedError(
            f"torchmx_eager: {type(module).__name__} has no MX attention config and its modeling "
            f"module {type(module).__module__!r} defines no eager_attention_forward to fall back "
            "to (supported: Llama- and Qwen2-style attention)")
    return eager


def _make_implementation(fallback: str):
    """The function registered as MX_IMPLEMENTATIONS[fallback]."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  is_causal=None, **kwargs):
        config = getattr(module, CONFIG_ATTRIBUTE, None)
        if config is None or not config.is_qkv_quantization_enabled:
            # exactly what transformers runs for this module under `fallback`
            return _fallback_function(module, fallback)(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                is_causal=is_causal, **kwargs)
        _check_kwargs(kwargs)
        out, probs = mx_attention(
            query, key, value, attention_mask, config,
            scaling=query.shape[-1] ** -0.5 if scaling is None else scaling,
            causal=_is_causal(module, query, attention_mask, is_causal),
            dropout=dropout, training=module.training)
        return out, probs if fallback == "eager" else None

    attention.__name__ = attention.__qualname__ = f"torchmx_{fallback}_attention"
    return attention


_registered = False


def register_attention_functions() -> None:
    """Register "torchmx_eager" and "torchmx_sdpa" with transformers (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    for fallback, name in MX_IMPLEMENTATIONS.items():
        AttentionInterface.register(name, _make_implementation(fallback))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[fallback])
    _registered = True


def record_attention(model, modules, config) -> None:
    """Write `model.config.torchmx_attention` ({"modules": names, "config": QAttentionConfig
    dict}) for a transformers model whose attention `modules` (names in `model`, or in its
    base model when `model` is that) now run their matmuls per `config`: save_pretrained
    writes it to config.json and TorchMXConfig's quantizer applies it again when the model
    loads (`restore_attention`)."""
    model_config = getattr(model, "config", None)
    if model_config is None or not hasattr(model_config, "to_dict"):
        return
    setattr(model_config, MODEL_CONFIG_KEY, {"modules": sorted(modules),
                                             "config": config.to_dict()})


def restore_attention(model) -> list:
    """Apply a loaded model's `config.torchmx_attention` (see `record_attention`): each named
    attention module gets its QAttentionConfig and the model's attention implementation
    becomes torchmx's. Returns the modules' names; ValueError for a module the model lacks or
    an implementation torchmx does not replace."""
    from ..config import QAttentionConfig

    entry = getattr(getattr(model, "config", None), MODEL_CONFIG_KEY, None)
    if not entry:
        return []
    config = QAttentionConfig.load_from_dict(entry["config"])
    prefix = getattr(model, "base_model_prefix", "")
    modules = dict(model.named_modules())
    found = {}
    for name in entry["modules"]:
        candidates = (name, f"{prefix}.{name}", name.removeprefix(prefix + "."))
        match = next((c for c in candidates if c in modules), None)
        if match is None:
            raise ValueError(f"config.json's {MODEL_CONFIG_KEY} names the attention module "
                             f"{name!r}, which this model does not have")
        found[match] = modules[match]
    implementation = model.config._attn_implementation
    if implementation not in MX_IMPLEMENTATIONS.values():
        if implementation not in MX_IMPLEMENTATIONS:
            raise ValueError(f"config.json's {MODEL_CONFIG_KEY}: MX attention replaces the "
                             f"attention implementations {', '.join(map(repr, MX_IMPLEMENTATIONS))}"
                             f"; the model loaded with {implementation!r}")
        register_attention_functions()
        model.set_attn_implementation(MX_IMPLEMENTATIONS[implementation])
    for module in found.values():
        setattr(module, CONFIG_ATTRIBUTE, config)
    return list(found)

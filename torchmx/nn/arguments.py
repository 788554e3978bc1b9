"""Validation of the layers' arguments: every mistake a ValueError or TypeError that names the
layer, the argument and what it allows, before torch's own (less telling) errors."""

import math

import torch

from ..config import MXConfig
from ..numerics import arguments as args
from ..numerics.arguments import HIGH_PRECISION_DTYPES

__all__ = ["check_features", "check_bias_flag", "check_dtype", "check_device",
           "check_linear_input", "check_mx_config", "check_attention_inputs"]

_DTYPES = ", ".join(map(str, HIGH_PRECISION_DTYPES))


def check_features(layer: str, **features) -> None:
    """in_features / out_features: ints >= 0 (as nn.Linear; bools are refused)."""
    for name, value in features.items():
        if not args.is_int(value):
            raise TypeError(f"{layer}: {name} must be an int >= 0, got "
                            f"{type(value).__name__} {value!r}")
        if value < 0:
            raise ValueError(f"{layer}: {name} must be an int >= 0, got {value}")


def check_bias_flag(layer: str, bias) -> None:
    if not isinstance(bias, bool):
        raise TypeError(f"{layer}: bias must be True or False, got {type(bias).__name__} "
                        f"{bias!r}")


def check_dtype(layer: str, dtype) -> None:
    """The parameters' dtype: None (torch's default) or one the MX quantizers take."""
    if dtype is not None and dtype not in HIGH_PRECISION_DTYPES:
        raise ValueError(f"{layer}: dtype must be None or one of {_DTYPES}, got {dtype!r}")


def check_device(layer: str, device) -> None:
    if device is None or isinstance(device, torch.device):
        return
    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{layer}: device must be None, a torch.device, a device string such "
                         f"as 'cpu' or 'cuda:0', or a CUDA index, got {device!r}") from None


def check_linear_input(layer, x, in_features: int) -> None:
    """A fp32/bf16/fp16 tensor whose last dim is in_features. `layer` names the layer in the
    message: a str, or a function giving it (called only for a bad input: forward's cost)."""
    if (isinstance(x, torch.Tensor) and x.dtype in args.HIGH_PRECISION_DTYPES and x.dim()
            and x.shape[-1] == in_features):
        return
    name = layer() if callable(layer) else layer
    args.check_high_precision_input(x, f"{name}: input")
    raise ValueError(f"{name}: input of shape {tuple(x.shape)} must end in "
                     f"in_features={in_features}")


def check_mx_config(config, arg: str = "config") -> None:
    if config is not None and not isinstance(config, MXConfig):
        hint = f' (e.g. MXConfig("{config}"))' if isinstance(config, str) else ""
        raise TypeError(f"{arg} must be a torchmx.config.MXConfig or None{hint}, got "
                        f"{type(config).__name__}")


def check_attention_inputs(query, key, value, attention_mask, config, scaling, dropout) -> None:
    """mx_attention's arguments: query (B, H, Lq, D), key and value (B, Hkv, Lk, D), H a
    multiple of Hkv, one float dtype; a mask broadcasting to (B, H, Lq, Lk); a
    QAttentionConfig or None; a finite scaling; dropout in [0, 1]."""
    from ..config import QAttentionConfig

    for name, t in (("query", query), ("key", key), ("value", value)):
        args.check_high_precision_input(t, f"mx_attention: {name}")
        if t.dim() != 4:
            raise ValueError(f"mx_attention: {name} must be 4-d (batch, heads, length, "
                             f"head_dim), got shape {tuple(t.shape)}")
    if key.shape != value.shape:
        raise ValueError(f"mx_attention: key and value must have one shape, got "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    b, h, _, d = query.shape
    if (key.shape[0], key.shape[3]) != (b, d) or key.shape[1] == 0 or h % key.shape[1]:
        raise ValueError(f"mx_attention: key/value {tuple(key.shape)} must match query "
                         f"{tuple(query.shape)} in batch and head_dim, with query's heads a "
                         "multiple of theirs")
    if attention_mask is not None:
        args.check_tensor(attention_mask, "mx_attention: attention_mask")
        scores = (b, h, query.shape[2], key.shape[2])
        try:
            ok = torch.broadcast_shapes(attention_mask.shape, scores) == scores
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"mx_attention: attention_mask of shape "
                             f"{tuple(attention_mask.shape)} must broadcast to the scores' "
                             f"shape {scores}")
    if config is not None and not isinstance(config, QAttentionConfig):
        raise TypeError(f"mx_attention: config must be a torchmx.config.QAttentionConfig or "
                        f"None, got {type(config).__name__}")
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)):
        raise TypeError(f"mx_attention: scaling must be a float, got {type(scaling).__name__}")
    if not math.isfinite(scaling):
        raise ValueError(f"mx_attention: scaling must be finite, got {scaling!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
        raise ValueError(f"mx_attention: dropout must be a float in [0, 1], got {dropout!r}")

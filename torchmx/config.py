"""Quantization configs: what to quantize, to which format, how. Frozen, validated, dict round trip.

`MXConfig` describes one quantized tensor; `QLinearConfig` a linear layer (weights, activations
and optionally, per `QLinearGradConfig`, the operands of its two backward GEMMs);
`QAttentionConfig` an attention block (its projections and, all together or not at all, q, k,
v and the attention weights).
The option names are the ones of the custom ops and `MXTensor.to_mx`.
"""

from dataclasses import MISSING, dataclass, fields
from typing import Any, Optional

import torch

from . import dtypes
from .numerics import arguments as args

__all__ = ["MXConfig", "QLinearGradConfig", "QLinearConfig", "QAttentionConfig",
           "as_linear_config", "as_attention_config"]


class _DictRoundTrip:
    """to_dict / load_from_dict for frozen dataclasses whose nested fields are configs too."""

    _nested: dict = {}  # field name -> config class

    def to_dict(self) -> dict:
        out = {}
        for field in fields(self):
            value = getattr(self, field.name)
            out[field.name] = value.to_dict() if isinstance(value, _DictRoundTrip) else value
        return out

    @classmethod
    def load_from_dict(cls, config_dict: dict) -> Any:
        if not isinstance(config_dict, dict):
            raise TypeError(f"{cls.__name__}.load_from_dict expects a dict, got {type(config_dict).__name__}")
        known = {field.name for field in fields(cls)}
        unknown = set(config_dict) - known
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        required = [f.name for f in fields(cls)
                    if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in config_dict]
        if missing:
            raise ValueError(f"{cls.__name__}: missing required keys {missing}")
        values = {}
        for name, value in config_dict.items():
            nested = cls._nested.get(name)
            values[name] = nested.load_from_dict(value) if nested and value is not None else value
        return cls(**values)


@dataclass(frozen=True)
class MXConfig(_DictRoundTrip):
    """How one tensor is quantized: format, block size, scale mode, element rounding.

    `elem_dtype_name`: a format name ("float8_e4m3", "e1m2"), an alias ("mxfp8", "mxfp4",
    "float8_e4m3fn", see `torchmx.dtypes.ALIASES`), a `torchmx.dtypes.DType` or a torch dtype
    (torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2, torch.int8); it is stored
    as the canonical name."""

    elem_dtype_name: str
    block_size: int = 32
    scale_mode: str = "floor"
    rounding: str = "even"

    def __post_init__(self):
        # A DType, an alias ("mxfp8") or a torch dtype: stored as the canonical name, so equal
        # configs compare equal and to_dict() gives names torchmx 0.1.0 reads.
        if not _is_format(self.elem_dtype_name):
            raise TypeError("elem_dtype_name must be a format name, a torchmx.dtypes.DType or a "
                            f"torch dtype, got {type(self.elem_dtype_name).__name__}")
        object.__setattr__(self, "elem_dtype_name", dtypes.resolve(self.elem_dtype_name).name)
        args.check_block_size(self.block_size)
        args.check_scale_mode(self.scale_mode)
        args.check_rounding(self.rounding)

    @property
    def elem_dtype(self) -> dtypes.DType:
        return dtypes.from_name(self.elem_dtype_name)

    def quantize(self, x, block_dim: int = -1):
        """(scale_u8, data) of x quantized per this config with blocks along `block_dim`:
        `torch.ops.torchmx.quantize_mx` with this config's options (plain tensors: traces
        into any graph)."""
        if not args.is_int(block_dim):  # the op's schema would take True as 1
            raise TypeError(f"block_dim must be an int, got {type(block_dim).__name__}")
        return torch.ops.torchmx.quantize_mx(x, self.elem_dtype_name, self.block_size,
                                             scale_mode=self.scale_mode, rounding=self.rounding,
                                             block_dim=block_dim)

    def to_mx(self, x, block_dim: int = -1):
        """x quantized per this config with blocks along `block_dim`, as an MXTensor of x's
        dtype (`MXTensor.to_mx` with this config's options)."""
        from .mx_tensor import MXTensor

        return MXTensor.to_mx(x, self.elem_dtype_name, self.block_size, scale_mode=self.scale_mode,
                              rounding=self.rounding, block_dim=block_dim)


def _check_optional_config(value, name: str) -> None:
    if value is not None and not isinstance(value, MXConfig):
        raise TypeError(f"{name} must be an MXConfig or None, got {type(value).__name__}")


_GRAD_ROLES = ("dgrad_grad_output_config", "dgrad_weight_config", "wgrad_grad_output_config",
               "wgrad_input_config")


@dataclass(frozen=True)
class QLinearGradConfig(_DictRoundTrip):
    """The operands of a linear layer's two backward GEMMs, each quantized along that GEMM's
    reduction dim (None: the operand stays as the straight-through estimator gives it).

    dgrad, grad_input = grad_output @ weight, reduces over out_features:
      `dgrad_grad_output_config` (grad_output, blocks along out_features) and
      `dgrad_weight_config` (the high-precision weight, blocks along out_features).
    wgrad, grad_weight = grad_output^T @ input, reduces over the tokens (all leading dims):
      `wgrad_grad_output_config` and `wgrad_input_config` (the high-precision input), both
      with blocks along the tokens.
    `QLinearGradConfig.uniform(cfg)` uses one MXConfig for all four.
    """

    dgrad_grad_output_config: Optional[MXConfig] = None
    dgrad_weight_config: Optional[MXConfig] = None
    wgrad_grad_output_config: Optional[MXConfig] = None
    wgrad_input_config: Optional[MXConfig] = None

    _nested = {name: MXConfig for name in _GRAD_ROLES}

    def __post_init__(self):
        for name in _GRAD_ROLES:
            _check_optional_config(getattr(self, name), name)

    @classmethod
    def uniform(cls, config: MXConfig) -> "QLinearGradConfig":
        """The same MXConfig for every backward operand."""
        if not isinstance(config, MXConfig):
            raise TypeError(f"config must be an MXConfig, got {type(config).__name__}")
        return cls(config, config, config, config)


@dataclass(frozen=True)
class QLinearConfig(_DictRoundTrip):
    """A linear layer: weights (blocks along K), activations (blocks along K; None keeps them
    in high precision) and the backward GEMMs (`grad_config`; None: straight-through, high
    precision). An MXConfig given as `grad_config` means `QLinearGradConfig.uniform(it)`."""

    weights_config: MXConfig
    activations_config: Optional[MXConfig] = None
    grad_config: Optional[QLinearGradConfig] = None

    _nested = {"weights_config": MXConfig, "activations_config": MXConfig,
               "grad_config": QLinearGradConfig}

    def __post_init__(self):
        if not isinstance(self.weights_config, MXConfig):
            raise TypeError(f"weights_config must be an MXConfig, got {type(self.weights_config).__name__}")
        _check_optional_config(self.activations_config, "activations_config")
        if isinstance(self.grad_config, MXConfig):
            object.__setattr__(self, "grad_config", QLinearGradConfig.uniform(self.grad_config))
        if self.grad_config is not None and not isinstance(self.grad_config, QLinearGradConfig):
            raise TypeError("grad_config must be a QLinearGradConfig, an MXConfig or None, got "
                            f"{type(self.grad_config).__name__}")


_ATTENTION_TENSORS = ("query_config", "key_config", "value_config", "attention_weights_config")


@dataclass(frozen=True)
class QAttentionConfig(_DictRoundTrip):
    """An attention block: its q/k/v/o projections and, all together or none, the inputs of the
    two attention matmuls (q, k, v and the softmax output)."""

    projection_config: QLinearConfig
    query_config: Optional[MXConfig] = None
    key_config: Optional[MXConfig] = None
    value_config: Optional[MXConfig] = None
    attention_weights_config: Optional[MXConfig] = None

    _nested = {"projection_config": QLinearConfig, **{name: MXConfig for name in _ATTENTION_TENSORS}}

    def __post_init__(self):
        if not isinstance(self.projection_config, QLinearConfig):
            raise TypeError("projection_config must be a QLinearConfig, got "
                            f"{type(self.projection_config).__name__}")
        for name in _ATTENTION_TENSORS:
            _check_optional_config(getattr(self, name), name)
        given = [getattr(self, name) is not None for name in _ATTENTION_TENSORS]
        if any(given) and not all(given):
            raise ValueError(f"give all or none of {', '.join(_ATTENTION_TENSORS)}")

    @property
    def is_qkv_quantization_enabled(self) -> bool:
        return self.query_config is not None


def _is_format(value) -> bool:
    return isinstance(value, (str, dtypes.DType, torch.dtype))


def as_linear_config(value, arg: str = "qconfig") -> QLinearConfig:
    """A QLinearConfig from what the model APIs accept: a QLinearConfig; an MXConfig or a
    format (name, alias, DType, torch dtype) for the weights, activations kept in high precision."""
    if isinstance(value, QLinearConfig):
        return value
    if isinstance(value, MXConfig):
        return QLinearConfig(value)
    if _is_format(value):
        return QLinearConfig(MXConfig(value))
    raise TypeError(f"{arg} must be a torchmx.config.QLinearConfig, an MXConfig or a format name "
                    f"(e.g. 'mxfp4') for the weights, got {type(value).__name__}")


def as_attention_config(value, arg: str = "qattention_config") -> QAttentionConfig:
    """A QAttentionConfig from a QAttentionConfig or anything `as_linear_config` takes (the
    projections only; the attention matmuls stay in high precision)."""
    if isinstance(value, QAttentionConfig):
        return value
    if isinstance(value, (QLinearConfig, MXConfig)) or _is_format(value):
        return QAttentionConfig(as_linear_config(value, arg))
    raise TypeError(f"{arg} must be a torchmx.config.QAttentionConfig, a QLinearConfig, an "
                    f"MXConfig or a format name (e.g. 'mxfp4'), got {type(value).__name__}")

"""MXTensor: a tensor subclass holding MX data (uint8 E8M0 scales and packed element codes).

Its outer dtype and shape are the logical, high-precision ones; the storage is two plain
tensors with the logical tensor's dims (a 0-d tensor is stored as one element):

- `_scale_e8m0`: uint8, the block axis reduced to ceil(n / block_size);
- `_data`: the packed codes (fp4: 2 per byte, element 2i in the low nibble; fp6: 4 in 3 bytes;
  other formats one byte, int8 as torch.int8), the block axis holding packed_length(n) bytes.

Ops on MXTensors go through the table in `torchmx/mx_ops/` (F.linear and torch.matmul are
intercepted above autograd, see __torch_function__); the differentiable casts are in
`autograd.py`. docs/mx_tensor.md describes the design.
"""

from typing import Optional, Sequence, Union

import torch

from . import dtypes, ops as _ops
from ._eager import short_path
from ._memo import memo
from .mx_ops import _registry, layout
from .mx_ops import export as _export
from .mx_ops.strict import MXLayoutWarning, reset_layout_warning, set_strict_matmul, strict_matmul
from .numerics import arguments as args
from .numerics.packing import packed_length

# Inside it, the wrapper's own metadata (dim, shape, requires_grad) is read directly: through
# MXTensor.__torch_function__ each read costs about as much as a small op's launch.
_no_subclass_functions = torch._C.DisableTorchFunctionSubclass

__all__ = [
    "MXTensor",
    "ToMXConstrFunc",
    "FromMXConstrFunc",
    "NoopFwToMXBw",
    "MXLayoutWarning",
    "set_strict_matmul",
    "strict_matmul",
    "reset_layout_warning",
    "allow_dequantize_fallback",
]

STE_MODES = ("identity", "clipped")
MIXED_SCALE_MODES = "mixed"  # scale_mode of a cat of MXTensors whose scale modes differ
_REPR_VALUES = 8  # a multiple of every packing group, so the shown bytes hold whole groups


# (data shape, data strides, logical shape, block axis, format name) -> layout.outer_strides:
# a pure function of them, worked out once per kind of MXTensor
_OUTER_STRIDES = {}


def _outer_strides(data, shape, block_dim, elem_dtype):
    key = (data.shape, data.stride(), shape, block_dim, elem_dtype.name)
    try:
        strides = _OUTER_STRIDES.get(key)
    except TypeError:  # symbolic sizes (torch.compile's dynamic shapes): not remembered
        return layout.outer_strides(data, shape, block_dim, elem_dtype)
    if strides is None:
        strides = memo(_OUTER_STRIDES, key, lambda: layout.outer_strides(data, shape, block_dim,
                                                                         elem_dtype))
    return strides


def _wrap(scale, data, elem_dtype, block_size, orig_dtype, block_dim, scale_mode, shape,
          strides=None) -> "MXTensor":
    """Build an MXTensor from parts already known to be consistent (no validation)."""
    shape = tuple(shape)
    self = torch.Tensor._make_wrapper_subclass(
        MXTensor,
        shape,
        strides=_outer_strides(data, shape, block_dim, elem_dtype) if strides is None else strides,
        dtype=orig_dtype,
        device=data.device,
        requires_grad=False,
    )
    self._scale_e8m0 = scale
    self._data = data
    self._elem_dtype = elem_dtype
    self._block_size = block_size
    self._orig_dtype = orig_dtype
    self._block_dim = block_dim
    self._scale_mode = scale_mode
    return self


def _check_parts(scale, data, elem_dtype, block_size, orig_dtype, padding, block_dim, scale_mode,
                 shape):
    """Validate the constructor's arguments; returns (format, block axis, logical shape, data)
    with MXINT8 data viewed as torch.int8 (uint8 bit patterns are accepted)."""
    elem_dtype = args.check_elem_dtype(elem_dtype)
    args.check_tensor(scale, "scale_e8m0_bits")
    args.check_tensor(data, "data_bits")
    args.check_block_size(block_size)
    args.check_target_dtype(orig_dtype, "orig_dtype")
    if scale_mode != MIXED_SCALE_MODES:
        args.check_scale_mode(scale_mode)
    if scale.dtype != torch.uint8:
        raise TypeError(f"scale_e8m0_bits must have dtype torch.uint8, got {scale.dtype}")
    allowed = (torch.int8, torch.uint8) if elem_dtype.kind == "int" else (torch.uint8,)
    if data.dtype not in allowed:
        raise TypeError(f"data_bits of {elem_dtype.name} must have dtype "
                        f"{' or '.join(map(str, allowed))}, got {data.dtype}")
    if elem_dtype.kind == "int":
        data = data.view(torch.int8)  # one storage dtype per format: cat/stack/copy_ need it
    if data.device != scale.device:
        raise ValueError(f"data_bits and scale_e8m0_bits must be on one device, got "
                         f"{data.device} and {scale.device}")
    if data.dim() == 0 or data.dim() != scale.dim():
        raise ValueError("data_bits and scale_e8m0_bits must have the same number (>= 1) of dims, "
                         f"got shapes {tuple(data.shape)} and {tuple(scale.shape)}")
    axis = args.normalize_block_dim(-1 if block_dim is None else block_dim, data.dim())
    blocks = scale.shape[axis]
    if padding is not None and (not args.is_int(padding)
                                or not 0 <= padding < (block_size if blocks else 1)):
        raise ValueError(f"padding must be an int in [0, block_size - 1] = "
                         f"[0, {block_size - 1}] (0 without blocks), got {padding!r}")
    if shape is None:
        shape = list(data.shape)
        shape[axis] = blocks * block_size - (padding or 0)
    else:
        shape = list(shape)
        if not all(args.is_int(s) and s >= 0 for s in shape):
            raise ValueError(f"shape must be a sequence of non-negative ints, got {tuple(shape)}")
        if len(layout.stored_shape(shape)) != data.dim():
            raise ValueError(f"shape {tuple(shape)} must have data_bits' number of dims "
                             f"({data.dim()}), or be () with 1-d data_bits")
        implied = blocks * block_size - layout.stored_shape(shape)[axis]
        if padding is not None and padding != implied:
            raise ValueError(f"padding={padding} disagrees with shape={tuple(shape)} (which "
                             f"implies padding {implied}); give one of them")
    expected_data, expected_scale = layout.storage_shapes(shape, axis, elem_dtype, block_size)
    if list(data.shape) != expected_data or list(scale.shape) != expected_scale:
        raise ValueError(
            f"shapes do not match: data_bits {tuple(data.shape)} and scale_e8m0_bits "
            f"{tuple(scale.shape)} cannot hold a {elem_dtype.name} tensor of shape {tuple(shape)} "
            f"in blocks of {block_size} along block_dim {axis} (expected data "
            f"{tuple(expected_data)}, scale {tuple(expected_scale)})")
    return elem_dtype, axis, shape, data


class MXTensor(torch.Tensor):
    """A tensor in an OCP MX format; its dtype and shape are the logical high-precision ones.

    Build one with `MXTensor.to_mx(data_hp, elem_dtype, block_size)`. The constructor keeps
    torchmx 0.1.0's arguments: `padding` is blocks * block_size - n, the zeros that complete the
    last block along `block_dim` (default: the last dim). `shape` (keyword) gives the logical
    shape instead of `padding` (giving both is allowed only when they agree), and is how a 0-d
    MXTensor is built. MXINT8 data may be int8 or its uint8 bit pattern (stored as int8).
    """

    _scale_e8m0: torch.Tensor
    _data: torch.Tensor
    _elem_dtype: dtypes.DType
    _block_size: int
    _orig_dtype: torch.dtype
    _block_dim: int
    _scale_mode: str

    @staticmethod
    def __new__(
        cls,
        scale_e8m0_bits: torch.Tensor,
        data_bits: torch.Tensor,
        elem_dtype: Union[dtypes.DType, str],
        block_size: int,
        orig_dtype: torch.dtype,
        padding: Optional[int] = None,
        block_dim: Optional[int] = None,
        *,
        scale_mode: str = "floor",
        shape: Optional[Sequence[int]] = None,
    ):
        elem_dtype, axis, shape, data_bits = _check_parts(
            scale_e8m0_bits, data_bits, elem_dtype, block_size, orig_dtype, padding, block_dim,
            scale_mode, shape)
        return _wrap(scale_e8m0_bits, data_bits, elem_dtype, block_size, orig_dtype, axis,
                     scale_mode, shape)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """F.linear and torch.matmul (`@`) with an MX argument run as one custom op
        (torch.ops.torchmx.mx_linear / mx_matmul, mx_ops/matmul.py), whatever the layout, in
        eager, torch.compile and export alike. Everything else dispatches normally; results
        are plain tensors unless an op of the table builds an MXTensor."""
        handler = _registry.TORCH_FUNCTIONS.get(func)
        if handler is not None:
            return handler(func, args, kwargs or {})
        with torch._C.DisableTorchFunctionSubclass():
            try:
                return func(*args, **(kwargs or {}))
            except RuntimeError as e:
                if _export.refused(e):
                    raise _export.unsupported(func) from None
                raise

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _registry.aten_handler(func)(func, args, kwargs or {})

    # ---------------------------------------------------------------- metadata

    @property
    def elem_dtype(self) -> dtypes.DType:
        return self._elem_dtype

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def block_dim(self) -> int:
        """The block axis (non-negative; 0 for a 0-d tensor)."""
        return self._block_dim

    @property
    def scale_mode(self) -> str:
        """How the scales were chosen (informational: it does not affect dequantization)."""
        return self._scale_mode

    @property
    def _block_dim_size(self):
        """Number of logical elements along the block axis."""
        return 1 if self.dim() == 0 else self.shape[self._block_dim]

    @property
    def _padding(self):
        """torchmx 0.1.0's name: zeros that complete the last block, blocks * block_size - n."""
        return self._scale_e8m0.shape[self._block_dim] * self._block_size - self._block_dim_size

    def _replace(self, scale, data, *, block_dim=None, shape=None, orig_dtype=None,
                 scale_mode=None) -> "MXTensor":
        """A new MXTensor with this one's format and the given parts."""
        return _wrap(
            scale, data, self._elem_dtype, self._block_size,
            self._orig_dtype if orig_dtype is None else orig_dtype,
            self._block_dim if block_dim is None else block_dim,
            self._scale_mode if scale_mode is None else scale_mode,
            self.shape if shape is None else shape,
        )

    # ---------------------------------------------------------------- torch.compile / pickling

    def __tensor_flatten__(self):
        meta = (self._elem_dtype.name, self._block_size, self._orig_dtype, self._block_dim,
                self._scale_mode)
        return ["_scale_e8m0", "_data"], meta

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        name, block_size, orig_dtype, block_dim, scale_mode = meta
        return _wrap(inner_tensors["_scale_e8m0"], inner_tensors["_data"], dtypes.from_name(name),
                     block_size, orig_dtype, block_dim, scale_mode, outer_size, outer_stride)

    def __reduce_ex__(self, protocol):
        parts = (self._scale_e8m0, self._data, self._elem_dtype.name, self._block_size,
                 self._orig_dtype, self._block_dim, self._scale_mode, tuple(self.shape),
                 self.requires_grad)
        if isinstance(self, torch.nn.Parameter):  # a tenth argument (older torchmx reads nine)
            parts += (True,)
        return _rebuild_mx_tensor, parts

    # ---------------------------------------------------------------- conversions

    @staticmethod
    def to_mx(
        data_hp: torch.Tensor,
        elem_dtype: Union[dtypes.DType, str],
        block_size: int = 32,
        *,
        scale_mode: str = "floor",
        rounding: str = "even",
        block_dim: Optional[int] = -1,
        seed: Union[int, torch.Generator, None] = None,
        ste: str = "identity",
    ) -> "MXTensor":
        """Quantize a fp32/bf16/fp16 tensor to MX, differentiably.

        The backward is the straight-through estimator: `ste="identity"` passes the gradient
        unchanged, `ste="clipped"` zeroes it where the input saturated (|x| above the block's
        largest representable magnitude). Other arguments as in torch.ops.torchmx.quantize_mx;
        `block_dim=None` means the last dim. Arguments are validated by ToMXConstrFunc; only
        what cannot enter a graph (a DType object, a torch.Generator) is resolved here.
        """
        if type(data_hp) is torch.Tensor and short_path(data_hp):
            key = (elem_dtype, type(block_size), block_size, scale_mode, rounding,
                   type(block_dim), block_dim, ste, data_hp.dtype, data_hp.dim())
            try:
                checked = _TO_MX_CHECKED.get(key)
            except TypeError:  # an unhashable argument: the checks below name it
                checked = key = None
            if checked is None:
                checked = _check_to_mx(key, data_hp, elem_dtype, block_size, scale_mode,
                                       rounding, block_dim, ste)
            fmt, axis = checked
            if seed is not None or rounding == "stochastic":
                seed = args.resolve_seed(_autograd.resolve_seed(seed, rounding), rounding)
            scale, data = _ops.quantize_checked(data_hp, fmt, block_size, scale_mode, rounding,
                                                axis, seed)
            return _wrap(scale, data, fmt, block_size, data_hp.dtype, axis, scale_mode,
                         data_hp.shape)
        if isinstance(data_hp, MXTensor):
            raise TypeError("data_hp is already an MXTensor; call .dequantize() first to "
                            "requantize")
        name = args.check_elem_dtype(elem_dtype).name
        seed = _autograd.resolve_seed(seed, rounding)
        if isinstance(data_hp, torch.Tensor) and short_path(data_hp):
            return _autograd.quantize_checked(data_hp, name, block_size, scale_mode, rounding,
                                              block_dim, seed, ste)
        return _to_mx(data_hp, name, block_size, scale_mode, rounding, block_dim, seed, ste)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The exact MX values, rounded once to `dtype` (default: the logical dtype).

        Differentiable (identity backward)."""
        return _from_mx(self, self._orig_dtype if dtype is None else dtype)

    def to_dtype(self, target_dtype: torch.dtype) -> torch.Tensor:
        """torchmx 0.1.0's name of dequantize(target_dtype)."""
        return _from_mx(self, target_dtype)

    # ---------------------------------------------------------------- printing

    def __repr__(self, *, tensor_contents=None) -> str:
        parts = [
            self._elem_dtype.name,
            f"block_size={self._block_size}",
            f"block_dim={self._block_dim}",
            f"scale_mode={self._scale_mode!r}",
            f"shape={tuple(self.shape)}",
            f"dtype={self.dtype}",
        ]
        if self.device.type != "cpu":
            parts.append(f"device={self.device}")
        parts.append(f"values={self._repr_values()}")
        if self.grad_fn is not None:
            parts.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            parts.append("requires_grad=True")
        return f"MXTensor({', '.join(parts)})"

    def _repr_values(self) -> str:
        """The first few values along the block axis of the first row, dequantized."""
        if torch._subclasses.fake_tensor.is_fake(self._data) or self._data.device.type == "meta":
            return "<not materialized>"
        if self.numel() == 0:
            return "[]"
        n = min(self._block_dim_size, _REPR_VALUES)
        row = [0] * self._data.dim()
        row[self._block_dim] = slice(0, packed_length(n, self._elem_dtype))
        data = self._data[tuple(row)]
        row[self._block_dim] = slice(0, layout.ceil_div(n, self._block_size))
        scale = self._scale_e8m0[tuple(row)]
        with torch.no_grad():
            values = torch.ops.torchmx.dequantize_mx(
                data, scale, self._elem_dtype.name, self._block_size, torch.float32, 0,
                block_dim_size=n)
        shown = ", ".join(f"{v:.4g}" for v in values.tolist())
        more = ", ..." if self.numel() > n else ""
        return f"[{shown}{more}]"


def _rebuild_mx_tensor(scale, data, elem_dtype_name, block_size, orig_dtype, block_dim,
                       scale_mode, shape, requires_grad, is_parameter=False):
    """Unpickle an MXTensor (validating its parts: a checkpoint is untrusted input), an
    nn.Parameter again if it was one (torch.export.load checks that parameters are)."""
    try:
        for name, flag in (("requires_grad", requires_grad), ("is_parameter", is_parameter)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        tensor = MXTensor(scale, data, elem_dtype_name, block_size, orig_dtype,
                          block_dim=block_dim, scale_mode=scale_mode, shape=shape)
    except (TypeError, ValueError) as e:  # any crafted part: one error type for all of them
        raise ValueError(f"invalid MXTensor in the checkpoint: {e}") from None
    if is_parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


# torch.load(weights_only=True) may rebuild MXTensors: the one global they pickle to.
torch.serialization.add_safe_globals([_rebuild_mx_tensor])


# ---------------------------------------------------------------- quantize, dequantize (no grad)

def quantize(data_hp, elem_dtype_name, block_size, scale_mode, rounding, block_dim,
             seed) -> MXTensor:
    """MXTensor holding torch.ops.torchmx.quantize_mx(data_hp, ...) (no autograd)."""
    quantize_mx = _ops.quantize_mx.eager()
    scale, data = quantize_mx(data_hp, elem_dtype_name, block_size, scale_mode=scale_mode,
                              rounding=rounding, block_dim=block_dim, seed=seed)
    axis = args.normalize_block_dim(block_dim, data_hp.dim())
    return _wrap(scale, data, dtypes.from_name(elem_dtype_name), block_size, data_hp.dtype, axis,
                 scale_mode, data_hp.shape)


# The kinds of to_mx arguments accepted on its short path (formats, sizes, modes, the input's
# dtype and dims) -> (format, block axis): checked once, looked up after.
_TO_MX_CHECKED = {}


def _check_to_mx(key, data_hp, elem_dtype, block_size, scale_mode, rounding, block_dim, ste):
    """to_mx's checks (ToMXConstrFunc's), remembered under `key` (None: not remembered)."""
    name, axis = _autograd.check_quantize_arguments(data_hp, elem_dtype, block_size, scale_mode,
                                                    rounding, block_dim)
    _autograd.check_ste(ste)
    checked = (dtypes.from_name(name), axis)
    return checked if key is None else memo(_TO_MX_CHECKED, key, lambda: checked)


def dequantize(tensor: MXTensor, dtype: torch.dtype) -> torch.Tensor:
    """The exact values of `tensor` rounded once to `dtype` (no autograd).

    The result is dense, its dims in the storage's memory order (a transposed MXTensor
    dequantizes to a transposed tensor), so no packed data is reordered.
    """
    return _dequantize(tensor, dtype, short_path())


def dequantize_short(tensor: MXTensor, dtype: torch.dtype) -> torch.Tensor:
    """`dequantize` for a caller on the short path of _eager.py (no operator)."""
    return _dequantize(tensor, dtype, True)


def _dequantize(tensor: MXTensor, dtype: torch.dtype, short: bool) -> torch.Tensor:
    """`dequantize` through the dequantize_mx operator, or (`short`: on the short path of
    _eager.py) its body after the checks, which an MXTensor's parts pass by construction."""
    data, scale, axis = tensor._data, tensor._scale_e8m0, tensor._block_dim
    with _no_subclass_functions():  # the wrapper's own metadata, without __torch_function__
        zero_dim, n = tensor.dim() == 0, tensor._block_dim_size
    order = None if data.is_contiguous() else layout.storage_order(data)
    if order == sorted(order or ()):
        order = None  # dims already in memory order
    if order is not None:
        data, scale, axis = data.permute(order), scale.permute(order), order.index(axis)
    if short:
        out = _ops.dequantize_checked(data, scale, tensor._elem_dtype, tensor._block_size, dtype,
                                      axis, n)
    else:
        out = torch.ops.torchmx.dequantize_mx(data, scale, tensor._elem_dtype.name,
                                              tensor._block_size, dtype, axis, block_dim_size=n)
    if order is not None:
        out = out.permute([order.index(d) for d in range(len(order))])
    return out.reshape(()) if zero_dim else out


# The autograd functions and the op table import this module: import them last.
from . import autograd as _autograd  # noqa: E402
from .autograd import FromMXConstrFunc, NoopFwToMXBw, ToMXConstrFunc  # noqa: E402
from ._dynamo_rules import allow_in_graph  # noqa: E402


@allow_in_graph
def _to_mx(data_hp, elem_dtype_name, block_size, scale_mode, rounding, block_dim, seed, ste):
    return ToMXConstrFunc.apply(data_hp, elem_dtype_name, block_size, scale_mode, rounding,
                                block_dim, seed, ste)


@allow_in_graph
def _from_mx_function(tensor, dtype):
    return FromMXConstrFunc.apply(tensor, dtype)


def _from_mx(tensor, dtype):
    short = False
    if not torch.compiler.is_compiling():  # (what follows is for eager calls only)
        with _no_subclass_functions():  # tensor.requires_grad: not through __torch_function__
            short = short_path(tensor)
    if short:
        return _dequantize(tensor, _autograd.check_dequantize_dtype(dtype), True)
    return _from_mx_function(tensor, dtype)


from .mx_ops import fallback, matmul, sharding, storage, views  # noqa: E402,F401  (registers the table)
from .mx_ops.fallback import allow_dequantize_fallback  # noqa: E402

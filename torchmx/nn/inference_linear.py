"""MXInferenceLinear: a linear layer whose weight is stored packed in an MX format.

The weight lives in two uint8 buffers, `weight_scale` (E8M0 bytes, (out, ceil(in / block)))
and `weight_data` (the packed codes, (out, packed bytes of in); MXINT8 codes as their uint8
bit pattern), so state_dict, torch.load(weights_only=True) and safetensors see plain tensors.
At forward the buffers are viewed as an MXTensor (`.weight`), the input is quantized on the fly
(per `activations_config`) and F.linear runs on MX operands: MXTensor's linear dispatch (the
exact product, fp32 accumulation; a fused kernel where one exists).
"""

import functools
import weakref
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import dtypes
from .._eager import short_path
from ..kernels._launch import hooks_installed
from ..config import QLinearConfig
from ..kernels.layouts import fp4_wgmma_layout, mma_layout, tma_stream_layout
from ..kernels.linear import dispatch as linear_dispatch
from ..mx_ops import weight_matmul
from ..mx_ops.matmul import exact_weight_linear
from ..mx_ops.fragment_linear import mx_fp4_fragment_linear  # noqa: F401 - registers the op
from ..mx_ops.piece_linear import mx_piece_linear  # noqa: F401 - registers the op
from ..mx_ops.stream_linear import mx_stream_linear  # noqa: F401 - registers the op
from ..mx_tensor import MXTensor
from ..numerics.packing import packed_length
from . import arguments, extra_state
from .mx_linear import check_linear, check_qconfig, describe_qconfig

__all__ = ["MXInferenceLinear", "prepack_weights"]

_EXTRA_STATE_VERSION = 1
# prepack()'s copy of the weight (the TMA stream layout, the fp4 wgmma layout for MXFP4 or the
# MMA layout): its codes, its scales and the kernel's split-K counters.
_PREPACKED_BUFFERS = ("weight_prepacked_codes", "weight_prepacked_scales",
                      "weight_prepacked_counters")
# Their earlier names, as layers pickled and state dicts saved by earlier versions hold them.
_OLD_PREPACKED_BUFFERS = dict(zip(("weight_fragment_codes", "weight_fragment_scales",
                                   "weight_fragment_counters"), _PREPACKED_BUFFERS))


class _PackedLinearFunction(torch.autograd.Function):
    """F.linear(quantized x, MX weight, bias) with a straight-through gradient for x.

    Autograd of the MX matmul itself would multiply the gradient by the MX weight along its
    out_features (off its block axis: exact, but flagged with MXLayoutWarning); this backward
    multiplies by the dequantized weight instead.
    """

    @staticmethod
    def forward(ctx, x, weight_mx, bias, activations_config, prepacked, direct=None):
        """`direct`: None, or a function (x, bias) -> the product `_packed_linear` computes,
        by the layer's own plan or bound product (forward's eager calls)."""
        ctx.save_for_backward(weight_mx)
        ctx.dtypes = (x.dtype, None if bias is None else bias.dtype)
        if direct is not None:
            return direct(x, bias)
        return _packed_linear(x, weight_mx, bias, activations_config, prepacked)

    @staticmethod
    def backward(ctx, grad_output):
        (weight_mx,) = ctx.saved_tensors
        x_dtype, bias_dtype = ctx.dtypes
        grad_x = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_output @ weight_mx.dequantize(grad_output.dtype)).to(x_dtype)
        if bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = grad_output.reshape(-1, grad_output.shape[-1]).sum(0).to(bias_dtype)
        return grad_x, None, grad_b, None, None, None


def _packed_linear(x, weight_mx, bias, activations_config, prepacked):
    if activations_config is not None:
        x = activations_config.to_mx(x, -1)
    elif prepacked is not None:  # weight-only: the op picks its kernel or the usual path
        layout, codes, scales, counters, fold, elem_dtype_name = prepacked
        if layout == "tma_stream":
            return torch.ops.torchmx.mx_stream_linear(
                x, codes, scales, counters, weight_mx._scale_e8m0, weight_mx._data,
                elem_dtype_name, weight_mx.shape[1], bias, x.dtype)
        if layout == "fp4_wgmma":
            return torch.ops.torchmx.mx_fp4_fragment_linear(
                x, codes, scales, counters, fold, weight_mx._scale_e8m0, weight_mx._data,
                weight_mx.shape[1], bias, x.dtype)
        return torch.ops.torchmx.mx_piece_linear(
            x, codes, scales, counters, weight_mx._scale_e8m0, weight_mx._data, elem_dtype_name,
            weight_mx.shape[1], bias, x.dtype)
    return F.linear(x, weight_mx, bias)


def _exact_product(weight_mx, x, bias):
    """_packed_linear(x, weight_mx, bias, None, None) where no kernel takes the product."""
    return exact_weight_linear(x, weight_mx, bias)


_LAYOUT_NAMES = {tma_stream_layout: "tma_stream", fp4_wgmma_layout: "fp4_wgmma", mma_layout: "mma"}


def _stream_layout_wanted(fmt: dtypes.DType, out_features: int, in_features: int,
                          device: torch.device) -> bool:
    """Whether prepack() makes a stream-layout copy of a weight [out_features, in_features] of
    this format on `device`: an sm_90 GPU where Triton has Gluon, with the kernel's CTAs (its
    64-row tiles, times the split of K) filling enough of the GPU's waves
    (stream_matmul.fills_waves). Elsewhere the fp4 wgmma and MMA kernels are the faster."""
    if device.type != "cuda":
        return False
    from ..kernels.linear import stream_matmul  # imports Triton: asked only for CUDA weights
    return (stream_matmul.usable_on(device)
            and stream_matmul.fills_waves(fmt, out_features, in_features, device))


def _prepack_layout(qconfig: QLinearConfig, out_features: int, in_features: int,
                    device: torch.device):
    """The layout module whose copy prepack() makes for this layer on `device` (tma_stream_layout
    where _stream_layout_wanted; else fp4_wgmma_layout for MXFP4 and mma_layout for the other
    formats), or None where none fits."""
    fmt, block = qconfig.weights_config.elem_dtype, qconfig.weights_config.block_size
    if qconfig.activations_config is not None:
        return None
    layouts = (fp4_wgmma_layout, mma_layout)  # MXFP4: the fp4 wgmma layout, the faster
    if (fmt in tma_stream_layout.FORMATS
            and _stream_layout_wanted(fmt, out_features, in_features, device)):
        layouts = (tma_stream_layout,) + layouts
    for layout in layouts:
        if layout.fits(fmt, block, out_features, in_features):
            return layout
    return None


# layer -> {dtype: (weight source, the weight viewed as an MXTensor)}: outside the layer, so
# that it is neither pickled, copied nor moved with it.
_WEIGHT_VIEWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# layer -> (its stream copy's source, {kind of input: StreamPlan or None}): outside the layer too
_STREAM_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# layer -> (its weight's source, {(input shape, input dtype, bias or none): (the product bound
# to the weight, CUDA device index) or None}): the eager calls of a layer without a prepacked
# copy (`_bound_call`)
_BOUND: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_transforms = torch._C._are_functorch_transforms_active


class MXInferenceLinear(nn.Module):
    """Inference linear layer with a packed MX weight; activations quantized on the fly.

    Build it with `MXInferenceLinear.from_float(linear, qconfig)` (an nn.Linear or an
    MXLinear, on any device including meta), or directly (empty buffers, to be loaded).
    The logical weight dtype follows the input at forward (the bias is cast to it), so an
    fp32, bf16 or fp16 input gives an output of its own dtype from the same packed weight. Gradients flow to the input (straight-through) and to
    the bias; the packed weight is not trainable. `to_float()` gives a plain nn.Linear back.
    """

    weight_scale: torch.Tensor
    weight_data: torch.Tensor

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, qconfig: QLinearConfig):
        super().__init__()
        arguments.check_features("MXInferenceLinear", in_features=in_features,
                                 out_features=out_features)
        arguments.check_bias_flag("MXInferenceLinear", bias)
        arguments.check_dtype("MXInferenceLinear", dtype)
        arguments.check_device("MXInferenceLinear", device)
        self.qconfig = check_qconfig(qconfig)
        self.in_features, self.out_features = in_features, out_features
        # the weight's logical dtype; follows the bias when there is one (see weight_dtype)
        self._weight_dtype = torch.get_default_dtype() if dtype is None else dtype
        fmt, block = qconfig.weights_config.elem_dtype, qconfig.weights_config.block_size
        self.register_buffer("weight_scale", torch.empty(
            out_features, -(-in_features // block), dtype=torch.uint8, device=device))
        self.register_buffer("weight_data", torch.empty(
            out_features, packed_length(in_features, fmt), dtype=torch.uint8, device=device))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self._init_prepacked()
        self.register_load_state_dict_post_hook(_refresh_prepacked)

    def _init_prepacked(self) -> None:
        """No prepacked copy (prepack() adds one; it is not saved: rebuilt from the weight)."""
        for name in _PREPACKED_BUFFERS:
            self.register_buffer(name, None, persistent=False)
        self._prepacked_fold = True
        self._prepacked_layout = None  # "tma_stream", "fp4_wgmma" or "mma" (_LAYOUT_NAMES)
        self._prepacked_source = None  # what the copy was built from (`_weight_source`)

    def __setstate__(self, state):
        buffers = state.get("_buffers", {})
        non_persistent = state.get("_non_persistent_buffers_set", set())
        for old, new in _OLD_PREPACKED_BUFFERS.items():  # pickled under the earlier names
            if old in buffers:
                buffers[new] = buffers.pop(old)
            if old in non_persistent:
                non_persistent.discard(old)
                non_persistent.add(new)
        for old in ("fold", "layout", "source"):  # pickled under the earlier attribute names
            if f"_fragment_{old}" in state:
                state[f"_prepacked_{old}"] = state.pop(f"_fragment_{old}")
        super().__setstate__(state)
        if "_prepacked_source" not in self.__dict__:  # pickled before prepack() existed
            self._init_prepacked()
        elif "_prepacked_layout" not in self.__dict__:  # pickled before the stream layout
            self._prepacked_layout = None  # prepack() below names the layout of its copy
        if self.prepacked:
            # Rebuilt from the weight, as forward would on its first eager call (the weight
            # tensors are new): the pickled copy may be in another version of its layout (the
            # stream layout's fp4 words changed) or suit another GPU, and a first call under
            # torch.compile would not check.
            self.prepack()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A prepacked copy saved under the earlier buffer names is dropped: the copy is never
        # loaded, prepack() rebuilds it from the loaded weight.
        for old in _OLD_PREPACKED_BUFFERS:
            state_dict.pop(prefix + old, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @classmethod
    def from_float(cls, linear: nn.Linear, qconfig: Optional[QLinearConfig] = None
                   ) -> "MXInferenceLinear":
        """Quantize `linear`'s weight (blocks along in_features) and keep its bias.

        `qconfig` defaults to the layer's own when `linear` is an MXLinear (QAT -> inference).
        A meta-device layer gives meta buffers (load real ones with load_state_dict(assign=True)).
        """
        check_linear(linear)
        if qconfig is None:
            qconfig = getattr(linear, "qconfig", None)
            if qconfig is None:
                raise TypeError("qconfig must be a torchmx.config.QLinearConfig (it can only be "
                                "omitted for an MXLinear), got None")
        check_qconfig(qconfig)
        weight = linear.weight.detach()
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                      dtype=weight.dtype, qconfig=qconfig)
        scale, data = qconfig.weights_config.quantize(weight, -1)
        new.weight_scale = scale
        new.weight_data = data.view(torch.uint8)
        new.bias = linear.bias
        new.train(linear.training)
        return new

    @property
    def weight_dtype(self) -> torch.dtype:
        """The weight's logical (high-precision) dtype: the bias's dtype when there is a bias
        (so it follows .to(dtype), .half(), load_state_dict(assign=True)); otherwise the dtype
        given at construction, updated by module dtype conversions (.to/.half/.bfloat16)."""
        return self.bias.dtype if self.bias is not None else self._weight_dtype

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.prepacked:  # the copy went through the same conversion as the weight
            self._prepacked_source = self._weight_source()
        if self.bias is not None:
            self._weight_dtype = self.bias.dtype
        else:  # the uint8 buffers carry no float dtype: see what fn does to one
            try:
                self._weight_dtype = fn(torch.empty(0, dtype=self._weight_dtype)).dtype
            except Exception:  # noqa: BLE001 - an fn that cannot take a probe: keep the dtype
                pass
        return self

    @property
    def weight(self) -> MXTensor:
        """The packed weight as an MXTensor of logical dtype `weight_dtype` (no copy)."""
        return self._weight_mx(self.weight_dtype)

    def _weight_mx(self, dtype: torch.dtype) -> MXTensor:
        cfg = self.qconfig.weights_config
        data = self.weight_data
        if cfg.elem_dtype.kind == "int":
            data = data.view(torch.int8)
        return MXTensor(self.weight_scale, data, cfg.elem_dtype_name, cfg.block_size, dtype,
                        block_dim=1, scale_mode=cfg.scale_mode,
                        shape=(self.out_features, self.in_features))

    def prepack(self) -> "MXInferenceLinear":
        """Add a copy of the weight laid out for Hopper's tensor cores and return self.

        Forward then multiplies bf16 inputs of few rows on an sm_90 GPU (H100 / H200) with a
        kernel that reads the copy. On an sm_90 GPU where Triton has Gluon (Triton 3.6), the
        stream layout (torchmx/kernels/layouts/tma_stream_layout.py; every format: 1 to 64 rows for MXFP4
        and MXFP6, 2 to 64 for MXFP8 and MXINT8; in features a multiple of 128, at least 256;
        weights whose kernel CTAs, one per 64-row tile or a few sharing its in features
        (split-K), fill enough of the GPU's waves: on an H100 out features 1024, 4096 and
        8192, and 14336 for MXFP4 and MXFP6; one MXFP4 row only unsplit where they fill 90%).
        Otherwise, and for the shapes it does not take: for MXFP4 the fp4 wgmma layout
        (torchmx/kernels/layouts/fp4_wgmma_layout.py, 2 to 64 rows), for the other formats the MMA
        layout (torchmx/kernels/layouts/mma_layout.py; 2 to 64 rows, fp6 1 to 32). All are faster
        than the standard layout's kernels (docs/matmul.md). Other inputs take the usual path,
        with the same numerics (exact products, fp32 sums, one rounding). Needs a weight-only
        config (no activations_config) with weights in blocks of 32, out_features a multiple
        of 64 and in_features of 64 (fp4, one-byte formats) or 128 (fp6). The copy costs the
        weight's bytes again (plus its split-K counters, N / 16 bytes: calls on one prepacked
        layer must not run concurrently on two CUDA streams). Its layout is chosen for the
        weight's device when prepack() runs (and again when a state dict is loaded). It is not
        saved in the state dict and follows .to(device). It is rebuilt when a state dict is
        loaded, when a pickled layer is loaded (torch.load, copy.deepcopy), and by an eager
        forward after the weight buffers were written or replaced; under torch.compile that
        check is not traced, so call prepack() again after changing the weight of a compiled
        model.
        """
        cfg = self.qconfig.weights_config
        if self.qconfig.activations_config is not None:
            raise ValueError(f"{self._describe()}.prepack(): the prepacked kernels multiply "
                             "unquantized activations; this layer quantizes them "
                             "(activations_config is set)")
        layout = _prepack_layout(self.qconfig, self.out_features, self.in_features,
                                 self.weight_data.device)
        if layout is None:
            raise ValueError(
                f"{self._describe()}.prepack(): no prepacked layout for {cfg.elem_dtype.name} "
                f"weights in blocks of {cfg.block_size} [{self.out_features}, "
                f"{self.in_features}]; it needs float4_e2m1 weights with in and out features "
                f"multiples of {fp4_wgmma_layout.CHUNK}, or weights of {mma_layout.describe()}")
        if self.weight_data.device.type == "meta":
            raise ValueError(f"{self._describe()}.prepack(): the weight is on the meta device; "
                             "load its values first")
        self._prepacked_fold = True  # used by the fp4 wgmma kernel alone
        if layout is tma_stream_layout:
            codes, scales = tma_stream_layout.pack(self.weight_scale, self.weight_data,
                                               cfg.elem_dtype)
        elif layout is fp4_wgmma_layout:
            codes, scales = fp4_wgmma_layout.preshuffle(self.weight_scale, self.weight_data)
            self._prepacked_fold = fp4_wgmma_layout.fold_scales(self.weight_scale)
        else:
            codes, scales = mma_layout.pack(self.weight_scale, self.weight_data, cfg.elem_dtype)
        self.weight_prepacked_codes, self.weight_prepacked_scales = codes, scales
        self.weight_prepacked_counters = torch.zeros(
            self.out_features // layout.CHUNK, dtype=torch.int32, device=codes.device)
        self._prepacked_layout = _LAYOUT_NAMES[layout]
        self._prepacked_source = self._weight_source()
        _BOUND.pop(self, None)  # forward now takes the prepacked copy's kernels
        return self

    def _weight_source(self) -> tuple:
        """Identifies the weight buffers' contents: in-place writes bump a tensor's version,
        assignments and moves replace the tensor."""
        buffers = self._buffers  # (not Module.__getattr__: forward asks at every call)
        data, scale = buffers["weight_data"], buffers["weight_scale"]
        # inference tensors have no version counter
        return (id(data), 0 if data.is_inference() else data._version, data.data_ptr(),
                id(scale), 0 if scale.is_inference() else scale._version, scale.data_ptr())

    @property
    def prepacked(self) -> bool:
        """Whether prepack() added the prepacked copy."""
        return self.weight_prepacked_codes is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y = F.linear(x quantized per activations_config, weight, bias) in x's dtype: the
        packed weight is viewed in x's dtype and the bias cast to it (any of fp32, bf16, fp16
        input works whatever the layer's weight_dtype)."""
        if not _is_compiling():
            out = self._bound_call(x)
            if out is not None:
                return out
        arguments.check_linear_input(self._describe, x, self.in_features)
        bias = self._parameters["bias"]  # (not Module.__getattr__: forward asks at every call)
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)  # differentiable: the gradient reaches the bias in its dtype
        compiling = _is_compiling()
        source = None if compiling else self._weight_source()
        prepacked = None
        if self._buffers["weight_prepacked_codes"] is not None:
            if not compiling and self._prepacked_source != source:
                self.prepack()  # the weight buffers were written or replaced since
            prepacked = (self._prepacked_layout, self.weight_prepacked_codes,
                        self.weight_prepacked_scales,
                        self.weight_prepacked_counters, self._prepacked_fold,
                        self.qconfig.weights_config.elem_dtype_name)
        if compiling:
            return _PackedLinearFunction.apply(x, self._weight_mx(x.dtype), bias,
                                               self.qconfig.activations_config, prepacked)
        weight, kernel_parts = self._weight_view(x.dtype, source)
        if (prepacked is None and self.qconfig.activations_config is None
                and type(x) is torch.Tensor
                and not weight_matmul.kernels_on(self._buffers["weight_data"])):
            # no kernel on this device (CPU): what F.linear(x, weight, bias) computes, directly
            if short_path(x, bias):
                return exact_weight_linear(x, weight, bias)
            return _PackedLinearFunction.apply(x, weight, bias, None, None, functools.partial(
                _exact_product, weight))
        device = self._buffers["weight_data"].get_device()
        # operands on other devices go to the operators, whose checks name them
        one_device = x.get_device() == device and (bias is None or bias.get_device() == device)
        usable = (kernel_parts is not None and one_device  # its [1]: the weight's codes
                  and weight_matmul._kernels_usable(kernel_parts[1].device))
        if short_path(x, bias):
            if self._prepacked_layout == "tma_stream" and prepacked is not None and one_device:
                out = self._stream_call(x, bias)
                if out is not None:
                    return out
                if usable:
                    prepacked = None  # the operator would run mx_weight_linear's kernels: below
            if (usable and prepacked is None
                    and (bias is None or bias.shape[0] == self.out_features)):
                # what F.linear(x, weight, bias) reaches below MXTensor's dispatch, its parts
                # (one MXTensor's) and route decided when the view was made
                scale, data, fmt, block_size, K, plans = kernel_parts
                out = linear_dispatch.linear(x, scale, data, fmt, block_size, K, bias, x.dtype,
                                            plans)
                if prepacked is None and bias is self._parameters["bias"]:
                    self._bind(x, bias, source, kernel_parts)
                return out
            return _packed_linear(x, weight, bias, self.qconfig.activations_config, prepacked)
        if (usable and prepacked is None and type(x) is torch.Tensor
                and (bias is None or bias.shape[0] == self.out_features)):
            # a gradient is asked: the same product through this weight's plans, below the
            # autograd.Function (whose backward is the straight-through one)
            scale, data, fmt, block_size, K, plans = kernel_parts
            out = _PackedLinearFunction.apply(
                x, weight, bias, None, None, lambda x, bias: linear_dispatch.linear(
                    x, scale, data, fmt, block_size, K, bias, x.dtype, plans))
            if bias is self._parameters["bias"]:
                self._bind(x, bias, source, kernel_parts)
            return out
        return _PackedLinearFunction.apply(x, weight, bias, self.qconfig.activations_config,
                                           prepacked)

    def _bound_call(self, x):
        """forward(x) through the product bound to this layer's weight for inputs like x
        (`_bind`: the kernel launches of the linear's plan, its compiled kernels called
        directly), where forward would run that very plan: no prepacked copy, the weight
        buffers unchanged since, the bias absent or in x's dtype, contiguous and aligned, x
        a plain contiguous 16-byte aligned tensor on the weight's CUDA device, and nothing that
        traces, transforms or profiles the call (where a gradient is asked, the product runs
        below the layer's autograd.Function). None elsewhere: the full forward runs."""
        entry = _BOUND.get(self)
        if entry is None or type(x) is not torch.Tensor:
            return None
        bias = self._parameters["bias"]
        bound = entry[1].get((x.shape, x.dtype, bias is None))
        if bound is None:
            return None
        address = x.data_ptr()  # passed as such: the launcher need not ask the tensor
        if (not x.is_contiguous() or address & 15 or x.get_device() != bound[1]
                or _dispatch_modes()
                or _functorch_transforms() or hooks_installed()
                or not weight_matmul.cuda_kernels_on()):
            return None
        bias_address = None
        if bias is not None:
            bias_address = bias.data_ptr()
            if (bias.dtype != x.dtype or not bias.is_contiguous() or bias_address & 15
                    or bias.get_device() != bound[1]):
                return None
        if entry[0] != self._weight_source():  # (prepack() drops the entry)
            return None
        product = bound[0]
        if torch.is_grad_enabled() and (x.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            weight = self._weight_view(x.dtype, entry[0])[0]  # what backward multiplies by
            return _PackedLinearFunction.apply(x, weight, bias, None, None,
                                               lambda x, bias: product(address, bias_address))
        return product(address, bias_address)

    def _bind(self, x, bias, source: tuple, kernel_parts: tuple) -> None:
        """After forward ran kernels/linear/dispatch.py's plan for x (the layer's own bias, no
        prepacked copy): keep the product bound to the weight for inputs like x
        (`dispatch.bound_linear`, None where the plan has none), which `_bound_call` takes."""
        entry = _BOUND.get(self)
        if entry is None or entry[0] != source:
            entry = _BOUND[self] = (source, {})
        if (type(x) is not torch.Tensor or x.device.type != "cuda" or not x.is_contiguous()
                or x.data_ptr() & 15 or hooks_installed()):
            return
        product = linear_dispatch.bound_linear(x, *kernel_parts[:5], bias, x.dtype,
                                               kernel_parts[5])
        entry[1][(x.shape, x.dtype, bias is None)] = (
            None if product is None else (product, x.get_device()))

    def _weight_view(self, dtype: torch.dtype, source: tuple):
        """(`_weight_mx(dtype)`, the arguments of kernels/linear/dispatch.py's linear when F.linear with
        that weight runs it (its parts, the weight's own plans), else None), built once per
        dtype and weight buffers
        (`source`); a view made under inference mode is an inference tensor, which autograd
        may not save: kept apart."""
        views = _WEIGHT_VIEWS.setdefault(self, {})
        key = (dtype, torch.is_inference_mode_enabled())
        cached = views.get(key)
        if cached is None or cached[0] != source:
            weight = self._weight_mx(dtype)
            cfg = self.qconfig.weights_config
            kernel_parts = None
            if (self.qconfig.activations_config is None
                    and linear_dispatch.supported(cfg.elem_dtype, cfg.block_size, dtype)):
                kernel_parts = (weight._scale_e8m0, weight._data, cfg.elem_dtype, cfg.block_size,
                                self.in_features, {})  # the last: this weight's linear plans
            cached = views[key] = (source, weight, kernel_parts)
        return cached[1], cached[2]

    def _stream_call(self, x: torch.Tensor, bias: Optional[torch.Tensor]):
        """mx_stream_linear's body for this layer's stream copy, through a StreamPlan made
        once per kind of input (rows, dtype, device, bias) where the operator would run the
        stream kernel (mx_ops/stream_linear's decision); None where it would not."""
        from ..kernels.linear import stream_matmul
        from ..mx_ops.stream_linear import _stream_rows
        if not weight_matmul._kernels_usable(x.device):
            return None
        K = self.in_features
        rows = x.numel() // K
        if bias is not None:
            bias = bias.contiguous()
        key = (rows, x.dtype, x.device,
               None if bias is None else (bias.dtype, bias.shape, bias.data_ptr() & 15))
        cached = _STREAM_PLANS.get(self)
        if cached is None or cached[0] is not self._prepacked_source:
            cached = _STREAM_PLANS[self] = (self._prepacked_source, {})
        plans = cached[1]
        if key not in plans:
            cfg = self.qconfig.weights_config
            plans[key] = None
            if (_stream_rows(x, self.weight_scale, cfg.elem_dtype, x.dtype) is not None
                    and (bias is None or tuple(bias.shape) == (self.out_features,))):
                plans[key] = stream_matmul.StreamPlan(
                    rows, self.weight_prepacked_codes, self.weight_prepacked_scales,
                    self.weight_scale.contiguous(), self.weight_data.contiguous(),
                    cfg.elem_dtype, bias is not None, x.dtype, self.weight_prepacked_counters)
        plan = plans[key]
        if plan is None:
            return None
        x2 = x.reshape(rows, K)
        if not x2.is_contiguous() or x2.data_ptr() % 16:
            x2 = x2.clone(memory_format=torch.contiguous_format)
        return plan(x2, bias).reshape(*x.shape[:-1], self.out_features)

    def to_float(self, dtype: Optional[torch.dtype] = None) -> nn.Linear:
        """A plain nn.Linear holding the dequantized weight in `dtype` (default weight_dtype).
        Its bias is this layer's (shared) when it has that dtype, else a copy cast to it, so
        the weight and bias always share one dtype."""
        dtype = self.weight_dtype if dtype is None else dtype
        with torch.device("meta"):
            linear = nn.Linear(self.in_features, self.out_features, self.bias is not None)
        linear.weight = nn.Parameter(self._weight_mx(dtype).dequantize())
        if self.bias is not None and self.bias.dtype != dtype:
            linear.bias = nn.Parameter(self.bias.detach().to(dtype),
                                       requires_grad=self.bias.requires_grad)
        else:
            linear.bias = self.bias
        linear.train(self.training)
        return linear

    # The quantization config travels with the state_dict as a uint8 tensor of its JSON text
    # (extra_state.encode: safetensors, save_pretrained and torch.load(weights_only=True) all
    # take it); loading checks it against this layer's, and also reads the dict that older
    # checkpoints hold.
    def get_extra_state(self) -> torch.Tensor:
        return extra_state.encode({"version": _EXTRA_STATE_VERSION,
                                   "qconfig": self.qconfig.to_dict()})

    def set_extra_state(self, state) -> None:
        try:
            state = extra_state.decode(state)
        except ValueError as e:
            raise ValueError(f"{self._describe()}: {e}") from None
        if not isinstance(state, dict) or state.get("version") != _EXTRA_STATE_VERSION:
            raise ValueError(f"{self._describe()}: unrecognized extra state in the checkpoint "
                             f"(expected a torchmx MXInferenceLinear state, version "
                             f"{_EXTRA_STATE_VERSION}): {state!r}")
        if not isinstance(state.get("qconfig"), dict):
            raise ValueError(f"{self._describe()}: the checkpoint's extra state has no 'qconfig' "
                             f"dict (expected {{'version': {_EXTRA_STATE_VERSION}, 'qconfig': "
                             f"{{...}}}}): {state!r}")
        try:
            theirs = QLinearConfig.load_from_dict(state["qconfig"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self._describe()}: invalid quantization config in the "
                             f"checkpoint's extra state: {e}") from None
        if theirs != self.qconfig:
            raise ValueError(f"{self._describe()}: the checkpoint was quantized with "
                             f"[{describe_qconfig(theirs)}], this layer with "
                             f"[{describe_qconfig(self.qconfig)}]; build the model with the "
                             "checkpoint's config")

    def _describe(self) -> str:
        return f"MXInferenceLinear(in_features={self.in_features}, out_features={self.out_features})"

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, {describe_qconfig(self.qconfig)}"
                + (", prepacked" if self.prepacked else ""))


def prepack_weights(model: nn.Module) -> List[str]:
    """MXInferenceLinear.prepack() on every layer of `model` that has a prepacked layout
    (weight-only, blocks of 32; MXFP4 with in and out features multiples of 64, the other
    formats as mma_layout.fits, or as tma_stream_layout.fits where prepack() makes stream
    copies); returns their names. The other layers are left as they
    are."""
    names = []
    for name, module in model.named_modules():
        if (isinstance(module, MXInferenceLinear)
                and _prepack_layout(module.qconfig, module.out_features, module.in_features,
                                    module.weight_data.device)):
            module.prepack()
            names.append(name)
    return names


def _refresh_prepacked(module: MXInferenceLinear, incompatible_keys) -> None:
    """After load_state_dict: rebuild the prepacked copy from the loaded weight."""
    if module.prepacked and module.weight_data.device.type != "meta":
        module.prepack()

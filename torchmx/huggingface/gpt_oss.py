"""gpt-oss MoE experts in MXFP4, in the Hugging Face checkpoint layout, as MXTensors.

gpt-oss checkpoints store each expert projection as two uint8 tensors:
`mlp.experts.{gate_up_proj,down_proj}_blocks` [E, N, K / 32, 16] (two E2M1 codes a byte,
element 2j in the low nibble) and `..._scales` [E, N, K / 32] (E8M0 bytes, bias 127), with
blocks of 32 along the reduction dim K; gate_up's N rows interleave gate (even) and up (odd).
That is torchmx's MXFP4 storage: `experts_mx` views them as one 3-D MXTensor [E, N, K] per
projection (block_dim 2) without copying a byte, and `MXGptOssExperts` keeps them as its
buffers under the same names, so its state dict is the checkpoint's bytes.

- `quantize_experts_(model)`: every GptOssExperts (full-precision weights) becomes an
  MXGptOssExperts (MXFP4, the same routing, the biases kept).
- `from_pretrained(path, **kwargs)`: a gpt-oss checkpoint in the mxfp4 layout, loaded with MX
  experts (TorchMXConfig's quantizer reads the layout; no full-precision copy of the experts).
- TorchMXConfig(weights="mxfp4") on a full-precision gpt-oss checkpoint quantizes its experts
  into MXGptOssExperts while they load (`load_projection`), one projection at a time.
"""

import weakref
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import dtypes
from ..config import MXConfig
from ..mx_ops import routed_linear
from ..mx_tensor import MXTensor

__all__ = ["MXGptOssExperts", "experts_mx", "pack_experts", "quantize_experts_",
           "from_pretrained", "PROJECTIONS", "is_gpt_oss_experts"]

PROJECTIONS = ("gate_up_proj", "down_proj")
# module -> {(projection, dtype, inference mode): (buffers' identity, per-expert MXTensors)}:
# outside the module, so that it is neither saved, copied nor moved with it.
_EXPERT_VIEWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BLOCK = 32
_FP4 = MXConfig("float4_e2m1", _BLOCK)


def _check_layout(blocks: torch.Tensor, scales: torch.Tensor, name: str) -> None:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"{name}: blocks and scales must be uint8, got {blocks.dtype} and "
                        f"{scales.dtype}")
    if blocks.dim() != 4 or blocks.shape[-1] != _BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"{name}: expected blocks [E, N, K/32, 16] and scales [E, N, K/32], "
                         f"got {tuple(blocks.shape)} and {tuple(scales.shape)}")


def experts_mx(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
               name: str = "experts") -> MXTensor:
    """The MXTensor [E, N, K] (blocks of 32 along K, logical dtype `dtype`) that gpt-oss's
    blocks [E, N, K/32, 16] and scales [E, N, K/32] hold, sharing their memory."""
    _check_layout(blocks, scales, name)
    experts, rows, groups, _ = blocks.shape
    return MXTensor(scales, blocks.view(experts, rows, groups * _BLOCK // 2), "float4_e2m1",
                    _BLOCK, dtype, block_dim=2, shape=(experts, rows, groups * _BLOCK))


def pack_experts(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(blocks, scales) in gpt-oss's layout of `weight` [E, N, K] (K a multiple of 32),
    quantized to MXFP4 with blocks of 32 along K (torchmx's default scale and rounding)."""
    if weight.dim() != 3 or weight.shape[-1] % _BLOCK:
        raise ValueError(f"weight must be [E, N, K] with K a multiple of {_BLOCK}, got "
                         f"{tuple(weight.shape)}")
    scales, data = _FP4.quantize(weight, -1)
    experts, rows, k = weight.shape
    return data.view(torch.uint8).reshape(experts, rows, k // _BLOCK, _BLOCK // 2), scales


class MXGptOssExperts(nn.Module):
    """transformers' GptOssExperts with MXFP4 weights: the same forward (top-k routing, clamped
    SwiGLU on interleaved gate/up, routing-weighted sum) with exact products and fp32 sums.
    Decode on a GPU (up to dispatch.ROUTED_MAX_PAIRS routed pairs): one launch per projection
    for every (token, expert) pair, read from the 3-D MX weights in place (the operator
    torchmx::mx_routed_linear, the gate in the first one's epilogue), then the
    routing-weighted sum over each token's pairs (fp32 sum of the weighted rows, rounded
    once). Otherwise each routed expert's rows are one F.linear on its MX weight (MXTensor's
    linear dispatch). Buffers `{gate_up_proj,down_proj}_{blocks,scales}` in gpt-oss's layout;
    biases in `dtype`; weights never exist in full precision."""

    def __init__(self, config, dtype=None, device=None):
        super().__init__()
        self.num_experts = config.num_local_experts
        self.hidden_size, self.intermediate_size = config.hidden_size, config.intermediate_size
        self.alpha, self.limit = config.swiglu_alpha, config.swiglu_limit
        for name, rows, k in (("gate_up_proj", 2 * self.intermediate_size, self.hidden_size),
                              ("down_proj", self.hidden_size, self.intermediate_size)):
            if k % _BLOCK:
                raise ValueError(f"{name}: its reduction dim {k} is not a multiple of {_BLOCK}")
            self.register_buffer(f"{name}_blocks", torch.empty(
                self.num_experts, rows, k // _BLOCK, _BLOCK // 2, dtype=torch.uint8, device=device))
            self.register_buffer(f"{name}_scales", torch.empty(
                self.num_experts, rows, k // _BLOCK, dtype=torch.uint8, device=device))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(
            self.num_experts, 2 * self.intermediate_size, dtype=dtype, device=device))
        self.down_proj_bias = nn.Parameter(torch.empty(
            self.num_experts, self.hidden_size, dtype=dtype, device=device))

    @classmethod
    def from_float(cls, experts: nn.Module) -> "MXGptOssExperts":
        """MXFP4 copy of a GptOssExperts (weights [E, K, N] as transformers keeps them)."""
        config = _Shape(experts)
        with torch.device("meta"):
            new = cls(config, dtype=experts.gate_up_proj_bias.dtype)
        for name in PROJECTIONS:
            blocks, scales = pack_experts(getattr(experts, name).detach().transpose(1, 2))
            setattr(new, f"{name}_blocks", blocks)
            setattr(new, f"{name}_scales", scales)
        new.gate_up_proj_bias = experts.gate_up_proj_bias
        new.down_proj_bias = experts.down_proj_bias
        return new

    def weight(self, name: str, dtype: torch.dtype) -> MXTensor:
        """`name`'s ("gate_up_proj" or "down_proj") weights as an MXTensor [E, N, K]."""
        return experts_mx(getattr(self, f"{name}_blocks"), getattr(self, f"{name}_scales"),
                          dtype, name)

    def expert_weight(self, name: str, expert: int, dtype: torch.dtype) -> MXTensor:
        """One expert's `name` weight as a 2-D MXTensor [N, K] with blocks along K (the
        layout of MXInferenceLinear's weight, which F.linear's MX paths take)."""
        blocks, scales = getattr(self, f"{name}_blocks")[expert], getattr(self, f"{name}_scales")[expert]
        rows, groups, _ = blocks.shape
        return MXTensor(scales, blocks.view(rows, groups * _BLOCK // 2), "float4_e2m1", _BLOCK,
                        dtype, block_dim=1, shape=(rows, groups * _BLOCK))

    def _expert_weights(self, name: str, dtype: torch.dtype) -> List[MXTensor]:
        """expert_weight(name, e, dtype) for every expert, built once per dtype and buffers
        (an in-place write bumps a buffer's version, an assignment replaces it)."""
        if torch.compiler.is_compiling():
            return [self.expert_weight(name, e, dtype) for e in range(self.num_experts)]
        buffers = (getattr(self, f"{name}_blocks"), getattr(self, f"{name}_scales"))
        source = tuple((id(t), 0 if t.is_inference() else t._version, t.data_ptr())
                       for t in buffers)
        views = _EXPERT_VIEWS.setdefault(self, {})
        key = (name, dtype, torch.is_inference_mode_enabled())
        cached = views.get(key)
        if cached is None or cached[0] != source:
            cached = views[key] = (source, [self.expert_weight(name, e, dtype)
                                            for e in range(self.num_experts)])
        return cached[1]

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def forward(self, hidden_states: torch.Tensor, router_indices=None, routing_weights=None):
        """hidden_states [T, H], router_indices [T, top_k], routing_weights [T, top_k] (as
        GptOssMLP passes them) -> [T, H]: for each expert some token was routed to, its tokens'
        two products with its MX weights, summed with their routing weights."""
        dtype = hidden_states.dtype
        codes = self._routed_codes(hidden_states, router_indices.numel())
        if codes is not None:
            return self._routed_forward(hidden_states, router_indices, routing_weights, *codes)
        gate_up = self._expert_weights("gate_up_proj", dtype)
        down = self._expert_weights("down_proj", dtype)
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(router_indices).tolist():
            token_idx, top_k_pos = torch.where(router_indices == e)
            x = hidden_states[token_idx]
            h = F.linear(x, gate_up[e], self.gate_up_proj_bias[e].to(dtype))
            y = F.linear(self._apply_gate(h), down[e], self.down_proj_bias[e].to(dtype))
            out.index_add_(0, token_idx, (y * routing_weights[token_idx, top_k_pos, None]).to(dtype))
        return out

    def _codes(self, name: str) -> torch.Tensor:
        """`name`'s codes as [E, N, K / 2] (a view of its blocks)."""
        blocks = getattr(self, f"{name}_blocks")
        return blocks.view(*blocks.shape[:2], -1)

    def _routed_codes(self, hidden_states: torch.Tensor, pairs: int):
        """(gate_up codes, down codes) when torchmx::mx_routed_linear runs its kernels for this
        input, else None: decided once per input shape, dtype and device and buffers."""
        if not routed_linear.usable_on(hidden_states.device):
            return None

        def decide():
            gate_up, down = self._codes("gate_up_proj"), self._codes("down_proj")
            ok = all(routed_linear.usable(x, getattr(self, f"{name}_scales"), codes,
                                          "float4_e2m1", _BLOCK, pairs)
                     for name, codes, x in (
                         ("gate_up_proj", gate_up, hidden_states),
                         ("down_proj", down,
                          hidden_states.new_empty((pairs, self.intermediate_size)))))
            return (gate_up, down) if ok else None

        if torch.compiler.is_compiling():
            return decide()
        # replaced buffers (an assignment) make a new decision and drop the old views
        source = tuple((id(b), b.data_ptr()) for b in self.buffers(recurse=False))
        key = ("routed", hidden_states.shape, hidden_states.dtype, hidden_states.device, pairs)
        views = _EXPERT_VIEWS.setdefault(self, {})
        cached = views.get(key)
        if cached is None or cached[0] != source:
            cached = views[key] = (source, decide())
        return cached[1]

    def _routed_forward(self, hidden_states, router_indices, routing_weights, gate_up, down):
        """forward through torchmx::mx_routed_linear: one launch per projection."""
        top_k = router_indices.shape[-1]
        op = routed_linear.mx_routed_linear.eager()
        gated = op(hidden_states, router_indices, self.gate_up_proj_scales, gate_up,
                   "float4_e2m1", _BLOCK, self.gate_up_proj_bias, top_k, self.alpha, self.limit)
        out = op(gated, router_indices, self.down_proj_scales, down, "float4_e2m1", _BLOCK,
                 self.down_proj_bias, 1, None, None)
        weighted = out.view(*router_indices.shape, -1) * routing_weights[..., None]
        return weighted.to(hidden_states.dtype).sum(1)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, weights=float4_e2m1/32")


class _Shape:
    """The config fields MXGptOssExperts reads, from a GptOssExperts."""

    def __init__(self, experts: nn.Module):
        self.num_local_experts = experts.num_experts
        self.hidden_size, self.intermediate_size = experts.hidden_size, experts.intermediate_size
        self.swiglu_alpha, self.swiglu_limit = experts.alpha, experts.limit


def is_gpt_oss_experts(module: nn.Module) -> bool:
    return type(module).__name__ == "GptOssExperts" and hasattr(module, "gate_up_proj")


def quantize_experts_(model: nn.Module) -> list:
    """Swap every GptOssExperts of `model` for MXGptOssExperts.from_float, in place; returns
    their names."""
    names = [name for name, module in model.named_modules() if is_gpt_oss_experts(module)]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, MXGptOssExperts.from_float(getattr(owner, child)))
    return names


def holds_experts_format(weights: MXConfig) -> bool:
    """Whether weights quantized per `weights` fit gpt-oss's layout (MXFP4, blocks of 32)."""
    return weights.elem_dtype == dtypes.float4_e2m1 and weights.block_size == _BLOCK


def load_projection(model: nn.Module, name: str, projection: str, weight: torch.Tensor) -> None:
    """While a full-precision checkpoint loads: quantize `projection`'s weight [E, K, N] (as
    GptOssExperts keeps it) of the experts module `name` into MXFP4, swapping that module for
    an MXGptOssExperts on its first projection (biases already loaded are kept)."""
    experts = model.get_submodule(name)
    if not isinstance(experts, MXGptOssExperts):
        with torch.device("meta"):
            new = MXGptOssExperts(_Shape(experts), dtype=experts.gate_up_proj_bias.dtype)
        for bias in ("gate_up_proj_bias", "down_proj_bias"):
            if not getattr(experts, bias).is_meta:
                setattr(new, bias, getattr(experts, bias))
        new._is_hf_initialized = True
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        experts = new
    blocks, scales = pack_experts(weight.transpose(1, 2))
    setattr(experts, f"{projection}_blocks", blocks)
    setattr(experts, f"{projection}_scales", scales)


def swap_for_checkpoint(model: nn.Module, checkpoint_keys) -> list:
    """Before loading a checkpoint (model on the meta device): every GptOssExperts whose
    `gate_up_proj_blocks` is among `checkpoint_keys` becomes an empty MXGptOssExperts (the
    checkpoint's bytes then load into its buffers). Returns their names."""
    keys = set(checkpoint_keys)
    prefix = getattr(model, "base_model_prefix", "")
    swapped = []
    for name, module in list(model.named_modules()):
        if not is_gpt_oss_experts(module):
            continue
        stored = (f"{name}.gate_up_proj_blocks", f"{prefix}.{name}.gate_up_proj_blocks",
                  f"{name.removeprefix(prefix + '.')}.gate_up_proj_blocks")
        if not keys.intersection(stored):
            continue
        with torch.device("meta"):
            new = MXGptOssExperts(_Shape(module), dtype=module.gate_up_proj_bias.dtype)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        swapped.append(name)
    return swapped


def from_pretrained(path, **kwargs):
    """AutoModelForCausalLM.from_pretrained(path, **kwargs) of a gpt-oss checkpoint in the
    mxfp4 layout, with MXGptOssExperts for its experts: the checkpoint's quantization config
    ("mxfp4") is replaced by TorchMXConfig() so that torchmx's quantizer loads it (a
    checkpoint with a quantization config counts as quantized: no layer is quantized while
    loading; the others stay as the checkpoint has them)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .config import TorchMXConfig

    config = kwargs.pop("config", None) or AutoConfig.from_pretrained(path)
    config.quantization_config = TorchMXConfig().to_dict()
    return AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs)

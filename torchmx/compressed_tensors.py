"""Checkpoints in compressed-tensors' MX formats (llm-compressor writes them, vLLM reads them).

compressed-tensors stores a linear layer `<name>` quantized to an MX format as:

| format (config)          | elements                                        | scales                  |
|--------------------------|-------------------------------------------------|-------------------------|
| `mxfp4-pack-quantized`   | `<name>.weight_packed` uint8 [out, in / 2], two E2M1 codes a byte, element 2j in the low nibble | `<name>.weight_scale` uint8 [out, in / 32], E8M0 (bias 127) |
| `mxfp6-pack-quantized`   | `<name>.weight_packed` uint8 [out, 3 in / 4], four E2M3 codes in 3 bytes, little-endian | the same |
| `mxfp8-quantized`        | `<name>.weight` float8_e4m3fn [out, in]         | the same                |

with "quantization_config" in config.json: quant_method "compressed-tensors", config_groups
whose "weights" are {num_bits 4/6/8, type "float", strategy "group", group_size 32,
scale_dtype "torch.uint8", symmetric} and whose "targets" name the layers ("Linear", exact
names or "re:" regexes), an "ignore" list. Those bytes are torchmx's storage of the same
formats (float4_e2m1, float6_e2m3, float8_e4m3, blocks of 32 along in_features), so both
directions only rename and re-view tensors: bit-exact.

- `to_torchmx(tensors, quantization_config)`: a compressed-tensors state dict -> the state
  dict of MXInferenceLinear layers (`weight_data`, `weight_scale`, `_extra_state`).
- `from_torchmx(state)`: the reverse -> (tensors, quantization_config).
- `save_pretrained(model, path, max_shard_size="5GB")` / `from_pretrained(path, **kwargs)`:
  whole checkpoints (config.json and safetensors shards with transformers' index file when
  there are several, each module's tensors in one shard; transformers loads the model).

Dynamic MX activations ("input_activations" with dynamic true, the same MX args) map to
`activations_config` with scale_mode "even": compressed-tensors rounds a block's amax to the
element's mantissa width before taking its exponent (for MXFP8 it rounds to E2M1's one
mantissa bit, where torchmx's "even" mode keeps E4M3's three: those activation scales can
differ). Weights are bytes and always match.
"""

import contextlib
import json
import os
import re
from typing import Dict, Mapping, Optional, Tuple

import torch

from . import dtypes
from .config import MXConfig, QLinearConfig
from .nn import extra_state

__all__ = ["FORMATS", "to_torchmx", "from_torchmx", "save_pretrained", "from_pretrained"]

QUANT_METHOD = "compressed-tensors"
# compressed-tensors format name -> torchmx element format
FORMATS = {"mxfp4-pack-quantized": dtypes.float4_e2m1, "mxfp6-pack-quantized": dtypes.float6_e2m3,
           "mxfp8-quantized": dtypes.float8_e4m3}
_BY_BITS = {fmt.bits: (name, fmt) for name, fmt in FORMATS.items()}
_BLOCK = 32


def _mx_args(fmt: dtypes.DType, dynamic: bool) -> dict:
    """compressed-tensors' QuantizationArgs (as JSON) of an MX format, blocks of 32."""
    return {"num_bits": fmt.bits, "type": "float", "symmetric": True, "group_size": _BLOCK,
            "strategy": "group", "dynamic": dynamic, "scale_dtype": "torch.uint8"}


def _format_of(args: object, where: str) -> dtypes.DType:
    """The torchmx format of QuantizationArgs (JSON) that describe an MX format."""
    if not isinstance(args, dict):
        raise ValueError(f"{where}: expected a dict of quantization args, got {args!r}")
    bits = args.get("num_bits")
    is_mx = (args.get("type") == "float" and args.get("strategy") == "group"
             and args.get("group_size") == _BLOCK and bits in _BY_BITS
             and str(args.get("scale_dtype")).removeprefix("torch.") == "uint8"
             and args.get("symmetric", True) is True)
    if not is_mx:
        raise ValueError(f"{where}: not an MX format (float, group of 32, uint8 E8M0 scales, "
                         f"symmetric, 4, 6 or 8 bits): {args!r}")
    return _BY_BITS[bits][1]


def _matches(name: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target in (name, "Linear")  # the class name: the layers with MX tensors are linear


def _layer_config(name: str, config: dict) -> QLinearConfig:
    """The QLinearConfig of layer `name`: the first config group that targets it."""
    if any(_matches(name, target) for target in config.get("ignore") or []):
        raise ValueError(f"{name}: has MX tensors but is in the config's ignore list")
    for group_name, group in (config.get("config_groups") or {}).items():
        if not any(_matches(name, target) for target in group.get("targets") or []):
            continue
        where = f"config_groups.{group_name}"
        weights = _format_of(group.get("weights"), f"{where}.weights")
        activations = group.get("input_activations")
        if activations is not None:
            if activations.get("dynamic") is not True:
                raise ValueError(f"{where}.input_activations: static activation scales are "
                                 "not MX; torchmx reads dynamic MX activations only")
            activations = MXConfig(_format_of(activations, f"{where}.input_activations"),
                                   _BLOCK, scale_mode="even")
        return QLinearConfig(MXConfig(weights, _BLOCK), activations)
    raise ValueError(f"{name}: has MX tensors but no config group targets it")


def to_torchmx(tensors: Mapping[str, torch.Tensor], quantization_config: dict) -> Dict[str, torch.Tensor]:
    """The torchmx state dict of a compressed-tensors one (see the module docstring): each MX
    layer's tensors become MXInferenceLinear's `weight_data` (the same bytes, as uint8),
    `weight_scale` and `_extra_state`; every other tensor is passed through."""
    if not isinstance(quantization_config, dict) or quantization_config.get("quant_method") != QUANT_METHOD:
        raise ValueError("quantization_config must be a compressed-tensors config (quant_method "
                         f"{QUANT_METHOD!r})")
    status = quantization_config.get("quantization_status", "compressed")
    if status != "compressed":
        raise ValueError(f"quantization_status is {status!r}; only 'compressed' checkpoints hold "
                         "packed MX tensors")
    state = dict(tensors)
    layers = [key[: -len(".weight_scale")] for key, t in tensors.items()
              if key.endswith(".weight_scale") and t.dtype == torch.uint8]
    for name in layers:
        qconfig = _layer_config(name, quantization_config)
        fmt = qconfig.weights_config.elem_dtype
        scale = state.pop(f"{name}.weight_scale")
        key = f"{name}.weight" if fmt.bits == 8 else f"{name}.weight_packed"
        data = state.pop(key, None)
        if data is None:
            raise ValueError(f"{name}: a {fmt.name} layer without {key}")
        expected = torch.float8_e4m3fn if fmt.bits == 8 else torch.uint8
        in_features = scale.shape[-1] * _BLOCK
        if (data.dtype != expected or data.dim() != 2 or scale.dim() != 2
                or data.shape[0] != scale.shape[0]
                or data.shape[1] * fmt.codes_per_group != in_features * fmt.bytes_per_group):
            raise ValueError(f"{name}: {key} {data.dtype} {tuple(data.shape)} and weight_scale "
                             f"{tuple(scale.shape)} are not {fmt.name} [out, in] codes with "
                             f"[out, in / {_BLOCK}] scales")
        state[f"{name}.weight_data"] = data.view(torch.uint8)
        state[f"{name}.weight_scale"] = scale
        state[f"{name}._extra_state"] = extra_state.encode({"version": 1,
                                                            "qconfig": qconfig.to_dict()})
    return state


def _ct_format(cfg: Optional[MXConfig], name: str, role: str) -> Optional[dtypes.DType]:
    if cfg is None:
        return None
    fmt = cfg.elem_dtype
    if cfg.block_size != _BLOCK or fmt not in FORMATS.values():
        raise ValueError(f"{name}: {role} in {fmt.name}, blocks of {cfg.block_size}: "
                         "compressed-tensors' MX formats are float4_e2m1, float6_e2m3 and "
                         f"float8_e4m3 in blocks of {_BLOCK}")
    return fmt


def from_torchmx(state: Mapping[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], dict]:
    """(tensors, quantization_config) in compressed-tensors' layout of a torchmx state dict
    (MXInferenceLinear layers; other tensors are passed through). One config group per
    distinct layer config, targeting its layers by name."""
    tensors, groups = dict(state), {}
    for key in [k for k in state if k.endswith("._extra_state")]:
        name = key[: -len("._extra_state")]
        layer = extra_state.decode(tensors.pop(key))
        if not isinstance(layer, dict) or not isinstance(layer.get("qconfig"), dict):
            raise ValueError(f"{key}: not a torchmx layer config")
        qconfig = QLinearConfig.load_from_dict(layer["qconfig"])
        weights = _ct_format(qconfig.weights_config, name, "weights")
        activations = _ct_format(qconfig.activations_config, name, "activations")
        if activations is not None and qconfig.activations_config.scale_mode != "even":
            raise ValueError(
                f"{name}: activations with scale_mode {qconfig.activations_config.scale_mode!r}; "
                "compressed-tensors' readers quantize MX activations with their own rule "
                "(torchmx's 'even' scale mode): quantize them with scale_mode='even' to save "
                "this model in its format")
        data, scale = tensors.pop(f"{name}.weight_data"), tensors.pop(f"{name}.weight_scale")
        if weights.bits == 8:
            tensors[f"{name}.weight"] = data.view(torch.float8_e4m3fn)
        else:
            tensors[f"{name}.weight_packed"] = data
        tensors[f"{name}.weight_scale"] = scale
        groups.setdefault((weights, activations), []).append(name)
    config_groups, formats = {}, set()
    for i, ((weights, activations), names) in enumerate(groups.items()):
        fmt_name = _BY_BITS[weights.bits][0]
        formats.add(fmt_name)
        config_groups[f"group_{i}"] = {
            "targets": sorted(names), "format": fmt_name, "weights": _mx_args(weights, False),
            "input_activations": None if activations is None else _mx_args(activations, True),
            "output_activations": None}
    config = {"quant_method": QUANT_METHOD, "quantization_status": "compressed",
              "format": formats.pop() if len(formats) == 1 else "mixed-precision",
              "config_groups": config_groups, "ignore": [], "kv_cache_scheme": None,
              "global_compression_ratio": None, "sparsity_config": {}, "transform_config": {}}
    return tensors, config


def _untied(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The tensors with each shared one kept once (safetensors refuses aliases; transformers
    ties them again when it loads the model)."""
    seen, out = set(), {}
    for key, t in tensors.items():
        ident = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                 t.dtype)
        if ident not in seen:
            seen.add(ident)
            out[key] = t.detach().contiguous()
    return out


_SIZE_UNITS = {"B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
               "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}
INDEX_NAME = "model.safetensors.index.json"


def _size_in_bytes(size) -> int:
    """max_shard_size as bytes: an int, or a string as transformers takes it ("5GB" = 5 * 10**9
    bytes, "500MiB" = 500 * 2**20)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", str(size).upper())
    if isinstance(size, str) and match and float(match.group(1)) > 0:
        return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    raise ValueError(f"max_shard_size must be a positive number of bytes or a size such as "
                     f"'5GB' or '500MiB', got {size!r}")


def _layer(key: str) -> str:
    """The module a tensor belongs to (its name up to the last dot)."""
    return key.rpartition(".")[0]


def _shards(tensors: Dict[str, torch.Tensor], max_bytes: int) -> list:
    """The tensors split into shards of at most max_bytes each, in key order, every module's
    tensors in one shard (a module larger than max_bytes gets a shard of its own)."""
    modules: Dict[str, Dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        modules.setdefault(_layer(key), {})[key] = t
    shards, current, size = [], {}, 0
    for group in modules.values():
        group_size = sum(t.numel() * t.element_size() for t in group.values())
        if current and size + group_size > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current.update(group)
        size += group_size
    if current or not shards:
        shards.append(current)
    return shards


def save_pretrained(model, path, max_shard_size="5GB") -> None:
    """Write a transformers model with MXInferenceLinear layers as a compressed-tensors
    checkpoint: config.json (the model's config, quantization_config replaced) and its tensors
    in safetensors shards of at most `max_shard_size` (bytes, or "5GB", "500MiB", ...), each
    module's tensors in one shard: `model.safetensors` when one shard holds them all, else
    `model-0000i-of-0000n.safetensors` and `model.safetensors.index.json` (total size and the
    shard of every tensor), as transformers writes them."""
    from safetensors.torch import save_file

    max_bytes = _size_in_bytes(max_shard_size)
    tensors, quantization_config = from_torchmx(model.state_dict())
    os.makedirs(path, exist_ok=True)
    config = model.config.to_dict()
    config["quantization_config"] = quantization_config
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    shards = _shards(_untied(tensors), max_bytes)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    with open(os.path.join(path, INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)


def from_pretrained(path, model_class=None, **kwargs):
    """Load a compressed-tensors MX checkpoint (config.json and *.safetensors in `path`) as a
    transformers model with MXInferenceLinear layers, bit for bit (`model_class` defaults to
    AutoModelForCausalLM; kwargs go to its from_pretrained). The tensors are renamed into a
    torchmx checkpoint in a temporary folder, which torchmx's quantizer loads."""
    import tempfile

    from safetensors import safe_open
    from safetensors.torch import save_file

    from .huggingface import TorchMXConfig

    if model_class is None:
        from transformers import AutoModelForCausalLM as model_class
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    quantization_config = config.get("quantization_config")
    shards = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    with contextlib.ExitStack() as stack:
        files = {shard: stack.enter_context(safe_open(os.path.join(path, shard), framework="pt"))
                 for shard in shards}
        where = {key: shard for shard, f in files.items() for key in f.keys()}
        # Each module is converted with its tensors together, into the shard that holds its
        # first tensor (another writer may have split a module's tensors across shards).
        owner: Dict[str, str] = {}
        for key, shard in where.items():
            owner.setdefault(_layer(key), shard)
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        weight_map = {}
        for shard in shards:  # one shard's tensors in memory at a time
            keys = [key for key in where if owner[_layer(key)] == shard]
            tensors = to_torchmx({key: files[where[key]].get_tensor(key) for key in keys},
                                 quantization_config)
            save_file(tensors, os.path.join(tmp, shard), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, shard))
            del tensors
        if len(shards) > 1:  # the shards keep their names, the index gets the new keys
            with open(os.path.join(tmp, INDEX_NAME), "w") as f:
                json.dump({"metadata": {}, "weight_map": weight_map}, f)
        config["quantization_config"] = TorchMXConfig().to_dict()
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f)
        return model_class.from_pretrained(tmp, **kwargs)


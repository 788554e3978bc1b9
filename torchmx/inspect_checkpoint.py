"""`torchmx inspect FILE`: what an MX checkpoint holds, read without building a model.

Works on safetensors files (torchmx.serialization.save_safetensors, transformers'
save_pretrained, safetensors' save_model, other tools) and on torch files of a state_dict
(loaded with weights_only=True: nothing in the file is executed). torchmx's MX layers are
recognized by their `<layer>.weight_scale` / `<layer>.weight_data` uint8 pair and the config in
`<layer>._extra_state`; MX tensors of gpt-oss's experts and of compressed-tensors' layers by
their layouts (torchmx.huggingface.gpt_oss, torchmx.compressed_tensors). A file with none of
them is said to be a full-precision checkpoint.
"""

import collections
import math
import re
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from . import dtypes
from .nn import extra_state

_SCALE, _DATA, _EXTRA = ".weight_scale", ".weight_data", "._extra_state"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TORCH_ZIP = b"PK\x03\x04"  # torch.save's default (zip) format
_PICKLE = b"\x80"  # torch.save(_use_new_zipfile_serialization=False): a pickle stream
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def read_state(path: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, object], str]:
    """(tensors, extra states by key, file kind) of a checkpoint file."""
    if path.is_dir():
        raise ValueError(f"{path}: is a directory; give a checkpoint file (.safetensors or a torch file)")
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as error:
        raise ValueError(f"{path}: cannot read ({error.strerror})") from None
    if path.suffix == ".safetensors" or (len(head) >= 9 and head[8:9] == b"{"):
        from .serialization import FORMAT, read_safetensors

        if _safetensors_metadata(path).get("torchmx.format") != FORMAT:
            return _read_plain_safetensors(path)  # save_pretrained, save_model, other tools
        tensors, extra, _ = read_safetensors(path)  # checksums and format version checked
        return tensors, extra, "safetensors"
    if not head.startswith((_TORCH_ZIP, _PICKLE)):
        raise ValueError(f"{path}: not a checkpoint (neither a torch.save file nor safetensors)")
    state = _torch_load(path)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: holds a {type(state).__name__}, not a state_dict; "
                         "save model.state_dict() instead")
    for key in state:
        if not isinstance(key, str):
            raise ValueError(f"{path}: not a state_dict "
                             f"(key {key!r} is of type {type(key).__name__}, not str)")
    tensors = {k: v for k, v in state.items()
               if isinstance(v, torch.Tensor) and not k.endswith(_EXTRA)}
    if not tensors and state and all(isinstance(v, dict) for v in state.values()):
        raise ValueError(f"{path}: holds a dict of dicts ({', '.join(map(repr, list(state)[:4]))}), "
                         "not a state_dict; save model.state_dict() alone")
    extra = {}
    for key in (k for k in state if k.endswith(_EXTRA)):
        try:  # a tensor of JSON text (torchmx.nn.extra_state) or, in older files, a dict
            extra[key] = extra_state.decode(state[key])
        except ValueError as error:
            raise ValueError(f"{path}: {key}: {error}") from None
    return tensors, extra, "torch"


def _safetensors_metadata(path: Path) -> dict:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError, RuntimeError) as error:
        raise ValueError(f"{path}: not a readable safetensors file ({error})") from None


def _read_plain_safetensors(path: Path):
    """A safetensors file of a state dict written by anything but save_safetensors: MX
    layers' extra states are their tensors of JSON text (torchmx.nn.extra_state)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        state = {key: f.get_tensor(key) for key in f.keys()}
    extra = {}
    for key in [k for k in state if k.endswith(_EXTRA)]:
        try:
            extra[key] = extra_state.decode(state.pop(key))
        except ValueError as error:
            raise ValueError(f"{path}: {key}: {error}") from None
    return state, extra, "safetensors"


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file is one clear line
        refused = _UNSUPPORTED_GLOBAL.search(str(error))
        if refused:
            raise ValueError(f"{path}: holds a pickled {refused.group(1)}, which weights_only "
                             "loading refuses to run; save model.state_dict() instead") from None
        first = _ANSI.sub("", str(error)).strip().splitlines()[:1] or [""]
        raise ValueError(f"{path}: not a readable torch checkpoint "
                         f"({type(error).__name__}: {first[0]})") from None


def _bytes(tensors) -> int:
    """Bytes of the tensors, each (tied) tensor counted once (as quant_api.model_bytes)."""
    from .quant_api import tensor_bytes

    return tensor_bytes(tensors)


def _weights_config(layer: str, config: object) -> dict:
    """The weights' MXConfig dict in a layer's extra state, checked: a file is user input."""
    where = f"{layer}{_EXTRA}"
    if config is None:
        raise ValueError(f"{layer}: an MX weight without {where} (its format is unknown)")
    if not isinstance(config, dict):
        raise ValueError(f"{where}: a {type(config).__name__}, not the dict torchmx writes")
    weights = config.get("qconfig", {})
    weights = weights.get("weights_config") if isinstance(weights, dict) else None
    if not isinstance(weights, dict):
        raise ValueError(f"{where}: no qconfig.weights_config dict")
    weights = dict(weights)
    try:
        weights["format"] = dtypes.from_name(weights.get("elem_dtype_name"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: elem_dtype_name: {error}") from None
    block_size = weights.get("block_size", 32)
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"{where}: block_size must be an int >= 1, got {block_size!r}")
    return weights


def _activations(layer: str, config: dict) -> str:
    """The activations' format name in a layer's config, or "none" (full precision)."""
    activations = config["qconfig"].get("activations_config")
    if activations is None:
        return "none"
    if not isinstance(activations, dict):
        raise ValueError(f"{layer}{_EXTRA}: activations_config is a {type(activations).__name__}, "
                         "not a dict or null")
    try:
        return dtypes.from_name(activations.get("elem_dtype_name")).name
    except (TypeError, ValueError) as error:
        raise ValueError(f"{layer}{_EXTRA}: activations_config.elem_dtype_name: {error}") from None


def _check_codes(key: str, tensor: torch.Tensor, allowed: Tuple[torch.dtype, ...]) -> None:
    if tensor.dtype not in allowed or tensor.dim() < 1:
        names = " or ".join(str(dtype).replace("torch.", "") for dtype in allowed)
        raise ValueError(f"{key}: a {tensor.dim()}-d {str(tensor.dtype).replace('torch.', '')} tensor; "
                         f"MX codes are {names} with at least one dimension")


def _mx_layer(name: str, scale: torch.Tensor, data: torch.Tensor, config: object) -> str:
    _check_codes(name + _SCALE, scale, (torch.uint8,))
    _check_codes(name + _DATA, data, (torch.uint8, torch.int8))  # MXINT8 codes may be int8
    weights = _weights_config(name, config)
    fmt = weights["format"]
    # fp4/fp6 store whole packing groups: a length 1-3 codes short of this shows the same.
    in_features = data.shape[-1] // fmt.bytes_per_group * fmt.codes_per_group
    shape = list(data.shape[:-1]) + [in_features]
    mx_bytes = scale.numel() + data.numel()
    return (f"{name:<48} {fmt.name:<12} block {weights.get('block_size', 32):<4} "
            f"{weights.get('scale_mode', 'floor')!s:<5} act {_activations(name, config):<12} {shape} "
            f"{mx_bytes:>10,} B  {8 * mx_bytes / max(math.prod(shape), 1):.2f} bits/weight")


def _histogram(scales: List[torch.Tensor], width: int = 40) -> List[str]:
    counts = collections.Counter()
    for scale in scales:
        values, frequency = torch.unique(scale.reshape(-1), return_counts=True)
        counts.update(dict(zip(values.tolist(), frequency.tolist())))
    if not counts:
        return []
    top = max(counts.values())
    lines = ["scale exponents (E8M0 byte - 127) over all MX blocks:"]
    for byte in sorted(counts):
        label = "NaN" if byte == 255 else f"2^{byte - 127}"
        lines.append(f"  {label:>6} {counts[byte]:>10,} {'#' * max(1, round(width * counts[byte] / top))}")
    return lines


def _other_layout(name: str, fmt: dtypes.DType, shape: List[int], scale: torch.Tensor,
                  data: torch.Tensor, layout: str) -> str:
    mx_bytes = scale.numel() + data.numel()
    return (f"{name:<48} {fmt.name:<12} block 32   {layout:<24} {shape} {mx_bytes:>10,} B  "
            f"{8 * mx_bytes / max(math.prod(shape), 1):.2f} bits/weight")


def _foreign_mx(tensors: Dict[str, torch.Tensor]):
    """(lines, keys, scales) of the MX tensors of other layouts: gpt-oss's MXFP4 experts
    (`<x>_blocks` [E, N, K/32, 16] and `<x>_scales` [E, N, K/32]) and compressed-tensors'
    layers (`weight_packed` or float8_e4m3fn `weight`, with uint8 `weight_scale`)."""
    lines, keys, scales = [], set(), []
    u8 = torch.uint8
    for key in sorted(tensors):
        t = tensors[key]
        if key.endswith("_blocks") and t.dtype == u8 and t.dim() == 4 and t.shape[-1] == 16:
            name = key[: -len("_blocks")]
            scale = tensors.get(name + "_scales")
            if scale is not None and scale.dtype == u8 and tuple(scale.shape) == tuple(t.shape[:-1]):
                shape = [*t.shape[:-2], t.shape[-2] * 32]
                lines.append(_other_layout(name, dtypes.float4_e2m1, shape, scale, t, "gpt-oss mxfp4 experts"))
                keys |= {key, name + "_scales"}
                scales.append(scale)
        elif key.endswith(".weight_scale") and t.dtype == u8 and t.dim() == 2:
            name = key[: -len(".weight_scale")]
            packed, weight = tensors.get(name + ".weight_packed"), tensors.get(name + ".weight")
            in_features = t.shape[1] * 32
            if packed is not None and packed.dtype == u8 and packed.dim() == 2:
                fmt = {in_features // 2: dtypes.float4_e2m1,
                       in_features * 3 // 4: dtypes.float6_e2m3}.get(packed.shape[1])
                data = packed
            elif weight is not None and weight.dtype == torch.float8_e4m3fn:
                fmt, data = dtypes.float8_e4m3, weight
            else:
                continue
            if fmt is None or data.shape[0] != t.shape[0]:
                continue
            lines.append(_other_layout(name, fmt, [t.shape[0], in_features], t, data,
                                       "compressed-tensors"))
            keys |= {key, name + (".weight" if data is weight else ".weight_packed")}
            scales.append(t)
    return lines, keys, scales


def describe(path: Path) -> str:
    tensors, extra, kind = read_state(path)
    layers = sorted(key[: -len(_SCALE)] for key in tensors
                    if key.endswith(_SCALE) and key[: -len(_SCALE)] + _DATA in tensors)
    mx_keys = {layer + suffix for layer in layers for suffix in (_SCALE, _DATA)}
    foreign, foreign_keys, foreign_scales = _foreign_mx(
        {k: v for k, v in tensors.items() if k not in mx_keys})
    total = _bytes(tensors.values())
    lines = [f"{path} ({kind}): {len(tensors)} tensors, {total:,} bytes, "
             f"{len(layers) + len(foreign)} MX layers"]
    if not layers and not foreign:
        lines.append("a full-precision checkpoint: no MX tensors (torchmx layers, gpt-oss "
                     "MXFP4 experts or compressed-tensors MX layers)")
    if layers:
        lines += ["", "MX layers:"]
        try:
            lines += [_mx_layer(layer, tensors[layer + _SCALE], tensors[layer + _DATA],
                                extra.get(layer + _EXTRA)) for layer in layers]
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    if foreign:
        lines += ["", "MX tensors of other layouts:"] + foreign
    mx_keys |= foreign_keys
    plain = [key for key in tensors if key not in mx_keys]
    if plain:
        lines += ["", "other tensors:"]
        lines += [f"{key:<48} {str(tensors[key].dtype).replace('torch.', ''):<9} "
                  f"{list(tensors[key].shape)!s:<16} {tensors[key].numel() * tensors[key].element_size():>10,} B"
                  for key in plain]
    histogram = _histogram([tensors[layer + _SCALE] for layer in layers] + foreign_scales)
    if histogram:
        lines += [""] + histogram
    return "\n".join(lines)

"""`torchmx inspect FILE`: what an MX checkpoint holds, read without building a model.

Works on torchmx safetensors files (torchmx.serialization.save_safetensors) and on torch files
of a state_dict (loaded with weights_only=True: nothing in the file is executed). MX layers are
recognized by their `<layer>.weight_scale` / `<layer>.weight_data` uint8 pair and the config in
`<layer>._extra_state`.
"""

import collections
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from . import dtypes

_SCALE, _DATA, _EXTRA = ".weight_scale", ".weight_data", "._extra_state"


def read_state(path: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, dict], str]:
    """(tensors, extra states by layer, file kind) of a checkpoint file."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with path.open("rb") as f:
        head = f.read(16)
    if path.suffix == ".safetensors" or (len(head) >= 9 and head[8:9] == b"{"):
        from .serialization import read_safetensors

        tensors, extra, _ = read_safetensors(path)  # checksums and format version checked
        return tensors, extra, "safetensors"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file is one clear line
        raise ValueError(f"{path}: not a readable torch checkpoint ({type(error).__name__}: {error})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: holds a {type(state).__name__}, not a state_dict")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    extra = {k: v for k, v in state.items() if k.endswith(_EXTRA)}
    return tensors, extra, "torch"


def _bytes(tensors) -> int:
    """Bytes of the tensors, each (tied) tensor counted once (as quant_api.model_bytes)."""
    from .quant_api import tensor_bytes

    return tensor_bytes(tensors)


def _mx_layer(name: str, scale: torch.Tensor, data: torch.Tensor, config: dict) -> str:
    weights = config.get("qconfig", {}).get("weights_config", {})
    fmt = dtypes.from_name(weights.get("elem_dtype_name", "?"))
    # fp4/fp6 store whole packing groups: a length 1-3 codes short of this shows the same.
    in_features = data.shape[-1] // fmt.bytes_per_group * fmt.codes_per_group
    mx_bytes = scale.numel() + data.numel()
    return (f"{name:<48} {fmt.name:<12} block {weights.get('block_size', '?'):<4} "
            f"{weights.get('scale_mode', 'floor'):<5} [{data.shape[0]}, {in_features}] "
            f"{mx_bytes:>10,} B  {8 * mx_bytes / max(data.shape[0] * in_features, 1):.2f} bits/weight")


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


def describe(path: Path) -> str:
    tensors, extra, kind = read_state(path)
    layers = sorted(key[: -len(_SCALE)] for key in tensors
                    if key.endswith(_SCALE) and key[: -len(_SCALE)] + _DATA in tensors)
    mx_keys = {layer + suffix for layer in layers for suffix in (_SCALE, _DATA)}
    total = _bytes(tensors.values())
    lines = [f"{path} ({kind}): {len(tensors)} tensors, {total:,} bytes, {len(layers)} MX layers"]
    if layers:
        lines += ["", "MX layers:"]
        lines += [_mx_layer(layer, tensors[layer + _SCALE], tensors[layer + _DATA],
                            extra.get(layer + _EXTRA, {})) for layer in layers]
    plain = [key for key in tensors if key not in mx_keys]
    if plain:
        lines += ["", "other tensors:"]
        lines += [f"{key:<48} {str(tensors[key].dtype).replace('torch.', ''):<9} "
                  f"{list(tensors[key].shape)!s:<16} {tensors[key].numel() * tensors[key].element_size():>10,} B"
                  for key in plain]
    histogram = _histogram([tensors[layer + _SCALE] for layer in layers])
    if histogram:
        lines += [""] + histogram
    return "\n".join(lines)

"""A layer's extra state as a tensor: its JSON text in UTF-8, one uint8 per byte.

MXInferenceLinear keeps its quantization config in `<layer>._extra_state`. A plain tensor is
what every writer of state dicts stores (safetensors' save_model, transformers'
save_pretrained, torch.distributed.checkpoint, torch.save with weights_only loading); the
first two refuse a dict. `decode` also takes the dict that older torchmx 0.2 checkpoints hold.
"""

import json

import torch

__all__ = ["encode", "decode"]


def encode(state: dict) -> torch.Tensor:
    """`state` (JSON-serializable) as a 1-d uint8 CPU tensor of its JSON text."""
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)


def decode(value: object) -> object:
    """The state `encode` made (a dict, from a tensor of JSON text); a dict (an older
    checkpoint) or anything else is returned as it is, for the caller to check. A uint8 tensor
    that is not UTF-8 JSON raises ValueError."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype != torch.uint8 or value.dim() != 1:
        raise ValueError(f"an extra state tensor must be 1-d uint8 (JSON text), got a "
                         f"{value.dim()}-d {str(value.dtype).replace('torch.', '')} tensor")
    try:
        return json.loads(bytes(value.detach().cpu().numpy()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"an extra state tensor that is not UTF-8 JSON text ({error})") from None

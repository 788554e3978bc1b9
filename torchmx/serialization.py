"""Checkpoints of MX models.

MX layers (MXInferenceLinear) keep their packed weights in plain uint8 buffers and their
quantization config in the state_dict's extra state (a uint8 tensor of its JSON text,
torchmx.nn.extra_state; older checkpoints hold a plain dict, still read), so:

- `torch.save(model.state_dict(), f)` / `torch.load(f, weights_only=True)` round-trip bit for
  bit in any process that can import torch (and torchmx, to build the model);
  `load_state_dict` raises ValueError when a layer's config differs from the checkpoint's.
- `save_safetensors(model, path)` / `load_safetensors(model, path)` write and read a
  safetensors file: every tensor of the state_dict (scales and packed codes as uint8), the
  extra states as JSON metadata (decoded from their tensors), tied tensors stored once, and a CRC32 per tensor. Loading
  checks the file, the checksums, the keys, shapes, dtypes and configs against the freshly
  built model and raises ValueError naming what differs.

A fresh model to load into is built like the saved one: the float model, then the same
quantize call (on the meta device too: its tensors are then assigned, not copied).
"""

import json
import os
import zlib
from typing import Dict, Optional, Tuple, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from .nn import extra_state

__all__ = ["save_safetensors", "load_safetensors", "read_safetensors"]

FORMAT = "torchmx"
FORMAT_VERSION = "1"
_EXTRA_STATE_SUFFIX = "_extra_state"  # torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX
_MAX_LISTED = 10

PathLike = Union[str, os.PathLike]


def _crc32(t: torch.Tensor) -> int:
    return zlib.crc32(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def _storage_key(t: torch.Tensor):
    """Tensors with equal keys are the same view of the same memory (tied weights)."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            tuple(t.stride()), t.dtype)


def save_safetensors(model: nn.Module, path: PathLike, *,
                     metadata: Optional[Dict[str, str]] = None) -> None:
    """Write model.state_dict() to a safetensors file (see the module docstring).

    `metadata`: extra string key/values stored in the header (keys must not start with
    "torchmx.")."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    user = dict(metadata or {})
    for key, value in user.items():
        if not isinstance(key, str) or not isinstance(value, str) or key.startswith("torchmx."):
            raise ValueError("metadata must map str to str, with keys not starting with "
                             f"'torchmx.'; got {key!r}: {type(value).__name__}")
    tensors, extra, aliases, seen = {}, {}, {}, {}
    for key, value in model.state_dict().items():
        if key.endswith(_EXTRA_STATE_SUFFIX):  # stored as JSON in the header (the layer's
            extra[key] = extra_state.decode(value)  # tensor of JSON text, or an older dict)
            continue
        if type(value) is not torch.Tensor:
            raise TypeError(f"state_dict entry {key!r} is a {type(value).__name__}; safetensors "
                            "stores plain tensors (MX layers keep theirs as uint8 buffers)")
        if value.is_meta:
            raise ValueError(f"state_dict entry {key!r} is on the meta device (no data to save)")
        storage = _storage_key(value)
        if storage in seen:
            aliases[key] = seen[storage]
            continue
        seen[storage] = key
        tensors[key] = value.detach().contiguous()
    try:
        extra_json = json.dumps(extra)
    except TypeError as e:
        raise TypeError(f"save_safetensors stores extra states as JSON: {e}") from None
    header = {
        "torchmx.format": FORMAT,
        "torchmx.format_version": FORMAT_VERSION,
        "torchmx.extra_state": extra_json,
        "torchmx.aliases": json.dumps(aliases),
        "torchmx.crc32": json.dumps({k: _crc32(t) for k, t in tensors.items()}),
        **user,
    }
    save_file(tensors, os.fspath(path), metadata=header)


def read_safetensors(path: PathLike) -> Tuple[Dict[str, torch.Tensor], Dict[str, object], Dict[str, str]]:
    """Read a save_safetensors file without a model: (tensors, extra states, metadata).

    `tensors` maps every state_dict key to its tensor (tied keys to the same tensor), `extra`
    every `..._extra_state` key to its value, `metadata` the whole header. Raises ValueError
    when the file is unreadable, not a torchmx checkpoint, of another format version, or
    corrupted (metadata, checksums, aliases)."""
    path = os.fspath(path)
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    if metadata.get("torchmx.format") != FORMAT:
        raise ValueError(f"{path}: not a torchmx checkpoint (written by "
                         "torchmx.serialization.save_safetensors)")
    if metadata.get("torchmx.format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: torchmx checkpoint format version "
                         f"{metadata.get('torchmx.format_version')!r}; this torchmx reads "
                         f"version {FORMAT_VERSION}")
    checksums = _json_object(path, metadata, "torchmx.crc32", "each tensor name to its CRC32 "
                             "(an int in [0, 2**32))")
    aliases = _json_object(path, metadata, "torchmx.aliases", "each tied key to the tensor name "
                           "it shares (a str)")
    extra = _json_object(path, metadata, "torchmx.extra_state", "each '..._extra_state' key to "
                         "its value")
    if set(checksums) != set(tensors):
        raise ValueError(f"{path}: corrupted: the tensors and their checksums do not match")
    wrong = [k for k, v in checksums.items()
             if type(v) is not int or not 0 <= v < 2 ** 32]  # noqa: E721 - bool is no checksum
    if wrong:
        raise ValueError(f"{path}: corrupted torchmx metadata: torchmx.crc32 must map each "
                         f"tensor name to an int in [0, 2**32); not so for {_listed(wrong)}")
    bad = [k for k, t in tensors.items() if _crc32(t) != checksums[k]]
    if bad:
        raise ValueError(f"{path}: corrupted: checksum mismatch for {_listed(bad)}")
    state = dict(tensors)
    for key, target in aliases.items():
        if not isinstance(target, str) or target not in tensors:
            raise ValueError(f"{path}: corrupted: {key!r} is tied to missing tensor {target!r}")
        if key in tensors or key.endswith(_EXTRA_STATE_SUFFIX):
            raise ValueError(f"{path}: corrupted: torchmx.aliases ties {key!r}, which is "
                             "stored itself or names an extra state")
        state[key] = tensors[target]
    clash = [k for k in extra if not k.endswith(_EXTRA_STATE_SUFFIX) or k in state]
    if clash:
        raise ValueError(f"{path}: corrupted torchmx metadata: torchmx.extra_state keys must end "
                         f"in {_EXTRA_STATE_SUFFIX!r} and name no tensor; not so for "
                         f"{_listed(clash)}")
    return state, extra, metadata


def _json_object(path: str, metadata: Dict[str, str], key: str, what: str) -> dict:
    """The JSON object stored under `key`, else ValueError naming the key."""
    if key not in metadata:
        raise ValueError(f"{path}: corrupted torchmx metadata: no {key!r} entry")
    try:
        value = json.loads(metadata[key])
    except (ValueError, RecursionError) as e:  # RecursionError: a deeply nested document
        raise ValueError(f"{path}: corrupted torchmx metadata: {key} is not valid JSON "
                         f"({type(e).__name__}: {e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: corrupted torchmx metadata: {key} must be a JSON object "
                         f"mapping {what}, got a {type(value).__name__}")
    return value


def _read(path: PathLike):
    """(state_dict with extra states, metadata) of a torchmx safetensors file."""
    tensors, extra, metadata = read_safetensors(path)
    return {**tensors, **extra}, metadata


def _listed(names) -> str:
    names = list(names)
    shown = ", ".join(map(repr, names[:_MAX_LISTED]))
    return shown + (f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


def _mismatches(model: nn.Module, state: dict, strict: bool) -> list:
    expected = model.state_dict()
    problems = []
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if strict and missing:
        problems.append(f"missing from the checkpoint: {_listed(missing)}")
    left_on_meta = [k for k in missing if isinstance(expected[k], torch.Tensor) and expected[k].is_meta]
    if not strict and left_on_meta:
        problems.append("missing from the checkpoint, and on the meta device in the model (they "
                        f"would be left without data): {_listed(left_on_meta)}")
    if strict and unexpected:
        problems.append(f"not in the model: {_listed(unexpected)}")
    for key, want in expected.items():
        have = state.get(key)
        if key.endswith(_EXTRA_STATE_SUFFIX) or have is None:
            continue
        if tuple(have.shape) != tuple(want.shape) or have.dtype != want.dtype:
            problems.append(f"{key}: checkpoint {have.dtype} {tuple(have.shape)}, model "
                            f"{want.dtype} {tuple(want.shape)}")
    return problems


def load_safetensors(model: nn.Module, path: PathLike, *, strict: bool = True) -> Dict[str, str]:
    """Load a save_safetensors file into `model` (built like the saved model), bit for bit.

    Raises ValueError when the file is not a torchmx checkpoint, is corrupted (checksums), or
    does not match the model (keys with strict=True, shapes, dtypes, MX configs). A model with
    meta-device tensors gets the checkpoint's tensors assigned; with strict=False, a key missing
    from the file whose model tensor is on the meta device raises ValueError too (it would be
    left without data). Returns the user metadata.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    state, metadata = _read(path)
    problems = _mismatches(model, state, strict)
    if problems:
        raise ValueError(f"{os.fspath(path)} does not match the model:\n  " + "\n  ".join(problems))
    assign = any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    model.load_state_dict(state, strict=strict, assign=assign)
    return {k: v for k, v in metadata.items() if not k.startswith("torchmx.")}

"""Fuzzed checkpoints: crafted safetensors headers and torchmx metadata, mutated files and
crafted pickles of MXTensors. Every loader answers a ValueError naming what is wrong (or
loads a well-formed file), never another exception type, and never executes code."""

import io
import json
import pickle
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from torchmx import MXTensor
from torchmx.config import MXConfig, QLinearConfig
from torchmx.mx_tensor import _rebuild_mx_tensor
from torchmx.nn import MXInferenceLinear
from torchmx.serialization import load_safetensors, read_safetensors, save_safetensors

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
METADATA_KEYS = ["torchmx.crc32", "torchmx.aliases", "torchmx.extra_state"]


def build():
    torch.manual_seed(0)
    return nn.Sequential(MXInferenceLinear.from_float(
        nn.Linear(32, 8), QLinearConfig(MXConfig("float4_e2m1"))))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "m.safetensors"
    save_safetensors(build(), path)
    return path.read_bytes()


def split(blob: bytes):
    """(header dict, tensor bytes) of a safetensors file."""
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def join(header, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def outcome(path):
    """None when both loaders accept the file, else the ValueError's message (any other
    exception fails the test)."""
    try:
        read_safetensors(path)
        load_safetensors(build(), path)
    except ValueError as e:
        assert str(e)
        return str(e)
    return None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=16), children, max_size=4),
    max_leaves=12)
tensor_names = st.sampled_from(["0.weight_scale", "0.weight_data", "0.bias", "0._extra_state",
                                "x", ""])
shaped_entries = {  # values shaped like each entry, with fuzzed contents
    "torchmx.crc32": st.dictionaries(tensor_names, json_values | st.integers(-1, 2 ** 33)),
    "torchmx.aliases": st.dictionaries(tensor_names, json_values | tensor_names),
    "torchmx.extra_state": st.dictionaries(tensor_names, json_values),
}


@FUZZ
@given(key=st.sampled_from(METADATA_KEYS), data=st.data())
def test_fuzzed_metadata_entries(tmp_path, saved, key, data):
    value = data.draw(st.one_of(
        json_values.map(json.dumps), shaped_entries[key].map(json.dumps), st.text(max_size=20),
        st.just("[" * 100_000 + "]" * 100_000)))  # nesting past the JSON parser's recursion
    header, tensors = split(saved)
    header["__metadata__"][key] = value
    path = tmp_path / "m.safetensors"
    path.write_bytes(join(header, tensors))
    message = outcome(path)
    if message is not None:
        assert any(word in message for word in (key, "checksum", "tied", "extra state",
                                                 "does not match the model")), message


@pytest.mark.parametrize("key, value, message", [
    ("torchmx.aliases", "[]", "torchmx.aliases must be a JSON object"),
    ("torchmx.aliases", '{"a": 3}', "'a' is tied to missing tensor 3"),
    ("torchmx.aliases", '{"0.bias": "0.weight_data"}', "'0.bias', which is stored itself"),
    ("torchmx.crc32", "5", "torchmx.crc32 must be a JSON object"),
    ("torchmx.crc32", '{"0.bias": "1", "0.weight_data": 1, "0.weight_scale": 1}',
     "torchmx.crc32 must map each tensor name to an int"),
    ("torchmx.extra_state", '"text"', "torchmx.extra_state must be a JSON object"),
    ("torchmx.extra_state", '{"0.bias": 1}', "keys must end in '_extra_state'"),
    ("torchmx.extra_state", '{"0._extra_state": 1}', "unrecognized extra state"),
    ("torchmx.extra_state", "{" * 100_000, "torchmx.extra_state is not valid JSON"),
], ids=lambda v: v[:24] if isinstance(v, str) else None)
def test_metadata_of_the_wrong_json_type(tmp_path, saved, key, value, message):
    header, tensors = split(saved)
    header["__metadata__"][key] = value
    path = tmp_path / "m.safetensors"
    path.write_bytes(join(header, tensors))
    with pytest.raises(ValueError, match=message):
        read_safetensors(path) if "extra state" not in message else load_safetensors(build(), path)


dtypes = st.sampled_from(["U8", "I8", "F32", "BF16", "F16", "BOOL", "F64", "I64", "U64",
                          "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "C64", "X", ""])
dims = st.integers(-2, 2 ** 40) | st.integers(0, 64)


@FUZZ
@given(entries=st.dictionaries(
    st.sampled_from(["0.weight_scale", "0.weight_data", "0.bias", "y"]),
    st.fixed_dictionaries({"dtype": dtypes, "shape": st.lists(dims, max_size=3),
                           "data_offsets": st.lists(st.integers(-1, 600), min_size=2,
                                                    max_size=2)})
    | json_values, max_size=4),
    payload=st.binary(max_size=600), crc=st.booleans())
def test_crafted_headers(tmp_path, saved, entries, payload, crc):
    header = {"__metadata__": split(saved)[0]["__metadata__"], **entries}
    if crc:  # checksums that name the crafted tensors
        header["__metadata__"]["torchmx.crc32"] = json.dumps({k: 0 for k in entries})
    path = tmp_path / "m.safetensors"
    path.write_bytes(join(header, payload))
    outcome(path)


@FUZZ
@given(position=st.integers(0, 10_000), flip=st.integers(1, 255), cut=st.booleans())
def test_mutated_files(tmp_path, saved, position, flip, cut):
    blob = bytearray(saved)
    position %= len(blob)
    if cut:
        blob = blob[:position]
    else:
        blob[position] ^= flip
    path = tmp_path / "m.safetensors"
    path.write_bytes(bytes(blob))
    outcome(path)


# ------------------------------------------------------------------------------ pickles

class Crafted:
    """Pickles to a call of _rebuild_mx_tensor with the given arguments."""

    def __init__(self, args):
        self.args = args

    def __reduce__(self):
        return _rebuild_mx_tensor, self.args


def load(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def valid_args():
    mx = MXTensor.to_mx(torch.randn(4, 40), "float6_e2m3", 16)
    return list(mx.__reduce_ex__(2)[1])


small_tensors = st.builds(
    lambda shape, dtype: torch.zeros(shape, dtype=dtype),
    st.lists(st.integers(0, 4), max_size=3),
    st.sampled_from([torch.uint8, torch.int8, torch.float32, torch.bool, torch.int64]))
pickle_values = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
                 | st.floats() | st.text(max_size=10) | small_tensors
                 | st.sampled_from([torch.float32, torch.bfloat16, torch.uint8, torch.int64])
                 | st.lists(st.integers(-3, 2 ** 40), max_size=3).map(tuple))


@FUZZ
@given(data=st.data())
def test_crafted_mx_tensor_pickles(data):
    args = valid_args()
    for i in data.draw(st.lists(st.integers(0, len(args)), min_size=1, max_size=3)):
        if i == len(args):
            args.append(data.draw(pickle_values))
        else:
            args[i] = data.draw(pickle_values)
    try:
        tensor = load(Crafted(tuple(args)))
    except ValueError as e:
        assert "MXTensor in the checkpoint" in str(e)
        return
    assert type(tensor) is MXTensor
    tensor.dequantize()  # a tensor that loads is a consistent one


@pytest.mark.parametrize("index, value, message", [
    (0, "not a tensor", "scale_e8m0_bits must be a torch.Tensor"),
    (2, "float7", "elem_dtype"),
    (3, 0, "block_size"),
    (8, "yes", "requires_grad must be a bool"),
    (9, 1, "is_parameter must be a bool"),
])
def test_crafted_pickle_messages(index, value, message):
    args = valid_args() + [False]
    args[index] = value
    with pytest.raises(ValueError, match=f"invalid MXTensor in the checkpoint.*{message}"):
        load(Crafted(tuple(args)))


class Exploit:
    def __reduce__(self):
        return exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",)


def test_pickles_cannot_execute_code(tmp_path, monkeypatch):
    """torchmx adds one safe global (_rebuild_mx_tensor); nothing else of it, and no builtin,
    is callable from a weights_only pickle."""
    monkeypatch.chdir(tmp_path)
    for obj in (Exploit(), MXTensor, torch.nn.Linear(2, 2)):
        with pytest.raises(pickle.UnpicklingError):
            load(obj)
    assert not (tmp_path / "PWNED").exists()

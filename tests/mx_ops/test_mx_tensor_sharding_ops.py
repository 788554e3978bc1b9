"""The ops FSDP2 and DTensor call to shard a tensor, on an MXTensor weight [rows, K] in blocks
along K: row shards (chunk / split / narrow along dim 0), K shards in whole blocks, the flat
view FSDP2 keeps of a shard, copies into a shard, `as_strided` onto its own geometry (how
FSDP2 rebuilds an unsharded parameter), moves and dtype relabels. Each result stays an MXTensor
and equals the same op on the dequantized tensor bit for bit."""

import pytest
import torch

from formats import FORMAT_IDS, FORMATS, wide_range_input
from test_mx_tensor_ops import assert_same_values, shares_storage
from torchmx import MXTensor

ROWS = (7, 0)  # odd, empty


def weight(fmt, rows, block=32, k=128):
    return MXTensor.to_mx(wide_range_input((rows, k), torch.bfloat16, seed=rows), fmt, block)


def check_pieces(pieces, expected, storage_of=None):
    assert len(pieces) == len(expected)
    for piece, plain in zip(pieces, expected):
        assert isinstance(piece, MXTensor)
        assert_same_values(piece, plain)
        if storage_of is not None:
            assert shares_storage(piece, storage_of)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_row_shards(fmt, rows):
    mx = weight(fmt, rows)
    plain = mx.dequantize()
    check_pieces(torch.chunk(mx, 2, dim=0), torch.chunk(plain, 2, dim=0), storage_of=mx)
    check_pieces(mx.split([3, rows - 3] if rows else [0, 0], dim=0),
                 plain.split([3, rows - 3] if rows else [0, 0], dim=0), storage_of=mx)
    check_pieces([mx.narrow(0, 0, rows // 2)], [plain.narrow(0, 0, rows // 2)], storage_of=mx)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_k_shards_in_whole_blocks(fmt):
    mx = weight(fmt, 7)
    plain = mx.dequantize()
    check_pieces(torch.chunk(mx, 4, dim=1), torch.chunk(plain, 4, dim=1), storage_of=mx)
    check_pieces(mx.split([64, 32, 32], dim=1), plain.split([64, 32, 32], dim=1), storage_of=mx)
    # a cut inside a block cannot stay MX: it runs on the dequantized values (plain result)
    cut = mx.split([48, 80], dim=1)
    for piece, expected in zip(cut, plain.split([48, 80], dim=1)):
        assert type(piece) is torch.Tensor
        assert_same_values(piece, expected)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_flat_view_and_back(fmt):
    mx = weight(fmt, 7)
    flat = mx.view(-1)
    assert isinstance(flat, MXTensor) and shares_storage(flat, mx)
    assert_same_values(flat, mx.dequantize().view(-1))
    assert_same_values(flat.view(7, 128), mx.dequantize())


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_copy_into_a_shard(fmt):
    src = weight(fmt, 7)
    dst = MXTensor.to_mx(torch.zeros(7, 128, dtype=torch.bfloat16), fmt, 32)
    dst.narrow(0, 0, 3).copy_(src.narrow(0, 4, 3))
    expected = torch.zeros(7, 128, dtype=torch.bfloat16)
    expected[:3] = src.dequantize()[4:]
    assert_same_values(dst, expected)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_as_strided_onto_its_own_geometry_is_an_alias(fmt):
    mx = weight(fmt, 7)
    alias = torch.as_strided(mx, mx.shape, mx.stride(), 0)
    assert isinstance(alias, MXTensor) and shares_storage(alias, mx)
    assert_same_values(alias, mx.dequantize())
    with pytest.raises(TypeError, match="as_strided"):  # any other geometry cuts blocks
        torch.as_strided(mx, (7, 64), mx.stride(), 0)
    with pytest.raises(TypeError, match="as_strided"):
        torch.as_strided(mx, mx.shape, mx.stride(), 128)


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_moves_and_relabels(fmt):
    mx = weight(fmt, 7)
    for out, dtype in ((mx.to("cpu"), torch.bfloat16), (mx.to(torch.float32), torch.float32),
                       (mx.detach(), torch.bfloat16), (mx.clone(), torch.bfloat16)):
        assert isinstance(out, MXTensor)
        assert_same_values(out, mx.dequantize(dtype))

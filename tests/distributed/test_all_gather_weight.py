"""MXAllGatherWeight in one process: its FSDP2 hooks called directly (the shards' inputs
concatenated as an all-gather would), for every format, and the wrapped weight in MXLinear.
The 2-rank runs are in tests/distributed/test_distributed.py."""

from types import SimpleNamespace

import pytest
import torch

from formats import FORMAT_IDS, FORMATS, wide_range_input
from torchmx import MXLinear, MXTensor
from torchmx.config import MXConfig, QLinearConfig
from torchmx.distributed import MXAllGatherWeight, enable_mx_all_gather


class Mesh:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def gather(weight, config, ranks, param_dtype=None):
    """The hooks' round trip: each rank's rows through fsdp_pre_all_gather, each input
    concatenated along dim 0 over the ranks as an all-gather would (the outputs FSDP2 hands to
    fsdp_post_all_gather), rank 0's shard and metadata."""
    shards = [MXAllGatherWeight(s, config) for s in weight.chunk(ranks, dim=0)]
    policy = SimpleNamespace(param_dtype=param_dtype)
    inputs = [s.fsdp_pre_all_gather(Mesh(ranks), weight.shape, weight.stride(), None, policy)
              for s in shards]
    outputs = tuple(torch.cat(parts) for parts in zip(*(i[0] for i in inputs)))
    return shards[0], outputs, inputs[0][1]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_gathered_weight_is_the_whole_weight_quantized(fmt):
    config = MXConfig(fmt.name, 32)
    weight = wide_range_input((8, 96), torch.float32, seed=3)
    shard, outputs, metadata = gather(weight, config, ranks=2)
    expected = tuple(o.clone() for o in outputs)
    gathered, inner = shard.fsdp_post_all_gather(outputs, metadata, torch.float32)
    scale, data = config.quantize(weight, -1)
    assert isinstance(gathered, MXTensor) and gathered.shape == weight.shape
    assert torch.equal(gathered._scale_e8m0, scale) and torch.equal(gathered._data, data)
    # no copy: the MXTensor holds the gathered tensors themselves
    assert [t.data_ptr() for t in inner] == [o.data_ptr() for o in outputs]
    # FSDP2 frees them after use and gathers the next step into the same tensors (out=)
    for t in outputs:
        t.zero_()
    for t, e in zip(outputs, expected):
        t.copy_(e)
    assert shard.fsdp_post_all_gather(outputs, metadata, torch.float32, out=gathered) is None
    assert torch.equal(gathered._scale_e8m0, scale) and torch.equal(gathered._data, data)


def test_mixed_precision_quantizes_the_cast_weight():
    config = MXConfig("float4_e2m1")
    weight = torch.randn(4, 64)
    shard, outputs, metadata = gather(weight, config, ranks=2, param_dtype=torch.bfloat16)
    gathered, _ = shard.fsdp_post_all_gather(outputs, metadata, torch.bfloat16)
    scale, data = config.quantize(weight.bfloat16(), -1)
    assert gathered.dtype == torch.bfloat16
    assert torch.equal(gathered._scale_e8m0, scale) and torch.equal(gathered._data, data)


def test_uneven_rows_gather_padded_high_precision():
    weight = torch.randn(7, 64)  # 2 ranks: 4 + 3 rows, padded to 4 + 4
    shards = [MXAllGatherWeight(s, MXConfig("float8_e4m3")) for s in weight.chunk(2)]
    (last,), metadata = shards[1].fsdp_pre_all_gather(Mesh(2), weight.shape, weight.stride(),
                                                      None, None)
    assert metadata is None and last.shape == (4, 64) and torch.equal(last[:3], weight[4:])
    assert bool((last[3] == 0).all())
    out, inner = shards[0].fsdp_post_all_gather((torch.cat([weight[:4], last]),), None,
                                                torch.float32)
    assert type(out) is torch.Tensor and inner == () and torch.equal(out[:7], weight)


def test_one_rank_shard_group_sends_the_weight_itself():
    """FSDP2 copies a single input where the shard group is one rank: nothing travels, so
    the weight goes as is and the layer quantizes it (as without the wrapper)."""
    weight = torch.randn(4, 64)
    shard = MXAllGatherWeight(weight, MXConfig("float4_e2m1"))
    policy = SimpleNamespace(param_dtype=torch.bfloat16)
    (sent,), metadata = shard.fsdp_pre_all_gather(Mesh(1), weight.shape, weight.stride(), None,
                                                  policy)
    assert metadata is None and sent.dtype == torch.bfloat16 and torch.equal(sent, weight.bfloat16())
    out, inner = shard.fsdp_post_all_gather((sent,), None, torch.bfloat16)
    assert out is sent and inner == ()


def test_a_write_requantizes():
    shard = MXAllGatherWeight(torch.randn(4, 64), MXConfig("float8_e4m3"))
    whole = (8, 64)  # this shard's 4 rows of 2 ranks'
    first = shard.fsdp_pre_all_gather(Mesh(2), whole, (64, 1), None, None)[0]
    again = shard.fsdp_pre_all_gather(Mesh(2), whole, (64, 1), None, None)[0]
    assert again is first  # the backward's re-gather reuses the forward's bytes
    shard.add_(1.0)
    codes, scales = shard.fsdp_pre_all_gather(Mesh(2), whole, (64, 1), None, None)[0]
    scale, data = MXConfig("float8_e4m3").quantize(shard.hp, -1)
    assert torch.equal(codes, data.view(torch.uint8)) and torch.equal(scales, scale)


def test_foreach_write_over_mixed_tensors_keeps_the_wrapper_and_requantizes():
    """The optimizer's foreach ops pass lists of every parameter: the wrappers among them are
    written through, stay themselves, and drop their quantized bytes."""
    shard = MXAllGatherWeight(torch.randn(4, 64), MXConfig("float8_e4m3"))
    plain = torch.randn(4, 64)
    before, plain_before = shard.hp.clone(), plain.clone()
    shard.fsdp_pre_all_gather(Mesh(2), (8, 64), (64, 1), None, None)
    torch._foreach_mul_([shard, plain], 2.0)
    assert shard._gathered is None
    assert torch.equal(shard.hp, before * 2) and torch.equal(plain, plain_before * 2)
    (out,) = torch._foreach_add([shard, plain], 1.0)[:1]
    assert type(out) is torch.Tensor and torch.equal(out, before * 2 + 1)


def test_pre_all_gather_hook_signature_is_what_fsdp2_reads():
    """FSDP2 inspects the hook at every all-gather and takes the 5-argument form."""
    import inspect

    shard = MXAllGatherWeight(torch.randn(4, 64), MXConfig("float8_e4m3"))
    assert list(inspect.signature(shard.fsdp_pre_all_gather).parameters) == [
        "mesh", "outer_size", "outer_stride", "module", "mp_policy"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["float8_e4m3", "float4_e2m1", "float6_e3m2", "int8"])
def test_pre_all_gather_quantize_plan_matches_the_operator_on_cuda(fmt):
    """On CUDA the shard is quantized through a plan kept on it: the operator's bytes, at the
    first gather and after a write (the plan reused on new values)."""
    config = MXConfig(fmt)
    shard = MXAllGatherWeight(torch.randn(48, 160, device="cuda"), config)
    policy = SimpleNamespace(param_dtype=torch.bfloat16)
    for _ in range(2):
        codes, scales = shard.fsdp_pre_all_gather(Mesh(2), (96, 160), (160, 1), None,
                                                  policy)[0]
        scale, data = config.quantize(shard.hp.bfloat16(), -1)
        assert torch.equal(codes, data.view(torch.uint8)) and torch.equal(scales, scale)
        shard.mul_(-3.0)


def test_wrapped_mxlinear_trains_like_the_plain_one():
    config = QLinearConfig(weights_config=MXConfig("float4_e2m1"),
                           activations_config=MXConfig("float8_e4m3"))
    torch.manual_seed(0)
    plain = MXLinear(64, 32, qconfig=config)
    wrapped = MXLinear(64, 32, qconfig=config)
    wrapped.load_state_dict(plain.state_dict())
    assert enable_mx_all_gather(torch.nn.Sequential(wrapped)) == ["0"]
    assert isinstance(wrapped.weight, MXAllGatherWeight)
    state = wrapped.state_dict()
    assert type(state["weight"]) is torch.Tensor and torch.equal(state["weight"], plain.weight)
    x = torch.randn(5, 64)
    for layer in (plain, wrapped):
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        layer(x).square().sum().backward()
        opt.step()
    assert torch.equal(wrapped.weight.hp, plain.weight.detach())
    assert torch.equal(wrapped(x), plain(x))


def test_layers_whose_backward_needs_the_weight_are_left_out():
    config = QLinearConfig(weights_config=MXConfig("float8_e4m3"),
                           grad_config=MXConfig("float8_e4m3"))
    model = torch.nn.Sequential(MXLinear(32, 32, qconfig=config))
    assert enable_mx_all_gather(model) == [] and type(model[0].weight) is torch.nn.Parameter


def test_bad_arguments():
    with pytest.raises(TypeError, match="config must be a torchmx.MXConfig"):
        MXAllGatherWeight(torch.ones(2, 32), "mxfp8")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        enable_mx_all_gather(torch.ones(2))

"""MXInferenceLinear.prepack() and torchmx.nn.prepack_weights: a second copy of the weight in
the TMA stream layout (MXFP4, MXFP8, MXINT8, where Triton has Gluon), the fp4 wgmma layout (MXFP4)
or the MMA layout (MXFP8, MXINT8, MXFP6), what forward does with it, and how the copy
follows the weight (load_state_dict, in-place writes, pickling, .to, inference mode,
torch.compile). Every test runs with and without stream copies.

On CPU the fp4 wgmma and MMA-layout kernels run under Triton's interpreter and the stream copies take
the op's usual path (Gluon does not run there); on an H100 all run on the GPU. Operands are
small integers, so every sum is exact and any kernel must give the plain layer's bits.
"""

import copy

import pytest
import torch

from torchmx import dtypes
from torchmx.config import MXConfig, QLinearConfig
from torchmx.kernels.layouts import fp4_wgmma_layout as fl, mma_layout as pl, tma_stream_layout as sl
from torchmx.kernels.linear import stream_matmul
from torchmx.mx_ops import weight_matmul
from torchmx.nn import MXInferenceLinear, inference_linear, prepack_weights

from matmul_operands import DEVICE, reference

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu  # the kernels run on the GPU where there is one
HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)
# fp4: the fp4 wgmma layout; the others: the MMA layout
FORMATS = ["float4_e2m1", "float8_e4m3", "int8", "float6_e3m2"]


@pytest.fixture(autouse=True, params=[False, True], ids=["fragment-piece", "stream"])
def stream_copies(request, monkeypatch):
    """Whether prepack() makes stream copies where they fit (on an H100 with Gluon it does by
    default for weights that fill the GPU's waves; on the CPU it does not)."""
    monkeypatch.setattr(inference_linear, "_stream_layout_wanted", lambda *_: request.param)
    # the kernel's wave policy would send these small layers to the usual path
    monkeypatch.setattr(stream_matmul, "MIN_WAVE_FILL", {1: 0.0, 2: 0.0, 4: 0.0})
    monkeypatch.setattr(stream_matmul, "ONE_ROW_MIN_FILL", 0.0)
    return request.param


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    """Without a GPU, let the ops dispatch CPU tensors to the kernels too (Triton's
    interpreter); with one, CPU tensors keep the reference path."""
    if not CUDA:
        monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})


def needs_kernel():
    if CUDA and not HOPPER:
        pytest.skip("the prepacked kernels need sm_90 (or the CPU interpreter)")


def _layer(N=128, K=256, bias=True, fmt="float4_e2m1", block_size=32, activations=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(K, N, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randint(-6, 7, (N, K), generator=g))
        if bias:
            linear.bias.copy_(torch.randint(-8, 9, (N,), generator=g))
    qconfig = QLinearConfig(weights_config=MXConfig(fmt, block_size=block_size),
                            activations_config=activations)
    return MXInferenceLinear.from_float(linear, qconfig).to(DEVICE)


def _unpacked(layer):
    """(scale, data) rebuilt from the layer's prepacked copy."""
    fmt = layer.qconfig.weights_config.elem_dtype
    codes, scales = layer.weight_prepacked_codes, layer.weight_prepacked_scales
    N, K = layer.out_features, layer.in_features
    if layer._prepacked_layout == "tma_stream":
        return sl.unpack(codes, scales, fmt, N, K)
    if layer._prepacked_layout == "fp4_wgmma":
        return fl.unshuffle(codes, scales, N, K)
    return pl.unpack(codes, scales, fmt, N, K)


@pytest.mark.parametrize("fmt,rows", [("float4_e2m1", r) for r in (1, 2, 16, 64, 70)]
                         + [("float8_e4m3", 16), ("float8_e4m3", 70), ("int8", 2), ("int8", 64),
                            ("float6_e3m2", 1), ("float6_e3m2", 33)])
def test_prepacked_layer_equals_the_plain_one(fmt, rows):
    """Rows where the prepacked kernels run and where the op takes the usual path."""
    needs_kernel()
    layer = _layer(fmt=fmt)
    x = torch.randint(-4, 5, (rows, 256)).to(torch.bfloat16).to(DEVICE)
    expected = layer(x)
    assert not layer.prepacked and "prepacked" not in repr(layer)
    assert layer.prepack() is layer and layer.prepacked and repr(layer).endswith("prepacked)")
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_copy_is_the_weight_in_its_layout(fmt, stream_copies):
    layer = _layer(fmt=fmt).prepack()
    expected = ("tma_stream" if stream_copies else
                "fp4_wgmma" if fmt == "float4_e2m1" else "mma")
    assert layer._prepacked_layout == expected
    s, d = _unpacked(layer)
    assert torch.equal(s, layer.weight_scale) and torch.equal(d, layer.weight_data)
    extra = layer.weight_prepacked_codes.numel() - layer.weight_data.numel()
    assert layer.weight_prepacked_counters.shape == (2,) and not layer.weight_prepacked_counters.any()
    assert layer.weight_prepacked_counters.dtype == torch.int32
    assert extra == (fl.PAD_CODE_BYTES if expected == "fp4_wgmma" else 0)


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e5m2"])
def test_prepacked_layer_trains_its_bias_and_input_straight_through(fmt):
    needs_kernel()
    plain, packed = _layer(fmt=fmt), _layer(fmt=fmt).prepack()
    grads = []
    for layer in (plain, packed):
        x = torch.randint(-4, 5, (8, 256)).to(torch.bfloat16).to(DEVICE).requires_grad_()
        layer(x).sum().backward()
        grads.append((x.grad, layer.bias.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_prepack_is_not_saved_and_is_rebuilt_on_load(fmt):
    needs_kernel()
    layer = _layer(fmt=fmt).prepack()
    state = layer.state_dict()
    assert not any("prepacked" in k or "fragment" in k for k in state)
    other = _layer(fmt=fmt, seed=1)
    layer.load_state_dict(other.state_dict())
    assert layer.prepacked
    s, d = _unpacked(layer)
    assert torch.equal(s, other.weight_scale) and torch.equal(d, other.weight_data)
    x = torch.randint(-4, 5, (4, 256)).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(layer(x), other(x), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["float4_e2m1", "int8"])
def test_an_eager_forward_rebuilds_a_stale_copy(fmt):
    needs_kernel()
    layer, other = _layer(fmt=fmt, bias=False).prepack(), _layer(fmt=fmt, seed=1, bias=False)
    x = torch.randint(-4, 5, (4, 256)).to(torch.bfloat16).to(DEVICE)
    layer.weight_data.copy_(other.weight_data)  # written in place
    layer.weight_scale.copy_(other.weight_scale)
    torch.testing.assert_close(layer(x), other(x), rtol=0, atol=0)
    third = _layer(fmt=fmt, seed=2, bias=False)
    layer.weight_data, layer.weight_scale = third.weight_data, third.weight_scale  # replaced
    torch.testing.assert_close(layer(x), third(x), rtol=0, atol=0)
    assert torch.equal(_unpacked(layer)[1], layer.weight_data)


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3"])
def test_prepacked_layer_pickles_and_moves(fmt, tmp_path):
    layer = _layer(fmt=fmt).prepack()
    path = tmp_path / "layer.pt"
    torch.save(layer, path)
    for other in (torch.load(path, weights_only=False), copy.deepcopy(layer),
                  copy.deepcopy(layer).to("cpu")):
        assert other.prepacked
        assert torch.equal(other.weight_prepacked_codes.cpu(), layer.weight_prepacked_codes.cpu())
        x = torch.randint(-4, 5, (3, 256)).to(torch.bfloat16).to(other.weight_data.device)
        if not CUDA or HOPPER:
            torch.testing.assert_close(other(x).cpu(), layer(x.to(DEVICE)).cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3"])
def test_a_pickled_copy_is_rebuilt_from_the_weight(fmt):
    """Copies pickled by another version of their layout (the TMA stream layout's fp4 words
    changed) must not reach the kernels, not even under torch.compile, which skips forward's
    check: unpickling rebuilds the copy."""
    layer = _layer(fmt=fmt).prepack()
    expected = layer.weight_prepacked_codes.clone()
    state = copy.deepcopy(layer).__getstate__()
    state["_buffers"]["weight_prepacked_codes"] = torch.zeros_like(expected)  # a stale copy
    loaded = MXInferenceLinear.__new__(MXInferenceLinear)
    loaded.__setstate__(state)
    assert loaded.prepacked and loaded._prepacked_layout == layer._prepacked_layout
    assert torch.equal(loaded.weight_prepacked_codes, expected)
    assert loaded._prepacked_source == loaded._weight_source()
    assert torch.equal(layer.weight_prepacked_codes, expected)  # the original is untouched


def test_layers_pickled_before_prepack_existed_load():
    layer = _layer()
    state = layer.__getstate__()
    for name in ("_prepacked_fold", "_prepacked_layout", "_prepacked_source"):
        state.pop(name)
    for name in ("weight_prepacked_codes", "weight_prepacked_scales", "weight_prepacked_counters"):
        state["_buffers"].pop(name)
        state["_non_persistent_buffers_set"].discard(name)
    old = MXInferenceLinear.__new__(MXInferenceLinear)
    old.__setstate__(state)
    assert not old.prepacked and "prepacked" not in repr(old)
    x = torch.randint(-4, 5, (2, 256)).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(old(x), layer(x), rtol=0, atol=0)


OLD_BUFFER_NAMES = {"weight_fragment_codes": "weight_prepacked_codes",
                    "weight_fragment_scales": "weight_prepacked_scales",
                    "weight_fragment_counters": "weight_prepacked_counters"}


def test_layers_pickled_with_the_old_buffer_names_load():
    """Layers pickled when the prepacked copy's buffers were named weight_fragment_*: the copy
    comes back under weight_prepacked_*, rebuilt from the weight, bit for bit."""
    needs_kernel()
    layer = _layer(fmt="float8_e4m3").prepack()
    state = copy.deepcopy(layer).__getstate__()
    for old, new in OLD_BUFFER_NAMES.items():
        state["_buffers"][old] = state["_buffers"].pop(new)
        state["_non_persistent_buffers_set"].discard(new)
        state["_non_persistent_buffers_set"].add(old)
    loaded = MXInferenceLinear.__new__(MXInferenceLinear)
    loaded.__setstate__(state)
    assert loaded.prepacked and not any(old in loaded._buffers for old in OLD_BUFFER_NAMES)
    for new in OLD_BUFFER_NAMES.values():
        assert torch.equal(getattr(loaded, new), getattr(layer, new))
        assert new in loaded._non_persistent_buffers_set
    x = torch.randint(-4, 5, (4, 256)).to(torch.bfloat16).to(DEVICE)
    assert torch.equal(loaded(x).view(torch.int16), layer(x).view(torch.int16))


def test_state_dicts_with_the_old_buffer_names_load_strictly(monkeypatch):
    """A state dict that holds a prepacked copy under the old names loads with strict=True:
    the saved copy is dropped and rebuilt from the loaded weight."""
    needs_kernel()
    source = _layer(fmt="float8_e4m3", seed=1).prepack()
    old_state = dict(source.state_dict())
    for old, new in OLD_BUFFER_NAMES.items():
        old_state[old] = torch.zeros_like(getattr(source, new))  # a stale copy
    layer = _layer(fmt="float8_e4m3").prepack()
    layer.load_state_dict(old_state, strict=True)
    for new in OLD_BUFFER_NAMES.values():
        assert torch.equal(getattr(layer, new), getattr(source, new))
    x = torch.randint(-4, 5, (4, 256)).to(torch.bfloat16).to(DEVICE)
    assert torch.equal(layer(x).view(torch.int16), source(x).view(torch.int16))
    # without the layer's hook the old keys are unexpected
    monkeypatch.setattr(MXInferenceLinear, "_load_from_state_dict",
                        torch.nn.Module._load_from_state_dict)
    with pytest.raises(RuntimeError, match="weight_fragment_codes"):
        _layer(fmt="float8_e4m3").load_state_dict(old_state, strict=True)


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float6_e3m2"])
def test_prepack_under_inference_mode(fmt):
    needs_kernel()
    with torch.inference_mode():
        layer = _layer(fmt=fmt).prepack()
        x = torch.randint(-4, 5, (5, 256)).to(torch.bfloat16).to(DEVICE)
        torch.testing.assert_close(layer(x), reference(x, layer.weight, layer.bias), rtol=0,
                                   atol=0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(fmt="float8_e4m3", block_size=64), "no prepacked layout for float8_e4m3 weights in "
                                             "blocks of 64"),
    (dict(K=96), "float4_e2m1 weights with in and out features multiples of 64"),
    (dict(fmt="float6_e2m3", K=192), "in_features of a unit's codes"),
    (dict(fmt="float8_e5m2", N=96), "out_features a multiple of 64"),
    (dict(activations=MXConfig("float8_e4m3")), "activations_config"),
])
def test_prepack_refuses_layers_without_a_prepacked_layout(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _layer(**kwargs).prepack()


def test_prepack_refuses_meta_weights():
    with torch.device("meta"):
        layer = MXInferenceLinear(128, 64, qconfig=QLinearConfig(
            weights_config=MXConfig("float8_e4m3")))
    with pytest.raises(ValueError, match="meta"):
        layer.prepack()


def test_prepack_weights_prepacks_the_layers_that_fit():
    model = torch.nn.Sequential(_layer(), torch.nn.ReLU(), _layer(N=256, K=128),
                                _layer(fmt="float8_e4m3"), _layer(K=96, N=64),
                                _layer(fmt="int8", block_size=64),
                                _layer(fmt="float6_e2m3", activations=MXConfig("float8_e4m3")))
    names = prepack_weights(model)
    assert names == ["0", "2", "3"]
    assert ([getattr(m, "prepacked", None) for m in model]
            == [True, None, True, True, False, False, False])


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3"])
def test_prepacked_layer_compiles(fmt):
    needs_kernel()
    layer = _layer(fmt=fmt).prepack()
    x = torch.randint(-4, 5, (2, 3, 256)).to(torch.bfloat16).to(DEVICE)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager" if not CUDA else "inductor")
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


def _old_attribute_names(state):
    """A layer's pickled state as earlier versions wrote it: `_fragment_*`, not `_prepacked_*`."""
    for name in ("fold", "layout", "source"):
        state[f"_fragment_{name}"] = state.pop(f"_prepacked_{name}")
    return state


@pytest.mark.parametrize("fmt,name", [("float4_e2m1", "fp4_wgmma"), ("int8", "mma")])
def test_layers_pickled_before_the_stream_layout_keep_their_copy(fmt, name, monkeypatch):
    """A layer prepacked (fp4 wgmma or MMA copy) and pickled before the layout was recorded,
    under the earlier attribute names."""
    monkeypatch.setattr(inference_linear, "_stream_layout_wanted", lambda *_: False)
    layer = _layer(fmt=fmt).prepack()
    state = _old_attribute_names(layer.__getstate__())
    state.pop("_fragment_layout")
    old = MXInferenceLinear.__new__(MXInferenceLinear)
    old.__setstate__(state)
    assert old.prepacked and old._prepacked_layout == name
    x = torch.randint(-4, 5, (2, 256)).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(old(x), reference(x, layer.weight, layer.bias), rtol=0, atol=0)


def test_prepack_makes_stream_copies_on_hopper_for_weights_that_fill_the_waves(monkeypatch):
    """The default policy (the fixture's patch undone): an sm_90 GPU with Gluon, and out_features
    whose 64-row tiles fill the SMs' waves."""
    monkeypatch.undo()
    if CUDA and not HOPPER:
        pytest.skip("the policy is for sm_90")
    monkeypatch.setattr(stream_matmul, "sm_count", lambda device: 2)
    expected = HOPPER and stream_matmul.available()
    fp4, fp8, here = dtypes.float4_e2m1, dtypes.float8_e4m3, torch.device(DEVICE)
    assert inference_linear._stream_layout_wanted(fp8, 128, 256, here) is expected
    assert not inference_linear._stream_layout_wanted(fp4, 192, 256, here)  # 3 tiles of 4
    # 5 tiles of 6: enough for MXFP4 (80%), not for one-byte codes (90%)
    assert inference_linear._stream_layout_wanted(fp4, 320, 256, here) is expected
    assert not inference_linear._stream_layout_wanted(fp8, 320, 256, here)
    # one tile: K split in two (at least 4 steps each) fills both SMs
    assert inference_linear._stream_layout_wanted(fp8, 64, 1024, here) is expected
    assert not inference_linear._stream_layout_wanted(fp8, 64, 512, here)
    assert not inference_linear._stream_layout_wanted(fp4, 128, 256, torch.device("cpu"))
    layer = _layer(fmt="float8_e4m3").prepack()
    assert layer._prepacked_layout == ("tma_stream" if expected else "mma")


def test_mxfp4_weights_never_take_the_piece_layout(stream_copies):
    """prepack() tries the fp4 wgmma layout before the MMA layout, and the fp4 wgmma layout
    takes every MXFP4 weight in blocks of 32 with both dims multiples of 64: every MXFP4 weight
    the MMA layout took (blocks of 32, out_features a multiple of 64, in_features of 128)
    gets a fragment (or stream) copy, for any format, block size and shape."""
    fp4 = dtypes.float4_e2m1
    layouts = set()
    for fmt in [dtypes.from_name(f) for f in FORMATS] + [dtypes.float8_e5m2, dtypes.float6_e2m3]:
        for block in (16, 32, 64):
            qconfig = QLinearConfig(weights_config=MXConfig(fmt.name, block_size=block))
            for N in range(64, 1025, 64):
                for K in range(16, 2049, 16):
                    layout = inference_linear._prepack_layout(qconfig, N, K,
                                                              torch.device("cpu"))
                    took_fp4 = fmt == fp4 and block == 32 and K % 128 == 0
                    if took_fp4:
                        assert layout is (sl if stream_copies and sl.fits(fp4, 32, N, K)
                                          else fl), (N, K)
                    layouts.add(None if layout is None else layout.__name__)
    assert {"torchmx.kernels.layouts.fp4_wgmma_layout",
            "torchmx.kernels.layouts.mma_layout"} <= layouts
    assert not any(pl.fits(fp4, block, N, K) for block in (16, 32, 64)
                   for N in range(0, 1025, 64) for K in range(0, 2049, 64))


def test_mxfp4_layers_pickled_with_an_mma_copy_load_with_an_fp4_wgmma_copy(monkeypatch):
    """Earlier versions could give an MXFP4 weight a piece copy, which only pickles hold (the
    copy is not in state dicts): unpickling rebuilds the copy in the layout prepack() picks
    now, bit for bit the weight."""
    monkeypatch.setattr(inference_linear, "_stream_layout_wanted", lambda *_: False)
    layer = _layer(fmt="float4_e2m1").prepack()
    state = _old_attribute_names(copy.deepcopy(layer).__getstate__())
    state["_fragment_layout"] = "piece"
    n = layer.weight_data.numel()  # the MMA layout's size: the weight's bytes, no padding
    state["_buffers"]["weight_prepacked_codes"] = torch.zeros(n, dtype=torch.uint8, device=DEVICE)
    state["_buffers"]["weight_prepacked_scales"] = torch.zeros_like(layer.weight_scale).view(-1)
    old = MXInferenceLinear.__new__(MXInferenceLinear)
    old.__setstate__(state)
    assert old.prepacked and old._prepacked_layout == "fp4_wgmma"
    s, d = _unpacked(old)
    assert torch.equal(s, layer.weight_scale) and torch.equal(d, layer.weight_data)
    x = torch.randint(-4, 5, (2, 256)).to(torch.bfloat16).to(DEVICE)
    assert torch.equal(old(x).view(torch.int16), layer(x).view(torch.int16))

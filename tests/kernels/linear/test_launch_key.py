"""kernels/_launch.py: its key, what it must tell apart for Triton (checked against Triton's own
keys on the GPU in tests/mx_ops/test_gpu_short_path.py), and what it may share."""

import pytest
import torch

from torchmx.kernels._launch import _key


def test_constexprs_are_keyed_by_value():
    assert _key([4], [True]) != _key([8], [True])
    assert _key([True], [True]) != _key([False], [True])


def test_ints_by_what_triton_specializes():
    assert _key([1], [False]) != _key([17], [False])  # == 1
    assert _key([16], [False]) != _key([24], [False])  # divisibility by 16
    assert _key([2**31 - 16], [False]) != _key([2**31], [False])  # i32 or i64
    assert _key([32], [False]) == _key([4096], [False])  # one specialization: shared


def test_tensors_by_dtype_and_alignment():
    base = torch.zeros(64, dtype=torch.uint8)
    aligned, unaligned = base[:32], base[1:33]
    assert base.data_ptr() % 16 == 0
    assert _key([aligned], [False]) != _key([unaligned], [False])
    assert _key([aligned], [False]) != _key([aligned.view(torch.int8)], [False])
    assert _key([aligned], [False]) == _key([torch.zeros(8, dtype=torch.uint8)], [False])


def test_floats_share_one_key_and_others_are_keyed_by_value():
    assert _key([0.5], [False]) == _key([2.0], [False])  # passed as fp32, never specialized
    assert _key([None], [False]) != _key([False], [False])


@pytest.mark.gpu
def test_linear_plans_are_made_once_per_kind_of_product(monkeypatch):
    """kernels/linear/dispatch.linear makes one plan per key (shapes, strides, alignments, dtypes, bias
    or none) and reuses it: the same product again, or another weight of the same shape, adds
    none; a bias adds one. Every result is the exact product's bits."""
    import torch.nn.functional as F

    import torchmx
    from matmul_operands import DEVICE, integer_operands, reference
    from torchmx.config import MXConfig, QLinearConfig
    from torchmx.kernels.linear import dispatch
    from torchmx.mx_ops import weight_matmul
    from torchmx.nn import inference_linear

    monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(dispatch, "_PLANS", {})
    x, w = integer_operands("float8_e4m3", 1, 16, 32)
    _, w2 = integer_operands("float8_e4m3", 1, 16, 32, seed=1)
    bias = (torch.arange(16, dtype=torch.bfloat16) / 4).to(DEVICE)
    for a, weight, b, plans in [(x, w, None, 1), (x, w2, None, 1), (x, w, bias, 2)]:
        with torch.no_grad():
            got = F.linear(a, weight, b)
        assert torch.equal(got, reference(a, weight, b))
        assert len(dispatch._PLANS) == plans
    # an MXInferenceLinear keeps its weight's plans, keyed by the input alone
    linear = torch.nn.Linear(32, 16, bias=False, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad():
        linear.weight.copy_(w.dequantize())
    layer = torchmx.MXInferenceLinear.from_float(linear, QLinearConfig(MXConfig("float8_e4m3")))
    for _ in range(2):
        with torch.no_grad():
            assert torch.equal(layer(x), reference(x, layer.weight))
    (_, _, (*_, own_plans)), = inference_linear._WEIGHT_VIEWS[layer].values()
    assert len(own_plans) == 1 and len(dispatch._PLANS) == 2


class _Launch:
    """A stand-in for _launch.Launch: records what `direct` was asked to bind."""

    def __init__(self, bound):
        self.bound, self.asked = bound, None

    def direct(self, fixed, free, index):
        self.asked = (fixed, free, index)
        return self.bound


def test_bind_weight_fixes_the_weights_slots_and_the_partials(monkeypatch):
    from torchmx.kernels import _launch

    made = []
    monkeypatch.setattr(_launch, "bound_product", lambda *args: made.append(args) or "product")
    w_scale, w_data = torch.zeros(4, 2, dtype=torch.uint8), torch.zeros(4, 32, dtype=torch.uint8)
    main, reduce = _Launch("main"), _Launch("reduce")
    device = torch.device("cuda", 1)  # (bound_product, which would allocate there, is replaced)
    assert _launch.bind_weight(main, reduce, w_scale, w_data, (1, 4), torch.bfloat16, device,
                               (3, 1, 4)) == "product"
    assert main.asked[1:] == ((0, 3, 4, 5), 1) and main.asked[0][1] is w_data
    assert main.asked[0][2] is w_scale and reduce.asked == ({}, (0, 1, 2), 1)
    assert made[-1] == ("main", "reduce", (1, 4), torch.bfloat16, device, (3, 1, 4))
    # without a split-K reduce: no partials
    assert _launch.bind_weight(_Launch("main"), None, w_scale, w_data, (1, 4), torch.float16,
                               device, (3, 1, 4)) == "product"
    assert made[-1] == ("main", None, (1, 4), torch.float16, device, None)
    # a launch that cannot be bound yet (not compiled on this device, a launch hook): none
    assert _launch.bind_weight(_Launch(None), reduce, w_scale, w_data, (1, 4), torch.bfloat16,
                               device, (3, 1, 4)) is None
    assert _launch.bind_weight(main, _Launch(None), w_scale, w_data, (1, 4), torch.bfloat16,
                               device, (3, 1, 4)) is None
    assert len(made) == 2

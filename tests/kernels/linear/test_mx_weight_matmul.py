"""The MX-weight matmul kernels (torchmx/kernels/linear/dispatch.py) and their dispatch from MXTensor.

On CPU the Triton kernels run under the interpreter on small shapes (conftest sets it); on a
CUDA machine the same tests run on the GPU, plus real sizes and the large-M cuBLAS path.

Two kinds of check:
- exact: operands whose products and partial sums are all exact in fp32 (small integers times
  MX values of bounded magnitude), so every fp32 accumulation order gives the same sum and the
  kernels must equal the reference path bit for bit;
- random: within the error bound of an fp32 accumulation plus one rounding of the exact
  (fp64) product.
"""

import pytest
import torch
import torch.nn.functional as F

from torchmx import MXTensor, dtypes
from torchmx.mx_tensor import MXLayoutWarning, reset_layout_warning
from torchmx.kernels.linear import dispatch as km
from torchmx.mx_ops import weight_matmul

from covering import all_pairs, pairs_when_interpreted
from matmul_operands import (DEVICE, assert_graph_replay_matches_eager,
                             assert_within_fp32_accumulation, integer_operands, reference)

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu  # the kernels run on the GPU where there is one
FORMATS = ["float8_e4m3", "float8_e5m2", "float6_e3m2", "float6_e2m3", "float4_e2m1", "int8"]
FP6 = ["float6_e3m2", "float6_e2m3"]
# The fused kernel takes fp6 in the rows variant only, on rows of whole 32-bit words (the only
# fp6 products the dispatch sends it: test_fp6_takes_the_fused_kernel_only_as_whole_words).
FUSED_FORMATS = [f for f in FORMATS if f not in FP6]
VARIANTS = {  # small tiles, K split, several blocks per step: every code path of the kernel
    "rows": km.Config(km.ROWS, 16, 2, 2),
    "rows_nb4": km.Config(km.ROWS, 16, 1, 4),
    "block_dots": km.Config(km.BLOCK_DOTS, 16, 2, 1),
    "scaled_dots": km.Config(km.SCALED_DOTS, 32, 3, 2),
}


# (variant, activation dtype) pairs the kernel takes: scaled dots round values to bf16 only.
VARIANT_DTYPES = [(v, d) for v in VARIANTS for d in (torch.bfloat16, torch.float16)
                  if not (v == "scaled_dots" and d == torch.float16)]


@pytest.mark.parametrize("fields,match", [
    (dict(variant=3), "variant"), (dict(block_n=48), "block_n"), (dict(blocks=0), "blocks"),
    (dict(num_warps=3), "num_warps"), (dict(split_k=0), "split_k"),
    (dict(num_stages=0), "num_stages"), (dict(variant=km.SCALED_DOTS, block_n=8), "block_n"),
])
def test_config_rejects_impossible_launches(fields, match):
    args = dict(variant=km.ROWS, block_n=16, split_k=1, blocks=2)
    with pytest.raises(ValueError, match=match):
        km.Config(**{**args, **fields})


def test_scaled_dots_refuse_fp16():
    x, w = integer_operands("float4_e2m1", 2, 8, 64, torch.float16)
    with pytest.raises(ValueError, match="bf16"):
        _fused(x, w, None, VARIANTS["scaled_dots"])


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """Route MXTensor matmuls on CPU through the kernels too (Triton's interpreter)."""
    monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})


def _fused(x, w, bias, config):
    return km.fused_linear(x, w._scale_e8m0, w._data, w.elem_dtype, w.block_size, bias,
                           x.dtype, config=config)


@pytest.mark.parametrize("fmt,variant,dtype,M,N,K", all_pairs(
    FUSED_FORMATS, VARIANT_DTYPES, [(1, 20, 96), (3, 17, 200), (18, 40, 70), (2, 32, 256)]),
    ids=str)
def test_fused_kernel_is_exact_on_exact_sums(fmt, variant, dtype, M, N, K):
    x, w = integer_operands(fmt, M, N, K, dtype)
    bias = torch.randint(-8, 9, (N,)).to(dtype).to(DEVICE)
    out = _fused(x, w, bias, VARIANTS[variant])
    assert out.dtype == dtype and out.shape == (M, N)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=0, atol=0)


@pytest.mark.parametrize("fmt,fast", [("float4_e2m1", 4), ("float8_e4m3", 1),
                                      ("float8_e5m2", 2)])
@pytest.mark.parametrize("variant,dtype", VARIANT_DTYPES)
def test_hardware_decodes_are_exact(monkeypatch, fmt, fast, variant, dtype):
    """The GPU's decode shortcuts (fp8 conversions, fp4 through fp16 bits), forced on here so
    that the interpreter runs them too (fp4 words, FAST 5: test_fp4_rows_read_whole_words)."""
    monkeypatch.setattr(km, "_fast_decode", lambda fmt, device, *variant_and_words: fast)
    x, w = integer_operands(fmt, 3, 20, 160, dtype)
    torch.testing.assert_close(_fused(x, w, None, VARIANTS[variant]), reference(x, w),
                               rtol=0, atol=0)


# Rows tiles of the fp4 word path: 4 rows per thread (16 rows over 4 warps; 8 rows over the 2
# warps left by 64 blocks), one row, two warps; with N = 32 and K = 256 the last two are whole
# tiles (EVEN), N = 20 / K = 200 are not.
FP4_WORD_TILES = [km.Config(km.ROWS, 16, 1, 32), km.Config(km.ROWS, 8, 1, 64),
                  km.Config(km.ROWS, 4, 2, 2), km.Config(km.ROWS, 8, 1, 4, num_warps=2)]


@pytest.mark.parametrize("config,block_size,dtype,M,N,K", pairs_when_interpreted(
    FP4_WORD_TILES, [32, 64], [torch.bfloat16, torch.float16], [(1, 20, 200), (2, 32, 256)]),
    ids=str)
def test_fp4_rows_read_whole_words(monkeypatch, config, block_size, dtype, M, N, K):
    """fp4 rows of whole 4-byte words are read as 32-bit words and decoded eight codes at a
    time (FAST 5: inline PTX on the GPU; under the interpreter, where it is forced on here, the
    same steps in Triton), laid out block-major (see matmul_kernels._block_major_codes)."""
    monkeypatch.setattr(km, "_fast_decode", lambda fmt, device, *variant_and_words: 5)
    x, w = integer_operands("float4_e2m1", M, N, K, dtype, block_size=block_size)
    assert km._read_words(w.elem_dtype, w._data, K, config.variant, 5)
    bias = torch.randint(-8, 9, (N,)).to(dtype).to(DEVICE)
    torch.testing.assert_close(_fused(x, w, bias, config), reference(x, w, bias), rtol=0,
                               atol=0)


@pytest.mark.parametrize("config", FP4_WORD_TILES)
def test_fp4_rows_words_special_scales(monkeypatch, config):
    """The fp4 word path: a NaN scale byte makes its row NaN, 2**127 overflows to Inf, 2**-127
    is exact; the other rows are untouched."""
    monkeypatch.setattr(km, "_fast_decode", lambda fmt, device, *variant_and_words: 5)
    x, w = integer_operands("float4_e2m1", 1, 16, 256, torch.bfloat16)
    x = x.abs() + 1
    scale, data = w._scale_e8m0.clone(), w._data.clone()
    scale[0, 5] = 255  # NaN
    scale[1, :] = 254  # 2**127 times codes of 1.0 (0x2) and positive x: the sum overflows
    data[1] = 0x22
    scale[2, :] = 0  # 2**-127
    w = w._replace(scale, data)
    out = _fused(x, w, None, config).float()
    assert out[0, 0].isnan() and out[0, 1] == float("inf")
    torch.testing.assert_close(out[:, 2:], reference(x, w).float()[:, 2:], rtol=0, atol=0)


@pytest.mark.parametrize("fmt,K,dtype,config,block_size", pairs_when_interpreted(
    FP6, [96, 256], [torch.bfloat16, torch.float16],
    [(VARIANTS["rows"], 32), (VARIANTS["rows_nb4"], 32), (km.Config(km.ROWS, 8, 1, 2), 64)]),
    ids=str)
def test_fp6_rows_read_whole_words(fmt, K, dtype, config, block_size):
    """fp6 rows of whole 4-byte words (K a multiple of 16) are read as 32-bit words, three per
    sixteen codes, codes straddling words included."""
    x, w = integer_operands(fmt, 1, 24, K, dtype, block_size=block_size)
    assert km._read_words(w.elem_dtype, w._data, K, config.variant, 0)
    bias = torch.randint(-8, 9, (24,)).to(dtype).to(DEVICE)
    torch.testing.assert_close(_fused(x, w, bias, config), reference(x, w, bias), rtol=0,
                               atol=0)


@pytest.mark.parametrize("fmt", FP6)
def test_fp6_takes_the_fused_kernel_only_as_whole_words(fmt):
    """The dispatch sends the fused kernel fp6 only for one row of whole words (more rows take
    mma_linear where it applies, else dequantize + cuBLAS, as do rows of other lengths); a
    config that would read fp6 otherwise is a ValueError naming it, before any launch."""
    for M, N, K, route in [(1, 24, 96, "fused"), (1, 24, 200, "dequantized"),
                           (3, 24, 96, "dequantized"), (64, 24, 256, "dequantized")]:
        x, w = integer_operands(fmt, M, N, K, torch.bfloat16)
        assert km._route(x, w._scale_e8m0, w._data, w.elem_dtype, 32, K)[0] == route, (M, K)
        torch.testing.assert_close(km.linear(x, w._scale_e8m0, w._data, w.elem_dtype, 32, K,
                                             None, x.dtype), reference(x, w), rtol=0, atol=0)
    x, w = integer_operands(fmt, 3, 24, 200, torch.bfloat16)
    for config in (VARIANTS["rows"], VARIANTS["block_dots"], VARIANTS["scaled_dots"]):
        with pytest.raises(ValueError, match="config: the fused kernel reads fp6 codes only"):
            _fused(x, w, None, config)


@pytest.mark.parametrize("fmt,variant", [(f, v) for f in FORMATS for v in VARIANTS
                                          if f not in FP6 or v.startswith("rows")])
@pytest.mark.parametrize("block_size", [32, 64])
def test_fused_kernel_random_within_fp32_accumulation(fmt, variant, block_size):
    torch.manual_seed(1)
    rows_k = 3 * block_size + (16 if fmt in FP6 else 10)  # fp6: whole words
    M, N, K = (1, 33, rows_k) if variant.startswith("rows") else (5, 33, 200)
    x = torch.randn(M, K, dtype=torch.bfloat16, device=DEVICE)
    w = MXTensor.to_mx(torch.randn(N, K, device=DEVICE) * 4, fmt, block_size)
    bias = torch.randn(N, dtype=torch.bfloat16, device=DEVICE)
    assert_within_fp32_accumulation(_fused(x, w, bias, VARIANTS[variant]), x, w, bias)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_kernel_special_values(variant):
    """A NaN scale byte makes its rows NaN; a NaN element code its row; Inf codes (e5m2)
    give Inf; extreme scales are exact."""
    M, N, K = 2, 6, 64
    x = torch.ones(M, K, dtype=torch.bfloat16, device=DEVICE)
    w = MXTensor.to_mx(torch.ones(N, K, device=DEVICE), "float8_e4m3", 32)
    scale, data = w._scale_e8m0.clone(), w._data.clone()
    scale[0, 1] = 255  # NaN scale
    data[1, 5] = 0x7F  # e4m3 NaN
    scale[2, :] = 254  # 2**127: the row's values are 2**127 each: the sum overflows to Inf
    scale[3, :] = 0  # 2**-127: exact in fp32 (subnormal), products tiny
    w = w._replace(scale, data)
    out = _fused(x, w, None, VARIANTS[variant]).float()
    assert out[:, 0].isnan().all() and out[:, 1].isnan().all()
    assert (out[:, 2] == float("inf")).all()
    ref = reference(x, w).float()
    torch.testing.assert_close(out[:, 3:], ref[:, 3:], rtol=0, atol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_kernel_empty_and_strided(variant):
    w = MXTensor.to_mx(torch.randn(8, 64, device=DEVICE), "float4_e2m1", 32)
    x = torch.randn(0, 64, dtype=torch.bfloat16, device=DEVICE)
    assert _fused(x, w, None, VARIANTS[variant]).shape == (0, 8)
    # x with a huge row stride and a non-unit column stride
    big = torch.randn(3, 2, 1000, dtype=torch.bfloat16, device=DEVICE)
    x = big[:, 0, 100:228:2]
    x_exact, w_exact = integer_operands("float4_e2m1", 3, 8, 64, torch.bfloat16)
    x = x.copy_(x_exact)
    torch.testing.assert_close(_fused(x, w_exact, None, VARIANTS[variant]),
                               reference(x_exact, w_exact), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", ["float6_e2m3", "float4_e2m1", "float8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 3, 70])
def test_dequantized_path(fmt, dtype, M):
    """The large-M (and fp6) path: bf16 dequantized weight, fp32 accumulation, one rounding;
    fp16 activations as two exact bf16 parts."""
    x, w = integer_operands(fmt, M, 24, 96, dtype)
    bias = torch.randint(-8, 9, (24,)).to(dtype).to(DEVICE)
    out = km.dequantized_linear(x, w._scale_e8m0, w._data, w.elem_dtype, 32, 96, bias, dtype)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=0, atol=0)
    torch.manual_seed(M)
    x = torch.randn(M, 96, dtype=dtype, device=DEVICE)
    out = km.dequantized_linear(x, w._scale_e8m0, w._data, w.elem_dtype, 32, 96, bias, dtype)
    assert_within_fp32_accumulation(out, x, w, bias)


def test_weights_past_32_bit_offsets_take_the_dequantize_path():
    meta = dict(device="meta", dtype=torch.uint8)
    x = torch.empty(1, 80000, device="meta", dtype=torch.bfloat16)
    small, huge = torch.empty(1000, 40000, **meta), torch.empty(60000, 40000, **meta)
    scale = torch.empty(60000, 2500, **meta)
    assert km._int32_offsets(x, small, scale[:1000], 1)
    assert not km._int32_offsets(x, huge, scale, 1)  # 2.4e9 bytes of fp4 codes


def test_supported_formats_and_block_sizes():
    for name in FORMATS:
        assert km.supported(dtypes.from_name(name), 32, torch.bfloat16)
        assert km.supported(dtypes.from_name(name), 32, torch.float16)
    assert not km.supported(dtypes.float4_e2m1, 16, torch.bfloat16)  # dot K of 8 codes
    assert not km.supported(dtypes.float4_e2m1, 48, torch.bfloat16)
    assert not km.supported(dtypes.float8_e4m3, 32, torch.float32)
    assert km.supported(dtypes.ExMy(1, 6), 32, torch.bfloat16)  # every ExMy fits bf16
    assert km.supported(dtypes.ExMy(4, 3, bias=20), 32, torch.bfloat16)
    assert not km.supported(dtypes.ExMy(5, 2), 32, torch.float16)  # 2**16 overflows fp16


# ---------------------------------------------------------------------------- dispatch

def _count_kernel_calls(monkeypatch):
    """The input shapes of the calls that ran the kernels: through dispatch.linear, (on CUDA,
    a call like an earlier one) through the product bound to the weight, or (on CUDA, under
    torch.compile) through the launches traced into the graph (dispatch.traced_linear)."""
    calls = []
    original, original_bound, original_traced = km.linear, weight_matmul.bound_call, km.traced_linear

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    def counting_bound(key, input, bias):
        out = original_bound(key, input, bias)
        if out is not None:
            calls.append(input.shape)
        return out

    def counting_traced(*args):
        out = original_traced(*args)
        if out is not None:
            calls.append(args[0].shape)
        return out

    monkeypatch.setattr(km, "linear", counting)
    monkeypatch.setattr(weight_matmul, "bound_call", counting_bound)
    monkeypatch.setattr(km, "traced_linear", counting_traced)
    return calls


@pytest.mark.parametrize("fmt", ["float4_e2m1", "float8_e4m3", "float6_e2m3"])
def test_dispatch_linear_matmul_mm_addmm(kernels_on_cpu, monkeypatch, fmt):
    calls = _count_kernel_calls(monkeypatch)
    x, w = integer_operands(fmt, 6, 24, 96, torch.bfloat16)
    bias = torch.randint(-3, 4, (24,)).to(torch.bfloat16).to(DEVICE)
    with_bias, without = reference(x, w, bias), reference(x, w)
    x3 = x.reshape(2, 3, 96)
    results = {
        "F.linear": (F.linear(x, w, bias), with_bias),
        "F.linear 3-d": (F.linear(x3, w, bias).reshape(6, 24), with_bias),
        "x @ w.t()": (torch.matmul(x3, w.t()).reshape(6, 24), without),
        "torch.mm": (torch.mm(x, w.t()), without),
        "torch.addmm": (torch.addmm(bias, x, w.t()), with_bias),
        "1-d x": (torch.stack([F.linear(row, w, bias) for row in x]), with_bias),
    }
    for name, (out, expected) in results.items():
        torch.testing.assert_close(out, expected, rtol=0, atol=0, msg=name)
    assert len(calls) == 5 + 6


def test_dispatch_mx_activations(kernels_on_cpu, monkeypatch):
    calls = _count_kernel_calls(monkeypatch)
    x, w = integer_operands("float8_e4m3", 4, 16, 64, torch.bfloat16)
    x_mx = MXTensor.to_mx(x, "float8_e4m3", 32)
    torch.testing.assert_close(F.linear(x_mx, w), reference(x, w), rtol=0, atol=0)
    assert len(calls) == 1


@pytest.mark.parametrize("case", ["fp32", "blocks along N", "block 16", "alpha", "2-d bias",
                                  "mx bias", "activations blocked along M"])
def test_dispatch_falls_back_to_the_exact_path(kernels_on_cpu, monkeypatch, case):
    calls = _count_kernel_calls(monkeypatch)
    reset_layout_warning()
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    x = torch.randn(4, 64, dtype=dtype, device=DEVICE)
    w_hp = torch.randn(32, 64, dtype=dtype, device=DEVICE)
    w = MXTensor.to_mx(w_hp, "float4_e2m1", 16 if case == "block 16" else 32,
                       block_dim=0 if case == "blocks along N" else -1)
    if case == "blocks along N":
        with pytest.warns(MXLayoutWarning):
            out = F.linear(x, w)
    elif case == "alpha":
        out = torch.addmm(torch.zeros(32, dtype=dtype, device=DEVICE), x, w.t(), alpha=2)
    elif case == "2-d bias":
        out = torch.addmm(torch.zeros(4, 32, dtype=dtype, device=DEVICE), x, w.t())
    elif case == "mx bias":
        bias = MXTensor.to_mx(torch.randn(32, dtype=dtype, device=DEVICE), "float8_e4m3", 32)
        out = F.linear(x, w, bias)
    elif case == "activations blocked along M":
        x_mx = MXTensor.to_mx(torch.randn(64, 64, dtype=dtype, device=DEVICE), "float8_e4m3",
                              32, block_dim=0)
        with pytest.warns(MXLayoutWarning):
            out = F.linear(x_mx, w)
    else:
        out = F.linear(x, w)
    assert out.dtype == dtype
    assert calls == []


def test_reference_backend_env_disables_the_kernels(kernels_on_cpu, monkeypatch):
    from torchmx.kernels.quantize import backends
    monkeypatch.setattr(backends, "FORCE_REFERENCE", True)  # TORCHMX_BACKEND=reference
    calls = _count_kernel_calls(monkeypatch)
    x, w = integer_operands("float4_e2m1", 2, 8, 64, torch.bfloat16)
    torch.testing.assert_close(F.linear(x, w), reference(x, w), rtol=0, atol=0)
    assert calls == []


def test_op_reference_implementation_matches_the_generic_path():
    """mx_weight_linear's own non-kernel implementation (any device without the kernels)."""
    torch.manual_seed(0)
    w = MXTensor.to_mx(torch.randn(24, 80), "float6_e3m2", 32)
    x = torch.randn(3, 80, dtype=torch.bfloat16)
    bias = torch.randn(24, dtype=torch.bfloat16)
    out = torch.ops.torchmx.mx_weight_linear(x, w._scale_e8m0, w._data, "float6_e3m2", 32, 80,
                                             bias, torch.bfloat16)
    torch.testing.assert_close(out, reference(x, w, bias), rtol=0, atol=0)


@pytest.mark.parametrize("case,error,named", [
    ("input width", ValueError, "in_features"), ("scale dtype", TypeError, "weight_scale"),
    ("data shape", ValueError, "data"), ("bias shape", ValueError, "bias"),
    ("format", ValueError, "float5"), ("block size", ValueError, "block_size")])
def test_op_bad_arguments_name_them(case, error, named):
    w = MXTensor.to_mx(torch.randn(24, 80), "float4_e2m1", 32)
    x = torch.randn(3, 80, dtype=torch.bfloat16)
    kwargs = dict(input=x, weight_scale=w._scale_e8m0, weight_data=w._data,
                  elem_dtype_name="float4_e2m1", block_size=32, in_features=80, bias=None,
                  out_dtype=torch.bfloat16)
    kwargs.update({
        "input width": dict(input=x[:, :64]),
        "scale dtype": dict(weight_scale=w._scale_e8m0.float()),
        "data shape": dict(weight_data=w._data[:, :30]),
        "bias shape": dict(bias=torch.zeros(23, dtype=torch.bfloat16)),
        "format": dict(elem_dtype_name="float5"),
        "block size": dict(block_size=0),
    }[case])
    with pytest.raises(error, match=named):
        torch.ops.torchmx.mx_weight_linear(**kwargs)


def test_compile_and_grad_through_the_kernels(kernels_on_cpu, monkeypatch):
    from torchmx.config import MXConfig, QLinearConfig
    from torchmx.quant_api import quantize_linear_
    calls = _count_kernel_calls(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    model = model.to(DEVICE, torch.bfloat16)
    quantize_linear_(model, QLinearConfig(MXConfig("float4_e2m1")))
    x = torch.randn(3, 64, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    eager = model(x)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    eager.sum().backward()  # the straight-through gradient of x still flows
    assert x.grad is not None and x.grad.shape == x.shape
    assert len(calls) >= 4


# ---------------------------------------------------------------------------- GPU only

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 2, 16, 64, 65, 300])
def test_gpu_both_paths_real_sizes(fmt, dtype, M):
    torch.manual_seed(M)
    N, K = 1536, 4096 + 96
    w = MXTensor.to_mx(torch.randn(N, K, device="cuda", dtype=dtype), fmt, 32)
    x = torch.randn(M, K, dtype=dtype, device="cuda")
    bias = torch.randn(N, dtype=dtype, device="cuda")
    assert_within_fp32_accumulation(F.linear(x, w, bias), x, w, bias)
    xi, wi = integer_operands(fmt, M, N, 1024, dtype)
    torch.testing.assert_close(F.linear(xi, wi), reference(xi, wi), rtol=0, atol=0)


@gpu
def test_gpu_cuda_graph_capture():
    w = MXTensor.to_mx(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16), "float4_e2m1",
                       32)
    x = torch.randn(1, 1024, dtype=torch.bfloat16, device="cuda")
    assert_graph_replay_matches_eager(lambda: F.linear(x, w))

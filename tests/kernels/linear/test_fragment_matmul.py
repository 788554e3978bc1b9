"""The fp4 wgmma layout of MXFP4 weights (kernels/layouts/fp4_wgmma_layout.py), its Hopper kernel
(kernels/linear/fp4_wgmma_matmul.py) and the op that dispatches to it (mx_ops/fragment_linear.py);
MXInferenceLinear.prepack() is tested in test_prepack.py.

On CPU the kernel runs under Triton's interpreter with the same bit program written in plain
Triton (`_decode_reference`); on an sm_90 GPU the inline-PTX decode and wgmma run, plus real
sizes. Exact checks use operands whose partial sums are exact in fp32 (any order gives the same
bits); random ones the fp32-accumulation bound.
"""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st

from torchmx import MXTensor, dtypes
from torchmx.kernels.layouts import fp4_wgmma_layout as fl
from torchmx.kernels.linear import fp4_wgmma_matmul as fm
from torchmx.mx_ops import fragment_linear as fop
from torchmx.mx_ops import weight_matmul
from torchmx.numerics import decode

from matmul_operands import DEVICE, assert_within_fp32_accumulation, integer_operands, reference
from ptx_emulator import run_ptx

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu  # the kernels run on the GPU where there is one
HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)
INTERPRETER = not CUDA


@pytest.fixture(autouse=True)
def kernels_on_cpu(monkeypatch):
    """Without a GPU, let the ops dispatch CPU tensors to the kernels too (Triton's
    interpreter); with one, CPU tensors keep the reference path."""
    if INTERPRETER:
        monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})


def needs_kernel():
    if CUDA and not HOPPER:
        pytest.skip("the fp4 wgmma kernel needs sm_90 (or the CPU interpreter)")


def parts(w):
    codes, scales = fl.preshuffle(w._scale_e8m0, w._data)
    counters = torch.zeros(w.shape[0] // 64, dtype=torch.int32, device=w.device)
    return codes, scales, counters, fl.fold_scales(w._scale_e8m0)


def run(x, w, bias=None, config=None):
    codes, scales, counters, fold = parts(w)
    out = fm.fp4_wgmma_linear(x, codes, scales, counters, w.shape[0], fold, bias, config)
    assert not counters.any(), "the split-K counters are left at zero"
    return out


# ---------------------------------------------------------------------------------- layout

def test_decode_program_places_every_code_as_value_times_2_pow_minus_126():
    """Golden: each pair's bf16x2 bits hold sign (15) and e1 e0 m (8..6) of its two codes."""
    codes = torch.stack([torch.roll(torch.arange(16), i)[:8] for i in range(16)])  # [16, 8]
    words = torch.zeros(16, dtype=torch.int64)
    for (j, half, bit), position in fl.STORED_BIT.items():
        words |= ((codes[:, 2 * j + half] >> bit) & 1) << position
    for j, pieces in enumerate(fl.PAIR_DECODE):
        pair = torch.zeros_like(words)
        for r, mask in pieces:
            pair |= (((words << r) | (words >> (32 - r))) & 0xFFFFFFFF if r else words) & mask
        for half in (0, 1):
            c = codes[:, 2 * j + half]
            expected = ((c & 8) << 12) | ((c & 7) << 6)
            assert torch.equal((pair >> (16 * half)) & 0xFFFF, expected)
    # bf16 bits ((c & 7) << 6) are the fp4 magnitude times 2**-126, e.g. 6.0 = 0b111:
    bits = torch.tensor([7 << 6], dtype=torch.int16).view(torch.bfloat16).double()
    assert bits.item() == 6.0 * 2.0 ** -126


def _run_ptx(program, word, multiplier):
    """The decode's inline PTX on the emulator: $8 the word, $9 the bf16x2 multiplier; the 8
    output halves $0..$7 as bf16."""
    regs = run_ptx(program, {"$8": word, "$9": multiplier})
    return [(regs[f"${i}"] & 0xFFFF).to(torch.int16).view(torch.bfloat16) for i in range(8)]


@triton.jit
def _multiplier_kernel(s_ptr, out_ptr, FOLD: tl.constexpr):
    i = tl.arange(0, 256)
    tl.store(out_ptr + i, fm._multiplier(tl.load(s_ptr + i), FOLD))


@pytest.mark.parametrize("fold", [True, False])
def test_the_inline_ptx_decode_gives_every_code_times_every_scale(fold):
    """The GPU's decode (PTX text and multiplier bits, not run by the interpreter) against
    value * 2**(s - 127) rounded once to bf16, for every code in every slot of a word and every
    scale byte its path takes (FOLD: s <= 128; else all, 255 being NaN)."""
    s = torch.arange(256, dtype=torch.int32, device=DEVICE)
    multiplier = torch.empty(256, dtype=torch.int32, device=DEVICE)
    _multiplier_kernel[(1,)](s, multiplier, FOLD=fold)
    s, multiplier = s.cpu().long(), multiplier.cpu().long() & 0xFFFFFFFF
    if fold:
        s, multiplier = s[:129], multiplier[:129]
    codes = torch.stack([torch.roll(torch.arange(16), i)[:8] for i in range(16)])  # [16, 8]
    words = torch.zeros(16, dtype=torch.int64)
    for (j, half, bit), position in fl.STORED_BIT.items():
        words |= ((codes[:, 2 * j + half] >> bit) & 1) << position
    program = fm.DECODE_FOLDED.value if fold else fm.DECODE_TWO_MULTIPLIES.value
    out = _run_ptx(program, words[:, None].expand(16, len(s)), multiplier[None, :].expand(16, -1))
    for slot in range(8):
        value = decode(codes[:, slot], dtypes.float4_e2m1).double()[:, None] \
            * torch.exp2(s[None, :] - 127.0)
        expected = value.to(torch.bfloat16)  # one rounding
        expected[:, s == 255] = float("nan")
        same = (out[slot].view(torch.int16) == expected.view(torch.int16))
        same |= out[slot].isnan() & expected.isnan()
        assert same.all(), f"slot {slot}: {int((~same).sum())} wrong (code, scale) pairs"


@settings(max_examples=25, deadline=None)
@given(nb=st.integers(1, 3), kb=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_preshuffle_round_trips(nb, kb, seed):
    g = torch.Generator().manual_seed(seed)
    N, K = 64 * nb, 64 * kb
    data = torch.randint(0, 256, (N, K // 2), generator=g).to(torch.uint8)
    scale = torch.randint(0, 256, (N, K // 32), generator=g).to(torch.uint8)
    codes, scales = fl.preshuffle(scale, data)
    assert codes.shape == (N * K // 2 + fl.PAD_CODE_BYTES,)
    assert scales.shape == (N * K // 32 + fl.PAD_SCALE_BYTES,)
    assert not codes[N * K // 2:].any() and not scales[N * K // 32:].any()
    s2, d2 = fl.unshuffle(codes, scales, N, K)
    assert torch.equal(s2, scale) and torch.equal(d2, data)


def test_a_lanes_sixteen_bytes_are_its_fragment():
    """Word q = 2 blk + a of lane 4 g + t in warp w holds row 16 w + 8 a + g from column
    32 blk + 2 t on: one code placed there lands in exactly that word."""
    N = K = 64
    data = torch.zeros(N, K // 2, dtype=torch.uint8)
    # warp 2, lane 5 (g = 1, t = 1), word 3 (blk = 1, a = 1): row 32 + 8 + 1, column 32 + 2
    data[41, 34 // 2] = 0x5  # code 5 at an even column: the low nibble
    codes, _ = fl.preshuffle(torch.zeros(N, K // 32, dtype=torch.uint8), data)
    chunk = codes[:N * K // 2].reshape(4, 32, 4, 4)  # warp, lane, word, byte
    assert {tuple(i[:3]) for i in chunk.nonzero().tolist()} == {(2, 5, 3)}


@pytest.mark.parametrize("fmt,block,N,K", [("float8_e4m3", 32, 64, 64), ("float4_e2m1", 64, 64, 64),
                                           ("float4_e2m1", 32, 96, 64), ("float4_e2m1", 32, 64, 32),
                                           ("float4_e2m1", 32, 0, 64)])
def test_fits_only_fp4_blocks_of_32_in_whole_chunks(fmt, block, N, K):
    assert not fl.fits(dtypes.from_name(fmt), block, N, K)
    assert fl.fits(dtypes.float4_e2m1, 32, 128, 192)


def test_unshuffle_rejects_parts_of_another_shape():
    codes, scales = fl.preshuffle(torch.zeros(64, 4, dtype=torch.uint8),
                                  torch.zeros(64, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="unshuffle"):
        fl.unshuffle(codes, scales, 64, 64)


def test_preshuffle_rejects_shapes_without_whole_chunks():
    with pytest.raises(ValueError, match="multiples of 64"):
        fl.preshuffle(torch.zeros(96, 2, dtype=torch.uint8), torch.zeros(96, 32, dtype=torch.uint8))


def test_preshuffle_in_passes_equals_one_pass(monkeypatch):
    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, 256, (320, 64), generator=g).to(torch.uint8)
    scale = torch.randint(0, 256, (320, 4), generator=g).to(torch.uint8)
    whole = fl.preshuffle(scale, data)
    monkeypatch.setattr(fl, "PRESHUFFLE_ROWS", 128)  # passes of 128, 128 and 64 rows
    for a, b in zip(whole, fl.preshuffle(scale, data)):
        assert torch.equal(a, b)


def test_fold_scales():
    assert fl.fold_scales(torch.tensor([[0, 128]], dtype=torch.uint8))
    assert not fl.fold_scales(torch.tensor([[0, 129]], dtype=torch.uint8))


# ---------------------------------------------------------------------------------- kernel

CONFIGS = {  # every code path: V, U, split (even, uneven, none), NONEMPTY, block_m, loads
    # one or two steps ahead, a register cap
    "v1u2s3": fm.Fp4WgmmaConfig(16, 1, 2, 3),
    "v1u2s3a1": fm.Fp4WgmmaConfig(16, 1, 2, 3, ahead=1),
    "v1u2s3a2": fm.Fp4WgmmaConfig(16, 1, 2, 3, ahead=2, maxnreg=96),
    "v2u1s2a2": fm.Fp4WgmmaConfig(32, 2, 1, 2, ahead=2),
    "v1u1s5a2": fm.Fp4WgmmaConfig(16, 1, 1, 5, ahead=2),
    "v2u1s2": fm.Fp4WgmmaConfig(32, 2, 1, 2),
    "v1u1s1": fm.Fp4WgmmaConfig(16, 1, 1, 1),
    "v2u2s4ne": fm.Fp4WgmmaConfig(64, 2, 2, 4, nonempty=True),
    "v1u4s2": fm.Fp4WgmmaConfig(16, 1, 4, 2),
    "v2u2s3w8": fm.Fp4WgmmaConfig(32, 2, 2, 3, num_warps=8),
    "default": None,
}


def _fitting(config, M, N, K):
    cfg = CONFIGS[config]
    return cfg is None or (M <= cfg.block_m and K % (64 * cfg.u) == 0 and N % (64 * cfg.v) == 0)


@pytest.mark.parametrize("config,M,N,K", [
    (config, *shape) for config in CONFIGS
    for shape in [(1, 128, 256), (5, 128, 640), (16, 256, 128), (33, 128, 384), (64, 128, 256)]
    if _fitting(config, *shape)])
def test_kernel_is_exact_on_exact_sums(config, M, N, K):
    needs_kernel()
    cfg = CONFIGS[config]
    x, w = integer_operands("float4_e2m1", M, N, K)
    bias = torch.randint(-8, 9, (N,)).to(torch.bfloat16).to(DEVICE)
    for b in (None, bias):
        out = run(x, w, b, cfg)
        assert out.dtype == torch.bfloat16 and out.shape == (M, N)
        torch.testing.assert_close(out, reference(x, w, b), rtol=0, atol=0)


@pytest.mark.parametrize("scale_bytes,x_scale", [((120, 129), 1), ((130, 136), 1),
                                                ((0, 3), 2.0 ** 40)],
                         ids=["fold", "two-multiply", "subnormal"])
def test_kernel_takes_every_scale(scale_bytes, x_scale):
    """Scales above 128 take the two-multiply decode; 0 is 2**-127 (a bf16 subnormal times the
    code; the activations keep the products normal in fp32). Small integer activations and
    scales within a few binades keep every sum exact in fp32, whatever the order."""
    needs_kernel()
    M, N, K = 4, 128, 256
    g = torch.Generator().manual_seed(7)
    data = torch.randint(0, 256, (N, K // 2), generator=g).to(torch.uint8)
    scale = torch.randint(*scale_bytes, (N, K // 32), generator=g).to(torch.uint8)
    w = MXTensor(scale.to(DEVICE), data.to(DEVICE), "float4_e2m1", 32, torch.bfloat16,
                 block_dim=1, shape=(N, K))
    x = (torch.randint(-4, 5, (M, K), generator=g) * x_scale).to(torch.bfloat16).to(DEVICE)
    assert fl.fold_scales(w._scale_e8m0) == (scale_bytes[1] <= 129)
    torch.testing.assert_close(run(x, w, None, fm.Fp4WgmmaConfig(16, 1, 2, 2)), reference(x, w),
                               rtol=0, atol=0)


def test_kernel_propagates_nan_scales():
    needs_kernel()
    x, w = integer_operands("float4_e2m1", 3, 64, 128)
    scale = w._scale_e8m0.clone()
    scale[5, 1] = 255
    w = MXTensor(scale, w._data, "float4_e2m1", 32, torch.bfloat16, block_dim=1, shape=(64, 128))
    out = run(x, w, None, fm.Fp4WgmmaConfig(16, 1, 1, 2))
    assert out[:, 5].isnan().all() and not out[:, [4, 6]].isnan().any()
    torch.testing.assert_close(out, reference(x, w), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("M", [2, 16, 40])
def test_kernel_is_within_fp32_accumulation_on_random_operands(M):
    needs_kernel()
    N, K = 128, 512
    g = torch.Generator().manual_seed(M)
    w = MXTensor.to_mx(torch.randn(N, K, generator=g).to(DEVICE), "float4_e2m1", 32)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).to(DEVICE)
    bias = torch.randn(N, generator=g).to(torch.bfloat16).to(DEVICE)
    assert_within_fp32_accumulation(run(x, w, bias), x, w, bias)


def test_config_rejects_impossible_launches():
    with pytest.raises(ValueError, match="block_m"):
        fm.Fp4WgmmaConfig(8, 1, 2, 1)
    with pytest.raises(ValueError, match="v must"):
        fm.Fp4WgmmaConfig(16, 3, 2, 1)
    with pytest.raises(ValueError, match="split"):
        fm.Fp4WgmmaConfig(16, 1, 2, 0)
    with pytest.raises(ValueError, match="ahead"):
        fm.Fp4WgmmaConfig(16, 1, 2, 1, ahead=3)
    for maxnreg in (0, 256, 96.0):
        with pytest.raises(ValueError, match="maxnreg"):
            fm.Fp4WgmmaConfig(16, 1, 2, 1, maxnreg=maxnreg)
    x, w = integer_operands("float4_e2m1", 17, 64, 128)
    with pytest.raises(ValueError, match="does not fit"):
        run(x, w, None, fm.Fp4WgmmaConfig(16, 1, 2, 1))


def test_default_config_fills_the_gpu():
    cpu = torch.device("cpu")
    small = fm.default_config(16, 8192, 8192, cpu)
    assert (small.block_m, small.v, small.u) == (16, 1, 2) and small.split >= 1
    assert fm.default_config(33, 8192, 8192, cpu).v == 2
    assert fm.default_config(33, 8192, 8192, cpu).num_warps == 8
    assert fm.default_config(33, 192, 8192, cpu).v == 1  # 192 rows: no 128-row tiles
    assert fm.default_config(8, 64, 64, cpu).u == 1 and fm.default_config(8, 64, 64, cpu).split == 1


# ---------------------------------------------------------------------------------- the op

def _op(x, w, p, bias=None):
    return torch.ops.torchmx.mx_fp4_fragment_linear(x, *p, w._scale_e8m0, w._data, w.shape[1],
                                                    bias, x.dtype)


@pytest.mark.parametrize("shape", [(1, 128), (2, 128), (3, 7, 128), (64, 128), (65, 128),
                                   (0, 128)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_op_equals_the_standard_path(shape, dtype):
    """Whatever it dispatches to, the op's result is F.linear on the MXTensor bit for bit (exact
    sums), with batch dims."""
    needs_kernel()
    N, K = 64, 128
    x, w = integer_operands("float4_e2m1", 1, N, K, dtype)
    x = torch.randint(-4, 5, shape).to(dtype).to(DEVICE)
    bias = torch.randint(-8, 9, (N,)).to(dtype).to(DEVICE)
    out = _op(x, w, parts(w), bias)
    assert out.shape == (*shape[:-1], N) and out.dtype == dtype
    torch.testing.assert_close(out, F.linear(x, w, bias), rtol=0, atol=0)


@pytest.mark.parametrize("rows", [1, 5])
def test_strided_activations_and_bias(rows):
    """Both the fragment op and the standard path (F.linear on the MXTensor) take strided x
    and bias: the kernels read copies with unit strides."""
    needs_kernel()
    N, K = 64, 128
    _, w = integer_operands("float4_e2m1", 1, N, K)
    big = torch.randint(-4, 5, (rows, 3, 2 * K)).to(torch.bfloat16).to(DEVICE)
    x = big[:, 1, ::2]  # row stride 6 K, column stride 2
    bias = torch.randint(-8, 9, (2 * N,)).to(torch.bfloat16).to(DEVICE)[::2]
    expected = reference(x, w, bias)
    torch.testing.assert_close(_op(x, w, parts(w), bias), expected, rtol=0, atol=0)
    torch.testing.assert_close(F.linear(x, w, bias), expected, rtol=0, atol=0)


def test_op_dispatch_by_rows_and_dtype():
    x = torch.zeros(16, 128, dtype=torch.bfloat16, device=DEVICE)
    on_kernel_device = not CUDA or HOPPER
    assert fop.uses_fragment_kernel(x, torch.bfloat16) == on_kernel_device
    assert fop.uses_fragment_kernel(x.view(2, 8, 128), torch.bfloat16) == on_kernel_device
    assert not fop.uses_fragment_kernel(x[:1], torch.bfloat16)  # one row: the one-row kernel
    assert not fop.uses_fragment_kernel(torch.zeros(65, 128, dtype=torch.bfloat16,
                                                    device=DEVICE), torch.bfloat16)
    assert not fop.uses_fragment_kernel(x.half(), torch.float16)


def test_op_checks_its_parts():
    x, w = integer_operands("float4_e2m1", 2, 64, 128)
    codes, scales, counters, fold = parts(w)
    with pytest.raises(ValueError, match="fragment_codes"):
        _op(x, w, (codes[:-1], scales, counters, fold))
    with pytest.raises(ValueError, match="fragment_counters"):
        _op(x, w, (codes, scales, counters.long(), fold))
    with pytest.raises(ValueError, match="mx_fp4_fragment_linear: input .* in_features=128"):
        _op(x[:, :96], w, (codes, scales, counters, fold))
    with pytest.raises(ValueError, match="bias must have shape"):
        _op(x, w, (codes, scales, counters, fold), torch.zeros(3, dtype=x.dtype, device=DEVICE))
    w96 = MXTensor.to_mx(torch.zeros(64, 96, device=DEVICE), "float4_e2m1", 32)
    with pytest.raises(ValueError, match="multiples of 64"):
        torch.ops.torchmx.mx_fp4_fragment_linear(x[:, :96], codes, scales, counters, fold,
                                                 w96._scale_e8m0, w96._data, 96, None, x.dtype)


# ---------------------------------------------------------------------------------- GPU sizes

@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("M", [2, 16, 32, 64])
def test_real_size_is_within_bound_and_deterministic(M):
    N = K = 8192
    w = MXTensor.to_mx(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "float4_e2m1", 32)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    p = parts(w)
    out = _op(x, w, p)
    assert_within_fp32_accumulation(out, x, w)
    for _ in range(3):
        assert torch.equal(_op(x, w, p), out)
    same = (out == F.linear(x, w)).float().mean().item()
    assert same > 0.99  # the rest differ only in fp32 accumulation order

"""kernels/linear/mx_gemm.py: MX x MX products through a GEMM that decodes the activation's codes.

On the CPU: the K order the kernels share, the exact fix-up kernel (under Triton's
interpreter, bit for bit), the policy and eligibility rules, the custom op's fallback, and
both Gluon kernels compiled for sm_90 (asynchronous wgmmas, no spills). On an sm_90 GPU: the
permuted dequantize bit for bit, the whole product against the exact one for every format
pair and ragged shapes, poisoned decodes through the fix-up, and the route from F.linear.
"""

import os

import pytest
import torch
import torch.nn.functional as F

from torchmx import MXTensor, dtypes
from torchmx.kernels.linear import mx_gemm
from torchmx.kernels.linear.mma_linear import FAST_SCALES

from matmul_operands import DEVICE, integer_operands

ON_GPU = DEVICE == "cuda" and mx_gemm.usable_on(torch.device("cuda"))
pytestmark = pytest.mark.gpu  # the kernels run on the GPU where there is one
needs_gluon = pytest.mark.skipif(not mx_gemm.available(), reason="this Triton has no Gluon")
on_gpu = pytest.mark.skipif(not ON_GPU, reason="needs an sm_90 GPU with Gluon")
FORMATS = mx_gemm.FORMATS
E4M3, E2M1 = dtypes.float8_e4m3, dtypes.float4_e2m1


def _parts(t):
    return t._data, t._scale_e8m0


def _exact(x_mx, w_mx):
    """The contract's result: exact fp32 operands, fp32 matmul, one rounding to bf16."""
    return (x_mx.dequantize(torch.float32) @ w_mx.dequantize(torch.float32).t()).to(
        torch.bfloat16)


# --- the K order ------------------------------------------------------------------------------

def test_permutation_gives_each_lane_its_wgmma_fragment():
    """Lane t's 16 contiguous codes of a step, 16 t .. 16 t + 15, must land on exactly the
    columns of its A fragment: 2 t, 2 t + 1, 2 t + 8, 2 t + 9 of each of the four k16 slices."""
    perm = mx_gemm.permutation(128)
    assert sorted(perm.tolist()) == list(range(128))
    place = torch.empty_like(perm)
    place[perm] = torch.arange(128)
    for step in (0, 64):
        for t in range(4):
            got = sorted(place[step + 16 * t: step + 16 * t + 16].tolist())
            want = sorted(step + 16 * q + c for q in range(4)
                          for c in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9))
            assert got == want
    assert perm[:16].tolist() == [0, 1, 16, 17, 32, 33, 48, 49, 2, 3, 18, 19, 34, 35, 50, 51]


def test_permutation_needs_whole_steps():
    with pytest.raises(ValueError, match="multiple of 64"):
        mx_gemm.permutation(96)


# --- the exact fix-up (Triton: runs under the interpreter) ------------------------------------

@pytest.mark.parametrize("x_fmt,w_fmt", [(E4M3, E2M1), (dtypes.int8, dtypes.float8_e5m2),
                                          (E2M1, E2M1), (dtypes.float8_e5m2, E4M3)],
                         ids=lambda f: f.name)
def test_fixup_recomputes_exactly_the_flagged_tiles(x_fmt, w_fmt):
    x, w = integer_operands(w_fmt, 70, 300, 128)
    x = MXTensor.to_mx(x, x_fmt, 32)
    w._scale_e8m0[260, 1] = 255  # NaN scale: column 260 NaN
    out = torch.full((70, 300), 7.0, dtype=torch.bfloat16, device=DEVICE)
    flags = mx_gemm.new_flags(70, 300, out.device)
    assert flags.shape == (4,)  # [ceil(70 / 64), ceil(300 / 256)]
    flags[1] = flags[2] = 1  # rows 0..63 x columns 256..299; rows 64..69 x columns 0..255
    mx_gemm.fixup(*_parts(x), x_fmt, *_parts(w), w_fmt, out, flags)
    exact = _exact(x, w)
    for got, want in ((out[:64, 256:], exact[:64, 256:]), (out[64:, :256], exact[64:, :256])):
        assert ((got == want) | (got.isnan() & want.isnan())).all()
    assert out[:64, 260].isnan().all() and not out[:64, 256:260].isnan().any()
    assert (out[:64, :256] == 7).all() and (out[64:, 256:] == 7).all()
    assert flags.tolist() == [0, 0, 0, 0]


def test_fixup_of_nothing_flagged_changes_nothing():
    x, w = integer_operands(E4M3, 64, 256, 64)
    x = MXTensor.to_mx(x, E4M3, 32)
    out = torch.full((64, 256), 3.0, dtype=torch.bfloat16, device=DEVICE)
    mx_gemm.fixup(*_parts(x), E4M3, *_parts(w), E4M3, out, mx_gemm.new_flags(64, 256, DEVICE))
    assert (out == 3).all()


# --- policy and eligibility -------------------------------------------------------------------

def test_first_wave_blocks_are_the_blocks_the_first_tiles_read():
    # tiles m fastest, one a CTA: 132 CTAs over 64 row tiles read blocks 0, 1 and 2
    assert mx_gemm.first_wave_blocks(8192, 8192, 132) == 3
    assert mx_gemm.first_wave_blocks(8192, 8192, 128) == 2
    assert mx_gemm.first_wave_blocks(2048, 4312, 132) == 9
    assert mx_gemm.first_wave_blocks(2048, 1024, 132) == 4  # every block: one wave holds all
    assert mx_gemm.first_wave_blocks(100, 300, 1) == 1


def test_preferred_follows_the_measured_shapes(monkeypatch):
    """benchmarks/bench_gpu_matmul.py --mx-gemm on an H100 (132 SMs): any pair of MXFP4, e4m3
    and e5m2, from 2048 rows with 90% of the SMs' tiles filled; never with MXINT8."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(mx_gemm, "sm_count", lambda device: 132)
    table = {(f.name, M, N): mx_gemm.preferred(f, f, M, N, cuda)
             for f in (E2M1, E4M3, dtypes.int8) for M in (1024, 2048, 8192)
             for N in (1024, 4096, 14336)}
    assert [k for k, v in table.items() if v] == [
        ("float4_e2m1", 2048, 4096), ("float4_e2m1", 2048, 14336),
        ("float4_e2m1", 8192, 1024), ("float4_e2m1", 8192, 4096),
        ("float4_e2m1", 8192, 14336), ("float8_e4m3", 2048, 4096),
        ("float8_e4m3", 2048, 14336), ("float8_e4m3", 8192, 1024),
        ("float8_e4m3", 8192, 4096), ("float8_e4m3", 8192, 14336)]
    pairs = [(x, w) for x in FORMATS for w in FORMATS
             if mx_gemm.preferred(x, w, 8192, 4096, cuda)]
    assert len(pairs) == 9 and all(dtypes.int8 not in pair for pair in pairs)
    assert mx_gemm.preferred(dtypes.float8_e5m2, E2M1, 2048, 4096, cuda)
    assert not mx_gemm.preferred(E4M3, dtypes.int8, 8192, 4096, cuda)


def _eligible(x_fmt=E4M3, w_fmt=E4M3, M=256, N=256, K=256, x_block=32, out=torch.bfloat16,
              x_parts=None, w_parts=None):
    x = MXTensor.to_mx(torch.randn(M, K), x_fmt, 32)
    w = MXTensor.to_mx(torch.randn(N, K), w_fmt, 32)
    x_data, x_scale = x_parts or _parts(x)
    return mx_gemm.eligible(x_data, x_scale, x_fmt, x_block, *(w_parts or _parts(w)), w_fmt, 32,
                            out)


def test_eligible_checks_formats_blocks_shapes_and_layout(monkeypatch):
    monkeypatch.setattr(mx_gemm, "usable_on", lambda device: True)
    assert all(_eligible(f, g) for f in FORMATS for g in FORMATS)
    assert not _eligible(dtypes.float6_e2m3)
    assert not _eligible(x_block=64)
    assert not _eligible(out=torch.float32)
    assert not _eligible(K=192)  # K a multiple of 128
    assert not _eligible(N=260)  # N a multiple of 8 (TMA stores rows of 16-byte multiples)
    x = MXTensor.to_mx(torch.randn(256, 512), E4M3, 32)
    assert not _eligible(K=256, x_parts=(x._data[:, ::2], x._scale_e8m0[:, ::2]))
    # rows that do not start on 16-byte (codes) or 4-byte (scale bytes) boundaries
    wide = MXTensor.to_mx(torch.randn(256, 384), E4M3, 32)
    assert _eligible(K=256, w_parts=(wide._data[:, :256], wide._scale_e8m0[:, :8]))
    assert not _eligible(K=256, w_parts=(wide._data[:, 8:264], wide._scale_e8m0[:, :8]))
    assert not _eligible(K=256, w_parts=(wide._data[:, :256], wide._scale_e8m0[:, 1:9]))
    assert not _eligible(K=256, x_parts=(wide._data[:, 8:264], wide._scale_e8m0[:, :8]))


def test_mx_gemm_names_its_bad_arguments():
    x = MXTensor.to_mx(torch.randn(256, 256, device=DEVICE), E4M3, 32)
    with pytest.raises(ValueError, match="blocks_before must be >= 0, got -1"):
        mx_gemm.mx_gemm(*_parts(x), E4M3, *_parts(x), E4M3, blocks_before=-1)
    with pytest.raises(ValueError, match="ctas must be >= 1, got 0"):
        mx_gemm.mx_gemm(*_parts(x), E4M3, *_parts(x), E4M3, ctas=0)
    with pytest.raises(ValueError, match="N of 8"):
        mx_gemm.mx_gemm(*_parts(x), E4M3, x._data[:100], x._scale_e8m0[:100], E4M3)


@pytest.mark.skipif(ON_GPU, reason="this machine has an sm_90 GPU with Gluon")
def test_nothing_is_eligible_without_an_sm90_gpu():
    assert not _eligible()


# --- the custom op: its fallback wherever the GEMM does not run -------------------------------

@pytest.mark.parametrize("x_fmt,w_fmt", [(E4M3, E4M3), (E2M1, dtypes.int8)], ids=lambda f: f.name)
def test_op_matches_the_dequantize_path(x_fmt, w_fmt):
    x, w = integer_operands(w_fmt, 6, 64, 128)
    x = MXTensor.to_mx(x, x_fmt, 32)
    out = torch.ops.torchmx.mx_mx_linear(x._scale_e8m0, x._data, w._scale_e8m0, w._data,
                                         x_fmt.name, w_fmt.name, 128)
    assert out.dtype == torch.bfloat16 and out.shape == (6, 64)
    assert torch.equal(out, _exact(x, w))


def test_op_checks_its_parts():
    x, w = integer_operands(E4M3, 6, 64, 128)
    x = MXTensor.to_mx(x, E4M3, 32)
    with pytest.raises(ValueError, match="mx_mx_linear"):
        torch.ops.torchmx.mx_mx_linear(x._scale_e8m0, x._data, w._scale_e8m0[:, :2], w._data,
                                       "float8_e4m3", "float8_e4m3", 128)


def test_op_passes_opcheck():
    x, w = integer_operands(E4M3, 4, 64, 128)
    x = MXTensor.to_mx(x, E4M3, 32)
    torch.library.opcheck(torch.ops.torchmx.mx_mx_linear,
                          (x._scale_e8m0, x._data, w._scale_e8m0, w._data, "float8_e4m3",
                           "float8_e4m3", 128))


# --- the Gluon kernels, compiled for sm_90 on any machine -------------------------------------

_COMPILED = ([("mx_gemm", f.name, f.name, 1000, 1000, 1024) for f in FORMATS]
             + [("mx_gemm", E4M3.name, E2M1.name, 1000, 1000, 1024),
                ("mx_gemm", E2M1.name, dtypes.int8.name, 1000, 1000, 1024)]
             + [("dequantize", f.name, 300, 1024) for f in (E4M3, E2M1)])


@pytest.fixture(scope="module")
def ptxas_reports():
    from gluon_compile import compile_reports
    return dict(zip(_COMPILED, compile_reports(_COMPILED)))


@needs_gluon
@pytest.mark.parametrize("case", _COMPILED, ids=str)
def test_compiles_for_sm90_with_async_wgmmas_and_no_spills(case, ptxas_reports):
    """ptxas says so in a warning when it serializes wgmmas (A registers still in flight being
    rewritten, too few registers): the GEMM would lose its overlap of decode and tensor cores."""
    report = ptxas_reports[case]
    assert ("mx_gemm_kernel" if case[0] == "mx_gemm" else "permuted_dequantize_kernel") in report
    assert "warning" not in report.lower(), report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report


# --- on an sm_90 GPU --------------------------------------------------------------------------

@on_gpu
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_permuted_weight_is_the_dequantized_weight_in_the_gemm_order(fmt):
    w = MXTensor.to_mx(torch.randn(300, 1024, device=DEVICE), fmt, 32)
    got = mx_gemm.permuted_weight(*_parts(w), fmt)
    want = w.dequantize(torch.bfloat16)[:, mx_gemm.permutation(1024).to(DEVICE)]
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def _within_fp32_bound(out, x_mx, w_mx):
    """out equals the exact product up to fp32 accumulation plus one bf16 rounding (any order of
    the fp32 sums); where the fp32 path overflows or gives NaN, the same Inf / NaN."""
    x, w = x_mx.dequantize(torch.float32).double(), w_mx.dequantize(torch.float32).double()
    fp32 = (x_mx.dequantize(torch.float32) @ w_mx.dequantize(torch.float32).t()).to(out.dtype)
    special = ~fp32.isfinite()
    if not (torch.equal(out.isnan(), fp32.isnan())
            and (out[fp32.isinf()] == fp32[fp32.isinf()]).all()):
        return False
    exact = x @ w.t()
    bound = (x.abs() @ w.abs().t()) * (x.shape[1] * 2.0 ** -24) + exact.abs() * 2.0 ** -8
    ok = (out.double() - exact).abs() <= bound + 1e-30
    return bool(ok[~special].all())


def _product_cases():
    """Every format pair at the aligned shape; at the ragged shapes (one specialization: M and N
    not multiples of 16), four pairs that give each format both sides: each pair is one more
    Gluon compile, seconds apiece. TORCHMX_TEST_FULL=1: every pair at every shape."""
    aligned, ragged = (1024, 1024, 1024), [(1000, 1096, 640), (130, 264, 128)]
    pairs = [(x, w) for x in FORMATS for w in FORMATS]
    if os.environ.get("TORCHMX_TEST_FULL") == "1":
        return [(x, w, *shape) for shape in [aligned, *ragged] for x, w in pairs]
    shifted = [(x, FORMATS[(i + 1) % len(FORMATS)]) for i, x in enumerate(FORMATS)]
    return ([(x, w, *aligned) for x, w in pairs]
            + [(x, w, *shape) for shape in ragged for x, w in shifted])


@on_gpu
@pytest.mark.parametrize("x_fmt,w_fmt,M,N,K", _product_cases(),
                         ids=lambda v: v.name if isinstance(v, dtypes.DType) else str(v))
def test_gemm_is_the_exact_product_up_to_fp32_sums(x_fmt, w_fmt, M, N, K):
    """By default these shapes' W is dequantized before the GEMM (one wave of tiles reads all
    of it); blocks_before=0 has the GEMM dequantize every block itself: the same bits."""
    g = torch.Generator(device=DEVICE).manual_seed(M + N)
    x = MXTensor.to_mx(torch.randn(M, K, device=DEVICE, generator=g), x_fmt, 32)
    w = MXTensor.to_mx(torch.randn(N, K, device=DEVICE, generator=g), w_fmt, 32)
    out = mx_gemm.mx_gemm(*_parts(x), x_fmt, *_parts(w), w_fmt)
    assert out.shape == (M, N) and not out.isnan().any()
    assert _within_fp32_bound(out, x, w)
    inside = mx_gemm.mx_gemm(*_parts(x), x_fmt, *_parts(w), w_fmt, blocks_before=0)
    assert torch.equal(out, inside)  # and deterministic


@on_gpu
@pytest.mark.parametrize("x_fmt,w_fmt", [(E4M3, E4M3), (E2M1, E2M1), (dtypes.float8_e5m2, E2M1),
                                          (dtypes.int8, dtypes.int8)], ids=lambda f: f.name)
@pytest.mark.parametrize("blocks_before,ctas", [(None, None), (0, None), (3, 7), (0, 1)])
def test_weight_dequantized_inside_the_gemm_gives_the_same_bits(x_fmt, w_fmt, blocks_before,
                                                                ctas):
    """2048 x 4312 outputs: 16 x 17 tiles, more than a wave, so by default the first wave's 9
    blocks of W are dequantized before the GEMM and the other 8 (the last one ragged) inside
    it, ahead of the tiles that read them; every split, and a GEMM of one CTA (its own
    dequantize warp writes every block its loader waits for), gives the bits of W
    dequantized first."""
    M, N, K = 2048, 4312, 384  # K: 6 steps, not a whole pass of the dequantize warp
    g = torch.Generator(device=DEVICE).manual_seed(7)
    x = MXTensor.to_mx(torch.randn(M, K, device=DEVICE, generator=g), x_fmt, 32)
    w = MXTensor.to_mx(torch.randn(N, K, device=DEVICE, generator=g), w_fmt, 32)
    first = mx_gemm.mx_gemm(*_parts(x), x_fmt, *_parts(w), w_fmt, blocks_before=17)
    assert _within_fp32_bound(first, x, w)
    out = mx_gemm.mx_gemm(*_parts(x), x_fmt, *_parts(w), w_fmt, blocks_before=blocks_before,
                          ctas=ctas)
    assert torch.equal(out, first)


@on_gpu
@pytest.mark.parametrize("x_fmt,w_fmt", [(E4M3, E4M3), (E2M1, dtypes.float8_e5m2),
                                          (dtypes.int8, E2M1)], ids=lambda f: f.name)
def test_integer_operands_give_the_exact_bits(x_fmt, w_fmt):
    x, w = integer_operands(w_fmt, 512, 512, 1024)
    x = MXTensor.to_mx(x, x_fmt, 32)
    for blocks_before in (None, 0):
        out = mx_gemm.mx_gemm(*_parts(x), x_fmt, *_parts(w), w_fmt, blocks_before=blocks_before)
        assert torch.equal(out, _exact(x, w))


@on_gpu
@pytest.mark.parametrize("x_fmt,w_fmt", [(E4M3, E4M3), (E2M1, dtypes.float8_e5m2),
                                          (dtypes.int8, E2M1)], ids=lambda f: f.name)
def test_poisoned_decodes_take_the_exact_fixup(x_fmt, w_fmt):
    """Scale bytes outside FAST_SCALES (bf16-subnormal and overflowing values), a NaN scale:
    the flagged tiles are recomputed exactly, NaN where the contract says NaN."""
    x, w = integer_operands(w_fmt, 1024, 512, 1024)
    x = MXTensor.to_mx(x, x_fmt, 32)
    low = FAST_SCALES[x_fmt][0]
    x._scale_e8m0[5, 3] = max(low - 3, 0)
    x._scale_e8m0[700, 10] = 190  # outside FAST_SCALES but for MXINT8; sums stay finite
    w._scale_e8m0[300, 7] = 1
    w._scale_e8m0[17, 0] = 255
    out = mx_gemm.mx_gemm(*_parts(x), x_fmt, *_parts(w), w_fmt, blocks_before=0)
    assert out[:, 17].isnan().all()
    # tiny and huge scales make the fp32 sums round: any order within the bound
    assert _within_fp32_bound(out, x, w)


@on_gpu
@pytest.mark.parametrize("x_fmt,codes", [(E4M3, (0x7F, 0xFF)),
                                         (dtypes.float8_e5m2, (0x7C, 0xFC, 0x7E, 0xFF))],
                         ids=["e4m3-nan", "e5m2-inf-nan"])
@pytest.mark.parametrize("ctas", [None, 1])
def test_nan_and_inf_codes_of_x_take_the_exact_fixup(x_fmt, codes, ctas):
    """The GEMM looks for x's NaN / Inf codes only in the tiles of the first 256 columns, and
    flags every tile of the 64 rows where it finds one: each row holding such a code (in
    any step, the last block of rows ragged) comes out exactly, in every column tile."""
    M, N, K = 1000, 696, 512  # 8 x 3 tiles; rows 960.. a ragged warpgroup
    g = torch.Generator(device=DEVICE).manual_seed(3)
    x = MXTensor.to_mx(torch.randn(M, K, device=DEVICE, generator=g), x_fmt, 32)
    w = MXTensor.to_mx(torch.randn(N, K, device=DEVICE, generator=g), E4M3, 32)
    w._data[:10, 0] = 0  # zeros where x's row 0 has its code: Inf x 0 is NaN
    places = [(0, 0), (70, 511), (300, 64), (999, 200)]  # (row, K column)
    for (row, col), code in zip(places, codes * 2):
        x._data.view(torch.uint8)[row, col] = code
    out = mx_gemm.mx_gemm(*_parts(x), x_fmt, *_parts(w), E4M3, ctas=ctas)
    rows = [row for row, _ in places]
    assert not out[rows].isfinite().any() and out[0, :10].isnan().all()
    assert out[[r for r in range(M) if r not in rows]].isfinite().all()
    assert _within_fp32_bound(out, x, w)


@on_gpu
@pytest.mark.parametrize("x_fmt,w_fmt", [(E2M1, E2M1), (E4M3, E2M1), (dtypes.float8_e5m2, E4M3)],
                         ids=lambda f: f.name)
def test_f_linear_routes_preferred_products_to_the_gemm(x_fmt, w_fmt):
    x, w = integer_operands(w_fmt, 4096, 1024, 1024)
    x = MXTensor.to_mx(x.reshape(2, 2048, 1024), x_fmt, 32)
    assert mx_gemm.preferred(x_fmt, w_fmt, 4096, 1024, x.device)
    out = F.linear(x, w)
    assert out.shape == (2, 2048, 1024)
    direct = mx_gemm.mx_gemm(x._data.reshape(4096, -1), x._scale_e8m0.reshape(4096, -1), x_fmt,
                             *_parts(w), w_fmt)
    assert torch.equal(out.reshape(4096, 1024), direct)
    assert torch.equal(out, _exact(x, w))  # integer operands: exact sums

"""The routed-pairs kernel (torchmx/kernels/linear/routed_gemv.py through dispatch.routed_linear):
each (token, expert) pair's row times its expert's weight, read from a 3-D MX tensor in
gpt-oss's layout, in one launch; with gpt-oss's gated activation in the epilogue.

On CPU it runs under Triton's interpreter (conftest sets it); on a CUDA machine the same tests
run the rows variant's fast decodes. Exact checks use operands whose every fp32 sum is exact, so
any accumulation order must give the reference's bits (as tests/kernels/linear/test_byte_gemv.py states it)."""

import pytest
import torch

from torchmx.huggingface import gpt_oss
from torchmx.kernels.linear import dispatch

from matmul_operands import DEVICE

pytestmark = pytest.mark.gpu  # the kernel runs on the GPU where there is one

pytest.importorskip("triton")


def _experts(E, N, K, seed=0, integer=True):
    """3-D MX weight [E, N, K] in gpt-oss's layout: integers in [-6, 6] quantized to MXFP4
    (values multiples of 1/2, |v| <= 6), or random normals."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randint(-6, 7, (E, N, K), generator=g).float() if integer
         else torch.randn(E, N, K, generator=g))
    blocks, scales = gpt_oss.pack_experts(w.to(DEVICE))
    return gpt_oss.experts_mx(blocks, scales, torch.float32)


def _routing(T, E, top_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)]).to(DEVICE)


def _reference_rows(x, w, experts, per_row, bias):
    """Row p: x[p // per_row] @ W[experts[p]].T + bias[experts[p]] in fp32, rounded once."""
    dense = w.dequantize(torch.float32)
    e = experts.reshape(-1)
    rows = x[torch.arange(e.numel(), device=x.device) // per_row].float()
    out = torch.einsum("pk,pnk->pn", rows.double(), dense[e].double()).float()
    if bias is not None:
        out = out + bias[e].float()
    return out.to(x.dtype)


def _routed(x, w, experts, per_row, bias, swiglu=None):
    return dispatch.routed_linear(x, experts, w._scale_e8m0, w._data, w.elem_dtype, w.block_size,
                                  bias, per_row, swiglu)


@pytest.mark.parametrize("dtype,T,top_k,E,N,K", [
    (torch.bfloat16, 1, 4, 6, 16, 64), (torch.float16, 3, 2, 5, 20, 96),
    (torch.bfloat16, 1, 3, 4, 5, 2112)], ids=str)
def test_exact_on_exact_sums(dtype, T, top_k, E, N, K):
    """Whole and partial row tiles (N % 8), one step of blocks and several, partial steps;
    several pairs of one expert."""
    w = _experts(E, N, K)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-4, 5, (T, K), generator=g).to(dtype).to(DEVICE)
    bias = torch.randint(-8, 9, (E, N), generator=g).to(dtype).to(DEVICE)
    experts = _routing(T, E, top_k)
    out = _routed(x, w, experts, top_k, bias)
    assert out.dtype == dtype and out.shape == (T * top_k, N)
    assert torch.equal(out, _reference_rows(x, w, experts, top_k, bias))
    # rows read by pair (per_row 1, the down projection's), no bias
    pairs = x.repeat_interleave(top_k, 0)
    assert torch.equal(_routed(pairs, w, experts, 1, None),
                       _reference_rows(pairs, w, experts, 1, None))


def test_one_byte_codes_and_special_scales():
    """MXFP8 e4m3 weights (rows variant's byte decode); a NaN scale byte makes its row NaN,
    the largest scale overflows to Inf, the smallest is exact."""
    from torchmx import MXTensor
    E, N, K = 3, 8, 64
    g = torch.Generator().manual_seed(2)
    dense = torch.randint(-6, 7, (E, N, K), generator=g).float().to(DEVICE)
    w = MXTensor.to_mx(dense, "float8_e4m3", 32, block_dim=2)
    scale = w._scale_e8m0.clone()
    scale[1, 0, 1] = 255
    scale[1, 2, :] = 254
    scale[1, 3, :] = 0
    w = w._replace(scale, w._data)
    x = torch.ones(2, K, dtype=torch.bfloat16, device=DEVICE)
    experts = torch.tensor([[1, 0], [2, 1]], device=DEVICE)
    out = _routed(x, w, experts, 2, None).float()
    ref = _reference_rows(x, w, experts, 2, None).float()
    assert out[0, 0].isnan() and out[3, 0].isnan() and out[0, 2].isinf()
    finite = ~ref.isnan()
    assert torch.equal(out[finite], ref[finite])


def _gate_reference(h, alpha, limit):
    """transformers' GptOssExperts._apply_gate, in h's dtype."""
    gate, up = h[..., ::2], h[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def test_gated_epilogue():
    """The SwiGLU epilogue equals transformers' gate on the rounded rows, but for the sigmoid's
    fp32 ulp: every output within one bf16 ulp, and nearly all equal."""
    T, top_k, E, N, K = 3, 2, 4, 16, 64
    w = _experts(E, N, K, integer=False)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, K, generator=g).to(torch.bfloat16).to(DEVICE)
    bias = torch.randn(E, N, generator=g).to(torch.bfloat16).to(DEVICE) * 4
    experts = _routing(T, E, top_k, seed=3)
    h = _routed(x, w, experts, top_k, bias)
    out = _routed(x, w, experts, top_k, bias, swiglu=(1.702, 7.0))
    expected = _gate_reference(h, 1.702, 7.0)
    assert out.shape == (T * top_k, N // 2) and out.dtype == torch.bfloat16
    ulp = torch.finfo(torch.bfloat16).eps * expected.float().abs().clamp(min=2 ** -126)
    assert ((out.float() - expected.float()).abs() <= ulp).all()
    assert (out == expected).float().mean() > 0.95
    assert (h.float().abs() > 7).any()  # the clamps are reached


def test_eligibility():
    w = _experts(2, 8, 64)
    x = torch.zeros(1, 64, dtype=torch.bfloat16, device=DEVICE)
    args = (w._scale_e8m0, w._data, w.elem_dtype, w.block_size)
    assert dispatch.routed_eligible(x, *args, 4)
    assert not dispatch.routed_eligible(x, *args, dispatch.ROUTED_MAX_PAIRS + 1)
    assert not dispatch.routed_eligible(x, *args, 0)
    assert not dispatch.routed_eligible(x.float(), *args, 4)


def test_gpt_oss_experts_routed_forward(monkeypatch):
    """MXGptOssExperts' forward through the routed kernel (on CPU under the interpreter, the
    kernels' devices widened) equals the operator's torch path (the routed experts' weights
    dequantized) up to the order of fp32 sums and the sigmoid's ulp, and transformers' per
    expert loop up to its bf16 sums."""
    from torchmx.mx_ops import weight_matmul

    class Config:
        num_local_experts, hidden_size, intermediate_size = 4, 32, 32
        swiglu_alpha, swiglu_limit = 1.702, 7.0

    torch.manual_seed(0)
    experts = gpt_oss.MXGptOssExperts(Config(), dtype=torch.bfloat16, device=DEVICE)
    for name, rows, k in (("gate_up_proj", 64, 32), ("down_proj", 32, 32)):
        blocks, scales = gpt_oss.pack_experts(torch.randn(4, rows, k, device=DEVICE))
        setattr(experts, f"{name}_blocks", blocks)
        setattr(experts, f"{name}_scales", scales)
    with torch.no_grad():
        experts.gate_up_proj_bias.normal_()
        experts.down_proj_bias.normal_()
    x = torch.randn(2, 32, device=DEVICE).to(torch.bfloat16)
    indices = _routing(2, 4, 2, seed=5)
    weights = torch.softmax(torch.randn(2, 2, device=DEVICE), -1).to(torch.bfloat16)
    with torch.no_grad():
        torch_path = experts._routed_forward(x, indices, weights, experts._codes("gate_up_proj"),
                                             experts._codes("down_proj"))
        loop = experts(x, indices, weights)
        monkeypatch.setattr(weight_matmul, "KERNEL_DEVICES", {"cuda", "cpu"})
        routed = experts(x, indices, weights)
    assert routed.shape == x.shape and routed.dtype == torch.bfloat16
    torch.testing.assert_close(routed, torch_path, rtol=2 ** -7, atol=2 ** -7)
    torch.testing.assert_close(routed, loop, rtol=2 ** -6, atol=2 ** -6 * loop.abs().max().item())


def test_operator_opcheck_and_errors():
    w = _experts(3, 8, 64)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 64, generator=g).to(torch.bfloat16).to(DEVICE)
    experts = torch.tensor([[0, 2], [1, 0]], device=DEVICE)
    bias = torch.randn(3, 8, generator=g).to(torch.bfloat16).to(DEVICE)
    op = torch.ops.torchmx.mx_routed_linear.default
    parts = (w._scale_e8m0, w._data, "float4_e2m1", 32)
    torch.library.opcheck(op, (x, experts, *parts, bias, 2, 1.702, 7.0))
    torch.library.opcheck(op, (x.repeat_interleave(2, 0), experts, *parts, None, 1, None, None))
    with pytest.raises(ValueError, match="swiglu_alpha and swiglu_limit"):
        op(x, experts, *parts, bias, 2, 1.702, None)
    with pytest.raises(ValueError, match="3-D weight parts"):
        op(x, experts, w._scale_e8m0[0], w._data[0], "float4_e2m1", 32, None, 2, None, None)


def test_operator_rejects_operands_it_would_read_past():
    w = _experts(3, 8, 64)
    x = torch.randn(2, 64).to(torch.bfloat16).to(DEVICE)
    experts = torch.tensor([[0, 2], [1, 0]], device=DEVICE)
    op = torch.ops.torchmx.mx_routed_linear.default
    parts = (w._scale_e8m0, w._data, "float4_e2m1", 32)
    with pytest.raises(TypeError, match="experts must hold integers"):
        op(x, experts.float(), *parts, None, 2, None, None)
    with pytest.raises(ValueError, match="input rows x per_row"):
        op(x, experts, *parts, None, 1, None, None)
    with pytest.raises(ValueError, match="per_row must be a positive int"):
        op(x[:0], experts[:0], *parts, None, 0, None, None)
    with pytest.raises(ValueError, match="64 columns, the weight 3 blocks"):
        op(x, experts, w._scale_e8m0.repeat(1, 1, 3)[:, :, :3], w._data, "float4_e2m1", 32,
           None, 2, None, None)
    with pytest.raises(ValueError, match=r"weight_data must hold uint8 codes \[E, N, 32\]"):
        op(x, experts, w._scale_e8m0, w._data[:, :, :16], "float4_e2m1", 32, None, 2, None, None)
    with pytest.raises(ValueError, match="disagree on experts and rows"):
        op(x, experts, w._scale_e8m0, w._data[:2], "float4_e2m1", 32, None, 2, None, None)
    with pytest.raises(ValueError, match=r"bias must be \[3, 8\]"):
        op(x, experts, *parts, torch.zeros(3, 4, dtype=x.dtype, device=DEVICE), 2, None, None)


@pytest.mark.parametrize("bad", [-1, 3, 1 << 40], ids=["negative", "E", "far"])
def test_expert_index_out_of_range_reads_nothing_outside_the_weight(bad):
    """On CPU a ValueError; where the kernel runs (a GPU), the pair's row is NaN and the other
    rows keep their bits (tests/kernels/test_gpu_memory_safety.py runs kernels under memcheck)."""
    w = _experts(3, 8, 64)
    x = torch.randint(-4, 5, (2, 64)).to(torch.bfloat16).to(DEVICE)
    good = torch.tensor([[0, 2], [1, 0]], device=DEVICE)
    experts = good.clone()
    experts[1, 0] = bad
    op = torch.ops.torchmx.mx_routed_linear.default
    parts = (w._scale_e8m0, w._data, "float4_e2m1", 32)
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match=r"experts must lie in \[0, 3\)"):
            op(x, experts, *parts, None, 2, None, None)
    out = _routed(x, w, experts, 2, None)
    assert torch.isnan(out[2]).all()
    keep = [0, 1, 3]
    assert torch.equal(out[keep], _routed(x, w, good, 2, None)[keep])

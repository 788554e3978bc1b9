"""On a CUDA GPU: gpt-oss MX experts (torchmx.huggingface.gpt_oss.MXGptOssExperts) on routed
decode tokens (1 and 16 tokens, top-4 of 8 experts), bf16, through the routed kernel (one launch
per projection) and through the per-expert F.linear path, against the fp32 products of the
dequantized experts rounded where the MX path rounds; the experts' memory stays the MX bytes."""

import pytest
import torch

pytest.importorskip("transformers")

from torchmx.huggingface import gpt_oss  # noqa: E402
from torchmx.mx_ops import routed_linear  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class _Config:
    num_local_experts, hidden_size, intermediate_size = 8, 512, 512
    swiglu_alpha, swiglu_limit = 1.702, 7.0


def reference(experts, x, indices, weights):
    """GptOssExperts' forward on the dequantized weights: fp32 products rounded to bf16 where
    the MX path rounds (each F.linear's output), the rest in bf16 as the model runs it."""
    out = torch.zeros_like(x)
    for e in torch.unique(indices).tolist():
        token_idx, pos = torch.where(indices == e)
        gate_up = experts.weight("gate_up_proj", torch.float32).dequantize()[e]
        down = experts.weight("down_proj", torch.float32).dequantize()[e]
        h = (x[token_idx].float() @ gate_up.T + experts.gate_up_proj_bias[e].float()).to(x.dtype)
        y = (experts._apply_gate(h).float() @ down.T
             + experts.down_proj_bias[e].float()).to(x.dtype)
        out.index_add_(0, token_idx, y * weights[token_idx, pos, None])
    return out


@pytest.mark.parametrize("path", ["routed", "per_expert"])
@pytest.mark.parametrize("tokens", [1, 16])
def test_mx_experts_on_routed_decode_tokens(tokens, path, monkeypatch):
    if path == "per_expert":
        monkeypatch.setattr(routed_linear, "usable", lambda *args: False)
    torch.manual_seed(tokens)
    experts = gpt_oss.MXGptOssExperts(_Config(), dtype=torch.bfloat16, device="cuda")
    for name, rows, k in (("gate_up_proj", 1024, 512), ("down_proj", 512, 512)):
        blocks, scales = gpt_oss.pack_experts(
            torch.randn(8, rows, k, device="cuda", dtype=torch.bfloat16) / 16)
        setattr(experts, f"{name}_blocks", blocks)
        setattr(experts, f"{name}_scales", scales)
    with torch.no_grad():
        experts.gate_up_proj_bias.normal_()
        experts.down_proj_bias.normal_()
    x = torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
    indices = torch.stack([torch.randperm(8, device="cuda")[:4] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, 4, device="cuda"), -1).to(torch.bfloat16)
    uses_routed = routed_linear.usable(x, experts.gate_up_proj_scales,
                                       experts._codes("gate_up_proj"), "float4_e2m1", 32,
                                       indices.numel())
    assert uses_routed == (path == "routed")
    with torch.no_grad():
        experts(x, indices, weights)  # first call: kernels compiled, plans made
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        out = experts(x, indices, weights)
    torch.cuda.synchronize()
    # Nothing of the experts' size stays behind (no dequantized copy cached): the output only.
    # Measured before the reference, whose cuBLAS matmuls allocate cuBLAS's workspaces (32 MiB
    # each on Hopper, kept for the process) through PyTorch's allocator.
    grown = torch.cuda.memory_allocated() - before
    assert grown <= out.numel() * out.element_size() + 4096, \
        f"{grown} bytes stayed allocated after the call"
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    expected = reference(experts, x, indices, weights)
    # The same roundings; fp32 sums in another order may move a bf16 result by an ulp.
    torch.testing.assert_close(out, expected, rtol=2 ** -6, atol=2 ** -6 * expected.abs().max().item())

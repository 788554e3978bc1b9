"""Decode latency of a Llama-style block stack (random weights): bf16 vs MXFP4 weights.

    python benchmarks/decode_llama.py [--layers 8] [--context 1024] [--batch 1]

Llama-3-8B's block shapes (hidden 4096, MLP 14336, 32 query / 8 key-value heads of 128, RMSNorm,
rotary embeddings, SwiGLU), `batch` sequences each decoding one new token attending to
`context` cached positions.
Both models run under torch.compile; one decode step is captured in a CUDA graph and the
median replay time is reported. The MX model is the bf16 one after
`torchmx.quantize_linear_` with MXFP4 weights (activations stay bf16): every projection runs
the fused MX-weight kernel. With batch 2..64 a third model has its layers prepacked
(`torchmx.nn.prepack_weights`: the TMA stream-layout kernel on Hopper with Gluon, else the
fp4 wgmma-layout one; its memory includes the
second copy of the weights); on Hopper it is timed again with the stream kernel launched
without programmatic dependent launch (stream_matmul.USE_PDL False).
"""

import argparse
import copy
import os
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torchmx  # noqa: E402
from torchmx.config import MXConfig, QLinearConfig  # noqa: E402
from torchmx.kernels.linear import stream_matmul  # noqa: E402
from torchmx.quant_api import model_bytes  # noqa: E402
from _timing import graph_time_us, interleaved_us, ratio_stats  # noqa: E402

HIDDEN, MLP, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128
# the prepacked model's rows: with the stream kernel's default launch (PDL) and without
PREPACKED, NO_PDL = "MXFP4 prepacked", "  without PDL"


def rms_norm(x, weight, eps=1e-5):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.gate_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.up_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.down_proj = nn.Linear(MLP, HIDDEN, bias=False)
        self.norm1 = nn.Parameter(torch.ones(HIDDEN))
        self.norm2 = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x, k_cache, v_cache, cos, sin):
        b = x.shape[0]
        h = rms_norm(x, self.norm1)
        q = rotate(self.q_proj(h).view(b, 1, HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
        k = rotate(self.k_proj(h).view(b, 1, KV_HEADS, HEAD_DIM).transpose(1, 2), cos, sin)
        v = self.v_proj(h).view(b, 1, KV_HEADS, HEAD_DIM).transpose(1, 2)
        keys = torch.cat((k_cache, k), dim=2)
        values = torch.cat((v_cache, v), dim=2)
        attn = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, 1, HIDDEN))
        h = rms_norm(x, self.norm2)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x, k_caches, v_caches, cos, sin):
        for block, k, v in zip(self.blocks, k_caches, v_caches):
            x = block(x, k, v, cos, sin)
        return x


def run(layers=8, context=1024, batch=1):
    torch.manual_seed(0)
    model = Stack(layers).to("cuda", torch.bfloat16).eval()
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    x = torch.randn(batch, 1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    caches = [[torch.randn(batch, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
               for _ in range(layers)] for _ in range(2)]
    angle = torch.rand(HEAD_DIM, device="cuda") * 6.28
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)

    mx_model = copy.deepcopy(model)
    torchmx.quantize_linear_(mx_model, QLinearConfig(MXConfig("float4_e2m1")))
    models = [("bf16", model), ("MXFP4 weights", mx_model)]
    if 2 <= batch <= 64:
        prepacked = copy.deepcopy(mx_model)
        torchmx.nn.prepack_weights(prepacked)
        models.append((PREPACKED, prepacked))
        if stream_matmul.usable_on(x.device):  # the stream kernel launched as usual too
            models.append((NO_PDL, prepacked))
    results, steps = {}, {}
    with torch.no_grad():
        reference = model(x, *caches, cos, sin)
        for name, m in models:
            compiled = torch.compile(m, dynamic=False)
            pdl = name != NO_PDL

            def step(compiled=compiled, pdl=pdl):
                stream_matmul.USE_PDL = pdl  # read by the stream op as the graph is captured
                try:
                    return compiled(x, *caches, cos, sin)
                finally:
                    stream_matmul.USE_PDL = True

            out = step()
            steps[name] = [step]
            results[name] = (graph_time_us(steps[name], repeats=50), model_bytes(m))
            if name != "bf16":
                cos_sim = F.cosine_similarity(out.float().flatten(), reference.float().flatten(), 0)
                print(f"  {name} output vs bf16: cosine {cos_sim.item():.4f}")
        if NO_PDL in steps:  # the pair again, interleaved: the difference is small
            pair = {name: steps[name] for name in (PREPACKED, NO_PDL)}
            times = interleaved_us(pair, rounds=15)
            ratio, low, high = ratio_stats(times, NO_PDL, PREPACKED)
            print(f"  interleaved: prepacked {statistics.median(times[PREPACKED]):.1f} "
                  f"us/step with PDL, {statistics.median(times[NO_PDL]):.1f} without "
                  f"({ratio:.3f}x [{low:.3f} - {high:.3f}] the time with PDL)")
    base = results["bf16"][0]
    print(f"\nDecode step, {layers} Llama-style blocks (hidden {HIDDEN}, MLP {MLP}), batch {batch}, "
          f"context {context}, torch.compile + CUDA graph ({torch.cuda.get_device_name()})")
    for name, (us, size) in results.items():
        print(f"  {name:15s} {us:8.1f} us/step   weights+buffers {size / 2**30:5.2f} GiB  "
              f"speedup vs bf16 {base / us:4.2f}x")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    run(args.layers, args.context, args.batch)

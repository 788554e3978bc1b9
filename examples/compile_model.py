"""torch.compile with MX layers: an inference model (packed weights) through inductor, and a
QAT training step (MXLinear) through AOTAutograd, both matching eager.

Run: python3 examples/compile_model.py   (about ten seconds on CPU: inductor compiles C++)
"""

import time

import torch
from torch import nn

from torchmx.config import MXConfig, QLinearConfig
from torchmx.quant_api import prepare_qat_, quantize_linear_

W4A8 = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))


def main() -> None:
    x = torch.randn(8, 256)

    model = mlp()
    quantize_linear_(model, W4A8)
    compiled = torch.compile(model, fullgraph=True)  # inductor
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(x)
        print(f"inductor compile + first call: {time.perf_counter() - start:.1f} s")
        print("compiled inference == eager:", torch.equal(out, model(x)))

    qat = mlp()
    prepare_qat_(qat, QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"),
                                    grad_config=MXConfig("float8_e5m2")))
    step = torch.compile(qat, backend="aot_eager", fullgraph=True)
    grads = []
    for module in (qat, step):  # eager, then compiled: forward and backward
        qat.zero_grad()
        module(x).square().mean().backward()
        grads.append([p.grad.clone() for p in qat.parameters()])
    print("compiled QAT step (MX forward and backward GEMMs) == eager, every gradient:",
          all(torch.equal(a, b) for a, b in zip(*grads)))

if __name__ == "__main__":
    main()

"""Quantization-aware training with MXLinear, then packing for inference.

A small MLP learns a synthetic classification task three ways: in bf16, with MX QAT (fp4
weights, fp8 activations) and with MX QAT that also quantizes the backward GEMMs (fp8 e5m2).
The QAT model is then packed (MXInferenceLinear) without changing its outputs.

Run: python3 examples/qat.py [--steps 300]   (a few seconds on CPU)
"""

import argparse

import torch
from torch import nn

from torchmx.config import MXConfig, QLinearConfig
from torchmx.quant_api import prepare_qat_, quantize_linear_

W4A8 = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))
W4A8_E5M2_GRADS = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"),
                                grad_config=MXConfig("float8_e5m2"))


def make_mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                         nn.Linear(128, 8))


def train(model: nn.Module, teacher: nn.Module, steps: int = 300) -> float:
    """Adam under bf16 autocast; returns the held-out cross-entropy."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x = torch.randn(256, 64, generator=data)
        with torch.no_grad():
            y = teacher(x).argmax(-1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return nn.functional.cross_entropy(model(x).float(), teacher(x).argmax(-1)).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="Adam steps per model (default 300)")
    steps = parser.parse_args().steps
    torch.set_num_threads(1)  # tiny matmuls
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8))
    print(f"bf16 baseline              held-out loss {train(make_mlp(1), teacher, steps):.4f}")
    for name, qconfig in [("MX QAT w4a8", W4A8), ("MX QAT w4a8, e5m2 grads", W4A8_E5M2_GRADS)]:
        model = make_mlp(1)
        prepare_qat_(model, qconfig, exclude=None)  # every Linear -> MXLinear, same parameters
        print(f"{name:<26} held-out loss {train(model, teacher, steps):.4f}")
    print(model)

    x = torch.randn(4, 64)
    with torch.no_grad():
        before = model(x)
    summary = quantize_linear_(model, W4A8, exclude=None)  # MXLinear -> MXInferenceLinear
    with torch.no_grad():
        same = torch.equal(model(x), before)
    print(summary)
    print("packed model gives the QAT model's outputs bit for bit:", same)


if __name__ == "__main__":
    main()

"""Save an MX model and load it into a freshly built one, bit for bit: torch.save of the
state_dict (loads with weights_only=True) and safetensors (uint8 tensors + metadata, checked).

Run: python3 examples/save_load.py   (a second on CPU)
"""

import pathlib
import tempfile

import torch
from torch import nn

from torchmx.config import MXConfig, QLinearConfig
from torchmx.quant_api import quantize_linear_
from torchmx.serialization import load_safetensors, save_safetensors

QCONFIG = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))


def build(device: str = "cpu") -> nn.Module:
    """The float model, then the same quantize call: how every MX model is rebuilt."""
    with torch.device(device):
        model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to(torch.bfloat16)
    quantize_linear_(model, QCONFIG)
    return model


def main() -> None:
    torch.manual_seed(0)
    model = build()
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
    folder = pathlib.Path(tempfile.mkdtemp())

    torch.save(model.state_dict(), folder / "model.pt")
    fresh = build()
    fresh.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    with torch.no_grad():
        print("torch.save -> torch.load(weights_only=True): same outputs:", torch.equal(fresh(x), expected))

    save_safetensors(model, folder / "model.safetensors", metadata={"recipe": "w4a8"})
    on_meta = build("meta")  # no memory for the float weights: the file's tensors are assigned
    metadata = load_safetensors(on_meta, folder / "model.safetensors")
    with torch.no_grad():
        print("safetensors into a meta-built model: same outputs:", torch.equal(on_meta(x), expected),
              "metadata:", metadata)
    for path in sorted(folder.iterdir()):
        print(f"{path.name}: {path.stat().st_size:,} bytes")

    wrong = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to(torch.bfloat16)
    quantize_linear_(wrong, QLinearConfig(MXConfig("float8_e4m3")))
    try:
        load_safetensors(wrong, folder / "model.safetensors")
    except ValueError as error:
        print("a model built with another format is refused:", str(error).splitlines()[1].strip())


if __name__ == "__main__":
    main()

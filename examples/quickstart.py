"""Quickstart: quantize a tensor to every MX format, look at the bits, measure the error.

Run: python3 examples/quickstart.py
"""

import torch

import torchmx  # noqa: F401  (registers torch.ops.torchmx.*)
from torchmx import dtypes


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    signal = reference.double().pow(2).sum()
    noise = (reference.double() - approximation.double()).pow(2).sum()
    return float(10 * torch.log10(signal / noise))


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 1024, dtype=torch.bfloat16)
    print(f"input: {tuple(x.shape)} {x.dtype}, blocks of 32 along the last dim\n")
    print(f"{'format':<12} {'bits/elem':>9} {'SQNR dB':>8}  first block's scale byte, first codes")
    for elem_dtype in dtypes.SUPPORTED_ELEM_DTYPES + (dtypes.ExMy(1, 2),):
        scale, data = torch.ops.torchmx.quantize_mx(x, elem_dtype.name, 32)
        x_hat = torch.ops.torchmx.dequantize_mx(data, scale, elem_dtype.name, 32, torch.bfloat16,
                                                block_dim_size=x.shape[-1])
        bits = 8 * (data.numel() + scale.numel()) / x.numel()
        codes = " ".join(f"{b:02x}" for b in data[0, :4].view(torch.uint8).tolist())
        print(f"{elem_dtype.name:<12} {bits:9.2f} {sqnr_db(x, x_hat):8.2f}  "
              f"scale={int(scale[0, 0])} (2^{int(scale[0, 0]) - 127}) bytes={codes}")


if __name__ == "__main__":
    main()

"""Quickstart: quantize to MX, look at the bits, dequantize, multiply, compare formats.

Run: python3 examples/quickstart.py   (a few seconds on CPU)
"""

import torch

from torchmx import MXTensor, dtypes
from torchmx.analysis import compare_formats, format_error_table


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 256, dtype=torch.bfloat16)
    w = torch.randn(64, 256, dtype=torch.bfloat16)

    # One E8M0 scale per block of 32 along the last dim, 4-bit codes packed two per byte.
    w_mx = MXTensor.to_mx(w, dtypes.float4_e2m1, block_size=32, scale_mode="rceil")
    print(w_mx)
    print("first block: scale byte", int(w_mx._scale_e8m0[0, 0]), "codes",
          " ".join(f"{b:02x}" for b in w_mx._data[0, :4].tolist()))

    # Dequantize exactly (one rounding to the requested dtype).
    w_hat = w_mx.dequantize(torch.float32)
    print(f"MXFP4 relative error: {float((w_hat - w.float()).norm() / w.float().norm()):.3f}")

    # Matmul with MX operands: the exact product of the dequantized operands, fp32 accumulation.
    x_mx = MXTensor.to_mx(x, "float8_e4m3", 32)
    y = torch.nn.functional.linear(x_mx, w_mx)
    print("y:", tuple(y.shape), y.dtype)

    # What each format costs this tensor.
    print()
    print(format_error_table(compare_formats(w, dtypes.SUPPORTED_ELEM_DTYPES + (dtypes.ExMy(1, 2),))))


if __name__ == "__main__":
    main()

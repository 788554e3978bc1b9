"""MXTensor basics: quantize, look inside, compute, train through, compile, save.

Run: python3 examples/mx_tensor_basics.py   (a few seconds on CPU)
"""

import io
import warnings

import torch
import torch.nn.functional as F

from torchmx import MXTensor, dtypes


def main() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 256, dtype=torch.bfloat16)

    # Quantize: blocks of 32 along the last dim (K), the layout MX matmul hardware multiplies.
    w_mx = MXTensor.to_mx(w, dtypes.float4_e2m1, 32)
    print(w_mx)
    print(f"storage: scale {tuple(w_mx._scale_e8m0.shape)} uint8, data {tuple(w_mx._data.shape)} "
          f"{w_mx._data.dtype} ({8 * (w_mx._data.numel() + w_mx._scale_e8m0.numel()) / w.numel():.2f} "
          "bits per element)")
    err = (w_mx.dequantize().float() - w.float()).norm() / w.float().norm()
    print(f"relative error of MXFP4: {err:.3f}")

    # Views keep MX storage; a slice that cuts a block dequantizes (plain tensor). Strides are
    # those of the same view of a plain tensor; .contiguous() compacts a strided slice.
    print("w_mx.t():", type(w_mx.t()).__name__, "| w_mx[:, 32:96]:", type(w_mx[:, 32:96]).__name__,
          "| w_mx[:, 3:10]:", type(w_mx[:, 3:10]).__name__)
    half = w_mx[:, 32:96]
    print("w_mx[:, 32:96] strides", half.stride(), "contiguous:", half.is_contiguous(),
          "-> .contiguous() data", tuple(half.contiguous()._data.shape))

    # Matmuls: exact dequantized operands, fp32 accumulation, the bias added in fp32, one
    # rounding to bf16 -- one custom op, torch.ops.torchmx.mx_matmul, in eager, compile, export.
    x = torch.randn(8, 256, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(64, dtype=torch.bfloat16)
    x_mx = MXTensor.to_mx(x, "float8_e4m3", 32)
    y = F.linear(x_mx, w_mx, bias)
    exact = (x_mx.dequantize(torch.float32) @ w_mx.dequantize(torch.float32).t()
             + bias.float()).bfloat16()
    print("linear == exact product + bias, rounded once:", torch.equal(y, exact))

    # Straight-through gradients flow back to the high-precision input. The backward multiplies
    # the gradient by w_mx along its N dim, which MX hardware could not: exact, but torchmx warns
    # once (MXLayoutWarning; torchmx.mx_tensor.strict_matmul() makes it an error).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y.float().pow(2).sum().backward()
    print("grad of x:", tuple(x.grad.shape), x.grad.dtype, "| warned:",
          [w.category.__name__ for w in caught])

    # torch.compile: one graph, same bits as eager.
    compiled = torch.compile(lambda a: F.linear(MXTensor.to_mx(a, "float8_e4m3"), w_mx, bias),
                             fullgraph=True, backend="aot_eager")
    print("compiled == eager:", torch.equal(compiled(x.detach()), y.detach()))

    # Save and load without executing code.
    buffer = io.BytesIO()
    torch.save({"w": w_mx}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["w"]
    print("loaded (weights_only=True):", torch.equal(loaded._data, w_mx._data))


if __name__ == "__main__":
    main()

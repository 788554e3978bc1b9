"""torchmx 0.1.0's README examples, run unchanged against this package.

Two typos fixed: `MXTensor.to_mx(y_mx, ...)` quantizes `y_hp` (y_mx did not exist yet), and the
comment's 4-D attention matmul `torch.matmul(Q, K.t)` is `torch.matmul(Q, K.transpose(-2, -1))`
(run below). The README quantizes the right-hand matrix along N, which MX hardware could not
multiply: the product is exact and MXLayoutWarning says so once.
"""

import pytest
import torch

from torchmx.mx_tensor import MXLayoutWarning, reset_layout_warning


def test_readme_usage_example():
    reset_layout_warning()
    with pytest.warns(MXLayoutWarning):
        # ---- torchmx 0.1.0 README, "Usage" (typo fixed: to_mx(y_hp, ...)) ----
        import torch
        from torchmx import MXTensor, dtypes

        # Create a high-precision tensor
        x_hp = torch.randn(128, 128, dtype=torch.bfloat16)

        # Quantize the tensor to MX format
        x_mx = MXTensor.to_mx(x_hp, elem_dtype=dtypes.float8_e4m3, block_size=32)

        # Dequantize the tensor back to high-precision
        x_hp_reconstructed = x_mx.to_dtype(torch.bfloat16)

        # Matmul 2 MXTensors
        y_hp = torch.randn(128, 128, dtype=torch.bfloat16)
        y_mx = MXTensor.to_mx(y_hp, elem_dtype=dtypes.float6_e3m2, block_size=32)

        # Notice the magic here. You can pass MXTensors into torch.matmul.
        # This even works for 4D Attention Matmuls torch.matmul(Q, K.t).
        # The output is a bf16 torch.Tensor
        out_bf16 = torch.matmul(x_mx, y_mx)
        # ---- end of the README example ----

    assert type(out_bf16) is torch.Tensor and out_bf16.dtype == torch.bfloat16
    assert out_bf16.shape == (128, 128)
    expected = (x_mx.dequantize(torch.float32) @ y_mx.dequantize(torch.float32)).bfloat16()
    assert torch.equal(out_bf16.view(torch.int16), expected.view(torch.int16))
    assert x_hp_reconstructed.dtype == torch.bfloat16
    assert (x_hp_reconstructed - x_hp).abs().max() <= x_hp.abs().max() / 8

    # The comment's attention matmul, K.t fixed to K.transpose(-2, -1)
    Q = MXTensor.to_mx(torch.randn(2, 4, 16, 64, dtype=torch.bfloat16), dtypes.float8_e4m3, 32)
    K = MXTensor.to_mx(torch.randn(2, 4, 16, 64, dtype=torch.bfloat16), dtypes.float8_e4m3, 32)
    scores = torch.matmul(Q, K.transpose(-2, -1))
    assert type(scores) is torch.Tensor and scores.shape == (2, 4, 16, 16)
    assert scores.dtype == torch.bfloat16


def test_readme_layers_example():
    pytest.importorskip("torchmx.config")
    pytest.importorskip("torchmx.quant_api")
    # ---- torchmx 0.1.0 README, "Quantizing Layers and Modules" ----
    from torch import nn
    from torchmx import MXTensor, dtypes  # noqa: F401
    from torchmx.config import QLinearConfig, MXConfig
    from torchmx.quant_api import quantize_linear_

    # Create a high-precision model
    model = nn.Sequential(
              nn.Linear(128, 256),
              nn.ReLU(),
              nn.Linear(256, 64),
              nn.ReLU()
            ).to(torch.bfloat16)

    # Define the quantization configuration
    qconfig = QLinearConfig(
        weights_config=MXConfig(elem_dtype_name="float6_e3m2", block_size=32),
        activations_config=MXConfig(elem_dtype_name="float8_e4m3", block_size=32),
    )

    # Quantize the model to MXFormat. Note this quantizes the model in place
    quantize_linear_(model=model, qconfig=qconfig)


    # Perform inference using the quantized model
    x_hp = torch.randn(16, 128, dtype=torch.bfloat16)
    y_mx = model(x_hp)
    # ---- end of the README example ----
    assert y_mx.shape == (16, 64) and y_mx.dtype == torch.bfloat16

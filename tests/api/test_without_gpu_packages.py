"""A CPU user's machine has neither Triton nor torchao: `import torchmx`, the README's example
and every layer's CPU path must work there (README command 1 runs on such a machine). They
work without transformers too (only torchmx.huggingface and TorchMXConfig need it)."""

import subprocess
import sys
import textwrap

_BLOCK = """
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("triton", "torchao", "transformers"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, _Missing())
"""

_PROGRAM = """
import torch
import torch.nn.functional as F
import torchmx
from torchmx import MXTensor, dtypes
from torchmx.config import MXConfig, QLinearConfig

# README's example
x = torch.randn(128, 256, dtype=torch.bfloat16)
w = torch.randn(64, 256, dtype=torch.bfloat16)
w_mx = MXTensor.to_mx(w, dtypes.float4_e2m1, block_size=32, scale_mode="rceil")
y = F.linear(MXTensor.to_mx(x, "float8_e4m3"), w_mx)
w_hat = w_mx.dequantize()
assert y.shape == (128, 64) and w_hat.shape == (64, 256)

# the layers, prepacked and not, and the model API
for fmt in ("float4_e2m1", "float8_e4m3", "float6_e2m3", "int8"):
    layer = torch.nn.Linear(256, 64)
    packed = torchmx.MXInferenceLinear.from_float(layer, QLinearConfig(MXConfig(fmt), None))
    expected = packed(x[:8].float())
    assert torch.equal(packed.prepack()(x[:8].float()), expected), fmt
model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
torchmx.quantize_linear_(model, QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3")))
assert model(x.float()).shape == (128, 8)
assert torchmx.ops.backend_for(torch.device("cpu")) in ("cpu", "reference")
from torchmx import compressed_tensors  # state-dict conversions need no transformers
weight_only = torch.nn.Sequential(torch.nn.Linear(64, 8))
torchmx.quantize_linear_(weight_only, "mxfp4")
assert compressed_tensors.from_torchmx(weight_only.state_dict())[1]["format"] == "mxfp4-pack-quantized"
try:
    torchmx.TorchMXConfig
except ImportError as error:
    assert "needs transformers" in str(error), error
else:
    raise AssertionError("TorchMXConfig without transformers")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "torchao", "transformers"))
assert not loaded, loaded
print("ok")
"""


def test_torchmx_works_without_triton_and_torchao():
    program = _BLOCK + textwrap.dedent(_PROGRAM)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")

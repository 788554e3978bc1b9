"""torchmx: OCP Microscaling (MX) formats for PyTorch.

`from torchmx import MXTensor, dtypes` gives the tensor subclass and the element formats;
importing torchmx registers the custom ops `torch.ops.torchmx.quantize_mx` and
`torch.ops.torchmx.dequantize_mx` and MXTensor's op table (aten_ops).
"""

from . import dtypes, numerics, ops
from . import mx_tensor, aten_ops  # mx_tensor first: it imports the op table at its end
from .mx_tensor import MXTensor

__version__ = "0.2.0"

__all__ = ["MXTensor", "dtypes", "numerics", "ops", "__version__"]

# Layers and the model API (torchmx.nn, torchmx.quant_api) and their configs.
from .config import MXConfig, QAttentionConfig, QLinearConfig, QLinearGradConfig  # noqa: E402
from .nn import MXInferenceLinear, MXLinear  # noqa: E402
from .quant_api import prepare_qat_, quantize_linear_, quantize_llm_  # noqa: E402
# Every torchmx operator exists once torchmx is imported (a saved torch.export program that
# calls one loads in a fresh process): the routed-experts operator too.
from .mx_ops import routed_linear as _routed_linear  # noqa: E402,F401
# The MX linear whose kernel launches torch.compile makes itself, where CUDA and Triton are
# (defined last: it imports the kernel modules, which import the rest of torchmx).
from .mx_ops import weight_matmul_compiled as _weight_matmul_compiled  # noqa: E402
_weight_matmul_compiled.define_where_usable()

__all__ += ["MXConfig", "QLinearConfig", "QLinearGradConfig", "QAttentionConfig", "MXLinear",
            "MXInferenceLinear", "quantize_linear_", "prepare_qat_", "quantize_llm_"]


def __getattr__(name):
    # transformers is optional and slow to import: TorchMXConfig (which registers torchmx's
    # quantizer with transformers) is imported when it is asked for.
    if name == "TorchMXConfig":
        try:
            from .huggingface import TorchMXConfig
        except ImportError as error:
            if error.name not in (None, "transformers"):
                raise
            raise ImportError("torchmx.TorchMXConfig needs transformers: pip install "
                              f"'torchmx[demo]' (or transformers) ({error})") from error
        return TorchMXConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

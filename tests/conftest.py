import os
import sys

import torch

# Tests import their shared helpers (e.g. the independent oracle) as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))

# Without a GPU, the Triton kernels are tested under Triton's interpreter. Triton fixes the mode
# when it is first imported, so it is set here, before any test module (or torch) imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _fix_interpreter_scalar_index():
    """Triton 3.6's interpreter holds scalars as 1-element arrays and converts them with
    int(array), which NumPy >= 2.4 rejects: a loop over a runtime bound (`range(n)`) fails
    there. Convert through .item() instead (what NumPy < 2.4 did)."""
    try:
        from triton.runtime import interpreter
    except Exception:
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    _fix_interpreter_scalar_index()

import os
import sys

import torch

# Tests import their shared helpers in tests/support (e.g. the independent oracle) as top-level modules.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))

# pytest-xdist runs one worker a CPU (pyproject.toml's addopts): one thread each, not one a CPU
# each (threads fighting over the cores).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))

# Without a GPU, the Triton kernels are tested under Triton's interpreter. Triton fixes the mode
# when it is first imported, so it is set here, before any test module (or torch) imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    try:
        import triton.runtime.interpreter  # noqa: F401
    except Exception:  # no Triton: the kernels' tests skip
        pass
    else:
        import triton_interpreter
        triton_interpreter.fix_scalar_index()
        triton_interpreter.fix_slow_generic_reduce()
        triton_interpreter.patch_language_once_per_launch()

"""On a CUDA GPU with NVIDIA's compute-sanitizer: the sweep of tests/support/gpu_memory_safety_sweep.py
(every CUDA kernel path fed crafted code and scale bytes, results checked) runs under memcheck
with PyTorch's caching allocator off, and must finish with no report; then its canary, a
deliberate far out-of-bounds read, must be reported, so the clean sweep was watched."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from repo import ROOT, SUPPORT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SWEEP = SUPPORT / "gpu_memory_safety_sweep.py"


def _sanitizer():
    found = shutil.which("compute-sanitizer")
    if found is None:
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        candidate = pathlib.Path(cuda_home, "bin", "compute-sanitizer")
        found = str(candidate) if candidate.exists() else None
    return found


def test_cuda_kernels_under_compute_sanitizer_memcheck():
    sanitizer = _sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not installed (it comes with the CUDA toolkit)")
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                      env.get("PYTHONPATH")]))
    run = subprocess.run(
        [sanitizer, "--tool", "memcheck", "--error-exitcode", "3", "--print-limit", "20",
         sys.executable, str(SWEEP)],
        env=env, capture_output=True, text=True, timeout=1800)
    out = run.stdout + run.stderr
    if "Device not supported" in out or "Error: Target application terminated before first" in out:
        pytest.skip("compute-sanitizer cannot attach to this GPU here: " + out[-300:])
    assert "sweep done" in out, out[-4000:]
    sweep, _, after = out.partition("sweep done")
    reports = [line for line in sweep.splitlines()
               if line.startswith("=========") and "COMPUTE-SANITIZER" not in line]
    assert not reports, "\n".join(reports[:40])
    assert "========= Invalid __global__ read" in after, (
        "the canary's out-of-bounds read was not reported: the sanitizer did not watch\n" + out[-4000:])
    assert run.returncode != 0, out[-4000:]

"""Memory safety of the C kernels as a standing test: tests/support/memory_safety_sweep.py runs in a
child process with torchmx/csrc/mx_cpu.c built with -fsanitize=address,undefined (loaded into
Python through ctypes, so the sanitizer runtimes are preloaded) and fails on any report.

The sweep is short by default (CI); TORCHMX_SANITIZER_EXAMPLES=2000 runs a longer one. The test
skips only when the C compiler cannot build and run sanitized code (the reason says why);
TORCHMX_REQUIRE_SANITIZERS=1 turns that skip into a failure.
"""

import os
import shutil
import subprocess
import sys

import pytest

from repo import ROOT, SUPPORT
# -O1 after the kernels' own -O3: sanitized builds compile twice as fast, and check as much.
SANITIZE = ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-g"]


def _compiler():
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _runtime(compiler, name):
    """Path of the compiler's shared sanitizer runtime `name` (e.g. libasan.so), or None."""
    found = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True)
    path = found.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def _sanitizer_setup(tmp_path):
    """(LD_PRELOAD value, None) when sanitized shared code builds here, else (None, reason)."""
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler (set CC)"
    if sys.platform != "linux":
        return None, f"the sanitizer runtimes are preloaded with LD_PRELOAD: Linux only, not {sys.platform}"
    runtimes = [_runtime(compiler, name) for name in ("libasan.so", "libubsan.so")]
    if None in runtimes:
        return None, f"{compiler} has no shared libasan/libubsan runtime"
    probe = tmp_path / "probe.c"
    probe.write_text("int probe(int x) { return x + 1; }\n")
    built = subprocess.run([compiler, *SANITIZE, "-shared", "-fPIC", str(probe), "-o",
                            str(tmp_path / "probe.so")], capture_output=True, text=True)
    if built.returncode:
        return None, f"{compiler} cannot build with {' '.join(SANITIZE)}: {built.stderr[-500:]}"
    return ":".join(runtimes), None


def test_c_kernels_under_address_and_undefined_behavior_sanitizers(tmp_path):
    preload, reason = _sanitizer_setup(tmp_path)
    if reason is not None:
        if os.environ.get("TORCHMX_REQUIRE_SANITIZERS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    env = dict(os.environ, LD_PRELOAD=preload, TORCHMX_CPU_CFLAGS=" ".join(SANITIZE),
               TORCHMX_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
               # Python keeps its interned objects to exit: no leak report.
               ASAN_OPTIONS="detect_leaks=0:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in ("TORCHMX_BACKEND", "TORCHMX_CPU_BACKEND"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, str(SUPPORT / "memory_safety_sweep.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    log = run.stdout[-3000:] + run.stderr[-6000:]
    sweep, _, canary = run.stderr.partition("AddressSanitizer")
    assert "sweep passed" in run.stdout, log
    # The canary's deliberate out-of-bounds read: the sanitizer was watching the sweep.
    assert "canary not reported" not in run.stdout and run.returncode != 0, log
    # Symbolized frames name mx_cpu.c, raw ones the mx_cpu_<digest>.so: either way, the kernel.
    assert "heap-buffer-overflow" in canary and "mx_cpu" in canary, log
    assert "runtime error" not in sweep, log

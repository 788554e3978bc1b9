"""The C kernels' cache file is keyed by the CPU too (-march=native code is CPU specific), so a
cache folder shared by different CPUs never gives one a library built for another."""

import pathlib
import platform

import pytest

from torchmx import cpu_kernels

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz
flags\t\t: fpu sse sse2 avx avx2 avx512f
bogomips\t: 5000.00

processor\t: 1
model name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz
flags\t\t: fpu sse sse2 avx avx2 avx512f
"""


def cpuinfo(tmp_path, text, name="cpuinfo"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_description_is_the_first_processors_model_and_flags(tmp_path):
    assert cpu_kernels._cpu_description(cpuinfo(tmp_path, XEON)) == (
        "model name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz\n"
        "flags\t\t: fpu sse sse2 avx avx2 avx512f")
    arm = ("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"
           "CPU part\t: 0xd40\n")
    assert cpu_kernels._cpu_description(cpuinfo(tmp_path, arm)) == (
        "Features\t: fp asimd sve\nCPU implementer\t: 0x41\nCPU part\t: 0xd40")


def test_description_falls_back_on_platform(tmp_path):
    expected = f"{platform.machine()} {platform.processor()}"
    assert cpu_kernels._cpu_description(str(tmp_path / "missing")) == expected
    assert cpu_kernels._cpu_description(cpuinfo(tmp_path, "processor\t: 0\n")) == expected


def test_different_cpus_get_different_cache_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMX_CACHE_DIR", str(tmp_path))
    older = XEON.replace(" avx512f", "").replace("Gold 6248", "E5-2680 v3")
    paths = {cpu_kernels._library_path(cpu_kernels._cpu_description(cpuinfo(tmp_path, text, name)))
             for text, name in [(XEON, "a"), (older, "b"), (XEON.replace(" avx512f", ""), "c")]}
    assert len(paths) == 3
    assert all(p.parent == pathlib.Path(tmp_path) and p.name.startswith("mx_cpu_") and p.suffix == ".so"
               for p in paths)
    same = cpu_kernels._library_path(cpu_kernels._cpu_description(cpuinfo(tmp_path, XEON, "d")))
    assert same in paths  # the same CPU finds its library again


def test_the_library_is_loaded_from_this_cpus_cache_file():
    if not cpu_kernels.available():
        pytest.skip("no C compiler here: the CPU kernels are not built")
    assert cpu_kernels._library_path(cpu_kernels._cpu_description()).is_file()

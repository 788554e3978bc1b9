import collections
import os
import random
import re
import sys
import time
import zlib

import numpy
import pytest
import torch

# Cache compiled modules (torchmx's, and the test modules pytest rewrites for its asserts) even
# where PYTHONDONTWRITEBYTECODE is set, as on the CI machine: without the cache every xdist worker
# and every subprocess a test starts compiles them again from source (seconds each). The cache
# goes to __pycache__ folders, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Tests import their shared helpers in tests/support (e.g. the independent oracle) as top-level modules.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))

# pytest-xdist runs one worker a CPU (pyproject.toml's addopts): one thread each, not one a CPU
# each (threads fighting over the cores).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _threads = max(1, (os.cpu_count() or 1) // _workers)
    torch.set_num_threads(_threads)
    # The processes tests start (the examples, fresh interpreters, distributed ranks) too: with
    # torch's default of one thread a CPU, their threads spin-wait against the other workers
    # (an op can take a hundred times longer).
    os.environ["OMP_NUM_THREADS"] = str(_threads)

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


# --- One seed per test -------------------------------------------------------------------------
# pytest-xdist hands each worker a varying set of files, in varying order: a test drawing from the
# global generators would see inputs that depend on what ran before it on its worker. Each test
# (and each module, for its module-scoped fixtures) starts from a seed derived from its node id.

def _seed_global_generators(node_id: str) -> None:
    seed = zlib.crc32(node_id.encode())
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)  # CUDA's generators too


@pytest.fixture(scope="module", autouse=True)
def _seeded_module(request):
    _seed_global_generators(request.node.nodeid)


@pytest.fixture(autouse=True)
def _seeded_test(request):
    node_id = request.node.nodeid
    group = request.node.get_closest_marker("xdist_group")
    if group is not None:  # `--dist loadgroup` appends "@group": the seed is the same with `-n 0`
        node_id = node_id.removesuffix("@" + group.args[0])
    _seed_global_generators(node_id)


# --- The gpu marker ----------------------------------------------------------------------------
# `pytest -m gpu` runs the tests that use a CUDA GPU when the machine has one (the kernel files run
# them under Triton's interpreter on CPU otherwise). A test skipped for want of a GPU must say so
# with the marker, or it would silently drop out of that run.
_NEEDS_GPU = re.compile(r"\bneeds? (an? )?(CUDA|sm_90|GPU)|\bneeds sm_90|kernel needs sm_90|runs on sm_90 GPUs only")


def _shares_a_module_fixture(item) -> bool:
    """Does the test use a fixture of module (or wider) scope defined in its own file (built
    once per worker that runs one of its tests)? Fixtures named with a leading underscore are
    the files' cheap autouse helpers (e.g. one restoring an environment variable)."""
    path = item.nodeid.split("::")[0]
    for name, definitions in item._fixtureinfo.name2fixturedefs.items():
        for definition in definitions:
            if (definition.scope in ("module", "package", "session") and not name.startswith("_")
                    and definition.baseid.split("::")[0] == path):
                return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist's, which turns the groups into "@group" node ids
def pytest_collection_modifyitems(config, items):
    for item in items:  # `--dist loadgroup` keeps these on one worker
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    unmarked = []
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            continue
        for mark in item.iter_markers("skipif"):
            if _NEEDS_GPU.search(str(mark.kwargs.get("reason", ""))):
                unmarked.append(item.nodeid)
                break
    if unmarked:
        raise pytest.UsageError("tests skipped without a GPU but not marked `gpu` "
                                "(pytest.mark.gpu): " + ", ".join(unmarked[:20]))


# --- Time per file -----------------------------------------------------------------------------
# Summed setup + call + teardown time of each file's tests (on the workers that ran them), so that a
# GPU run or a CI run says where its minutes went.
_SECONDS_PER_FILE = collections.Counter()
_TESTS_PER_FILE = collections.Counter()
_SESSION_START = time.perf_counter()


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _SECONDS_PER_FILE[path] += report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _TESTS_PER_FILE[path] += 1


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS_PER_FILE:
        return
    shown = _SECONDS_PER_FILE.most_common(15)
    write = terminalreporter.write_line
    terminalreporter.section("time per file (setup + call + teardown, summed over workers)")
    for path, seconds in shown:
        write(f"{seconds:9.1f} s {_TESTS_PER_FILE[path]:6d} tests  {path}")
    if len(_SECONDS_PER_FILE) > len(shown):
        rest = sum(_SECONDS_PER_FILE.values()) - sum(s for _, s in shown)
        write(f"{rest:9.1f} s in the other {len(_SECONDS_PER_FILE) - len(shown)} files")
    write(f"{sum(_SECONDS_PER_FILE.values()):9.1f} s of test time in {len(_SECONDS_PER_FILE)} files, "
          f"{time.perf_counter() - _SESSION_START:.1f} s wall")

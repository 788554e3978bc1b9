"""Every example in examples/ runs on CPU, in seconds, without error and without a torchmx
warning."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "mx_tensor_basics.py"}


# Runs an example as __main__ with every warning torchmx raises (from its own modules or, through
# stacklevel, attributed to the example's line) turned into an error: examples show none.
RUN_WITHOUT_TORCHMX_WARNINGS = (
    "import runpy, sys, warnings\n"
    "warnings.filterwarnings('error', module=r'(torchmx|__main__)($|\\.)')\n"
    "sys.argv = sys.argv[1:]  # the example's own argv, as `python3 example.py` gives it\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(  # this checkout's torchmx, not an installed one
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run([sys.executable, "-c", RUN_WITHOUT_TORCHMX_WARNINGS, str(path)],
                            capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "an example should show what it did"

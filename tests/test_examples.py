"""Every example in examples/ runs on CPU, in seconds, without error."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "mx_tensor_basics.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    result = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                            timeout=180, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "an example should show what it did"

"""The README's first two commands are the set-up on a fresh CPU machine: command 1 installs
the demo's extra (no Triton, no torchao) and runs the main job, command 2 installs the test
extra and runs the suite, and .ci/run runs command 2. The extras resolve against the torch the
commands pin (stock PyPI's Linux torch 2.13.0 wheel requires triton 3.7.1)."""

import re

import pytest
from packaging.requirements import Requirement

from repo import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

COMMAND_1 = 'python3 -m pip install torch==2.13.0 -e ".[demo]" && python3 -m torchmx'
COMMAND_2 = 'python3 -m pip install torch==2.13.0 -e ".[test]" && python3 -m pytest -q'


def _extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project, {name: [Requirement(r) for r in reqs]
                     for name, reqs in project["optional-dependencies"].items()}


def test_the_readme_opens_with_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert first_block.splitlines() == [COMMAND_1, COMMAND_2]


def test_ci_runs_command_2():
    last = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert last.replace("pip install -q ", "pip install ") == COMMAND_2


def test_command_1_runs_the_cli_and_installs_no_gpu_package():
    project, extras = _extras()
    assert (ROOT / "torchmx" / "__main__.py").read_text().count("main()") == 1
    assert project["scripts"]["torchmx"] == "torchmx.cli:main"
    demo = {r.name for r in extras["demo"]} | {Requirement(r).name for r in project["dependencies"]}
    assert not demo & {"triton", "torchao"}


def test_command_2_extra_admits_the_triton_of_stock_torch_2_13():
    _, extras = _extras()
    test = {r.name: r for r in extras["test"]}
    assert test["torchmx"].extras == {"demo", "torchao"}
    assert test["triton"].specifier.contains("3.7.1") and test["triton"].specifier.contains("3.6.0")
    assert {r.name for r in extras["torchao"]} == {"torchao"}

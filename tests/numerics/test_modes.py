"""One table of scale modes and roundings (numerics/modes.py): the spellings of the contract, the
integers of the C kernels' enums and of the Triton kernels' constexprs all come from it."""

import pathlib
import re

import pytest

import torchmx
from torchmx import cpu_kernels
from torchmx.numerics import ROUNDING_MODES, SCALE_MODES, Rounding, ScaleMode

PACKAGE = pathlib.Path(torchmx.__file__).parent
C_SOURCE = PACKAGE / "csrc" / "mx_cpu.c"


def c_enum(prefix):
    """{name: value} of the C enum in mx_cpu.c whose names start with `prefix`."""
    for body in re.findall(r"enum\s*\{([^}]*)\}", C_SOURCE.read_text()):
        members = dict(re.findall(r"(\w+)\s*=\s*(\d+)", body))
        if members and all(name.startswith(prefix) for name in members):
            return {name[len(prefix):]: int(value) for name, value in members.items()}
    raise AssertionError(f"no enum of {prefix}* names in {C_SOURCE}")


def test_spellings_are_the_contracts():
    assert SCALE_MODES == ("floor", "ceil", "even", "rceil")
    assert ROUNDING_MODES == ("even", "away", "toward_zero", "trunc", "stochastic")


@pytest.mark.parametrize("enum, prefix", [(ScaleMode, "SCALE_"), (Rounding, "ROUND_")],
                         ids=["scale_mode", "rounding"])
def test_c_enum_matches_the_table(enum, prefix):
    assert c_enum(prefix) == {member.name: int(member) for member in enum}


def test_c_input_codes_match_the_wrapper():
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    codes = {str(dtype).removeprefix("torch."): code for dtype, code in cpu_kernels._INPUT_CODES.items()}
    assert {names[name]: value for name, value in c_enum("IN_").items()} == codes


def test_triton_constexprs_match_the_table():
    tl_numerics = pytest.importorskip("torchmx.kernels._tl_numerics")
    for member in ScaleMode:
        assert getattr(tl_numerics, f"SCALE_{member.name}").value == int(member)
    for member in Rounding:
        assert getattr(tl_numerics, f"ROUND_{member.name}").value == int(member)


def test_kernels_compare_modes_by_name():
    literal = re.compile(r"\b(SCALE_MODE|ROUNDING)\s*[!=<>]=?\s*\d")
    found = [f"{path.name}:{number}: {line.strip()}"
             for path in sorted((PACKAGE / "kernels").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if literal.search(line)]
    assert found == []

"""The format table: every descriptor field, custom minifloats, names."""

import pytest
import torch
from expecttest import TestCase

from torchmx import dtypes


class FormatTable(TestCase):
    def test_table(self):
        rows = [
            f"{d.name:12} bits={d.bits} e={d.exponent_bits} m={d.mantissa_bits} bias={d.exponent_bias} "
            f"emax={d.emax} max={d.max} max_code={d.max_code:#04x} nan={d.has_nan} inf={d.has_inf} "
            f"pack={d.codes_per_group}/{d.bytes_per_group} {d.storage_dtype}"
            for d in dtypes.SUPPORTED_ELEM_DTYPES + (dtypes.ExMy(1, 2), dtypes.ExMy(3, 2, bias=2))
        ]
        self.assertExpectedInline("\n".join(rows), """\
float8_e4m3  bits=8 e=4 m=3 bias=7 emax=8 max=448.0 max_code=0x7e nan=True inf=False pack=1/1 torch.uint8
float8_e5m2  bits=8 e=5 m=2 bias=15 emax=15 max=57344.0 max_code=0x7b nan=True inf=True pack=1/1 torch.uint8
float6_e3m2  bits=6 e=3 m=2 bias=3 emax=4 max=28.0 max_code=0x1f nan=False inf=False pack=4/3 torch.uint8
float6_e2m3  bits=6 e=2 m=3 bias=1 emax=2 max=7.5 max_code=0x1f nan=False inf=False pack=4/3 torch.uint8
float4_e2m1  bits=4 e=2 m=1 bias=1 emax=2 max=6.0 max_code=0x07 nan=False inf=False pack=2/1 torch.uint8
int8         bits=8 e=0 m=6 bias=0 emax=0 max=1.984375 max_code=0x7f nan=False inf=False pack=1/1 torch.int8
e1m2         bits=4 e=1 m=2 bias=1 emax=0 max=1.75 max_code=0x07 nan=False inf=False pack=2/1 torch.uint8
e3m2_bias2   bits=6 e=3 m=2 bias=2 emax=5 max=56.0 max_code=0x1f nan=False inf=False pack=4/3 torch.uint8""")


def test_torchmx_010_names():
    assert set(dtypes.STR_TO_SUPPORTED_ELEM_DTYPE) == {
        "float8_e4m3", "float8_e5m2", "float6_e3m2", "float6_e2m3", "float4_e2m1", "int8"}
    assert dtypes.float8_e4m3.max_pow2 == 8 and dtypes.float4_e2m1.max == 6.0
    assert dtypes.float8_e4m3.torch_dtype == torch.float8_e4m3fn
    assert repr(dtypes.float6_e2m3) == "float6_e2m3"


def test_descriptors_are_frozen_and_hashable():
    with pytest.raises(AttributeError):
        dtypes.float8_e4m3.max = 1.0
    assert dtypes.ExMy(1, 2) == dtypes.ExMy(1, 2) and hash(dtypes.ExMy(1, 2)) == hash(dtypes.ExMy(1, 2))


@pytest.mark.parametrize("name", ["e1m2", "e3m3", "e2m1_bias3", "float4_e2m1", "int8"])
def test_names_round_trip(name):
    assert dtypes.from_name(name).name == name
    assert dtypes.resolve(name) is dtypes.resolve(dtypes.from_name(name)) or \
        dtypes.resolve(name) == dtypes.from_name(name)


def test_custom_matches_builtin_where_it_should():
    # Without special codes, E2M1/E3M2/E2M3 ExMy are exactly the OCP formats.
    for e, m, builtin in [(2, 1, dtypes.float4_e2m1), (3, 2, dtypes.float6_e3m2), (2, 3, dtypes.float6_e2m3)]:
        custom = dtypes.ExMy(e, m)
        assert (custom.max, custom.emax, custom.max_code, custom.exponent_bias) == (
            builtin.max, builtin.emax, builtin.max_code, builtin.exponent_bias)


@pytest.mark.parametrize("call, error, words", [
    (lambda: dtypes.ExMy(0, 3), ValueError, "exponent_bits >= 1"),
    (lambda: dtypes.ExMy(5, 3), ValueError, "<= 8"),
    (lambda: dtypes.ExMy(2, -1), ValueError, "mantissa_bits >= 0"),
    (lambda: dtypes.ExMy(2.0, 1), TypeError, "exponent_bits must be an int"),
    (lambda: dtypes.ExMy(4, 3, bias=40), ValueError, "bias must be in [0, 20]"),
    # emax 127: scaled values would reach 2**128, past fp32 (the C kernel differed there).
    (lambda: dtypes.ExMy(7, 0, bias=0), ValueError, "emax = 2**exponent_bits - 1 - bias must be <= 64"),
    (lambda: dtypes.ExMy(7, 0, bias=20), ValueError, "got 107"),
    (lambda: dtypes.from_name("fp4"), ValueError, "allowed: float8_e4m3"),
    (lambda: dtypes.from_name("e1m2_bias1"), ValueError, "unknown elem_dtype"),
    (lambda: dtypes.resolve(3), TypeError, "DType or its name"),
])
def test_bad_formats(call, error, words):
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value)

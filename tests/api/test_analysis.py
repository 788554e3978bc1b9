"""Error metrics: exact on constructed cases, consistent with the ops on real data."""

import math

import torch
from expecttest import TestCase

from torchmx.analysis import compare_formats, format_error_table, quantization_error, sqnr_db


def test_sqnr_exact_values():
    x = torch.tensor([3.0, 4.0])
    assert sqnr_db(x, x) == math.inf
    assert math.isclose(sqnr_db(x, torch.tensor([3.0, 3.0])), 10 * math.log10(25 / 1))


def test_saturation_and_flush_are_counted():
    # fp8 e4m3, floor scale: amax 480 -> scale 2**0, 480 saturates to 448; 2**-10 flushes to 0.
    x = torch.tensor([480.0, 1.0, 2.0**-10, 0.0] + [1.0] * 28)
    stats = quantization_error(x, "float8_e4m3")
    assert stats.saturated_fraction == 1 / 32
    assert stats.flushed_fraction == 1 / 31
    assert stats.max_abs_error == 32.0
    assert quantization_error(x, "float8_e4m3", scale_mode="ceil").saturated_fraction == 0


def test_nan_blocks_are_left_out():
    x = torch.ones(64)
    x[0] = float("nan")
    stats = quantization_error(x, "int8")
    assert stats.sqnr_db == math.inf  # the other block is exact


class Table(TestCase):
    def test_table_on_a_fixed_tensor(self):
        torch.manual_seed(0)
        x = torch.randn(64, 256)
        table = format_error_table(compare_formats(x))
        self.assertExpectedInline(table, """\
format       block  scale  bits  SQNR dB  max |err|  flushed saturated
float8_e4m3     32  floor  8.25    30.66       0.43    0.00%     0.87%
float8_e5m2     32  floor  8.25    25.33       0.43    0.00%     0.87%
float6_e3m2     32  floor  6.25    25.33       0.43    0.35%     0.87%
float6_e2m3     32  floor  6.25    30.89       0.18    2.38%     0.34%
float4_e2m1     32  floor  4.25    18.78       0.93    9.06%     2.29%
int8            32  floor  8.25    41.64     0.0312    1.29%     0.01%""")

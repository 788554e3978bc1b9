"""Golden bit patterns for hand-picked MX cases (expecttest).

Every expected string below was derived by hand from shared/DESIGN.md section 2 (the
derivation is the comment above it) and then compared with the library's output; the helper
additionally checks that the independent oracle (tests/support/oracle.py) and the custom op agree with
the reference implementation on every case.

Notation: ``s`` lists the E8M0 scale bytes, ``d`` the stored data bytes (packed as in
docs/numerics.md: fp4 element 2i in the low nibble, fp6 4 codes in 3 little-endian bytes,
int8 two's complement), all in hex.  For dequantize, the output's raw bit patterns in hex.
"""

import expecttest
import numpy as np
import torch

import oracle

F32 = torch.float32


def _hex(t: torch.Tensor) -> str:
    return " ".join(f"{v:02x}" for v in t.contiguous().view(torch.uint8).reshape(-1).tolist())


def q(values, fmt, block_size=32, scale_mode="floor", rounding="even", dtype=F32,
      block_dim=-1):
    import torchmx  # noqa: F401
    from torchmx.numerics import quantize_mx_reference

    x = torch.tensor(values, dtype=dtype)
    s, d = quantize_mx_reference(x, fmt, block_size, scale_mode=scale_mode,
                                 rounding=rounding, block_dim=block_dim)
    # the custom op and the oracle must agree with the reference on every golden case
    s_op, d_op = torch.ops.torchmx.quantize_mx(x, fmt, block_size, scale_mode=scale_mode,
                                               rounding=rounding, block_dim=block_dim)
    assert torch.equal(s_op, s) and torch.equal(d_op.view(torch.uint8), d.view(torch.uint8))
    s_or, d_or = oracle.oracle_quantize(x, fmt, block_size, scale_mode, rounding, block_dim)
    assert np.array_equal(s.numpy(), s_or), (s, s_or)
    assert np.array_equal(d.view(torch.uint8).numpy(), d_or.view(np.uint8)), (d, d_or)
    return f"s: {_hex(s)} | d: {_hex(d)}"


def dq_bits(codes, scale_bytes, fmt, block_size, target):
    import torchmx  # noqa: F401
    from torchmx.numerics import dequantize_mx_reference

    f = oracle.from_name(fmt)
    data = torch.from_numpy(oracle.pack_codes(np.array(codes), f).copy())
    if f.kind == "int":
        data = data.view(torch.int8)
    scale = torch.tensor(scale_bytes, dtype=torch.uint8)
    n = len(codes)
    out = dequantize_mx_reference(data, scale, fmt, block_size, target, -1, block_dim_size=n)
    out_op = torch.ops.torchmx.dequantize_mx(data, scale, fmt, block_size, target, -1,
                                             block_dim_size=n)
    want = oracle.oracle_dequantize(data, scale, f, block_size, target, -1, block_dim_size=n)
    width = {torch.float32: 8, torch.bfloat16: 4, torch.float16: 4}[target]
    got_bits = oracle.tensor_bits(out)
    assert np.array_equal(got_bits, oracle.tensor_bits(out_op))
    assert np.array_equal(got_bits, oracle.tensor_bits(want)), (out, want)
    return " ".join(f"{b:0{width}x}" for b in got_bits.tolist())


class TestRoundingTies(expecttest.TestCase):
    # float4_e2m1, block amax 5 -> floor(log2 5) - emax = 2 - 2 = 0 -> scale byte 0x7f, y = x.
    # Grid 0 .5 1 1.5 2 3 4 6 = codes 0..7. Elements and their codes per mode:
    #   4.0 -> 6 ; 2.5 tie 2(4)|3(5) ; -2.5 -> sign 8 + same ; 0.75 tie .5(1)|1(2) ;
    #   1.25 tie 1(2)|1.5(3) ; 5.0 tie 4(6)|6(7) ; -5.0 ; 0.25 tie 0(0)|.5(1) ;
    #   2.75 (not a tie) -> 3(5), trunc 2(4) ; -0.3 -> -.5(9), trunc -0(8)
    # even picks the even code, away the larger magnitude, toward_zero the smaller, trunc
    # always the smaller.  Bytes pack pairs low nibble first.
    X = [4.0, 2.5, -2.5, 0.75, 1.25, 5.0, -5.0, 0.25, 2.75, -0.3]

    def test_fp4_even(self):
        # codes 6 4 c 2 2 6 e 0 5 9 -> bytes 46 2c 62 0e 95
        self.assertExpectedInline(q(self.X, "float4_e2m1"), """s: 7f | d: 46 2c 62 0e 95""")

    def test_fp4_away(self):
        # codes 6 5 d 2 3 7 f 1 5 9 -> bytes 56 2d 73 1f 95
        self.assertExpectedInline(q(self.X, "float4_e2m1", rounding="away"),
                                  """s: 7f | d: 56 2d 73 1f 95""")

    def test_fp4_toward_zero(self):
        # codes 6 4 c 1 2 6 e 0 5 9 -> bytes 46 1c 62 0e 95
        self.assertExpectedInline(q(self.X, "float4_e2m1", rounding="toward_zero"),
                                  """s: 7f | d: 46 1c 62 0e 95""")

    def test_fp4_trunc(self):
        # codes 6 4 c 1 2 6 e 0 4 8 -> bytes 46 1c 62 0e 84
        self.assertExpectedInline(q(self.X, "float4_e2m1", rounding="trunc"),
                                  """s: 7f | d: 46 1c 62 0e 84""")

    # float8_e4m3, amax 256 -> e = 8 - 8 = 0 (0x7f). 256 = 0.1111.000 = 0x78.
    # binade [16, 32) has quantum 2 (ef = 4 + 7 = 11 -> 0x58 = 16):
    #   17 tie 16(0x58)|18(0x59): even 58, away 59, tz 58, trunc 58
    #   19 tie 18(0x59)|20(0x5a): even 5a, away 5a, tz 59, trunc 59
    #  -19 same with the sign bit 0x80.
    Y = [256.0, 17.0, 19.0, -19.0]

    def test_fp8_ties_all_modes(self):
        got = "\n".join(f"{r}: " + q(self.Y, "float8_e4m3", rounding=r)
                        for r in ("even", "away", "toward_zero", "trunc"))
        self.assertExpectedInline(got, """\
even: s: 7f | d: 78 58 5a da
away: s: 7f | d: 78 59 5a da
toward_zero: s: 7f | d: 78 58 59 d9
trunc: s: 7f | d: 78 58 59 d9""")

    # MXINT8, amax 1 -> e = 0 (0x7f); code = round(64 y):
    #   1.0 -> 64 (0x40); 1.5/64 -> 1.5; -1.5/64 -> -1.5; 2.5/64 -> 2.5; 0.5/64; -0.5/64;
    #   1.75/64 -> 1.75 (nearest 2, trunc 1)
    #   even: 40 02 fe 02 00 00 02 ; away: 40 02 fe 03 01 ff 02 ;
    #   toward_zero: 40 01 ff 02 00 00 02 ; trunc: 40 01 ff 02 00 00 01
    Z = [1.0, 1.5 / 64, -1.5 / 64, 2.5 / 64, 0.5 / 64, -0.5 / 64, 1.75 / 64]

    def test_int8_ties_all_modes(self):
        got = "\n".join(f"{r}: " + q(self.Z, "int8", rounding=r)
                        for r in ("even", "away", "toward_zero", "trunc"))
        self.assertExpectedInline(got, """\
even: s: 7f | d: 40 02 fe 02 00 00 02
away: s: 7f | d: 40 02 fe 03 01 ff 02
toward_zero: s: 7f | d: 40 01 ff 02 00 00 02
trunc: s: 7f | d: 40 01 ff 02 00 00 01""")


class TestSaturation(expecttest.TestCase):
    def test_e4m3_amax_480_floor(self):
        # floor(log2 480) = 8 -> e = 0 (0x7f). 480 > 448 saturates to 448 = 0.1111.110 = 7e
        # (0x7f would be NaN); -480 -> fe; 464 is the 448|480 midpoint: even -> 448 (7e);
        # 449 -> 7e.
        self.assertExpectedInline(q([480.0, -480.0, 464.0, 449.0], "float8_e4m3"),
                                  """s: 7f | d: 7e fe 7e 7e""")

    def test_e4m3_saturation_under_away(self):
        # same block under 'away': 464 would round to 480 -> saturates to 448 anyway
        self.assertExpectedInline(
            q([480.0, -480.0, 464.0, 449.0], "float8_e4m3", rounding="away"),
            """s: 7f | d: 7e fe 7e 7e""")

    def test_e5m2_and_fp4_saturation(self):
        # e5m2: amax 122880 = 1.875 * 2^16 -> e = 16 - 15 = 1 (0x80); y = 61440 > 57344 ->
        # max code 0.11110.11 = 7b (never the Inf code 7c).
        # e2m1: amax 7.9 -> e = 2 - 2 = 0; y = 7.9 > 6 -> 7; -7 -> f; packed f<<4 | 7 = f7.
        self.assertExpectedInline(q([122880.0, -1.0], "float8_e5m2") + " ; "
                                  + q([7.9, -7.0], "float4_e2m1"),
                                  """s: 80 | d: 7b b8 ; s: 7f | d: f7""")


class TestSubnormalsAndTinyScales(expecttest.TestCase):
    def test_e4m3_subnormal_elements(self):
        # amax 256 -> e = 0 (0x7f). 2^-6 = min normal 0.0001.000 = 08; 2^-7 = subnormal
        # mantissa 4 -> 04; 2^-9 = min subnormal 01; 1.5 * 2^-9 ties 1|2 -> even 02;
        # 2^-10 ties 0|1 -> 00; -2^-11 rounds to -0 -> 80 (sign kept).
        x = [256.0, 2.0**-6, 2.0**-7, 2.0**-9, 3 * 2.0**-10, 2.0**-10, -(2.0**-11)]
        self.assertExpectedInline(q(x, "float8_e4m3"), """s: 7f | d: 78 08 04 01 02 00 80""")

    def test_scale_2_pow_minus_127(self):
        # amax 2^-119 -> e = -119 - 8 = -127 -> byte 00. y = x * 2^127 exactly (the scale
        # 2^-127 is an fp32 subnormal; it must not be flushed): 2^-119 -> 256 = 78;
        # 2^-136 -> 2^-9 = 01 (fp32-subnormal input!); 3 * 2^-137 -> 1.5 * 2^-9 ties 1|2
        # -> 02; 2^-137 -> 2^-10 ties 0|1 -> 00; -2^-130 -> -2^-3 = 1.0 * 2^-3 -> ef 4 -> a0.
        x = [2.0**-119, 2.0**-136, 3 * 2.0**-137, 2.0**-137, -(2.0**-130)]
        self.assertExpectedInline(q(x, "float8_e4m3"), """s: 00 | d: 78 01 02 00 a0""")

    def test_tiny_block_1e_38(self):
        # fp32(1e-38) = 9.99999935e-39 < 2^-126: floor(log2) = -127 -> e = -127 - emax,
        # clamped to -127 -> byte 00 for every format. y = 1e-38 * 2^127 = 1.7014...:
        #   e4m3: 1.7014 * 8 = 13.61 -> 14/8 = 1.75 -> ef 7 mant 6 -> 3e
        #   e2m1: nearest of 1.5|2 -> 1.5 -> 3
        #   int8: 64 * 1.7014 = 108.89 -> 109 = 6d
        got = " ; ".join(q([1e-38], f) for f in ("float8_e4m3", "float4_e2m1", "int8"))
        self.assertExpectedInline(got, """s: 00 | d: 3e ; s: 00 | d: 03 ; s: 00 | d: 6d""")

    def test_fp32_subnormal_amax_even_mode(self):
        # even mode on an fp32-subnormal amax: bits 0x00400000 (2^-127) + (1 << 19) keeps
        # exponent field 0 -> rounded amax 0 -> e clamps to -127 -> byte 00; y = 1 -> 38.
        # int8 (mbits 6): 2^-127 * 1.9921875 has bits 0x007f8000 -> + (1 << 16) -> 0x00800000
        # = 2^-126 -> e = -126 -> byte 01; y = 0.99609375 -> 63.75 -> 64 = 40.
        got = q([2.0**-127], "float8_e4m3", scale_mode="even") + " ; " + q(
            [2.0**-127 * 1.9921875], "int8", scale_mode="even")
        self.assertExpectedInline(got, """s: 00 | d: 38 ; s: 01 | d: 40""")


class TestSpecialBlocks(expecttest.TestCase):
    def test_nan_and_inf_blocks_next_to_normal_block(self):
        # block size 4. Block 0 has a NaN -> ff and all codes 00. Block 1 [4,5,6,7]: amax 7 ->
        # e = 2 - 8 = -6 -> 0x79; y = 64x = 256 (78), 320 = 1.25*256 (7a), 384 (7c), 448 (7e).
        # Block 2 has +Inf -> ff, 00s. Block 3 has -Inf -> ff, 00s.
        x = [1.0, 2.0, float("nan"), 3.0, 4.0, 5.0, 6.0, 7.0,
             float("inf"), 1.0, 1.0, 1.0, 1.0, float("-inf"), 0.0, 2.0]
        self.assertExpectedInline(q(x, "float8_e4m3", block_size=4), """\
s: ff 79 ff ff | d: 00 00 00 00 78 7a 7c 7e 00 00 00 00 00 00 00 00""")

    def test_nan_block_dequantizes_to_nan_other_block_exact(self):
        import torchmx  # noqa: F401
        from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference

        x = torch.tensor([1.0, float("nan"), 3.0, 4.0, 5.0, 6.0])
        s, d = quantize_mx_reference(x, "float8_e4m3", 3)
        out = dequantize_mx_reference(d, s, "float8_e4m3", 3, F32, -1, block_dim_size=6)
        # block 0 all NaN (fp32 NaN bit patterns vary, so print via isnan); block 1 exact
        txt = f"{torch.isnan(out).tolist()} {out[3:].tolist()}"
        self.assertExpectedInline(txt, """\
[True, True, True, False, False, False] [4.0, 5.0, 6.0]""")

    def test_signed_zero(self):
        # all-zero block -> scale 00, codes are the sign bit: e4m3 80/00, e2m1 8/0 (packed
        # low nibble first: 08 08), int8 has no -0 -> 00.  In a nonzero block (amax 1,
        # e = -8 -> 0x77) -0.0 is still 80 and 1.0 -> 256 = 78.
        got = " ; ".join([q([-0.0, 0.0, -0.0, 0.0], "float8_e4m3"),
                          q([-0.0, 0.0, -0.0, 0.0], "float4_e2m1"),
                          q([-0.0, 0.0], "int8"),
                          q([1.0, -0.0], "float8_e4m3")])
        self.assertExpectedInline(got, """\
s: 00 | d: 80 00 80 00 ; s: 00 | d: 08 08 ; s: 00 | d: 00 00 ; s: 77 | d: 78 80""")

    def test_negative_zero_dequantizes_to_negative_zero(self):
        # e4m3 code 80 under any finite scale -> -0.0: fp32 80000000, bf16/fp16 8000
        got = " ; ".join(dq_bits([0x80, 0x00], [0x7f], "float8_e4m3", 32, t)
                         for t in (torch.float32, torch.bfloat16, torch.float16))
        self.assertExpectedInline(got, """80000000 00000000 ; 8000 0000 ; 8000 0000""")


class TestPacking(expecttest.TestCase):
    def test_fp6_e3m2_packing(self):
        # amax 28 -> e = 4 - 4 = 0 (7f). e3m2 codes: 28 = 1.75*16 -> ef 7 mant 3 -> 1f;
        # 1 -> ef 3 -> 0c; -1 -> 2c; 0.25 = min normal 2^-2 -> ef 1 -> 04;
        # 7 = 1.75*4 -> ef 5 mant 3 -> 17; -28 -> 3f.
        # group 0: w = 1f | 0c<<6 | 2c<<12 | 04<<18 = 0x12c31f -> bytes 1f c3 12
        # group 1 (partial, missing codes 0): w = 17 | 3f<<6 = 0xfd7 -> bytes d7 0f 00
        self.assertExpectedInline(q([28.0, 1.0, -1.0, 0.25, 7.0, -28.0], "float6_e3m2"),
                                  """s: 7f | d: 1f c3 12 d7 0f 00""")

    def test_fp6_e2m3_packing(self):
        # amax 7.5 -> e = 2 - 2 = 0. e2m3 codes (bias 1): 7.5 = 1.875*4 -> ef 3 mant 7 -> 1f;
        # -0.125 = subnormal 1/8 -> 21; 1.0 -> ef 1 -> 08; 0.5 -> subnormal 4 -> 04.
        # w = 1f | 21<<6 | 08<<12 | 04<<18 = 0x1f + 0x840 + 0x8000 + 0x100000 = 0x10885f
        # -> bytes 5f 88 10
        self.assertExpectedInline(q([7.5, -0.125, 1.0, 0.5], "float6_e2m3"),
                                  """s: 7f | d: 5f 88 10""")

    def test_fp4_packing_low_nibble_first(self):
        # amax 6 -> e = 0. codes 1->2, 2->4, 3->5, 4->6, 6->7 (odd count: last high nibble 0)
        # bytes: 2|4<<4 = 42, 5|6<<4 = 65, 7 = 07
        self.assertExpectedInline(q([1.0, 2.0, 3.0, 4.0, 6.0], "float4_e2m1"),
                                  """s: 7f | d: 42 65 07""")

    def test_fp4_packing_along_dim0(self):
        # 2-D input [[1, 2], [3, 4], [6, -1]], blocks along dim 0 (block_size 3):
        # column 0 [1,3,6] amax 6 -> e 0: codes 2 5 7; column 1 [2,4,-1] amax 4 -> e 0: 4 6 a.
        # data shape (2, 2): row 0 holds elements 0,1 of each column: (2|5<<4, 4|6<<4) = 52 64;
        # row 1 holds element 2 (high nibble 0): 07 0a.  scale shape (1, 2): 7f 7f.
        self.assertExpectedInline(
            q([[1.0, 2.0], [3.0, 4.0], [6.0, -1.0]], "float4_e2m1", block_size=3, block_dim=0),
            """s: 7f 7f | d: 52 64 07 0a""")

    def test_custom_e1m2_packing(self):
        # e1m2 (bias 1, emax 0, max 1.75): grid 0 .25 .5 .75 1 1.25 1.5 1.75, 4-bit codes,
        # 2 per byte. amax 1.75 -> e = 0. codes 1.75 -> 7, -0.5 -> a, 1.0 -> 4 -> bytes a7 04.
        self.assertExpectedInline(q([1.75, -0.5, 1.0], "e1m2"), """s: 7f | d: a7 04""")


class TestInt8(expecttest.TestCase):
    def test_never_minus_128(self):
        # floor: amax 1.9921875 -> e = 0 (7f); y = -1.9921875 -> 64y = -127.5 -> even gives
        # -128 -> clamped to -127 = 81; away also -128 -> 81; 1.0 -> 40.
        # block [-2, 1]: e = 1 (80), -1 -> -64 = c0, 0.5 -> 32 = 20.
        got = " ; ".join([q([-1.9921875, 1.0], "int8"),
                          q([-1.9921875, 1.0], "int8", rounding="away"),
                          q([-2.0, 1.0], "int8")])
        self.assertExpectedInline(got, """s: 7f | d: 81 40 ; s: 7f | d: 81 40 ; s: 80 | d: c0 20""")

    def test_positive_saturation(self):
        # floor: amax 1.99 -> e = 0; 64 * 1.99 = 127.36 -> 127 = 7f;
        # ceil of bf16 max 0x7f7f (3.3895e38, log2 -> 128): e = 128 clamps to 127 (fe);
        # y = 1.9921875 -> 127.5 -> 128 -> clamped 127 = 7f.
        got = q([1.99], "int8") + " ; " + q([3.3895313892515355e38], "int8", scale_mode="ceil",
                                            dtype=torch.bfloat16)
        self.assertExpectedInline(got, """s: 7f | d: 7f ; s: fe | d: 7f""")


class TestScaleModes(expecttest.TestCase):
    # e4m3 single-element blocks. floor e = floor(log2 a) - 8, ceil = ceil(log2 a) - 8,
    # even: a's fp32 mantissa rounded to 3 bits ties up then floor, rceil: ceil(log2(a/448)).
    # a = 1.9375 = 1.1111b: floor e=-8 (77), y=496 -> sat 7e; ceil/even(1.1111+.0001 = 10.0)/
    #   rceil(log2(.004325) = -7.85) all e=-7 (78), y=248 ties 240(77)|256(78) -> 78.
    # a = 1.875 = 1.111b: floor 77/7e (480 sat); ceil 78, y=240 = 1.875*128 -> ef 14 mant 7
    #   -> 77; even: 1.1110 + .0001 no carry -> 77/7e; rceil: 1.875/448 = 2^-7.9 -> 78/77.
    # a = 1.75: floor 77/7e (448); ceil 78, y = 224 -> 76; even no carry 77/7e;
    #   rceil 1.75/448 = 2^-8 exactly -> 77/7e.
    def test_e4m3_modes(self):
        lines = []
        for a in (1.9375, 1.875, 1.75):
            lines.append(f"{a}: " + ", ".join(f"{m} " + q([a], "float8_e4m3", scale_mode=m)
                                              for m in ("floor", "ceil", "even", "rceil")))
        self.assertExpectedInline("\n".join(lines), """\
1.9375: floor s: 77 | d: 7e, ceil s: 78 | d: 78, even s: 78 | d: 78, rceil s: 78 | d: 78
1.875: floor s: 77 | d: 7e, ceil s: 78 | d: 77, even s: 77 | d: 7e, rceil s: 78 | d: 77
1.75: floor s: 77 | d: 7e, ceil s: 78 | d: 76, even s: 77 | d: 7e, rceil s: 77 | d: 7e""")

    # e2m1 (emax 2, mbits 1, max 6).
    # a = 7 = 1.75 * 4: floor e = 0 (7f) y = 7 -> sat 6 = 7; ceil e = 3 - 2 = 1 (80), y = 3.5
    #   ties 3(5)|4(6) -> 6; even 1.11 + .01 = 10.0 -> e = 1 (80) -> 6; rceil 7/6 -> 1 -> 6.
    # a = 6.5 = 1.625 * 4: floor 7f/7; ceil 80 y = 3.25 -> 3 = 5; even 1.101 + .01 = 1.111
    #   no carry -> 7f/7; rceil 6.5/6 = 1.083 -> e = 1 -> 80/5.
    def test_e2m1_modes(self):
        lines = []
        for a in (7.0, 6.5):
            lines.append(f"{a}: " + ", ".join(f"{m} " + q([a], "float4_e2m1", scale_mode=m)
                                              for m in ("floor", "ceil", "even", "rceil")))
        self.assertExpectedInline("\n".join(lines), """\
7.0: floor s: 7f | d: 07, ceil s: 80 | d: 06, even s: 80 | d: 06, rceil s: 80 | d: 06
6.5: floor s: 7f | d: 07, ceil s: 80 | d: 05, even s: 7f | d: 07, rceil s: 80 | d: 05""")

    # MXINT8 (emax 0, even counts mbits 6, max 127/64 = 1.984375).
    # a = 1.9921875 = 1.1111111b: floor 7f, 127.5 -> 128 -> clamp 127 = 7f; ceil e = 1 (80),
    #   y*64 = 63.75 -> 64 = 40; even 1.1111111 + 2^-7 = 10.0 -> 80/40; rceil 1.9921875/1.984375
    #   = 1.0039 -> 1 -> 80/40.
    # a = 1.984375 = 127/64: floor 7f/7f; ceil 80, 63.5 -> even 64 = 40; even: no carry ->
    #   7f/7f; rceil d = 1 exactly -> e = 0 -> 7f/7f.
    def test_int8_modes(self):
        lines = []
        for a in (1.9921875, 1.984375):
            lines.append(f"{a}: " + ", ".join(f"{m} " + q([a], "int8", scale_mode=m)
                                              for m in ("floor", "ceil", "even", "rceil")))
        self.assertExpectedInline("\n".join(lines), """\
1.9921875: floor s: 7f | d: 7f, ceil s: 80 | d: 40, even s: 80 | d: 40, rceil s: 80 | d: 40
1.984375: floor s: 7f | d: 7f, ceil s: 80 | d: 40, even s: 7f | d: 7f, rceil s: 7f | d: 7f""")

    def test_even_mode_reaching_2_pow_128(self):
        # fp32 max 0x7f7fffff + (1 << 19) overflows into exponent field 255: counts as 2^128
        # -> e = 128 - 8 = 120 -> byte f7 for e4m3; y = 3.4028e38 / 2^120 = 255.99998 ->
        # binade [128, 256) quantum 16: 15.99999 -> 16 -> 256 = 78.  int8: 128 - 0 clamps
        # to 127 (fe), y = 1.99999988 -> 128 -> 127 = 7f.
        fmax = 3.4028234663852886e38
        got = q([fmax], "float8_e4m3", scale_mode="even") + " ; " + q(
            [fmax], "int8", scale_mode="even")
        self.assertExpectedInline(got, """s: f7 | d: 78 ; s: fe | d: 7f""")

    def test_rceil_division_rounding(self):
        # rceil uses d = fp32(amax / max) with RNE.  (In the fp32 normal range that rounding
        # can never carry d across a power of two, but where d is an fp32 subnormal it can.)
        # e4m3, a0 = 448 * 2^-127 = 1.75 * 2^-119 (fp32 normal, ulp 2^-142): d = 2^-127
        #   exactly -> e = -127 (00), y = 448 -> 7e.
        # a1 = a0 + 1 ulp: exact quotient 2^-127 + 2^-142 / 448 = 2^-127 + 2^-150.8 lies
        #   within half an ulp (2^-150) of 2^-127 -> d = 2^-127 -> e = -127 (00),
        #   y = 448 + 2^-15 -> saturates to 7e.  (An exact ceil(log2(a1 / 448)) would be -126.)
        # a2 = a0 + 2 ulps: offset 2^-149.8 > 2^-150 -> d = 2^-127 + 2^-149 -> e = -126 (01),
        #   y = 224.00003 -> 76.
        a0 = np.float32(1.75 * 2.0**-119)
        a1 = np.nextafter(a0, np.float32(1))
        a2 = np.nextafter(a1, np.float32(1))
        assert float(a1) - float(a0) == 2.0**-142 and float(a2) - float(a0) == 2.0**-141
        got = " ; ".join(q([float(a)], "float8_e4m3", scale_mode="rceil") for a in (a0, a1, a2))
        self.assertExpectedInline(got, """s: 00 | d: 7e ; s: 00 | d: 7e ; s: 01 | d: 76""")


class TestDequantize(expecttest.TestCase):
    def test_fp32_subnormal_output(self):
        # e4m3 code 01 (2^-9) with scale byte 00 (2^-127) -> 2^-136 = fp32 subnormal
        # 2^13 * 2^-149 -> 00002000; code 0b (11 * 2^-9) -> 11 * 2^13 = 16000.
        # bf16 (min subnormal 2^-133): 2^-136 -> 0000; 11 * 2^-136 = 1.375 * 2^-133 -> 0001.
        got = " ; ".join(dq_bits([0x01, 0x0B], [0x00], "float8_e4m3", 32, t)
                         for t in (torch.float32, torch.bfloat16))
        self.assertExpectedInline(got, """00002000 00016000 ; 0000 0001""")

    def test_fp16_no_precast_scale(self):
        # e4m3 448 (7e) * 2^-27 (byte 100 = 0x64) = 1.75 * 2^-19 = 56 * 2^-24: fp16 subnormal
        # 0038. (Casting the scale 2^-27 to fp16 first would give 0.)  Code 01 * 2^-27 =
        # 2^-36 -> 0000.  fp32: 1.75 * 2^-19 -> exponent field 108 = 0x6c, mantissa .75 ->
        # 0x36600000; 2^-36 -> exponent field 91 = 0x5b -> 0x2d800000.
        got = " ; ".join(dq_bits([0x7E, 0x01], [100], "float8_e4m3", 32, t)
                         for t in (torch.float16, torch.float32))
        self.assertExpectedInline(got, """0038 0000 ; 36600000 2d800000""")

    def test_overflow_and_specials(self):
        # e5m2 7b (57344) * 2^127 (byte fe) = 1.75 * 2^142 -> +Inf in fp32/bf16/fp16.
        # e5m2 7c (Inf) * 1 -> Inf, fc -> -Inf.  fp16 with byte 0x7f: 7b -> 57344 = 7b00.
        got = " ; ".join([dq_bits([0x7B], [0xFE], "float8_e5m2", 32, torch.float32),
                          dq_bits([0x7B], [0xFE], "float8_e5m2", 32, torch.bfloat16),
                          dq_bits([0x7B, 0x7C, 0xFC], [0x7F], "float8_e5m2", 32, torch.float16)])
        self.assertExpectedInline(got, """7f800000 ; 7f80 ; 7b00 7c00 fc00""")

    def test_int8_and_fp6_decode(self):
        # int8 code -127 (0x81) * 2^-6 * 2^1 (byte 80) = -3.96875 -> fp32 c07e0000;
        # e2m3 code 1f = 7.5 with byte 7f -> 40f00000; e3m2 code 01 = 2^-4 (subnormal,
        # 1/4 * 2^-2) with byte 7f -> 3d800000.
        got = " ; ".join([dq_bits([-127], [0x80], "int8", 32, torch.float32),
                          dq_bits([0x1F], [0x7F], "float6_e2m3", 32, torch.float32),
                          dq_bits([0x01], [0x7F], "float6_e3m2", 32, torch.float32)])
        self.assertExpectedInline(got, """c07e0000 ; 40f00000 ; 3d800000""")


if __name__ == "__main__":
    import unittest

    unittest.main()

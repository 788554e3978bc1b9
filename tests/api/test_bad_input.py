"""User mistakes get a ValueError / TypeError naming the argument and the allowed values
(DESIGN.md section 5), never an AssertionError, an IndexError from deep inside or a silent
answer.  Every case runs through the reference functions and through the custom ops.
"""

import re

import pytest
import torch

FP_NAMES = ("float8_e4m3", "float8_e5m2", "float6_e3m2", "float6_e2m3", "float4_e2m1")
ALL_NAMES = FP_NAMES + ("int8",)
SCALE_MODES = ("floor", "ceil", "even", "rceil")
ROUNDINGS = ("even", "away", "toward_zero", "trunc", "stochastic")
HP_DTYPES = ("float32", "bfloat16", "float16")


def _lib():
    import torchmx  # noqa: F401
    import torchmx.numerics as numerics

    return numerics


def quantize(impl, x, fmt="float8_e4m3", block_size=4, **kw):
    if impl == "reference":
        return _lib().quantize_mx_reference(x, fmt, block_size, **kw)
    _lib()
    return torch.ops.torchmx.quantize_mx(x, fmt, block_size, **kw)


def dequantize(impl, data, scale, fmt="float8_e4m3", block_size=4, target=torch.float32,
               block_dim=-1, **kw):
    if impl == "reference":
        return _lib().dequantize_mx_reference(data, scale, fmt, block_size, target, block_dim,
                                              **kw)
    _lib()
    return torch.ops.torchmx.dequantize_mx(data, scale, fmt, block_size, target, block_dim,
                                           **kw)


def check_error(fn, exc_types, must_contain=(), any_of=()):
    """fn() must raise one of exc_types whose message contains every string of must_contain
    and, if given, at least one string of each tuple in any_of."""
    try:
        fn()
    except (AssertionError, IndexError, KeyError, AttributeError) as e:  # never these
        pytest.fail(f"raised {type(e).__name__}: {e}")
    except exc_types as e:
        msg = str(e)
        for s in must_contain:
            assert s in msg, f"message does not mention {s!r}: {msg}"
        for alts in any_of:
            assert any(a in msg for a in alts), f"message mentions none of {alts}: {msg}"
        return msg
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"raised {type(e).__name__} instead of {exc_types}: {e}")
    pytest.fail("no error raised (silent answer)")


VE, TE = ValueError, TypeError
BOTH = (ValueError, TypeError)
IMPLS = ["reference", "op"]


# --------------------------------------------------------------------------------------
# quantize
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int8,
                                   torch.bool, torch.complex64, torch.float64])
def test_quantize_rejects_input_dtype(impl, dtype):
    x = torch.zeros(8, dtype=dtype)
    check_error(lambda: quantize(impl, x), TE, ("data_hp",) + HP_DTYPES)


def test_quantize_rejects_non_tensor():
    check_error(lambda: quantize("reference", [1.0, 2.0]), TE, ("data_hp",))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_size", [0, -1, -32])
def test_quantize_rejects_block_size_value(impl, block_size):
    check_error(lambda: quantize(impl, torch.ones(8), block_size=block_size), VE,
                ("block_size",), any_of=[(">= 1", "≥ 1", "positive", "at least 1")])


@pytest.mark.parametrize("block_size", [2.5, 4.0, "32", None])
def test_quantize_rejects_block_size_type(block_size):
    # (through the op a non-int is rejected by the op schema itself; see test below)
    check_error(lambda: quantize("reference", torch.ones(8), block_size=block_size), BOTH,
                ("block_size",))


@pytest.mark.parametrize("block_size", [2.5, "32"])
def test_op_rejects_block_size_type(block_size):
    # the dispatcher's schema check raises before any torchmx code runs; it must still be a
    # clear error naming the argument, never a silent answer
    check_error(lambda: quantize("op", torch.ones(8), block_size=block_size),
                (TypeError, ValueError, RuntimeError), ("block_size",))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", ["fp8", "float8_e4m4", "FLOAT8_E4M3", "", "e9m9x", "mxfp5"])
def test_quantize_rejects_unknown_format(impl, fmt):
    check_error(lambda: quantize(impl, torch.ones(8), fmt), VE, ("elem_dtype",) + ALL_NAMES)


@pytest.mark.parametrize("fmt", [None, 8, torch.float16])  # torch.float8_e4m3fn is a format
def test_quantize_rejects_format_of_wrong_type(fmt):
    check_error(lambda: quantize("reference", torch.ones(8), fmt), BOTH, ("elem_dtype",))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("mode", ["round", "FLOOR", "nearest", "e8m0", ""])
def test_quantize_rejects_scale_mode(impl, mode):
    check_error(lambda: quantize(impl, torch.ones(8), scale_mode=mode), VE,
                ("scale_mode",) + SCALE_MODES)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rounding", ["nearest", "half_even", "EVEN", "floor", "sr", ""])
def test_quantize_rejects_rounding(impl, rounding):
    check_error(lambda: quantize(impl, torch.ones(8), rounding=rounding), VE,
                ("rounding",) + ROUNDINGS)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape,block_dim", [((8,), 1), ((8,), -2), ((2, 8), 2),
                                             ((2, 8), -3), ((2, 3, 4), 5), ((), 1), ((), -2)])
def test_quantize_rejects_block_dim(impl, shape, block_dim):
    x = torch.ones(shape)
    nd = max(x.dim(), 1)
    msg = check_error(lambda: quantize(impl, x, block_dim=block_dim), BOTH, ("block_dim",))
    # the allowed range is spelled out
    nums = set(re.findall(r"-?\d+", msg))
    assert str(-nd) in nums and str(nd - 1) in nums, msg


@pytest.mark.parametrize("block_dim", [1.5, "0", None])
def test_quantize_rejects_block_dim_type(block_dim):
    check_error(lambda: quantize("reference", torch.ones(2, 8), block_dim=block_dim), BOTH,
                ("block_dim",))


@pytest.mark.parametrize("seed", ["abc", 1.5, -1])
def test_quantize_rejects_bad_seed(seed):
    check_error(lambda: quantize("reference", torch.ones(8), rounding="stochastic", seed=seed),
                BOTH, ("seed",))


# --------------------------------------------------------------------------------------
# dequantize
# --------------------------------------------------------------------------------------


def _good(fmt="float8_e4m3", shape=(2, 8), block_size=4):
    return _lib().quantize_mx_reference(torch.linspace(-3, 3, 16).reshape(shape), fmt,
                                        block_size)


@pytest.mark.parametrize("impl", IMPLS)
def test_good_dequantize_baseline(impl):
    # the calls below differ from this working call in one argument only
    s, d = _good()
    out = dequantize(impl, d, s)
    assert out.shape == (2, 8) and out.dtype == torch.float32


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.int32, torch.bool])
def test_dequantize_rejects_data_dtype(impl, dtype):
    s, d = _good()
    check_error(lambda: dequantize(impl, d.to(dtype), s), TE, ("data_lp", "uint8"))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", FP_NAMES)
def test_dequantize_rejects_int8_data_for_float_formats(impl, fmt):
    s, d = _good(fmt)
    check_error(lambda: dequantize(impl, d.view(torch.int8), s, fmt), TE, ("data_lp", "uint8"))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.float32])
def test_dequantize_rejects_scale_dtype(impl, dtype):
    s, d = _good()
    check_error(lambda: dequantize(impl, d, s.to(dtype)), TE, ("uint8",),
                any_of=[("shared_exp_e8m0", "scale")])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("target", [torch.float64, torch.int32, torch.uint8,
                                    torch.float8_e4m3fn, torch.complex64])
def test_dequantize_rejects_target_dtype(impl, target):
    s, d = _good()
    check_error(lambda: dequantize(impl, d, s, target=target), BOTH,
                ("target_dtype",) + HP_DTYPES)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", ["scale_blocks", "scale_rows", "data_rows", "ndim",
                                  "data_len", "scale_0d", "data_0d"])
def test_dequantize_rejects_mismatched_shapes(impl, case):
    s, d = _good()  # scale (2, 2), data (2, 8)
    if case == "scale_blocks":
        s = torch.cat([s, s], dim=1)  # (2, 4): too many blocks
    elif case == "scale_rows":
        s = s[:1]
    elif case == "data_rows":
        d = torch.cat([d, d])
    elif case == "ndim":
        s = s.reshape(-1)
    elif case == "data_len":
        d = d[:, :5]  # 5 e4m3 elements need ceil(5 / 4) = 2 scales per row ...
        s = torch.cat([s, s[:, :1]], dim=1)  # ... but 3 are given
    elif case == "scale_0d":
        s = s[0, 0]
    elif case == "data_0d":
        d, s = d[0, 0], s[0, 0]
    check_error(lambda: dequantize(impl, d, s), VE, any_of=[("shape", "dims", "dim")])


@pytest.mark.parametrize("impl", IMPLS)
def test_dequantize_rejects_partial_fp6_group(impl):
    s, d = _good("float6_e3m2")  # 8 elements -> 6 bytes per row
    check_error(lambda: dequantize(impl, d[:, :5], s, "float6_e3m2"), VE, ("data_lp",))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt,n", [("float4_e2m1", 10), ("float4_e2m1", 5), ("float6_e2m3", 12),
                                   ("float8_e4m3", 9), ("int8", 12)])
def test_dequantize_rejects_inconsistent_block_dim_size(impl, fmt, n):
    s, d = _good(fmt)  # 8 elements per row, 2 blocks of 4
    check_error(lambda: dequantize(impl, d, s, fmt, block_dim_size=n), VE,
                any_of=[("block_dim_size", "shape")])


@pytest.mark.parametrize("n", [-1, 2.5])
def test_dequantize_rejects_bad_block_dim_size(n):
    s, d = _good()
    check_error(lambda: dequantize("reference", d, s, block_dim_size=n), BOTH,
                ("block_dim_size",))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_dim", [2, -3, 7])
def test_dequantize_rejects_block_dim(impl, block_dim):
    s, d = _good()
    msg = check_error(lambda: dequantize(impl, d, s, block_dim=block_dim), BOTH, ("block_dim",))
    nums = set(re.findall(r"-?\d+", msg))
    assert "-2" in nums and "1" in nums, msg


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_size", [0, -4])
def test_dequantize_rejects_block_size(impl, block_size):
    s, d = _good()
    check_error(lambda: dequantize(impl, d, s, block_size=block_size), VE, ("block_size",))


@pytest.mark.parametrize("impl", IMPLS)
def test_dequantize_block_size_must_match_scale(impl):
    # block size 2 for 8 elements needs 4 scales per row; only 2 are given
    s, d = _good()
    check_error(lambda: dequantize(impl, d, s, block_size=2), VE, any_of=[("shape",)])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", ["fp4", "float4", "e2m1x"])
def test_dequantize_rejects_unknown_format(impl, fmt):
    s, d = _good()
    check_error(lambda: dequantize(impl, d, s, fmt), VE, ("elem_dtype",) + ALL_NAMES)


def test_dequantize_rejects_non_tensors():
    s, d = _good()
    check_error(lambda: dequantize("reference", d.tolist(), s), TE, ("data_lp",))
    check_error(lambda: dequantize("reference", d, s.tolist()), TE,
                any_of=[("shared_exp_e8m0", "scale")])

"""The GPU half of the memory-safety sweep: every CUDA kernel path of torchmx fed crafted code
and scale bytes, meant to run under `compute-sanitizer --tool memcheck` (tests/kernels/test_gpu_memory_safety.py
starts it so; `python3 tests/support/gpu_memory_safety_sweep.py` runs it bare, `--device cpu` through the C kernels).

PyTorch's caching allocator is off in the child (PYTORCH_NO_CUDA_MEMORY_CACHING=1, set by the
test): every tensor is then its own allocation, so a read or write past a tensor's end leaves
the allocation and memcheck reports it, instead of landing silently in a neighbour's bytes.

What runs, each result checked:
- quantize_mx of raw input bits (NaN, Inf, subnormals) in every format, scale mode and rounding,
  odd lengths, both axes: bits equal to the reference;
- dequantize_mx of arbitrary code bytes (custom ExMy widths with the unused high bits set too)
  and arbitrary scale bytes (0, 254, 255 included): bits equal to the reference;
- F.linear with an MX weight of arbitrary bytes at row counts that reach every route (the
  small-M kernels, the tensor-core kernels, the chunked dequantize + cuBLAS path);
- MXInferenceLinear prepacked in each layout (stream, fragment, piece) at 1 to 64 rows and
  past them. The linear results are held to the dequantized weight's product: NaN where it
  has NaN, the rest within fp32-summation tolerance (the bit-exact linear contract is tested
  in the kernels' own tests on exact sums; here the bytes are arbitrary).
Then the canary: a Triton kernel that reads far past its input, which memcheck must report,
so a clean run is known to have been watched. `--no-canary` leaves it out.
"""

import sys

import torch
import torch.nn.functional as F

from torchmx import MXTensor, dtypes
from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import MXInferenceLinear
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference

from formats import every_custom_format

SCALE_MODES = ("floor", "ceil", "even", "rceil")
ROUNDINGS = ("even", "away", "toward_zero", "trunc", "stochastic")
DEVICE = "cuda"  # `--device cpu` runs the same sweep through the C kernels (a dry run)
LINEAR_FORMATS = ("float4_e2m1", "float6_e2m3", "float6_e3m2", "float8_e4m3", "float8_e5m2",
                  "int8")


FORMATS = list(dtypes.SUPPORTED_ELEM_DTYPES) + every_custom_format()


def _raw(shape, dtype, gen):
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
    info = torch.iinfo(bits)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(bits).view(dtype)


def _same_bits(got, expected, what):
    got, expected = got.cpu(), expected.cpu()
    if got.dtype.is_floating_point:
        width = {4: torch.int32, 2: torch.int16}[got.element_size()]
        nan = torch.isnan(expected)
        ok = torch.equal(torch.isnan(got), nan) and torch.equal(
            got.masked_fill(nan, 0).view(width), expected.masked_fill(nan, 0).view(width))
    else:
        ok = torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    if not ok:
        raise AssertionError(f"{what}: the CUDA result differs from the reference")


BUILTIN = set(dtypes.SUPPORTED_ELEM_DTYPES)
QUANTIZE_LAYOUTS = ((torch.bfloat16, (3, 97), -1, 32), (torch.float32, (67, 5), 0, 16),
                    (torch.float16, (1, 33), -1, 32))
DEQUANTIZE_LAYOUTS = ((97, -1, 32), (64, -1, 1), (45, 0, 96))
TARGETS = (torch.float32, torch.bfloat16, torch.float16)


def _quantize_cases():
    """Built-in formats: every scale mode with every rounding; custom widths: two of each, in
    turn (every kernel specialization costs a compile under the sanitizer)."""
    for i, fmt in enumerate(FORMATS):
        if fmt in BUILTIN:
            combos = [(m, r) for m in SCALE_MODES for r in ROUNDINGS]
        else:
            combos = [(SCALE_MODES[i % 4], ROUNDINGS[i % 5]),
                      (SCALE_MODES[(i + 1) % 4], ROUNDINGS[(i + 2) % 5])]
        for j, (mode, rounding) in enumerate(combos):
            yield (fmt, mode, rounding) + QUANTIZE_LAYOUTS[(i + j) % len(QUANTIZE_LAYOUTS)]


def sweep_quantize(gen):
    count = 0
    for fmt, mode, rounding, dtype, shape, axis, block in _quantize_cases():
        x = _raw(shape, dtype, gen)
        seed = 1234 if rounding == "stochastic" else None
        scale, data = torch.ops.torchmx.quantize_mx(
            x.to(DEVICE), fmt.name, block, scale_mode=mode, rounding=rounding, block_dim=axis,
            seed=seed)
        ref_scale, ref_data = quantize_mx_reference(
            x, fmt, block, scale_mode=mode, rounding=rounding, block_dim=axis, seed=seed)
        what = f"quantize {fmt.name} {mode} {rounding} {dtype} {shape} axis {axis}"
        _same_bits(scale, ref_scale, what + " scales")
        _same_bits(data, ref_data, what + " codes")
        count += 1
    return count


def _dequantize_cases():
    """Built-in formats: every layout to every target dtype; custom widths: each layout once."""
    for i, fmt in enumerate(FORMATS):
        for j, layout in enumerate(DEQUANTIZE_LAYOUTS):
            targets = TARGETS if fmt in BUILTIN else (TARGETS[(i + j) % 3],)
            for target in targets:
                yield (fmt, target) + layout


def sweep_dequantize(gen):
    count = 0
    for fmt, target, n, axis, block in _dequantize_cases():
        rows, groups = 3, -(-n // block)
        packed = {4: -(-n // 2), 6: -(-n // 4) * 3}.get(fmt.bits, n)
        data_shape = (rows, packed) if axis == -1 else (packed, rows)
        scale_shape = (rows, groups) if axis == -1 else (groups, rows)
        # every byte value, the bits above a narrow format's width included
        data = torch.randint(0, 256, data_shape, generator=gen, dtype=torch.uint8)
        scale = torch.randint(0, 256, scale_shape, generator=gen, dtype=torch.uint8)
        scale.view(-1)[:3] = torch.tensor([0, 254, 255], dtype=torch.uint8)
        data = data.view(fmt.storage_dtype)
        got = torch.ops.torchmx.dequantize_mx(
            data.to(DEVICE), scale.to(DEVICE), fmt.name, block, target, axis, block_dim_size=n)
        expected = dequantize_mx_reference(
            data, scale, fmt, block, target, block_dim=axis, block_dim_size=n)
        _same_bits(got, expected, f"dequantize {fmt.name} n {n} axis {axis} block {block} {target}")
        count += 1
    return count


def _crafted_weight(fmt, n, k, gen):
    """An MXTensor [n, k] (bf16 logical) of arbitrary code bytes and scales 100..140 and 255."""
    w = MXTensor.to_mx(torch.randn(n, k, generator=gen).to(DEVICE).bfloat16(), fmt)
    data = torch.randint(0, 256, w._data.shape, generator=gen, dtype=torch.uint8)
    scale = torch.randint(100, 141, w._scale_e8m0.shape, generator=gen, dtype=torch.uint8)
    scale.view(-1)[::97] = 255
    return w._replace(scale.to(DEVICE), data.to(DEVICE).view(w._data.dtype))


def _check_linear(got, x, w, what, expected=None):
    if expected is None:
        expected = x.float() @ w.dequantize(torch.float32).t()
    got = got.float()
    nan = torch.isnan(expected)
    if not torch.equal(torch.isnan(got), nan):
        raise AssertionError(f"{what}: NaNs where the dequantized product has none, or missing")
    torch.testing.assert_close(got.masked_fill(nan, 0), expected.masked_fill(nan, 0),
                               rtol=2e-2, atol=1e-2 * expected.masked_fill(nan, 0).abs().max().item()
                               + 1e-6, msg=what)


def sweep_linear(gen):
    count = 0
    for fmt in LINEAR_FORMATS:
        w = _crafted_weight(fmt, 192, 384, gen)
        for rows in (1, 2, 5, 16, 33, 64, 130, 1100):
            x = torch.randn(rows, 384, generator=gen).to(DEVICE).bfloat16()
            with torch.no_grad():
                got = F.linear(x, w)
            _check_linear(got, x, w, f"F.linear {fmt} rows {rows}")
            count += 1
    return count


def sweep_routed(gen):
    """torchmx::mx_routed_linear (gpt-oss experts) on crafted codes and scales, with expert
    indices in range, at the ends, far outside it and negative: rows of bad indices are NaN."""
    op = torch.ops.torchmx.mx_routed_linear.default
    count = 0
    for E, N, K in ((4, 64, 256), (3, 40, 96)):
        w = _crafted_weight("float4_e2m1", E * N, K, gen)
        scale, data = w._scale_e8m0.view(E, N, -1), w._data.view(torch.uint8).view(E, N, -1)
        for tokens, top_k in ((1, 4), (5, 2), (16, 4)):
            x = torch.randn(tokens, K, generator=gen).to(DEVICE).bfloat16()
            experts = torch.randint(0, E, (tokens, top_k), generator=gen)
            experts.view(-1)[::3] = torch.tensor([-1, E, 1 << 40, E - 1])[
                torch.arange(experts.view(-1)[::3].numel()) % 4]
            experts = experts.to(DEVICE)
            bad = (experts.view(-1) < 0) | (experts.view(-1) >= E)
            if DEVICE == "cpu":
                continue  # the operator refuses bad indices on CPU (a ValueError)
            with torch.no_grad():
                got = op(x, experts, scale, data, "float4_e2m1", 32, None, top_k, None, None)
            if not torch.isnan(got[bad]).all():
                raise AssertionError(f"routed E {E} N {N} K {K}: a bad index gave numbers")
            good = experts.view(-1).clamp(0, E - 1)
            rows = x.repeat_interleave(top_k, 0).float()
            expected = torch.einsum("pk,pnk->pn", rows, w.dequantize(torch.float32).view(E, N, K)[good])
            _check_linear(got[~bad], rows[~bad], None, f"routed E {E} rows {tokens}x{top_k}",
                          expected=expected[~bad])
            count += 1
    return count


def sweep_prepacked(gen):
    count, layouts = 0, set()
    for fmt in LINEAR_FORMATS:
        for n, k in ((1024, 4096), (4096, 1024), (128, 256)):
            cfg = QLinearConfig(MXConfig(fmt))
            layer = MXInferenceLinear.from_float(torch.nn.Linear(k, n).to(DEVICE).bfloat16(), cfg)
            w = _crafted_weight(fmt, n, k, gen)
            layer.weight_scale, layer.weight_data = w._scale_e8m0, w._data.view(torch.uint8)
            try:
                layer.prepack()
            except ValueError:  # no prepacked layout for this shape and format
                continue
            layouts.add(layer._fragment_layout)
            for rows in (1, 2, 7, 16, 64, 65):
                x = torch.randn(rows, k, generator=gen).to(DEVICE).bfloat16()
                with torch.no_grad():
                    got = layer(x)
                _check_linear(got - layer.bias, x, layer.weight, f"prepacked {fmt} [{n}, {k}] rows {rows}")
                count += 1
    return count, sorted(layouts)


def canary():
    """Read 1 TiB past a 4-byte tensor, where nothing is allocated: memcheck must report it."""
    import triton
    import triton.language as tl

    @triton.jit
    def _read_far(src, dst):
        tl.store(dst, tl.load(src + (1 << 38)))

    src = torch.zeros(1, dtype=torch.float32, device="cuda")
    dst = torch.empty(1, dtype=torch.float32, device="cuda")
    _read_far[(1,)](src, dst)
    torch.cuda.synchronize()


def main(argv):
    global DEVICE
    if "--device" in argv:
        DEVICE = argv[argv.index("--device") + 1]
    gen = torch.Generator().manual_seed(0)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    print(f"quantize cases: {sweep_quantize(gen)}", flush=True)
    print(f"dequantize cases: {sweep_dequantize(gen)}", flush=True)
    print(f"F.linear cases: {sweep_linear(gen)}", flush=True)
    print(f"routed experts cases: {sweep_routed(gen)}", flush=True)
    count, layouts = sweep_prepacked(gen)
    print(f"prepacked cases: {count}, layouts: {', '.join(layouts) or 'none'}", flush=True)
    if DEVICE == "cuda":
        from torchmx.kernels.linear import stream_matmul
        if stream_matmul.usable_on(torch.device("cuda")) and "stream" not in layouts:
            raise AssertionError("the TMA stream layout is usable on this GPU but no case reached it")
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    print("sweep done", flush=True)
    if DEVICE == "cuda" and "--no-canary" not in argv:
        canary()
        print("canary ran", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

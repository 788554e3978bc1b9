"""GPU quantize / dequantize throughput of torchmx's Triton kernels, next to a device copy and
the baselines, measured side by side in one run.

    python benchmarks/bench_gpu_quantize.py                 # the table (16384 x 8192 bf16)
    python benchmarks/bench_gpu_quantize.py --quick         # fewer cases, no baselines
    python benchmarks/bench_gpu_quantize.py --sweep         # try tile configurations first
    python benchmarks/bench_gpu_quantize.py --input-dtype fp16   # fp16 (or fp32) input

Each case first checks its output against the reference numerics (bit for bit, on a slice of
rows computed on CPU), then times it with triton.testing.do_bench_cudagraph (median over
replays of a CUDA graph of many calls: device time, without the host's launch work).
Bandwidth counts the bytes a perfect kernel moves: the input read once and every output
written once. "copy" is an elementwise kernel writing the input's bits to another buffer
(x * 1), timed the same way; the target is 90% of it (85% for the fused row + column pass).
Where a case runs on a pair kernel (_tl_quantize_pairs), a "quant elem" / "fused elem"
row follows it: the same case on the per-element kernel, checked equal, for comparison.

Baselines, where they run: torch.compile of the reference numerics (quantize_mx_reference /
dequantize_mx_reference), torchao's to_mx / to_dtype under torch.compile (--torchao-path, a
folder holding torchao 0.18), and torchmx 0.1.0 (--torchmx010-path, a folder holding torchmx
0.1.0 and torchao 0.6.1; it registers the same op names, so it runs in a subprocess). A column
shows "n/a" with a reason where a baseline cannot run a case, "-" where it was not measured.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import textwrap

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402

from torchmx import dtypes  # noqa: E402
from torchmx.kernels.quantize import triton_backend as tb  # noqa: E402
from torchmx.numerics import SCALE_MODES, dequantize_mx_reference, quantize_mx_reference  # noqa: E402
from torchmx.numerics.packing import packed_length  # noqa: E402

FORMATS = [dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.float6_e3m2, dtypes.float6_e2m3,
           dtypes.float4_e2m1, dtypes.int8]
BLOCK = 32
INPUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CHECK_ROWS = 256  # rows (8 blocks along dim 0) compared with the CPU reference


def bench(fn) -> float:
    """Milliseconds of fn() on the device: the median over replays of a CUDA graph of many
    calls. Device time only: launched one by one, a call's host work (Python, allocation,
    Triton's launch) took about as long as its kernel, or longer, on the H100 host at this
    size, leaving the GPU idle, which do_bench (one call per L2 flush) then counted.
    Functions that cannot be captured (some baselines) fall back to do_bench, with a note."""
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception as error:  # noqa: BLE001 - e.g. a baseline that syncs with the host
        print(f"  (timed without a CUDA graph: {type(error).__name__})")
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def make_input(rows, cols, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, cols, device="cuda", generator=g)
    spread = torch.randint(-8, 8, (rows, 1), device="cuda", generator=g).float()
    return (x * torch.exp2(spread)).to(dtype)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def gbps(num_bytes, ms) -> float:
    return num_bytes / ms / 1e6


def check_quantize(x, fmt, scale_mode, axis, got):
    ref = quantize_mx_reference(x[:CHECK_ROWS].cpu(), fmt, BLOCK, scale_mode=scale_mode,
                                block_dim=axis)
    lengths = ((CHECK_ROWS, CHECK_ROWS) if axis == -1 else
               (CHECK_ROWS // BLOCK, packed_length(CHECK_ROWS, fmt)))
    for r, g, n in zip(ref, got, lengths):
        if not torch.equal(r, g[:n].cpu()):
            raise AssertionError(f"quantize {fmt.name} {scale_mode} axis={axis}: kernel differs "
                                 "from the reference")


def check_dequantize(scale, data, fmt, axis, out):
    if axis == 0:
        s, d = scale[:CHECK_ROWS // BLOCK], data[:packed_length(CHECK_ROWS, fmt)]
    else:
        s, d = scale[:CHECK_ROWS], data[:CHECK_ROWS]
    ref = dequantize_mx_reference(d.cpu(), s.cpu(), fmt, BLOCK, out.dtype, axis,
                                  block_dim_size=CHECK_ROWS if axis == 0 else out.shape[1])
    got = out[:CHECK_ROWS].cpu()
    same = (ref.view(torch.int16) == got.view(torch.int16)) | (ref.isnan() & got.isnan())
    if not bool(same.all()):
        raise AssertionError(f"dequantize {fmt.name} axis={axis}: kernel differs from the reference")


# ---------------------------------------------------------------------------------- baselines

def compiled_reference_quantize(fmt, scale_mode, axis):
    def f(x):
        return quantize_mx_reference(x, fmt, BLOCK, scale_mode=scale_mode, block_dim=axis)
    return torch.compile(f)


def compiled_reference_dequantize(fmt, axis, n):
    def f(data, scale):
        return dequantize_mx_reference(data, scale, fmt, BLOCK, torch.bfloat16, axis,
                                       block_dim_size=n)
    return torch.compile(f)


class TorchAO:
    """torchao's to_mx / to_dtype under torch.compile (last-dim blocks only)."""

    ELEM = {"float8_e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
            "float4_e2m1": "float4_e2m1fn_x2"}

    def __init__(self, path):
        self.error = None
        try:
            if path:
                sys.path.insert(0, path)
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
            import torchao
            self.version = torchao.__version__
            self.modes = {"floor": ScaleCalculationMode.FLOOR, "ceil": ScaleCalculationMode.CEIL,
                          "even": ScaleCalculationMode.EVEN, "rceil": ScaleCalculationMode.RCEIL}
            self.to_mx, self.to_dtype = to_mx, to_dtype
        except Exception as error:  # not installed, or does not import with this torch
            self.error = f"{type(error).__name__}: {error}"[:120]

    def _unsupported(self, fmt, axis):
        """Why torchao cannot run this case, or None."""
        if self.error:
            return "not available (" + self.error + ")"
        if axis != -1:
            return "last-dim blocks only"
        if fmt.name not in self.ELEM:
            return "format not in torchao"
        return None

    def quantize(self, fmt, scale_mode, axis):
        if self._unsupported(fmt, axis):
            return None, self._unsupported(fmt, axis)
        elem = getattr(torch, self.ELEM[fmt.name])
        mode = self.modes[scale_mode]
        fn = torch.compile(lambda x: self.to_mx(x, elem, BLOCK, mode))
        return fn, None

    def dequantize(self, fmt, axis):
        if self._unsupported(fmt, axis):
            return None, self._unsupported(fmt, axis)
        elem = getattr(torch, self.ELEM[fmt.name])
        fn = torch.compile(lambda d, s: self.to_dtype(d, s, elem, BLOCK, torch.bfloat16))
        return (fn, elem), None


TORCHMX010_SCRIPT = textwrap.dedent("""
    import json, sys, torch, triton
    import torchmx
    rows, cols = int(sys.argv[1]), int(sys.argv[2])
    out = {"version": getattr(torchmx, "__version__", "0.1.0")}
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(rows, cols, device="cuda", generator=g)).to(torch.bfloat16)
    for name in ("float8_e4m3", "float8_e5m2", "float6_e3m2", "float6_e2m3", "float4_e2m1", "int8"):
        try:
            q = lambda: torch.ops.torchmx.quantize_mx(x, name, 32)
            scale, data = q()
            ms = triton.testing.do_bench(q, warmup=10, rep=100, return_mode="median")
            nb = x.numel() * 2 + scale.numel() + data.numel() * data.element_size()
            out["q_" + name] = nb / ms / 1e6
            d = lambda: torch.ops.torchmx.dequantize_mx(data, scale, name, 32, torch.bfloat16, -1)
            y = d()
            ms = triton.testing.do_bench(d, warmup=10, rep=100, return_mode="median")
            nb = scale.numel() + data.numel() * data.element_size() + y.numel() * y.element_size()
            out["d_" + name] = nb / ms / 1e6
        except Exception as error:
            out["error_" + name] = (type(error).__name__ + ": " + str(error))[:100]
    print("JSON" + json.dumps(out))
""")


def torchmx010(path, rows, cols):
    """{'q_<fmt>': GB/s, 'd_<fmt>': GB/s} from torchmx 0.1.0 in a subprocess, or an error."""
    if not path:
        return {"error": "not installed (pass --torchmx010-path)"}
    env = dict(os.environ, PYTHONPATH=path)
    try:
        run = subprocess.run([sys.executable, "-c", TORCHMX010_SCRIPT, str(rows), str(cols)],
                             env=env, capture_output=True, text=True, timeout=900,
                             cwd="/")
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    for line in run.stdout.splitlines():
        if line.startswith("JSON"):
            return json.loads(line[4:])
    tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": tail[0][:120]}


# -------------------------------------------------------------------------------------- main

def fmt_ratio(ours, other):
    if isinstance(other, str):
        return other
    if other is None:
        return "-"
    return f"{ours / other:.2f}x"


def run_sweep(x, kinds=None, sweep_formats=None):
    """Time a few tile configurations per kernel (summed over `sweep_formats`, by default fp8,
    fp6 e2m3, fp4 and MXINT8); print the best (they can be copied into
    triton_backend.TUNING)."""
    rows_like = [dict(elements=e, columns=c, num_warps=w) for e, c, w in
                 ((4096, 128, 4), (8192, 256, 8), (16384, 256, 8), (16384, 512, 16))]
    thread_like = [dict(blocks=b, row_blocks=r, num_warps=w) for b, r, w in
                   ((128, 32, 4), (256, 32, 4), (256, 32, 8), (512, 32, 8), (256, 64, 4))]
    variants = {
        "quantize_rows_thread": thread_like,
        # enabled=0: the per-element kernel (quantize_rows_thread), timed side by side.
        "quantize_rows_pairs": [dict(cfg, enabled=1) for cfg in thread_like]
        + [dict(thread_like[0], enabled=0)],
        "quantize_cols": [dict(elements_per_thread=e, num_warps=w) for e, w in
                          ((64, 4), (64, 2), (32, 4), (128, 4))],
        "dequantize_rows": rows_like,
        "dequantize_cols": [dict(elements=e, columns=c, num_warps=w) for e, c, w in
                            ((8192, 256, 4), (8192, 128, 8), (16384, 256, 8), (4096, 64, 4))],
        "quantize_fused": [dict(row_blocks=r, col_blocks=c, vec=v, num_warps=w, encode=e, maxnreg=m)
                           for r, c, v, w, e, m in
                           ((1, 2, 8, 1, 2, 168), (1, 2, 8, 1, 0, 0), (1, 2, 8, 1, 2, 0),
                            (1, 2, 8, 1, 2, 144), (1, 1, 8, 1, 2, 168), (1, 4, 8, 2, 2, 168),
                            (2, 2, 8, 2, 2, 168), (1, 8, 2, 4, 2, 168))],
        # enabled=0: the per-element fused kernel, timed side by side with the pair kernel.
        "quantize_fused_pairs": [dict(row_blocks=r, col_blocks=c, vec=v, num_warps=w,
                                      maxnreg=m, enabled=e)
                                 for r, c, v, w, m, e in
                                 ((1, 8, 4, 4, 128, 1), (1, 8, 4, 4, 128, 0),
                                  (1, 8, 4, 4, 0, 1), (1, 4, 4, 2, 128, 1), (1, 2, 4, 1, 128, 1),
                                  (2, 4, 4, 4, 128, 1), (1, 16, 4, 8, 128, 1),
                                  (1, 8, 4, 4, 96, 1))],
        "dequantize_fp6_rows": [dict(chunks=c, row_chunks=r, num_warps=w) for c, r, w in
                                ((512, 128, 4), (256, 128, 4), (1024, 128, 8), (512, 64, 4))],
    }
    if kinds:
        variants = {k: v for k, v in variants.items() if k in kinds}
    formats = [dtypes.float8_e4m3, dtypes.float6_e2m3, dtypes.float4_e2m1, dtypes.int8]
    if sweep_formats:
        formats = sweep_formats
    best = {}
    for kind, configs in variants.items():
        saved = dict(tb.TUNING[kind])
        results = []
        for cfg in configs:
            tb.TUNING[kind] = cfg
            total = 0.0
            each = []
            try:
                for fmt in formats:
                    if kind == "dequantize_fp6_rows" and fmt.codes_per_group != 4:
                        continue
                    if kind.startswith("quantize_fused"):
                        ms = bench(lambda: tb.quantize_rowwise_colwise(x, fmt, BLOCK, "floor", "even", None))
                    elif kind.startswith("quantize"):
                        axis = 0 if kind.endswith("cols") else 1
                        ms = bench(lambda: tb.quantize(x, fmt, BLOCK, "floor", "even", axis, None))
                    else:
                        axis = 0 if kind.endswith("cols") else 1
                        s, d = tb.quantize(x, fmt, BLOCK, "floor", "even", axis, None)
                        ms = bench(lambda: tb.dequantize(d, s, fmt, BLOCK, torch.bfloat16, axis,
                                                         x.shape[axis]))
                    total += ms
                    each.append(f"{fmt.name} {ms * 1e3:.1f}")
            except Exception as error:  # e.g. too many registers for a configuration
                print(f"sweep {kind} {cfg}: {type(error).__name__}")
                continue
            results.append((total, cfg, each))
        tb.TUNING[kind] = saved
        results.sort(key=lambda r: r[0])
        best[kind] = results[0][1]
        print(f"sweep {kind}:\n" + "\n".join(f"  {c} {t:.3f} ms ({', '.join(e)} us)"
                                             for t, c, e in results))
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--quick", action="store_true", help="fewer cases, no baselines")
    parser.add_argument("--sweep", action="store_true", help="tune tile shapes first")
    parser.add_argument("--sweep-kinds", default=None,
                        help="comma-separated TUNING kinds to sweep (default: all)")
    parser.add_argument("--torchao-path", default=None)
    parser.add_argument("--torchmx010-path", default=None)
    parser.add_argument("--formats", default=None,
                        help="comma-separated format names (default: all six; also what "
                             "--sweep times)")
    parser.add_argument("--ops", default="quantize,dequantize,fused",
                        help="comma-separated subset of quantize, dequantize, fused")
    parser.add_argument("--modes", default=None,
                        help="comma-separated scale modes (default: all four; --quick: floor, rceil)")
    parser.add_argument("--input-dtype", default="bf16", choices=sorted(INPUT_DTYPES),
                        help="dtype of the input (the targets are stated for bf16)")
    parser.add_argument("--no-baselines", action="store_true", help="time torchmx only")
    parser.add_argument("--json", default=None, help="write the rows here as JSON")
    args = parser.parse_args()

    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}; triton {triton.__version__}; "
          f"date {datetime.date.today().isoformat()}")
    rows, cols = args.rows, args.cols
    x = make_input(rows, cols, INPUT_DTYPES[args.input_dtype])
    y = torch.empty_like(x)
    # The copy is an elementwise kernel (x * 1, the same bits): a captured y.copy_(x) becomes a
    # graph memcpy node, which ran well below the same copy outside a graph for the fp32 input
    # on an H100 (perhaps a copy engine instead of the SMs); the latter is printed for
    # reference.
    copy_ms = bench(lambda: torch.mul(x, 1, out=y))
    copy_gbps = gbps(2 * nbytes(x), copy_ms)
    memcpy_gbps = gbps(2 * nbytes(x), triton.testing.do_bench(lambda: y.copy_(x), warmup=25,
                                                              rep=100, return_mode="median"))
    print(f"input {rows}x{cols} {args.input_dtype}; device copy {copy_gbps:.0f} GB/s "
          f"({2 * nbytes(x) / 1e6:.0f} MB in {copy_ms * 1e3:.1f} us; y.copy_(x) outside a "
          f"graph {memcpy_gbps:.0f} GB/s)")

    if args.sweep:
        best = run_sweep(x, args.sweep_kinds.split(",") if args.sweep_kinds else None,
                         [dtypes.from_name(n) for n in args.formats.split(",")]
                         if args.formats else None)
        for kind, cfg in best.items():
            tb.TUNING[kind] = cfg
        print("using", json.dumps(best))

    baselines = not (args.quick or args.no_baselines)
    ao = TorchAO(args.torchao_path) if baselines else None
    old = torchmx010(args.torchmx010_path, rows, cols) if baselines else {}
    old_note = old.get("error")
    if ao is not None and ao.error:
        print(f"torchao: n/a ({ao.error})")
    if baselines and old_note:
        print(f"torchmx 0.1.0: n/a ({old_note})")

    formats = FORMATS if not args.quick else [dtypes.float8_e4m3, dtypes.float6_e2m3,
                                               dtypes.float4_e2m1]
    if args.formats:
        formats = [dtypes.from_name(name) for name in args.formats.split(",")]
    modes = SCALE_MODES if not args.quick else ["floor", "rceil"]
    if args.modes:
        modes = args.modes.split(",")
    ops = set(args.ops.split(","))
    table = []

    def add(op, fmt, mode, axis, num_bytes, ms, ref=None, tao=None, t010=None):
        g = gbps(num_bytes, ms)
        row = dict(op=op, format=fmt.name, scale_mode=mode, axis=axis, gbps=g,
                   copy_fraction=g / copy_gbps,
                   vs_compiled_ref=ref if isinstance(ref, str) else (g / ref if ref else None),
                   vs_torchao=tao if isinstance(tao, str) else (g / tao if tao else None),
                   vs_torchmx010=t010 if isinstance(t010, str) else (g / t010 if t010 else None))
        table.append(row)
        print(f"{op:10s} {fmt.name:12s} {mode:6s} axis={axis:2d} {g:7.0f} GB/s "
              f"{100 * g / copy_gbps:5.1f}% of copy | vs compiled ref {fmt_ratio(g, ref)} | "
              f"vs torchao {fmt_ratio(g, tao)} | vs torchmx 0.1.0 {fmt_ratio(g, t010)}",
              flush=True)

    def element_kernel_row(op, kind, fmt, mode, axis, fn, expected):
        """Time `fn` again with pair kernel `kind` disabled, i.e. on the per-element kernel
        (same outputs, checked), for comparison; not in the summary."""
        saved = tb.TUNING[kind]
        tb.TUNING[kind] = dict(saved, enabled=0)
        try:
            if not all(torch.equal(a, b) for a, b in zip(fn(), expected)):
                raise AssertionError(f"{op} {fmt.name} {mode}: kernels differ")
            add(op, fmt, mode, axis, nbytes(x, *expected), bench(fn))
        finally:
            tb.TUNING[kind] = saved

    baseline_formats = {"float8_e4m3", "float4_e2m1"}
    for fmt in formats:
        for axis in (-1, 0) if "quantize" in ops else ():
            for mode in modes:
                fn = lambda: tb.quantize(x, fmt, BLOCK, mode, "even", axis % 2, None)  # noqa: E731
                scale, data = fn()
                check_quantize(x, fmt, mode, axis, (scale, data))
                ms = bench(fn)
                num_bytes = nbytes(x, scale, data)
                ref = tao = t010 = None
                if baselines and mode == "floor" and fmt.name in baseline_formats:
                    try:
                        c = compiled_reference_quantize(fmt, mode, axis)
                        c(x)
                        ref = gbps(num_bytes, bench(lambda: c(x)))
                    except Exception as error:
                        ref = f"n/a ({type(error).__name__})"
                if baselines and fmt.name in baseline_formats and mode in ("floor", "rceil"):
                    f, why = ao.quantize(fmt, mode, axis)
                    if f is None:
                        tao = f"n/a ({why})" if ao.error is None else "n/a"
                    else:
                        try:
                            f(x)
                            tao = gbps(num_bytes, bench(lambda: f(x)))
                        except Exception as error:
                            tao = f"n/a ({type(error).__name__})"
                if baselines and mode == "floor":
                    if axis != -1:
                        t010 = "n/a (last dim only)"
                    elif old_note:
                        t010 = "n/a"
                    else:
                        t010 = old.get("q_" + fmt.name, "n/a")
                add("quantize", fmt, mode, axis, num_bytes, ms, ref, tao, t010)
                if axis == -1 and tb._pairs_apply(*tb._view_rows(x, 1), fmt, "even",
                                                  "quantize_rows_pairs"):
                    element_kernel_row("quant elem", "quantize_rows_pairs", fmt, mode, axis, fn,
                                       (scale, data))
        for axis in (-1, 0) if "dequantize" in ops else ():
            scale, data = tb.quantize(x, fmt, BLOCK, "floor", "even", axis % 2, None)
            n = x.shape[axis]
            fn = lambda: tb.dequantize(data, scale, fmt, BLOCK, torch.bfloat16, axis % 2, n)  # noqa: E731
            out = fn()
            check_dequantize(scale, data, fmt, axis, out)
            ms = bench(fn)
            num_bytes = nbytes(scale, data, out)
            ref = tao = t010 = None
            if baselines and fmt.name in baseline_formats:
                try:
                    c = compiled_reference_dequantize(fmt, axis, n)
                    c(data, scale)
                    ref = gbps(num_bytes, bench(lambda: c(data, scale)))
                except Exception as error:
                    ref = f"n/a ({type(error).__name__})"
                got, why = ao.dequantize(fmt, axis)
                if got is None:
                    tao = f"n/a ({why})" if ao.error is None else "n/a"
                else:
                    f, elem = got
                    try:
                        s_ao, d_ao = ao.to_mx(x, elem, BLOCK)
                        f(d_ao, s_ao)
                        tao = gbps(num_bytes, bench(lambda: f(d_ao, s_ao)))
                    except Exception as error:
                        tao = f"n/a ({type(error).__name__})"
            if baselines:
                t010 = ("n/a (last dim only)" if axis != -1 else
                        "n/a" if old_note else old.get("d_" + fmt.name, "n/a"))
            add("dequantize", fmt, "-", axis, num_bytes, ms, ref, tao, t010)
            del out
        for mode in (modes[:2] if not args.quick else modes[:1]) if "fused" in ops else ():
            fn = lambda: tb.quantize_rowwise_colwise(x, fmt, BLOCK, mode, "even", None)  # noqa: E731
            (sr, dr), (sc, dc) = fn()
            for (s1, d1), axis in (((sr, dr), 1), ((sc, dc), 0)):
                s2, d2 = tb.quantize(x, fmt, BLOCK, mode, "even", axis, None)
                if not (torch.equal(s1, s2) and torch.equal(d1, d2)):
                    raise AssertionError(f"fused {fmt.name} {mode}: differs from the single pass")
            check_quantize(x, fmt, mode, -1, (sr, dr))
            ms = bench(fn)
            add("fused r+c", fmt, mode, -1, nbytes(x, sr, dr, sc, dc), ms,
                "-" if baselines else None)
            if tb._pairs_apply(*tb._view_cols(x, 0), fmt, "even", "quantize_fused_pairs"):
                element_kernel_row("fused elem", "quantize_fused_pairs", fmt, mode, -1,
                                   lambda: sum(fn(), ()), (sr, dr, sc, dc))

    # Summary against the targets.
    worst = {}
    for row in table:
        if row["op"] in ("fused elem", "quant elem"):
            continue
        key = row["op"]
        if key not in worst or row["copy_fraction"] < worst[key]["copy_fraction"]:
            worst[key] = row
    print(f"\nsummary ({device}, {datetime.date.today().isoformat()}, copy {copy_gbps:.0f} GB/s):")
    for key, row in worst.items():
        target = 0.85 if key == "fused r+c" else 0.90
        status = "meets" if row["copy_fraction"] >= target else "MISSES"
        print(f"  {key}: lowest {100 * row['copy_fraction']:.1f}% of copy "
              f"({row['format']} {row['scale_mode']} axis={row['axis']}), target "
              f"{100 * target:.0f}%: {status}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, date=datetime.date.today().isoformat(),
                           copy_gbps=copy_gbps, rows=table, tuning=tb.TUNING), f, indent=1)


if __name__ == "__main__":
    main()

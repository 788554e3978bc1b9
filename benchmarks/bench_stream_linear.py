"""The stream kernel (kernels/linear/stream_matmul.py, Gluon) vs the kernels it replaces (issue #7).

    python benchmarks/bench_stream_linear.py        # needs an sm_90 GPU and Triton with Gluon
    python benchmarks/bench_stream_linear.py --formats float6_e2m3 --parts check,wave

Checks first: every format through the kernel and through torch.ops.torchmx.mx_stream_linear
(the op that MXInferenceLinear.prepack() layers call; it runs the kernel for 1 (MXFP4, MXFP6)
or 2 ..64 rows and weights whose tiles fill the GPU's waves)
against the exact product, bit for bit on operands whose sums are exact. Then, at N = K =
8192, by CUDA-graph replays over 8 weight copies (microseconds per call):

- the ring configurations (slots, sub-steps a slot) at 1, 16 and 64 rows: what
  stream_matmul._PREFERRED is chosen from;
- per format and rows: the read-only floor of the weight's bytes (launched as usual and
  with PDL, reading before its wait: a floor no real kernel can reach), the stream kernel at
  its default config (PDL), the fragment (MXFP4) or piece (MXFP8, MXFP6, MXINT8) kernel (the prepacked
  copies where Triton has no Gluon; at one row the usual path, byte_gemv's one-row kernels,
  which the op keeps for one row), and cuBLAS bf16 on the unquantized weight; ratios are
  their time / the stream kernel's;
- programmatic dependent launch (StreamConfig.pdl, .prefetch) against the usual launch, at
  1, 16 and 64 rows, back to back over the 8 copies and one call a graph (nothing to overlap);
- the wave policy (stream_matmul.fills_waves): the stream kernel (K split where the tiles are
  few: stream_matmul.split_k) against the kernel it would replace on Llama-3-8B's projections,
  with the CTAs' fill of their waves and the policy's choice; for the split shapes also the
  kernel unsplit.
"""

import argparse
import dataclasses
import datetime
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gpu_matmul import (ROTATE, check, make_weights, prepacked_kernel_runs,  # noqa: E402
                              prepacked_linear, prepacked_parts, read_floor_us)
from torchmx import MXTensor, dtypes  # noqa: E402
from torchmx.kernels.layouts import tma_stream_layout  # noqa: E402
from torchmx.kernels.linear import stream_matmul  # noqa: E402
from torchmx.mx_ops import stream_linear as stream_op  # noqa: E402
from _timing import graph_time_us, interleaved_us  # noqa: E402

FORMATS = [dtypes.float4_e2m1, dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.int8,
           dtypes.float6_e2m3, dtypes.float6_e3m2]
# formats timed at every row count (the others at 16 rows): one of each decode
ALL_ROWS = (dtypes.float4_e2m1, dtypes.float8_e4m3, dtypes.float6_e2m3)
ROWS = [1, 2, 4, 8, 16, 32, 64]
SWEEP_ROWS = [1, 16, 64]
RINGS = [(2, 2), (4, 1), (4, 2), (6, 1), (6, 2), (8, 1), (8, 2)]


def parts(w):
    """What MXInferenceLinear.prepack() makes: the stream codes, scales and split-K counters."""
    counters = torch.zeros(w.shape[0] // tma_stream_layout.CHUNK, dtype=torch.int32,
                           device=w.device)
    return (*tma_stream_layout.pack(w._scale_e8m0, w._data, w.elem_dtype), counters)


def stream_op_call(x, w, p, bias=None):
    return torch.ops.torchmx.mx_stream_linear(x, *p, w._scale_e8m0, w._data, w.elem_dtype.name,
                                              w.shape[1], bias, x.dtype)


def kernel_call(x, w, p, bias=None, config=None):
    codes, scales, counters = p
    return stream_matmul.stream_linear(x, codes, scales, w._scale_e8m0, w._data, w.elem_dtype,
                                       bias, x.dtype, config, counters)


def check_all(formats):
    torch.manual_seed(0)
    for fmt in formats:
        for M, N, K in [(1, 256, 1024), (7, 320, 384), (16, 8192, 8192), (33, 128, 4096),
                        (64, 1024, 2048), (16, 1024, 4096), (2, 4096, 4096)]:
            w = MXTensor.to_mx(torch.randn(N, K, device="cuda"), fmt, 32)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
            p = parts(w)
            check(kernel_call(x, w, p, b), x, w, b, f"stream {fmt.name} {M}x{N}x{K}")
            runs = (M in stream_op.STREAM_ROWS[fmt.codes_per_group]
                    and stream_matmul.fills_waves(fmt, N, K, x.device, M))
            assert stream_op.uses_stream_kernel(x, w._scale_e8m0, fmt, torch.bfloat16) == runs
            check(stream_op_call(x, w, p, b), x, w, b, f"op {fmt.name} {M}x{N}x{K}")
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randint(-4, 5, (16, 1024), device="cuda", generator=g).to(torch.bfloat16)
        w = MXTensor.to_mx(torch.randint(-6, 7, (512, 1024), device="cuda", generator=g)
                           .to(torch.bfloat16), fmt, 32)
        exact = (x.float() @ w.dequantize(torch.float32).t()).to(torch.bfloat16)
        if not torch.equal(kernel_call(x, w, parts(w)), exact):
            raise AssertionError(f"stream {fmt.name}: not bit-exact on exact sums")
    print("check: every format matches the exact product (bit for bit where the sums are "
          "exact), through the kernel and the op")


def sweep(N, K, formats):
    print(f"\nring configurations (slots, sub-steps), N = K = {N}: microseconds per call")
    for fmt in [f for f in ALL_ROWS if f in formats]:
        ws = make_weights(fmt, N, K, ROTATE)
        ps = [parts(w) for w in ws]
        for M in SWEEP_ROWS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            times = []
            for stages, sub in RINGS:
                cfg = stream_matmul.StreamConfig(stages, sub)
                try:
                    t = graph_time_us([lambda w=w, p=p: kernel_call(x, w, p, None, cfg)
                                       for w, p in zip(ws, ps)])
                except ValueError:  # does not fit in shared memory at these rows
                    continue
                times.append(f"({stages}, {sub}) {t:.1f}")
            default = stream_matmul.default_config(fmt, M, K)
            print(f"  {fmt.name:12s} M={M:<3d} default ({default.stages}, {default.sub}): "
                  + ", ".join(times))
        ws = ps = None  # freed before the next format (lambdas hold the names)


def table(N, K, formats):
    print(f"\nfew-row MX-weight linear, N = K = {N}: microseconds per call; ratios = their "
          f"time / the stream kernel's")
    print(f"{'format':12s} {'M':>3s} {'floor':>6s} {'PDL':>5s} {'stream':>7s} "
          f"{'previous':>17s} {'cuBLAS bf16':>16s}")
    dense = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(ROTATE)]
    for fmt in formats:
        ws = make_weights(fmt, N, K, ROTATE)
        ps = [parts(w) for w in ws]
        old = [prepacked_parts(w) for w in ws]
        floors = read_floor_us(ws), read_floor_us(ws, pdl=True)
        for M in ROWS if fmt in ALL_ROWS else [16]:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ours = graph_time_us([lambda w=w, p=p: kernel_call(x, w, p) for w, p in zip(ws, ps)])
            if prepacked_kernel_runs(fmt, M):
                name = "fragment" if fmt == dtypes.float4_e2m1 else "piece"
                previous = graph_time_us([lambda w=w, p=p: prepacked_linear(x, w, p)
                                          for w, p in zip(ws, old)])
            else:
                name = "usual"
                previous = graph_time_us([lambda w=w: F.linear(x, w) for w in ws])
            cublas = graph_time_us([lambda w=w: F.linear(x, w) for w in dense])
            print(f"{fmt.name:12s} {M:3d} {floors[0]:6.1f} {floors[1]:5.1f} {ours:7.1f} "
                  f"{name:>8s} {previous:5.1f} "
                  f"({previous / ours:.3f}x) {cublas:6.1f} ({cublas / ours:.2f}x)")
        del ws, ps, old


def wave_policy(formats):
    """The shapes behind stream_linear's wave policy: Llama-3-8B's projections (and N = K =
    8192) at the row counts where the policy's answers differ."""
    print("\nwave policy: the stream kernel vs the kernel it would replace, Llama-3-8B's shapes "
          "(interleaved rounds, median microseconds); ratio = previous / stream; 'unsplit': "
          "the stream kernel without split-K")
    print(f"{'format':12s} {'N':>6s} {'K':>6s} {'M':>3s} {'split':>5s} {'fill':>5s} "
          f"{'stream':>7s} {'unsplit':>8s} {'previous':>17s} {'ratio':>6s}  policy")
    for fmt, rows in ((dtypes.float4_e2m1, (1, 16, 64)), (dtypes.float8_e4m3, (16, 64)),
                      (dtypes.float6_e2m3, (1, 16, 64))):
        if fmt not in formats:
            continue
        for N, K in ((8192, 8192), (14336, 4096), (4096, 14336), (4096, 4096), (1024, 4096)):
            ws = make_weights(fmt, N, K, ROTATE)
            ps = [parts(w) for w in ws]
            old = [prepacked_parts(w) for w in ws]
            split = stream_matmul.split_k(N, K, ws[0].device)
            for M in rows:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                name = "fragment" if fmt == dtypes.float4_e2m1 else "piece"
                if not prepacked_kernel_runs(fmt, M):
                    name = "usual"
                variants = {
                    "stream": [lambda w=w, p=p: kernel_call(x, w, p) for w, p in zip(ws, ps)],
                    "previous": [lambda w=w, p=p: prepacked_linear(x, w, p)
                                 for w, p in zip(ws, old)]}
                if split > 1:
                    unsplit = stream_matmul.default_config(fmt, M, K)
                    variants["unsplit"] = [lambda w=w, p=p: kernel_call(x, w, p, None, unsplit)
                                           for w, p in zip(ws, ps)]
                t = {k: statistics.median(v)
                     for k, v in interleaved_us(variants, rounds=11).items()}
                fill = stream_matmul.wave_fill(N, K, x.device)
                takes = stream_matmul.fills_waves(fmt, N, K, x.device, M)
                unsplit_us = f"{t['unsplit']:8.1f}" if "unsplit" in t else f"{'-':>8s}"
                print(f"{fmt.name:12s} {N:6d} {K:6d} {M:3d} {split:5d} {fill:5.2f} "
                      f"{t['stream']:7.1f} {unsplit_us} {name:>8s} {t['previous']:6.1f} "
                      f"{t['previous'] / t['stream']:6.3f}  {'stream' if takes else name}")
            del ws, ps, old


PREFETCHES = (0, 2, 4, 8)  # stream_matmul._PREFETCH: 4


def overlap(N, K, formats):
    """The kernel launched with programmatic dependent launch (PDL: each call lets the next
    start on the SMs its CTAs leave and waits for the previous one before reading x; first
    asking L2 for its first p sub-steps of W) against the usual launch."""
    print(f"\nprogrammatic dependent launch, N = K = {N} (interleaved rounds, median "
          f"microseconds a call; floors: the read-only kernel without / with PDL); "
          f"ratio = usual / PDL; 'L2 p': p sub-steps prefetched (default "
          f"{stream_matmul.StreamConfig(2, 1).prefetch}); 'alone': one call a graph, nothing "
          f"before or after it to overlap")
    print(f"{'format':12s} {'M':>3s} {'floor':>6s} {'PDL':>5s} {'usual':>6s}  "
          + "  ".join(f"{f'L2 {p}':>14s}" for p in PREFETCHES)
          + f"  {'usual alone':>11s} {'default alone':>13s}")
    for fmt in formats:
        ws = make_weights(fmt, N, K, ROTATE)
        ps = [parts(w) for w in ws]
        floors = read_floor_us(ws), read_floor_us(ws, pdl=True)
        for M in SWEEP_ROWS if fmt in ALL_ROWS else [16]:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            default = stream_matmul.default_config(fmt, M, K, stream_matmul.split_k(N, K,
                                                                                     x.device))
            configs = {"usual": dataclasses.replace(default, pdl=False)}
            configs.update({f"L2 {p}": dataclasses.replace(default, prefetch=p)
                            for p in PREFETCHES})
            variants = {name: [lambda w=w, p=p, cfg=cfg: kernel_call(x, w, p, None, cfg)
                               for w, p in zip(ws, ps)] for name, cfg in configs.items()}
            variants["usual alone"] = [lambda: kernel_call(x, ws[0], ps[0], None,
                                                           configs["usual"])]
            variants["default alone"] = [lambda: kernel_call(x, ws[0], ps[0], None, default)]
            t = {k: statistics.median(v) for k, v in interleaved_us(variants, rounds=11).items()}
            cells = "  ".join(f"{t[name]:6.1f} ({t['usual'] / t[name]:.3f})"
                              for name in list(configs)[1:])
            print(f"{fmt.name:12s} {M:3d} {floors[0]:6.1f} {floors[1]:5.1f} {t['usual']:6.1f}  "
                  f"{cells}  {t['usual alone']:11.1f} {t['default alone']:13.1f}")
        ws = ps = None  # freed before the next format (lambdas hold the names)


PARTS = ("check", "sweep", "table", "pdl", "wave")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default=",".join(f.name for f in FORMATS),
                        help="comma-separated formats (default: all)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    args = parser.parse_args()
    formats = [dtypes.from_name(name) for name in args.formats.split(",")]
    todo = args.parts.split(",")
    if not set(todo) <= set(PARTS):
        parser.error(f"--parts: choose from {', '.join(PARTS)}, got {args.parts}")
    N = K = 8192
    print(f"stream kernel vs the kernels it replaces ({torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}, Triton {triton.__version__}, {datetime.date.today()}; "
          f"CUDA-graph replays over {ROTATE} weight copies)\n")
    if "check" in todo:
        check_all(formats)
    if "sweep" in todo:
        sweep(N, K, formats)
    if "table" in todo:
        table(N, K, formats)
    if "pdl" in todo:
        overlap(N, K, formats)
    if "wave" in todo:
        wave_policy(formats)


if __name__ == "__main__":
    main()

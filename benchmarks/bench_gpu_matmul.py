"""MX-weight matmuls on the GPU: torchmx's kernels next to cuBLAS bf16 and compiled dequantize +
mm, measured side by side in one run (issue #7).

    python benchmarks/bench_gpu_matmul.py              # check, then the table (N = K = 8192)
    python benchmarks/bench_gpu_matmul.py --sweep      # time the fused kernel's configurations
    python benchmarks/bench_gpu_matmul.py --e2e        # + decode latency of a Llama-style stack
    python benchmarks/bench_gpu_matmul.py --large-m    # only M = 8192 vs cuBLAS on deq, interleaved
    python benchmarks/bench_gpu_matmul.py --mx-gemm    # MX x MX: the x-decoding GEMM vs dequantize

Every case is first checked against the exact product (fp64 of the dequantized operands; the
fp32-accumulated result must be within a few fp32 ulps of the inner products' magnitude, and
rounded once). Times are medians over CUDA-graph replays of R calls on R different weight
copies, so the weights come from device memory, not from L2 (an fp4 8192 x 8192 weight is
34 MB; the L2 holds 50-60 MB).

Columns: "ours" (torchmx: the fused kernel for M <= SMALL_M, dequantize + cuBLAS above; the rows
"<format> prepacked" are MXInferenceLinear.prepack()'s ops, where they run their own kernels:
torchmx.mx_fp4_fragment_linear, the fp4 wgmma-layout kernel for 2..64 rows of MXFP4, and
torchmx.mx_piece_linear, mma_linear on the MMA layout for 2..64 rows of MXFP8 and MXINT8 and
1..32 of MXFP6, on sm_90),
"cuBLAS bf16" (F.linear on the unquantized bf16 weight), "compiled deq+mm" (torch.compile of
the reference dequantize followed by the matmul), "old path" (torchmx 0.2's first version:
exact fp32 dequantize, fp32 matmul), "read-only" (a Triton kernel that only reads the same
weight bytes, codes and scales, in contiguous chunks of 4-16 KiB, one per program, the best of
a few chunk sizes: the memory floor of any kernel streaming this weight here),
and for M = 8192 "cuBLAS on deq" (bf16 matmul of the already dequantized operands: the
issue's target is ours <= 1.05x of it). The dequantized operands differ by product: for MX
weights they are the bf16 activations and the dequantized weight; for MX x MX the activations
are dequantized too, so each product is timed against its own baseline.
"""

import argparse
import datetime
import itertools
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torchmx import MXTensor, dtypes  # noqa: E402
from torchmx.kernels.linear import byte_gemv, fp4_wgmma_matmul as fm, mma_linear  # noqa: E402
from torchmx.kernels.layouts import fp4_wgmma_layout  # noqa: E402
from torchmx.kernels.linear import dispatch as km, mx_gemm  # noqa: E402
from torchmx.kernels.layouts import mma_layout  # noqa: E402
from torchmx.mx_ops import fragment_linear as fragment_op, piece_linear as piece_op  # noqa: E402
from torchmx.numerics import dequantize_mx_reference  # noqa: E402
from _timing import graph_time_us, interleaved_us, ratio_stats  # noqa: E402

FORMATS = [dtypes.float4_e2m1, dtypes.float8_e4m3, dtypes.float8_e5m2, dtypes.float6_e2m3,
           dtypes.float6_e3m2, dtypes.int8]
PIECE_FORMATS = [f for f in FORMATS if f != dtypes.float4_e2m1]  # prepacked: the MMA layout
ROTATE = 8  # weight copies per graph: 8 x 34 MB (fp4) is far beyond the L2


def make_weights(fmt, N, K, copies, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(copies):
        w = torch.randn(N, K, device="cuda", generator=g, dtype=dtype)
        out.append(MXTensor.to_mx(w, fmt, 32))
    return out


def exact_linear(x, w_mx, bias=None):
    """fp64 product of the exact operands (the oracle), as fp64."""
    w = w_mx.dequantize(torch.float32).double()
    out = x.double() @ w.t()
    return out if bias is None else out + bias.double()


def check(out, x, w_mx, bias=None, name=""):
    """The result equals the exact product up to fp32 accumulation (a few ulps of the sum of
    |terms|) plus one rounding to out's dtype."""
    exact = exact_linear(x, w_mx, bias)
    magnitude = x.double().abs() @ w_mx.dequantize(torch.float32).double().abs().t()
    k = x.shape[-1]
    fp32_bound = magnitude * (k * 2.0 ** -24) + 1e-30
    rounding = exact.abs() * (2.0 ** -8 if out.dtype == torch.bfloat16 else 2.0 ** -11)
    err = (out.double() - exact).abs()
    bad = (err > fp32_bound + rounding) | out.isnan()
    if bad.any():
        raise AssertionError(f"{name}: {int(bad.sum())} outputs off the exact product "
                             f"(max err {err.max().item():.3g})")


def check_all(device_name):
    """Odd shapes, every format, bf16 and fp16, both paths, with and without bias."""
    torch.manual_seed(0)
    for fmt in FORMATS:
        for M, N, K in [(1, 257, 320), (7, 96, 4096 + 32), (16, 8192, 1024), (64, 300, 992),
                        (65, 136, 512), (300, 200, 96)]:
            for dtype in (torch.bfloat16, torch.float16):
                w = MXTensor.to_mx(torch.randn(N, K, device="cuda", dtype=dtype), fmt, 32)
                x = torch.randn(M, K, device="cuda", dtype=dtype)
                b = torch.randn(N, device="cuda", dtype=dtype)
                check(F.linear(x, w, b), x, w, b, f"{fmt.name} {M}x{N}x{K} {dtype}")
                check(x @ w.t(), x, w, None, f"{fmt.name} {M}x{N}x{K} {dtype} matmul")
    print(f"check: every format, both paths, bf16 and fp16 match the exact product "
          f"({device_name})")
    for M, N, K, spread in [(2, 64, 64, 1), (16, 192, 640, 1), (33, 128, 4096, 1),
                            (64, 8192, 1024, 1), (16, 8192, 8192, 1), (5, 256, 512, 2.0 ** 20)]:
        w = MXTensor.to_mx(torch.randn(N, K, device="cuda") * spread, dtypes.float4_e2m1, 32)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        parts = prepacked_parts(w)
        out = prepacked_linear(x, w, parts, b)
        check(out, x, w, b, f"prepacked {M}x{N}x{K} fold={parts[3]}")
        for _ in range(3):  # the split-K reduction is deterministic
            assert torch.equal(prepacked_linear(x, w, parts, b), out)
    print(f"check: prepacked fp4 (fp4 wgmma kernel) matches the exact product, fold and two-"
          f"multiply scales, repeat calls bit-identical ({device_name})")
    for fmt in PIECE_FORMATS:
        for M, N, K in [(1, 256, 512), (2, 64, 256), (16, 192, 640), (33, 128, 4096),
                        (64, 8192, 1024), (16, 8192, 8192)]:
            w = MXTensor.to_mx(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), fmt, 32)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
            parts = prepacked_parts(w)
            out = prepacked_linear(x, w, parts, b)
            check(out, x, w, b, f"prepacked {fmt.name} {M}x{N}x{K}")
            for _ in range(3):  # the in-kernel split-K sum is deterministic
                assert torch.equal(prepacked_linear(x, w, parts, b), out)
            # the same tile and split as the standard layout's kernel: the same bits
            assert torch.equal(F.linear(x, w, b), out), f"prepacked {fmt.name} {M}x{N}x{K}"
    print(f"check: prepacked fp8, MXINT8 and fp6 (MMA layout) match the exact product and the "
          f"standard layout's kernel bit for bit, repeat calls bit-identical ({device_name})")


def prepacked_parts(w):
    """The parts MXInferenceLinear.prepack() makes of an MX weight: the fp4 wgmma layout's for
    MXFP4 (with its fold flag), the MMA layout's for the other formats; split-K counters."""
    counters = torch.zeros(w.shape[0] // 64, dtype=torch.int32, device=w.device)
    if w.elem_dtype == dtypes.float4_e2m1:
        codes, scales = fp4_wgmma_layout.preshuffle(w._scale_e8m0, w._data)
        return codes, scales, counters, fp4_wgmma_layout.fold_scales(w._scale_e8m0)
    return (*mma_layout.pack(w._scale_e8m0, w._data, w.elem_dtype), counters)


def prepacked_linear(x, w, parts, bias=None):
    """MXInferenceLinear's forward on a prepacked weight: the op that reads the parts."""
    if w.elem_dtype == dtypes.float4_e2m1:
        return torch.ops.torchmx.mx_fp4_fragment_linear(x, *parts, w._scale_e8m0, w._data,
                                                        w.shape[1], bias, x.dtype)
    return torch.ops.torchmx.mx_piece_linear(x, *parts, w._scale_e8m0, w._data,
                                             w.elem_dtype.name, w.shape[1], bias, x.dtype)


def prepacked_kernel_runs(fmt, M):
    """Whether the prepacked op runs its own kernel for M rows (else it takes the usual path,
    the "ours" row)."""
    if fmt == dtypes.float4_e2m1:
        return M in fragment_op.FRAGMENT_ROWS
    return M in piece_op.PIECE_ROWS[fmt.codes_per_group]


def configs_to_sweep(M):
    """The fused kernel's variants and tile choices worth timing for M activation rows."""
    product = itertools.product
    if M == 1:
        return [km.Config(km.ROWS, bn, sk, nb) for bn, sk, nb in product(
            (4, 8, 16, 64, 128), (1, 2, 8), (4, 16, 32))]
    return [km.Config(km.SCALED_DOTS, bn, sk, nb, 4, 3) for bn, sk, nb in product(
        (64, 128), (2, 4, 8), (2, 4, 8))]


def sweep(fmts, Ms, N, K):
    results = {}
    for fmt in fmts:
        ws = make_weights(fmt, N, K, ROTATE)
        for M in Ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            rows = time_configs(configs_to_sweep(M), lambda i, cfg: km.fused_linear(
                x, ws[i]._scale_e8m0, ws[i]._data, fmt, 32, None, torch.bfloat16, config=cfg),
                x, ws, f"{fmt.name} M={M}")
            results[(fmt.name, M)] = rows
            best_of_variant = {}
            for t, cfg in rows:
                best_of_variant.setdefault(cfg.variant, (t, cfg))
            default = km._default_config(fmt, M, N, K // 32, torch.bfloat16, x.device)
            shown = rows[:4] + sorted(best_of_variant.values(), key=lambda r: r[0])
            shown += [(t, cfg) for t, cfg in rows if cfg == default][:1]
            shown = list(dict.fromkeys(shown))  # each row once
            for t, cfg in shown:
                tag = "  (default)" if cfg == default else ""
                print(f"sweep {fmt.name:12s} M={M:3d} {t:7.1f} us  {cfg}{tag}")
    return results


def time_configs(configs, run, x, ws, label):
    """[(us, config)] fastest first: run(i, config) on every weight copy ws[i], checked first
    against the exact product; configs that fail to compile or to check are reported and left
    out."""
    rows = []
    for cfg in dict.fromkeys(configs):  # each once, in order
        calls = [lambda i=i, cfg=cfg: run(i, cfg) for i in range(len(ws))]
        try:
            check(calls[0](), x, ws[0])
            rows.append((graph_time_us(calls, repeats=10), cfg))
        except Exception as e:  # a config that does not compile or is wrong
            print(f"  {label} {cfg}: {type(e).__name__}: {str(e)[:120]}")
    return sorted(rows, key=lambda r: r[0])


def fragment_configs(M):
    """Tiles of the fp4 wgmma kernel worth timing for M activation rows (Fp4WgmmaConfig)."""
    block_m = km.block_m_for(M)
    tiles = [(1, 2, 6, 4), (1, 2, 8, 4), (1, 2, 12, 4), (1, 4, 8, 4), (2, 2, 4, 4), (2, 2, 6, 4),
             (2, 2, 8, 4), (2, 2, 4, 8), (2, 2, 8, 8), (4, 2, 4, 8)]
    return [fm.Fp4WgmmaConfig(block_m, v, u, split, warps, stages)
            for (v, u, split, warps), stages in itertools.product(tiles, (2, 3))]


def fragment_sweep(Ms, N, K):
    ws = make_weights(dtypes.float4_e2m1, N, K, ROTATE)
    parts = [prepacked_parts(w) for w in ws]
    for M in Ms:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        default = fm.default_config(M, N, K, x.device)
        rows = time_configs(fragment_configs(M) + [default], lambda i, cfg: fm.fp4_wgmma_linear(
            x, *parts[i][:3], N, parts[i][3], None, cfg), x, ws, f"fragment M={M}")
        for t, cfg in rows[:6] + [r for r in rows[6:] if r[1] == default][:1]:
            tag = "  (default)" if cfg == default else ""
            print(f"sweep fragment     M={M:3d} {t:7.1f} us  {cfg}{tag}")


def gemv_sweep(fmts, N, K):
    """The tiles of the one-row kernel of one-byte codes (kernels/linear/byte_gemv.py)."""
    configs = [byte_gemv.GemvConfig(bn, pieces, warps) for bn, pieces, warps in itertools.product(
        (1, 2, 4, 8), (128, 256, 512), (2, 4, 8))]
    for fmt in fmts:
        ws = make_weights(fmt, N, K, ROTATE)
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        rows = time_configs(configs, lambda i, cfg: byte_gemv.byte_gemv(
            x, ws[i]._scale_e8m0, ws[i]._data, fmt, 32, None, torch.bfloat16, cfg), x, ws,
            f"gemv {fmt.name}")
        default = byte_gemv.default_config(N, K, x.device)
        for t, cfg in rows[:6] + [r for r in rows[6:] if r[1] == default][:1]:
            tag = "  (default)" if cfg == default else ""
            print(f"sweep gemv {fmt.name:12s} M=  1 {t:7.1f} us  {cfg}{tag}")


def mma_sweep(fmts, Ms, N, K):
    """The tiles of the tensor-core kernel for 2..64 rows of an MXFP8, MXFP6, MXFP4 or MXINT8
    weight in the standard layout (kernels/linear/mma_linear.py): 64 / 128-row tiles, 1-4 units of a
    row a step (64-256 one-byte / 128-512 fp4 or fp6 codes), two steps ahead, 2-6 programs an
    SM, each without and with a register cap (128 up to 16 rows: 4 programs of 4 warps an SM;
    else 168: 3)."""
    for fmt in fmts:
        ws = make_weights(fmt, N, K, ROTATE)
        unit = mma_linear.UNITS[fmt.codes_per_group][0]  # codes of a unit of a row
        for M in Ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            configs = []
            caps = (None, 128 if M <= 16 else 168)
            for v, u, per_sm, cap in itertools.product((1, 2), (1, 2, 4), (2, 3, 4, 6), caps):
                split = max(1, min(K // (unit * u), round(per_sm * km.sm_count(x.device)
                                                          / (N // (64 * v)))))
                configs.append(mma_linear.MmaConfig(v, u, split, maxnreg=cap))
            default = mma_linear.default_config(fmt, M, N, K, 32, x.device)
            # the tile of 16 rows (4 programs an SM) at every M, for comparison
            small = mma_linear.default_config(fmt, 16, N, K, 32, x.device)
            rows = time_configs(configs + [default], lambda i, cfg: mma_linear.mma_linear(
                x, ws[i]._scale_e8m0, ws[i]._data, fmt, 32, None, torch.bfloat16, cfg), x, ws,
                f"mma_linear {fmt.name} M={M}")
            for t, cfg in rows[:6] + [r for r in rows[6:] if r[1] in (default, small)]:
                tag = ("  (default)" if cfg == default
                       else "  (16 rows' default)" if cfg == small else "")
                print(f"sweep mma_linear {fmt.name:12s} M={M:3d} {t:7.1f} us  {cfg}{tag}")


torch._dynamo.config.recompile_limit = 64  # one compiled graph per (format, M)


def compiled_dequant_mm(fmt, K):
    def f(x, scale, data):
        w = dequantize_mx_reference(data, scale, fmt, 32, torch.bfloat16, -1, block_dim_size=K)
        return F.linear(x, w)
    return torch.compile(f, dynamic=False)


def old_path(x, w):
    """The exact generic path: fp32 dequantize, fp32 matmul, one rounding."""
    return (x.float() @ w.dequantize(torch.float32).t()).to(x.dtype)


def ratio(a, b):
    return f"{b / a:5.2f}x" if a and b else "  n/a"


@triton.jit
def _read_kernel(codes_ptr, scales_ptr, out_ptr, code_bytes, scale_bytes, CHUNK: tl.constexpr,
                 PDL: tl.constexpr = False):
    """Reads one chunk of CHUNK bytes of a weight's codes or, for the programs past the codes,
    of its scales, as 16-byte vectors; writes their integer sum (so nothing is optimized
    away): the memory traffic of the matmul, no math. PDL (launched with programmatic
    dependent launch): lets the next kernel launch at once, reads before waiting for the
    previous one, waits before its store; the floor of back-to-back calls that overlap
    (a real kernel could not read its input before the wait)."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    code_chunks = tl.cdiv(code_bytes, CHUNK)
    if pid < code_chunks:
        chunk = pid.to(tl.int64)
        base, size = codes_ptr.to(tl.pointer_type(tl.int32)), code_bytes
    else:
        chunk = (pid - code_chunks).to(tl.int64)
        base, size = scales_ptr.to(tl.pointer_type(tl.int32)), scale_bytes
    offs = tl.arange(0, CHUNK // 4)
    words = tl.load(base + chunk * (CHUNK // 4) + offs, mask=chunk * CHUNK + offs * 4 < size,
                    other=0)
    total = tl.sum(words, axis=0)
    if PDL:
        gdc_wait()
    tl.store(out_ptr + pid, total)


def read_floor_us(ws, pdl=False):
    """Best time of a read-only Triton kernel over the weights' bytes (codes and scales, in
    chunks of 4-16 KiB, one per program), over a few chunk sizes and warps: what streaming
    these bytes costs here, before any decoding. pdl: each launched with programmatic
    dependent launch (_read_kernel's PDL)."""
    data, scale = ws[0]._data, ws[0]._scale_e8m0
    if not (data.is_contiguous() and scale.is_contiguous()):
        return float("inf")
    best = float("inf")
    for chunk, warps in [(4096, 4), (8192, 4), (8192, 8), (16384, 8)]:
        programs = -(-data.numel() // chunk) + -(-scale.numel() // chunk)
        out = torch.empty(programs, dtype=torch.int32, device="cuda")
        calls = [lambda w=w: _read_kernel[(programs,)](
            w._data, w._scale_e8m0, out, w._data.numel(), w._scale_e8m0.numel(), CHUNK=chunk,
            PDL=pdl, num_warps=warps, launch_pdl=pdl) for w in ws]
        best = min(best, graph_time_us(calls, repeats=10))
    return best


def table(N, K, Ms, fmts):
    print(f"\nMX-weight linear, N = K = {N}: microseconds per call (CUDA-graph replays, "
          f"{ROTATE} weight copies); ratios = baseline time / ours")
    print(f"{'format':21s} {'M':>5s} {'ours':>9s} {'cuBLAS bf16':>12s} {'compiled deq+mm':>16s} "
          f"{'old path':>9s} {'weight TB/s':>12s} {'read-only':>10s}")
    dense = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(ROTATE)]
    for fmt in fmts:
        ws = make_weights(fmt, N, K, ROTATE)
        weight_bytes = ws[0]._data.numel() + ws[0]._scale_e8m0.numel()
        deq_mm = compiled_dequant_mm(fmt, K)
        floor = read_floor_us(ws)
        for M in Ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ours = graph_time_us([lambda w=w: F.linear(x, w) for w in ws])
            cublas = graph_time_us([lambda w=w: F.linear(x, w) for w in dense])
            try:
                compiled = graph_time_us([lambda w=w: deq_mm(x, w._scale_e8m0, w._data)
                                          for w in ws])
            except Exception as e:
                print(f"  compiled deq+mm failed: {type(e).__name__}: {str(e)[:100]}")
                compiled = None
            old = graph_time_us([lambda w=w: old_path(x, w) for w in ws[:2]], repeats=5) \
                if M <= 16 else None
            rows = [(fmt.name, ours)]
            if fmt in PIECE_FORMATS + [dtypes.float4_e2m1] and prepacked_kernel_runs(fmt, M):
                parts = [prepacked_parts(w) for w in ws]
                rows.append((f"{fmt.name} prepacked", graph_time_us(
                    [lambda w=w, p=p: prepacked_linear(x, w, p) for w, p in zip(ws, parts)])))
                del parts
            for label, t in rows:
                tbs = weight_bytes / t / 1e6
                print(f"{label:21s} {M:5d} {t:9.1f} {cublas:9.1f} ({ratio(t, cublas)}) "
                      f"{(compiled or 0):9.1f} ({ratio(t, compiled)}) "
                      f"{(old or 0):7.1f} ({ratio(t, old)}) {tbs:8.2f} "
                      + (f"{floor:10.1f}" if floor < float("inf") else f"{'-':>10}"))


def large_m(N, K, M, fmts, rounds=21):
    print(f"\nM = {M}, N = K = {N}: ours vs cuBLAS bf16 on the already dequantized operands "
          f"(target <= 1.05x); the four graphs replayed interleaved, {rounds} rounds: ratios "
          "are medians of per-round ratios [min - max]. Baselines: 'x bf16' multiplies the bf16 "
          "activations by the dequantized weight (weight-only's operands), 'x deq' the "
          "dequantized MX activations by it (MX x MX's operands); 'MX x MX / x bf16' is the "
          "ratio this script printed before 2026-11-23's twenty-fifth session")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    for fmt in fmts:
        ws = make_weights(fmt, N, K, 2)
        w_deq = [w.dequantize(torch.bfloat16) for w in ws]
        x_mx = MXTensor.to_mx(x, fmt, 32)
        x_deq = x_mx.dequantize(torch.bfloat16)
        check(F.linear(x, ws[0]), x, ws[0], name=f"{fmt.name} weight-only {M}x{N}x{K}")
        check(F.linear(x_mx, ws[0]), x_deq, ws[0], name=f"{fmt.name} MX x MX {M}x{N}x{K}")
        print(f"check: {fmt.name} weight-only and MX x MX match the exact product")
        times = interleaved_us({
            "x bf16": [lambda w=w: F.linear(x, w) for w in w_deq],
            "x deq": [lambda w=w: F.linear(x_deq, w) for w in w_deq],
            "weight-only": [lambda w=w: F.linear(x, w) for w in ws],
            "MX x MX": [lambda w=w: F.linear(x_mx, w) for w in ws],
        }, rounds=rounds)

        def cell(name, base):
            med, lo, hi = ratio_stats(times, name, base)
            return f"{med:5.3f}x [{lo:5.3f} - {hi:5.3f}]"

        def baseline(name):
            t = statistics.median(times[name])
            return f"cuBLAS on deq ({name}) {t:7.1f} us ({2 * M * N * K / t / 1e6:.0f} TFLOP/s)"

        print(f"{fmt.name:12s} {baseline('x bf16')}   weight-only "
              f"{statistics.median(times['weight-only']):7.1f} us {cell('weight-only', 'x bf16')}")
        print(f"{'':12s} {baseline('x deq')}    MX x MX "
              f"{statistics.median(times['MX x MX']):7.1f} us {cell('MX x MX', 'x deq')}   "
              f"MX x MX / x bf16 {cell('MX x MX', 'x bf16')}")


MX_GEMM_SHAPES = list(itertools.product((2048, 4096, 8192), (1024, 4096, 8192, 14336),
                                        (4096, 8192)))


def mx_gemm_sweep(pairs, shapes=MX_GEMM_SHAPES, rounds=7):
    """MX x MX products, interleaved: kernels/linear/mx_gemm.py's GEMM (x decoded in its main loop, W
    dequantized in its order, inside the GEMM ahead of the tiles past the first wave: 'gemm';
    all of W first: 'W first') and the dequantize + cuBLAS path ('deq'), each against cuBLAS
    on the dequantized operands; 'preferred' is mx_gemm.preferred's choice (what F.linear
    runs). pairs: (x format, W format). Each is checked against the exact product first."""
    print(f"\nMX x MX: the x-decoding GEMM ('gemm'; 'W first': its weight all dequantized "
          f"before it) vs dequantize + cuBLAS ('deq'), against cuBLAS bf16 on the dequantized "
          f"operands; medians of {rounds} interleaved rounds")
    print(f"{'x / W format':25s} {'M':>5s} {'N':>6s} {'K':>5s} {'cuBLAS us':>10s} {'deq':>7s} "
          f"{'W first':>7s} {'gemm':>7s} {'gemm/deq [min - max]':>22s} preferred")
    for x_fmt, fmt in pairs:
        name = x_fmt.name if x_fmt == fmt else f"{x_fmt.name} / {fmt.name}"
        for M, N, K in shapes:
            g = torch.Generator(device="cuda").manual_seed(M + N + K)
            x = MXTensor.to_mx(torch.randn(M, K, device="cuda", generator=g,
                                           dtype=torch.bfloat16), x_fmt, 32)
            ws = make_weights(fmt, N, K, 2)
            x_deq = x.dequantize(torch.bfloat16)
            w_deq = [w.dequantize(torch.bfloat16) for w in ws]
            parts = (x._data, x._scale_e8m0, x_fmt)

            def gemm(w, blocks_before=None):
                return mx_gemm.mx_gemm(*parts, w._data, w._scale_e8m0, fmt, blocks_before)

            def deq(w):
                return km.linear(x_deq, w._scale_e8m0, w._data, fmt, 32, K, None,
                                 torch.bfloat16)

            check(gemm(ws[0]), x_deq, ws[0], name=f"{name} gemm {M}x{N}x{K}")
            check(gemm(ws[0], N), x_deq, ws[0], name=f"{name} gemm, W first {M}x{N}x{K}")
            check(deq(ws[0]), x_deq, ws[0], name=f"{name} deq {M}x{N}x{K}")
            times = interleaved_us({
                "cublas": [lambda w=w: torch.mm(x_deq, w.t()) for w in w_deq],
                "deq": [lambda w=w: (x.dequantize(torch.bfloat16), deq(w)) for w in ws],
                "first": [lambda w=w: gemm(w, N) for w in ws],
                "gemm": [lambda w=w: gemm(w) for w in ws]}, rounds=rounds)
            med, lo, hi = ratio_stats(times, "gemm", "deq")
            print(f"{name:25s} {M:5d} {N:6d} {K:5d} {statistics.median(times['cublas']):10.1f} "
                  + "".join(f"{ratio_stats(times, k, 'cublas')[0]:6.3f}x "
                            for k in ("deq", "first", "gemm"))
                  + f"{med:6.3f} [{lo:5.3f} - {hi:5.3f}]  "
                  f"{'gemm' if mx_gemm.preferred(x_fmt, fmt, M, N, x.device) else 'deq'}",
                  flush=True)
            x = ws = x_deq = w_deq = None  # freed (closures hold the names)
            torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--e2e", action="store_true")
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--formats", default=None,
                        help="formats, comma-separated (default: all); --mx-gemm: x's and W's "
                             "formats, FORMAT (both) or X_FORMAT/W_FORMAT (default: "
                             "mx_gemm.PREFERRED_FORMATS, each with itself)")
    parser.add_argument("--large-m", action="store_true",
                        help="only the M = 8192 comparison (checked, no table)")
    parser.add_argument("--mx-gemm", action="store_true",
                        help="only MX x MX: the x-decoding GEMM against dequantize + cuBLAS "
                             "over shapes (checked)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds of the M = 8192 comparison (default 21) or "
                             "of --mx-gemm (default 7)")
    parser.add_argument("--shapes", default=None,
                        help="--mx-gemm: MxNxK,... (default: M 2048-8192, N 1024-14336, "
                             "K 4096, 8192)")
    parser.add_argument("--m", default=None,
                        help="activation rows (table: 1,16,32,64,128; --sweep: 1,16)")
    args = parser.parse_args()
    name = torch.cuda.get_device_name()
    print(f"device: {name}, torch {torch.__version__}, {datetime.date.today()}")
    N = K = args.size
    fmts = FORMATS
    if args.formats and not args.mx_gemm:
        fmts = [dtypes.from_name(f) for f in args.formats.split(",")]
    large = [dtypes.float4_e2m1, dtypes.float8_e4m3]
    if args.large_m:
        large_m(N, K, 8192, [f for f in fmts if f in large] or large, args.rounds or 21)
        return
    if args.mx_gemm:
        shapes = ([tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
                  if args.shapes else MX_GEMM_SHAPES)
        pairs = [(f, f) for f in mx_gemm.PREFERRED_FORMATS]
        if args.formats:
            pairs = [tuple(dtypes.from_name(f) for f in (pair.split("/") * 2)[:2])
                     for pair in args.formats.split(",")]
        mx_gemm_sweep(pairs, shapes, args.rounds or 7)
        return
    if not args.no_check:
        check_all(name)
    if args.sweep:
        Ms = [int(m) for m in (args.m or "1,16").split(",")]
        sweep([f for f in fmts if f in (dtypes.float4_e2m1, dtypes.float8_e4m3)], Ms, N, K)
        sweep([f for f in fmts if f == dtypes.float6_e2m3], [1], N, K)
        if 1 in Ms:
            gemv_sweep([f for f in fmts if f in (dtypes.float8_e4m3, dtypes.float8_e5m2,
                                                 dtypes.int8)], N, K)
        mma_sweep([f for f in fmts if f in mma_linear.FAST_SCALES],
                  [m for m in Ms if 2 <= m <= 64], N, K)
        if dtypes.float4_e2m1 in fmts:
            fragment_sweep([int(m) for m in (args.m or "1,16,32,64").split(",")], N, K)
        return
    table(N, K, [int(m) for m in (args.m or "1,16,32,64,128").split(",")], fmts)
    large_m(N, K, 8192, large, args.rounds or 21)
    if args.e2e:
        from decode_llama import run as run_e2e
        run_e2e()


if __name__ == "__main__":
    main()

"""How fast kernels of the matmuls' shapes can stream an MX weight's bytes, with no math (issue #7).

    python benchmarks/bench_stream_shapes.py                      # e4m3 and fp4, N = K = 8192
    python benchmarks/bench_stream_shapes.py --formats float8_e4m3

bench_gpu_matmul.py's "read-only" column is the memory floor: thousands of short programs, each
reading one 4-16 KiB chunk of the weight's codes or scales. A tensor-core kernel for a few
activation rows cannot have that shape. Its programs each own a tile of W rows (so they share
x's loads) and a long run of K, and split-K partials cost bytes of their own: at 16 rows
torchmx's kernels run 512-640 programs, each streaming 50-130 KiB, and one per 64-row tile
would stream 512 KiB. This script times read-only kernels of exactly that shape over the same
bytes: P programs, each streaming one contiguous P-th of the codes and of the scales, step by
step, through Triton's software pipeline, either by TMA (tensor descriptors) or by cp.async
(pipelined loads). It sweeps P, the step and the pipeline depth, and prints each shape's best
time next to the floor.

Every kernel first checks that it read each byte once: the sum of the words its programs return
equals the words' sum computed by torch (mod 2**32). Times are medians of CUDA-graph replays
over 8 weight copies (device memory, not L2), as in bench_gpu_matmul.py.
"""

import argparse
import datetime
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gpu_matmul import ROTATE, make_weights, read_floor_us  # noqa: E402
from torchmx import dtypes  # noqa: E402
from _timing import graph_time_us  # noqa: E402

ROW = 256  # bytes in a row of the 2-d views: 64 int32 words
PROGRAMS = (128, 256, 512)  # a 64-row tile of N = 8192 each, or split 2 or 4 along K
STEPS = (32, 64)  # code rows a step: 8 or 16 KiB
STAGES = (3, 4, 6, 8)


@triton.jit
def tma_stream_kernel(codes, scales, out_ptr, rows, scale_rows, STEP: tl.constexpr,
                      SCALE_STEP: tl.constexpr, STAGES: tl.constexpr):
    """Program p: the word sum of code rows p * rows .. + rows and scale rows p * scale_rows ..
    + scale_rows (tensor descriptors over [rows, 64] int32 views), STEP / SCALE_STEP rows a
    step, loaded by TMA STAGES - 1 steps ahead."""
    p = tl.program_id(0)
    acc = tl.zeros([STEP, 64], tl.int32)
    scale_acc = tl.zeros([SCALE_STEP, 64], tl.int32)
    for i in tl.range(0, rows // STEP, num_stages=STAGES):
        acc += codes.load([p * rows + i * STEP, 0])
        scale_acc += scales.load([p * scale_rows + i * SCALE_STEP, 0])
    tl.store(out_ptr + p, tl.sum(tl.sum(acc, 1), 0) + tl.sum(tl.sum(scale_acc, 1), 0))


@triton.jit
def load_stream_kernel(codes_ptr, scales_ptr, out_ptr, rows, scale_rows, STEP: tl.constexpr,
                       SCALE_STEP: tl.constexpr, STAGES: tl.constexpr):
    """tma_stream_kernel's reads as pipelined loads (cp.async into shared memory)."""
    p = tl.program_id(0).to(tl.int64)
    words = codes_ptr.to(tl.pointer_type(tl.int32)) + p * rows * 64 \
        + tl.arange(0, STEP)[:, None] * 64 + tl.arange(0, 64)[None, :]
    scale_words = scales_ptr.to(tl.pointer_type(tl.int32)) + p * scale_rows * 64 \
        + tl.arange(0, SCALE_STEP)[:, None] * 64 + tl.arange(0, 64)[None, :]
    acc = tl.zeros([STEP, 64], tl.int32)
    scale_acc = tl.zeros([SCALE_STEP, 64], tl.int32)
    for i in tl.range(0, rows // STEP, num_stages=STAGES):
        acc += tl.load(words + i * STEP * 64)
        scale_acc += tl.load(scale_words + i * SCALE_STEP * 64)
    tl.store(out_ptr + p, tl.sum(tl.sum(acc, 1), 0) + tl.sum(tl.sum(scale_acc, 1), 0))


def word_sum(t: torch.Tensor) -> int:
    """The int32 words of a byte tensor summed mod 2**32."""
    return int(t.view(torch.int32).to(torch.int64).sum()) % 2**32


def shapes(code_rows: int, scale_rows: int):
    """(P, step, scale step) for every program count and step that split both views evenly."""
    for programs in PROGRAMS:
        for step in STEPS:
            scale_step = step * scale_rows // code_rows
            if (code_rows % (programs * step) == 0 and scale_step >= 1
                    and scale_step * code_rows == step * scale_rows):
                yield programs, step, scale_step


def stream_table(fmt, N, K):
    ws = make_weights(fmt, N, K, ROTATE)
    parts = [(w._data.reshape(-1), w._scale_e8m0.reshape(-1)) for w in ws]
    code_bytes, scale_bytes = parts[0][0].numel(), parts[0][1].numel()
    code_rows, scale_rows = code_bytes // ROW, scale_bytes // ROW
    expected = (word_sum(parts[0][0]) + word_sum(parts[0][1])) % 2**32
    floor = read_floor_us(ws)
    print(f"\n{fmt.name}: {code_bytes / 2**20:.0f} MiB of codes + {scale_bytes / 2**20:.0f} MiB of "
          f"scales, {ROTATE} copies; read-only floor (short programs) {floor:.1f} us")
    print(f"{'loads':6s} {'programs':>8s} {'KiB each':>8s} {'step KiB':>8s} {'best us':>8s} "
          f"{'stages':>6s} {'warps':>5s} {'vs floor':>8s}")
    best_overall = float("inf")
    for loads in ("tma", "cp.async"):
        for programs, step, scale_step in shapes(code_rows, scale_rows):
            rows, srows = code_rows // programs, scale_rows // programs
            out = torch.empty(programs, dtype=torch.int32, device="cuda")
            if loads == "tma":
                args = [(TensorDescriptor.from_tensor(c.view(torch.int32).view(-1, 64), [step, 64]),
                         TensorDescriptor.from_tensor(s.view(torch.int32).view(-1, 64),
                                                      [scale_step, 64])) for c, s in parts]
                kernel = tma_stream_kernel
            else:
                args, kernel = parts, load_stream_kernel
            best = (float("inf"), 0, 0)
            for stages in STAGES:
                for warps in (4, 8):
                    def run(a, stages=stages, warps=warps):
                        kernel[(programs,)](*a, out, rows, srows, STEP=step,
                                            SCALE_STEP=scale_step, STAGES=stages,
                                            num_warps=warps)
                    run(args[0])
                    got = int(out.to(torch.int64).sum()) % 2**32
                    if got != expected:
                        raise SystemExit(f"{loads} P={programs} step={step} stages={stages}: "
                                         f"read sum {got} != {expected}")
                    t = graph_time_us([lambda a=a: run(a) for a in args], repeats=10)
                    best = min(best, (t, stages, warps))
            t, stages, warps = best
            best_overall = min(best_overall, t)
            print(f"{loads:6s} {programs:8d} {(code_bytes + scale_bytes) / programs / 1024:8.0f} "
                  f"{step * ROW / 1024:8.0f} {t:8.1f} {stages:6d} {warps:5d} {t / floor:7.3f}x")
    print(f"check: each of these kernels read every byte of {fmt.name}'s weight once (its "
          "programs' word sums add up to torch's)")
    print(f"{fmt.name}: best long-program stream {best_overall:.1f} us = "
          f"{best_overall / floor:.3f}x the read-only floor ({floor:.1f} us)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--formats", default="float8_e4m3,float4_e2m1")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, {datetime.date.today()}")
    for name in args.formats.split(","):
        stream_table(dtypes.from_name(name), args.size, args.size)


if __name__ == "__main__":
    main()

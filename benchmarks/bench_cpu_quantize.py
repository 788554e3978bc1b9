"""CPU quantize / dequantize: torchmx vs torchmx 0.1.0, side by side in one run.

    python3 benchmarks/bench_cpu_quantize.py [--rows 4096 --cols 4096]
        [--torchmx010-python /tmp/torchmx010/bin/python]   # made by setup_torchmx010.sh

It first checks that the ops (C kernels) equal the reference numerics bit for bit on the
benchmark's own input, then times every format (best of --repeat runs, which is robust to
other load on the machine; bf16 input, blocks of 32 along the last dim) next to a plain copy of the input and, when given its interpreter,
torchmx 0.1.0 (run in a subprocess: it needs torchao==0.6.1). Ratios > 1 mean torchmx is faster.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

import torchmx  # noqa: F401
from torchmx import dtypes
from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference
from torchmx.ops import backend_for

FORMATS = [d.name for d in dtypes.SUPPORTED_ELEM_DTYPES]

# Runs inside torchmx 0.1.0's environment; prints {format: [quantize_s, dequantize_s]}.
BASELINE_SCRIPT = """
import json, sys, time, torch
from torchmx.mx_tensor import quantize_mx, dequantize_mx
rows, cols, repeat, names = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
torch.manual_seed(0)
x = torch.randn(rows, cols, dtype=torch.bfloat16)
def best_time(fn):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return min(times)
out = {}
for name in names:
    scale, data = quantize_mx(x, name, 32)
    out[name] = [best_time(lambda: quantize_mx(x, name, 32)),
                 best_time(lambda: dequantize_mx(data, scale, name, 32, torch.bfloat16, 1))]
print(json.dumps(out))
"""


def best_time(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def check_bit_exact(x, name):
    sample = x[:64]
    expected = quantize_mx_reference(sample, name, 32)
    scale, data = torch.ops.torchmx.quantize_mx(sample, name, 32)
    if not (torch.equal(expected[0], scale) and torch.equal(expected[1], data)):
        sys.exit(f"FAIL: quantize_mx({name}) differs from the reference")
    out = torch.ops.torchmx.dequantize_mx(data, scale, name, 32, torch.bfloat16)
    ref = dequantize_mx_reference(data, scale, name, 32, torch.bfloat16)
    if not torch.equal(out.view(torch.int16), ref.view(torch.int16)):
        sys.exit(f"FAIL: dequantize_mx({name}) differs from the reference")


def run_baseline(python, rows, cols, repeat):
    names = [n for n in FORMATS if n != "float8_e5m2"]  # torchmx 0.1.0 has no e5m2
    # Its own working directory and no PYTHONPATH, so that it imports its torchmx, not ours.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([python, "-c", BASELINE_SCRIPT, str(rows), str(cols), str(repeat), *names],
                            capture_output=True, text=True, cwd=tempfile.gettempdir(), env=env)
    if result.returncode != 0:
        print(f"torchmx 0.1.0 baseline failed: {result.stderr.strip().splitlines()[-1:]}")
        return {}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--torchmx010-python", help="python of an environment with torchmx 0.1.0")
    opts = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(opts.rows, opts.cols, dtype=torch.bfloat16)
    print(f"input {opts.rows}x{opts.cols} bf16, block 32, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, backend {backend_for(x.device)}")
    for name in FORMATS:
        check_bit_exact(x, name)
    print("correctness: ops == reference numerics, bit for bit, every format")

    copy_s = best_time(x.clone, opts.repeat)
    ours = {}
    for name in FORMATS:
        scale, data = torch.ops.torchmx.quantize_mx(x, name, 32)
        ours[name] = (
            best_time(lambda: torch.ops.torchmx.quantize_mx(x, name, 32), opts.repeat),
            best_time(lambda: torch.ops.torchmx.dequantize_mx(data, scale, name, 32, torch.bfloat16),
                        opts.repeat),
        )
    baseline = run_baseline(opts.torchmx010_python, opts.rows, opts.cols, opts.repeat) \
        if opts.torchmx010_python else {}

    print(f"\nplain copy of the input: {copy_s * 1e3:.1f} ms")
    print(f"{'format':<12} {'quantize ms':>11} {'0.1.0 ms':>9} {'speedup':>8} | "
          f"{'dequant ms':>10} {'0.1.0 ms':>9} {'speedup':>8}")
    for name in FORMATS:
        q, d = ours[name]
        bq, bd = baseline.get(name, (None, None))
        fmt = lambda v: f"{v * 1e3:9.1f}" if v else f"{'n/a':>9}"
        ratio = lambda b, o: f"{b / o:7.1f}x" if b else f"{'n/a':>8}"
        print(f"{name:<12} {q * 1e3:11.1f} {fmt(bq)} {ratio(bq, q)} | "
              f"{d * 1e3:10.1f} {fmt(bd)} {ratio(bd, d)}")
    if not baseline:
        print("(torchmx 0.1.0 not measured: pass --torchmx010-python, see benchmarks/setup_torchmx010.sh)")


if __name__ == "__main__":
    main()

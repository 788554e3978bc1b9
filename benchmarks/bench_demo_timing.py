"""Why the demo's forward times move: the same models timed in one process, block after block.

Builds the demo's models once (all-MiniLM-L6-v2 in full precision and quantized to each default
format, W+A), then times blocks of rounds (one forward pass of every model each, as the demo
does), each block with the PyTorch thread count named in `--blocks` (default 1,2,1,2: the same
models alternately with one and two threads, close in time). Per block it prints each model's
median wall time, the median over rounds of each recipe's time over full precision's, and per
call: the process's CPU time over its wall time (about 1 with one thread: the call never
waited for a core; about 2 with two busy threads), the involuntary context switches (a thread
taken off its core for another) and the page faults.

The models are built as the demo builds them: each runs once as soon as it is quantized. With
`--build-all-first` (every model built before any runs) glibc's malloc settles on other
thresholds in this process: the MX calls then hand the memory of their dequantized weights
back to the system and fault it in again at every call, and take longer; the faults column
shows it.

    PYTHONPATH=. python3 benchmarks/bench_demo_timing.py [--blocks 1,2,1,2] [--rounds 10]
        [--build-all-first] [--save]

`--save` also writes the output to benchmarks/results/demo_timing_<UTC stamp>_cpu.txt.
"""

import argparse
import copy
import datetime
import gc
import logging
import os
import resource
import statistics
import time

import torch

from torchmx.cli import DEFAULT_FORMATS
from torchmx.evaluate import DEMO_SENTENCES, WARM_UP_CALLS, Recipe
from torchmx.models import MiniLM
from torchmx.quant_api import quantize_linear_

from _results import save


def _models(args):
    """(names, forward functions) of full precision and every default format, W+A."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    encoder = MiniLM.load(device="cpu")
    batch = encoder.tokenize(list(DEMO_SENTENCES))

    def forward(model):
        def call():
            with torch.no_grad():
                model(**batch)
        return call

    calls = [forward(encoder.model)]
    for fmt in DEFAULT_FORMATS:
        quantized = copy.deepcopy(encoder.model)
        quantize_linear_(quantized, Recipe(fmt).qconfig(), progress=False)
        calls.append(forward(quantized))
        if not args.build_all_first:
            calls[-1]()  # as the demo, which embeds the sentences with each model once it is built
    return ["full precision", *DEFAULT_FORMATS], calls


def _block(calls, rounds):
    """(per model: wall ms of each call), process CPU s / wall s, and per call the involuntary
    context switches and page faults, over `rounds` rounds of one call of every model."""
    times = [[] for _ in calls]
    before, cpu_start, wall_start = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for _ in range(rounds):
        for call, samples in zip(calls, times):
            start = time.perf_counter()
            call()
            samples.append(1e3 * (time.perf_counter() - start))
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    after, count = resource.getrusage(resource.RUSAGE_SELF), rounds * len(calls)
    return (times, cpu / wall, (after.ru_nivcsw - before.ru_nivcsw) / count,
            (after.ru_minflt - before.ru_minflt) / count)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="1,2,1,2", help="PyTorch's thread count of each block")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per block")
    parser.add_argument("--build-all-first", action="store_true",
                        help="build every model before running any (the demo runs each once it is built)")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args(argv)
    threads = [int(n) for n in args.blocks.split(",")]
    if args.rounds < 1 or min(threads) < 1:
        parser.error("--rounds and every thread count must be >= 1")

    names, calls = _models(args)
    load_before = os.getloadavg()[0]
    lines = [f"# PYTHONPATH=. python3 benchmarks/bench_demo_timing.py --blocks {args.blocks} --rounds {args.rounds}"
             + (" --build-all-first" if args.build_all_first else ""),
             f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, cpu ({os.cpu_count()} cores), "
             f"torch {torch.__version__}; {WARM_UP_CALLS} warm-up calls of every model with each thread count, "
             f"then blocks of {args.rounds} rounds",
             f"{'block':<6}{'threads':>8}" + "".join(f"{name[:11]:>12}" for name in names)
             + f"{'cpu/wall':>9}{'ctxsw/call':>11}{'faults/call':>12}"]
    for count in sorted(set(threads)):
        torch.set_num_threads(count)
        for call in calls:
            for _ in range(WARM_UP_CALLS):
                call()
    gc.collect()
    gc.disable()
    for i, count in enumerate(threads):
        torch.set_num_threads(count)
        times, cpu_share, switches, faults = _block(calls, args.rounds)
        lines.append(f"{i:<6}{count:>8}" + "".join(f"{statistics.median(t):>10.1f}ms" for t in times)
                     + f"{cpu_share:>9.2f}{switches:>11.1f}{faults:>12.1f}")
        lines.append(f"{'':<6}{'vs fp':>8}{'':>12}" + "".join(
            f"{statistics.median(a / b for a, b in zip(t, times[0])):>11.2f}x" for t in times[1:]))
    gc.enable()
    lines.append(f"# load average (1 min) {load_before:.1f} before the blocks, {os.getloadavg()[0]:.1f} after "
                 "(other processes sharing the cores)")
    text = "\n".join(lines)
    print(text)
    if args.save:
        save(text, "demo_timing", "cpu")


if __name__ == "__main__":
    main()

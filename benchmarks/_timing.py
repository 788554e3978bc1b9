"""Timing shared by the benchmarks: the wall time of a loop of eager calls (what a user's loop
takes, host included), and medians of CUDA-graph replays (the GPU's time alone).

Each timed stretch starts behind a spin kernel (`queue_ahead`): when the GPU is idle, a start
event runs as soon as it is queued, and the GPU then waits for the CPU to submit the graph
(several microseconds), which the events would count as the graph's time. Behind a spin of
about a quarter of a millisecond the event and the graph are both queued before the GPU gets to
them, so the events measure the GPU's time only.
"""

import cProfile
import statistics
import time

import torch

# GPU clock cycles of the spin (about 0.25 ms at the H100's clocks): far longer than the CPU
# takes to queue an event and a graph.
SPIN_CYCLES = 500_000


def wall_us(fn, calls: int, rounds: int, warmup: int = 3, device="cuda",
            wait: bool = True) -> float:
    """Median over `rounds` of the wall microseconds per call of `calls` back-to-back calls of
    fn, after `warmup` calls. On CUDA the device is idle when each round starts; wait=False
    stops the clock once the host has queued the calls (the host's own time), wait=True once
    the device has run them."""
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if wait:
            sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return statistics.median(times)


def queue_ahead():
    """Keeps the GPU busy while the CPU queues what follows (the module docstring)."""
    torch.cuda._sleep(SPIN_CYCLES)


def capture(calls) -> torch.cuda.CUDAGraph:
    """`calls` (a list of thunks, run in order) captured in one CUDA graph; they run once
    first (compiles, autotuning) on a side stream."""
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_time_us(calls, repeats=20) -> float:
    """Median microseconds per call of `calls`, captured in one CUDA graph and replayed."""
    graph = capture(calls)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        queue_ahead()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    return statistics.median(times)


def interleaved_us(variants: dict, rounds=21, warmup=3) -> dict:
    """Microseconds per call of each variant (name -> list of thunks), round by round: each
    variant is captured in its own CUDA graph, and every round replays each graph once, back
    to back, in an order rotated from round to round. Clock changes (power and thermal limits)
    then hit all variants alike, and per-round ratios (`ratio_stats`) cancel them. The first
    `warmup` rounds are dropped. Returns name -> list of per-round times."""
    graphs = {name: (capture(calls), len(calls)) for name, calls in variants.items()}
    names = list(graphs)
    times = {name: [] for name in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        events = []
        queue_ahead()  # the later graphs of the round queue while the earlier ones run
        for name in names[shift:] + names[:shift]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name][0].replay()
            end.record()
            events.append((name, start, end))
        torch.cuda.synchronize()
        if r >= warmup:
            for name, start, end in events:
                times[name].append(start.elapsed_time(end) * 1000 / graphs[name][1])
    return times


def ratio_stats(times: dict, name: str, base: str):
    """(median, min, max) over rounds of times[name] / times[base], each round's ratio taken
    from the same round's replays."""
    ratios = sorted(a / b for a, b in zip(times[name], times[base]))
    return statistics.median(ratios), ratios[0], ratios[-1]


def profiled(fn, calls: int) -> cProfile.Profile:
    """cProfile of `calls` calls of fn (the host's work); the GPU is then waited for."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    return profiler


def kernel_table(fn) -> str:
    """The GPU kernels of one call of fn (after one untimed call): count, mean and total
    duration (us), the longest total first (torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = sorted(((e.count, e.device_time_total, e.key) for e in prof.key_averages()
                   if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda r: -r[1])
    return "\n".join(f"  {n:4d} x {total / max(n, 1):7.1f} us = {total:8.1f} us  {name[:90]}"
                     for n, total, name in rows)

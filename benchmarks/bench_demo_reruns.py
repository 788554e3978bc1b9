"""Do the demo's forward times hold from one run to the next?

Runs the main job (`python3 -m torchmx`, the README's first command after installation) N times
in fresh processes, each writing its own report.json. First checks that everything but the
timings is identical across runs (SQNR, cosine, neighbour agreement, bytes: the numerics are
deterministic); then prints, per recipe, each run's forward time and its ratio to the
full-precision forward timed alongside, and the spread of each over the runs
((max - min) / min), under a header with the load average, the timing settings the reports
record (threads, warm-up calls, rounds) and each run's wall time. Extra arguments go to the
demo (e.g. `--repeat 9`, `--device cuda`).

    python3 benchmarks/bench_demo_reruns.py [--runs 3] [--save] [-- DEMO ARGS...]

`--save` also writes the table to benchmarks/results/demo_reruns_<UTC stamp>_<device>.txt.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from _results import save

TIMING_KEYS = ("forward_ms", "forward_ms_samples", "forward_vs_full_precision")


def _run_demo(out_dir, demo_args):
    """(report.json of one run of the demo, the run's wall time in seconds)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torchmx", "--out", str(out_dir), *demo_args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out_dir / "report.json").read_text()), time.perf_counter() - start


def _without_timings(report):
    kept = {k: v for k, v in report.items()
            if k not in TIMING_KEYS + ("environment", "results")}
    kept["results"] = [{k: v for k, v in r.items() if k not in TIMING_KEYS}
                       for r in report["results"]]
    return kept


def _spread(values):
    return (max(values) - min(values)) / min(values)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--save", action="store_true")
    parser.add_argument("demo_args", nargs="*")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be at least 2")

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        reports, seconds = zip(*[_run_demo(pathlib.Path(tmp, f"run{i}"), args.demo_args)
                                 for i in range(args.runs)])
    load_after = os.getloadavg()[0]

    first = _without_timings(reports[0])
    for i, report in enumerate(reports[1:], 1):
        if _without_timings(report) != first:
            raise SystemExit(f"run {i} differs from run 0 in more than its timings")

    env = reports[0].get("environment", {})
    timing = reports[0].get("timing", {})
    device = reports[0]["device"]
    lines = [f"# python3 benchmarks/bench_demo_reruns.py --runs {args.runs}"
             + (" -- " + " ".join(args.demo_args) if args.demo_args else ""),
             f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, device {device} "
             f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores), "
             f"torch {env.get('torch', '?')}, torchmx {env.get('torchmx', '?')}",
             f"# load average (1 min) {load_before:.1f} before the runs, {load_after:.1f} after "
             "(other processes sharing the cores slow and scatter every timing)",
             f"# timing: {timing.get('threads', '?')} thread(s), {timing.get('warm_up_calls', '?')} warm-up "
             f"calls, median of {timing.get('rounds', '?')} rounds; each run took "
             + ", ".join(f"{s:.0f}" for s in seconds) + " s",
             "# numerics identical across runs (everything in report.json but the timings)",
             f"{'recipe':<34}" + "".join(f"{'run ' + str(i) + ' ms':>12}" for i in range(args.runs))
             + f"{'spread':>9}" + "".join(f"{'vs fp ' + str(i):>10}" for i in range(args.runs))
             + f"{'spread':>9}"]
    rows = [("full precision", [r["forward_ms"] for r in reports], None)]
    for j, result in enumerate(reports[0]["results"]):
        acts = "-" if result["weights_only"] else result["activation_dtype"]
        label = f"W {result['elem_dtype']} A {acts} {result['scale_mode']}"
        rows.append((label, [r["results"][j]["forward_ms"] for r in reports],
                     [r["results"][j]["forward_vs_full_precision"] for r in reports]))
    worst_ms = worst_ratio = 0.0
    for label, ms, ratio in rows:
        line = f"{label:<34}" + "".join(f"{v:>12.1f}" for v in ms) + f"{_spread(ms):>9.1%}"
        worst_ms = max(worst_ms, _spread(ms))
        if ratio is not None:
            line += "".join(f"{v:>9.2f}x" for v in ratio) + f"{_spread(ratio):>9.1%}"
            worst_ratio = max(worst_ratio, _spread(ratio))
        lines.append(line)
    lines.append(f"largest spread over the runs: forward time {worst_ms:.1%}, "
                 f"ratio to full precision {worst_ratio:.1%}")
    text = "\n".join(lines)
    print(text)
    if args.save:
        save(text, "demo_reruns", device)


if __name__ == "__main__":
    main()

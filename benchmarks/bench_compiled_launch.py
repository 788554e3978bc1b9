"""What launching the MX linears costs under torch.compile, with and without inductor's static
launcher for user-defined Triton kernels.

    PYTHONPATH=. python3 benchmarks/bench_compiled_launch.py [--rows 1 16] [--processes 4] [--save]

Under torch.compile (default mode) a one-launch MX linear is a `torch.library.triton_op` whose
Triton kernel inductor launches itself (torchmx/mx_ops/weight_matmul_compiled.py). Inductor
launches its own kernels through its static launcher, but user-defined Triton kernels through
Triton's launcher, unless `TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1` is in the
environment (off by default in torch 2.11; inductor's compile workers read the environment,
so it cannot be switched on for one compile inside a running process).

This script runs `--processes` fresh processes, alternately without and with that variable.
Each compiles bench_overhead's 4 Llama MLP blocks (bf16, MXFP4 and MXFP8 weights, and the
floor: every linear a preallocated output) for each row count, then times the four compiled
models in interleaved rounds (so that a drift of the host's speed reaches all four), and
counts the launches of one forward that inductor's static launcher makes. It prints, per setting, the median
over its processes of the wall time per forward (the GPU's work included) and of the host
time alone (the clock stopped once the host has queued the forward), and, each computed in a
process and then the median taken over processes (fresh processes on one host differ in speed
by as much as 25%), the host cost of one linear, (host of the stack - host of the floor) / 12,
and bf16's wall time over the model's. Correctness first: each process's
compiled MX outputs are hashed, and the script says whether both settings gave the same bits.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

ENV = "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"
MODELS = ("bf16", "MXFP4", "MXFP8", "floor")
LINEARS = 12  # 4 blocks x gate, up, down


def _static_launches(fn) -> float:
    """Kernel launches per forward made by inductor's static launcher (its C `_launch_kernel`);
    every other launch goes through one of Triton's C launchers, whose function names differ
    from kernel to kernel."""
    import pstats
    from _timing import profiled
    stats = pstats.Stats(profiled(fn, 10)).stats
    return sum(calls for (path, _, name), (_, calls, *_) in stats.items()
               if path == "~" and name.strip("<>").split(".")[-1] == "_launch_kernel") / 10


def measure(rows: int, rounds: int) -> dict:
    """One process's figures for `rows` activation rows (see the module docstring)."""
    import torch
    from _timing import wall_us
    from bench_overhead import _floor_stack, decode_models
    torch._dynamo.reset()  # a new row count: no automatic dynamic shapes from the last one
    models = decode_models()
    compiled, digests = {}, {}
    with torch.no_grad():
        x = torch.randn(1, rows, 4096, device="cuda", dtype=torch.bfloat16,
                        generator=torch.Generator("cuda").manual_seed(1))
        for name in MODELS:
            stack = models[name] if name != "floor" else _floor_stack(models["bf16"], rows)
            compiled[name] = torch.compile(stack)
            out = compiled[name](x)
            if name.startswith("MX"):
                digests[name] = hashlib.sha256(out.view(torch.int16).cpu().numpy()).hexdigest()
        times = {name: [] for name in MODELS}
        for _ in range(rounds):
            for name, fn in compiled.items():
                call = lambda: fn(x)  # noqa: E731
                times[name].append((wall_us(call, 50, 1), wall_us(call, 50, 1, wait=False)))
        return {"rows": rows, "digests": digests,
                "wall": {n: statistics.median(w for w, _ in t) for n, t in times.items()},
                "host": {n: statistics.median(h for _, h in t) for n, t in times.items()},
                "static": {n: _static_launches(lambda: compiled[n](x)) for n in MODELS}}


def _child(rows, rounds) -> None:
    import torch._inductor.config as inductor_config
    static = bool(getattr(inductor_config, "static_launch_user_defined_triton_kernels", False))
    print(json.dumps({"static": static, "results": [measure(r, rounds) for r in rows]}))


def _run(static: bool, rows, rounds) -> dict:
    env = dict(os.environ, **{ENV: "1" if static else "0"})
    done = subprocess.run([sys.executable, __file__, "--child", "--rows", *map(str, rows),
                           "--rounds", str(rounds)], env=env, check=True, capture_output=True,
                          text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["static"] != static:
        raise SystemExit(f"{ENV}={int(static)} did not reach inductor's config")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--processes", type=int, default=4,
                        help="fresh processes, alternately without and with the static launcher")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        return _child(options.rows, options.rounds)

    import datetime
    import torch
    from _results import save
    runs = {False: [], True: []}
    for i in range(options.processes):
        static = bool(i % 2)
        runs[static].append(_run(static, options.rows, options.rounds))
    device = torch.cuda.get_device_name()
    lines = [f"# python3 benchmarks/bench_compiled_launch.py --rows {' '.join(map(str, options.rows))} "
             f"--processes {options.processes} --rounds {options.rounds}",
             f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {device}, "
             f"torch {torch.__version__}; torch.compile default mode, 4 Llama MLP blocks "
             f"(H 4096, I 14336), torch.no_grad()"]
    for index, rows in enumerate(options.rows):
        same = all(run["results"][index]["digests"] == runs[False][0]["results"][index]["digests"]
                   for static in runs for run in runs[static])
        lines.append(f"\n{rows} row(s): compiled MX outputs identical in every process, with and "
                     f"without the static launcher: {'yes' if same else 'NO'}")
        lines.append(f"{'static launcher':<16}{'model':<7}{'wall us':>9}{'host us':>9}"
                     f"{'host/linear':>13}{'vs bf16 wall':>14}{'static launches':>17}")
        for static, results in runs.items():
            figures = [run["results"][index] for run in results]
            wall = {n: statistics.median(f["wall"][n] for f in figures) for n in MODELS}
            host = {n: statistics.median(f["host"][n] for f in figures) for n in MODELS}
            for name in MODELS:
                # each process's own figures first (a process's speed reaches all four models)
                per_linear = ("" if name == "floor" else "{:13.1f}".format(statistics.median(
                    (f["host"][name] - f["host"]["floor"]) / LINEARS for f in figures)))
                ratio = ("" if name == "floor" else "{:13.2f}x".format(statistics.median(
                    f["wall"]["bf16"] / f["wall"][name] for f in figures)))
                lines.append(f"{'on' if static else 'off':<16}{name:<7}{wall[name]:9.1f}"
                             f"{host[name]:9.1f}{per_linear:>13}{ratio:>14}"
                             f"{figures[0]['static'][name]:17g}")
    lines.append("(wall, host: medians over each setting's processes of each process's median "
                 "over its rounds; host/linear, (host of the stack - host of the floor) / 12 "
                 "linears, and vs bf16 wall: medians over the processes of each process's own. "
                 "static "
                 "launches: per forward, by inductor's static launcher; bf16's are inductor's own "
                 "kernels, an MX model's beyond them its MX kernels, the rest of which Triton's "
                 "launchers launch)")
    text = "\n".join(lines)
    print(text)
    if options.save:
        slug = "".join(c if c.isalnum() else "-" for c in device.lower()).strip("-")
        save(text, "compiled_launch", slug)


if __name__ == "__main__":
    main()

"""Where the host time of one eager MX linear goes, piece by piece, on the GPU host.

    python benchmarks/profile_linear_launch.py [--compile] [--save]
    python benchmarks/profile_linear_launch.py --bound [--rows 1 16] [--save]

For the gate projection of bench_overhead's Llama MLP (4096 -> 14336) with MXFP4 and MXFP8
weights at 1 and 16 rows: the host time per call (wall time of a loop, no synchronize: what
the host alone takes) of each layer of the eager call, from `MXInferenceLinear.forward` down
to the compiled Triton kernel's launcher, next to `x + 1` and `nn.Linear` in bf16; then the
4-block MLP forward (eager) with its GPU kernel time per forward (torch.profiler) beside the
wall time, which tells a host-bound forward from a GPU-bound one; with --compile, the same
forward under torch.compile (default mode) and the host functions it spends its time in.
"""

import argparse
import datetime
import io
import pathlib
import pstats
import sys
import time

import torch
import torch.nn.functional as F

from torchmx.kernels.linear import dispatch
from torchmx.nn import inference_linear

from _timing import kernel_table, profiled, wall_us
from bench_overhead import decode_models

RESULTS = pathlib.Path(__file__).parent / "results"


def host(fn, calls=400, rounds=7):
    return wall_us(fn, calls, rounds, warmup=20, wait=False)


def synced(fn, calls=200, rounds=5):
    return wall_us(fn, calls, rounds, warmup=10, wait=True)


def attempt(label, fn) -> str:
    """label and fn()'s figure, or the error it raised (one failed measurement keeps the rest)."""
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - a diagnostic: print and go on
        return f"{label} failed: {type(e).__name__}: {str(e)[:120]}"
    return f"{label} {value:.1f}" if isinstance(value, float) else f"{label} {value}"


def kernel_us(fn) -> float:
    """GPU kernel time of one call of fn (sum of its kernels' durations, torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    return total / 5


def top(fn, n, calls=100) -> str:
    text = io.StringIO()
    pstats.Stats(profiled(fn, calls), stream=text).sort_stats("tottime").print_stats(n)
    return "\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip())


def linear_table(layers, out) -> None:
    for rows in (1, 16):
        x = torch.randn(1, rows, 4096, device="cuda", dtype=torch.bfloat16)
        x2 = x.reshape(rows, 4096)
        bf16 = layers["bf16"]
        print(f"\n--- one linear 4096 -> 14336, {rows} row(s): host us per call "
              f"(synced us, GPU kernel us) ---", file=out)
        print(f"x + 1            {host(lambda: x + 1):7.1f}", file=out)
        print(f"torch.empty      {host(lambda: torch.empty((rows, 14336), dtype=torch.bfloat16, device='cuda')):7.1f}", file=out)
        print(f"nn.Linear bf16   {host(lambda: bf16(x)):7.1f}  ({synced(lambda: bf16(x)):.1f}, "
              + attempt("GPU", lambda: kernel_us(lambda: bf16(x))) + ")", file=out)
        for name in ("MXFP4", "MXFP8"):
            layer = layers[name]
            layer(x)
            weight, parts = layer._weight_view(x.dtype, layer._weight_source())
            scale, data, fmt, block, K, plans = parts
            plan = [p for k, p in plans.items() if k[0] == x2.shape][0]
            rows_line = [f"{name}: layer(x) {host(lambda: layer(x)):.1f} "
                         f"({synced(lambda: layer(x)):.1f}, "
                         + attempt("GPU", lambda: kernel_us(lambda: layer(x))) + ")"]
            entry = inference_linear._BOUND.get(layer)
            product = entry and entry[1].get((x.shape, x.dtype, True))
            if product is not None:
                rows_line.append(f"bound product {host(lambda: product[0](x, None)):.1f}")
            rows_line.append(f"F.linear(x, w_mx) {host(lambda: F.linear(x, weight)):.1f}")
            rows_line.append(f"dispatch.linear {host(lambda: dispatch.linear(x, scale, data, fmt, block, K, None, x.dtype, plans)):.1f}")
            rows_line.append(f"plan() {host(lambda: plan(x2, scale, data, None)):.1f}  [{type(plan).__name__}]")
            main = plan.main
            o = plan(x2, scale, data, None)
            tensors = {"FusedPlan": (x2, data, scale, o, o, o), "GemvPlan": (x2, data, scale, o, o, o),
                       "MmaPlan": (x2, data, scale, data, scale, o, o, o, o)}[type(plan).__name__]
            rows_line.append(f"plan.main() {host(lambda: main(*tensors)):.1f}")
            compiled = next(iter(main._compiled.values()))
            values = main._values.copy()
            for slot, t in zip(main.slots, tensors):
                values[slot] = t
            g = main.grid
            stream = torch._C._cuda_getCurrentRawStream(0)
            run = compiled.run
            rows_line.append(attempt("compiled.run(tensors)", lambda: host(lambda: run(
                g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None, None,
                None, *values))))
            ints = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values]
            rows_line.append(attempt("compiled.run(ints)", lambda: host(lambda: run(
                g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None, None,
                None, *ints))))
            kwargs = dict(main.kwargs)
            args = list(main.args)
            for slot, t in zip(main.slots, tensors):
                args[slot] = t
            kernel = main.kernel
            rows_line.append(attempt("kernel[grid]()", lambda: host(lambda: kernel[g](*args, **kwargs))))
            rows_line.append(f"values {len(values)}, constexpr {sum(main.kernel.params[i].is_constexpr for i in range(len(values)))}")
            print("\n  ".join(rows_line), file=out)
        if rows == 1:
            for name in ("MXFP4", "MXFP8"):
                layer = layers[name]
                print(f"\ncProfile, {name} layer(x), 1 row, 100 calls:", file=out)
                print(top(lambda: layer(x), 22), file=out)


def mlp_table(models, out, compile_: bool, deadline: float) -> None:
    with torch.no_grad():
        for rows in (1, 16):
            x = torch.randn(1, rows, 4096, device="cuda", dtype=torch.bfloat16)
            print(f"\n--- 4 MLP blocks, {rows} row(s): eager us a forward: synced / host alone "
                  f"/ GPU kernels ---", file=out)
            for name, model in models.items():
                print(f"{name:<7}{synced(lambda: model(x), 50, 7):9.1f}"
                      f"{host(lambda: model(x), 50, 7):9.1f}  "
                      + attempt("GPU", lambda: kernel_us(lambda: model(x))), file=out)
    if not compile_ or time.perf_counter() > deadline:
        return
    with torch.no_grad():
        x = torch.randn(1, 1, 4096, device="cuda", dtype=torch.bfloat16)
        for name in ("MXFP8", "bf16"):
            torch._dynamo.reset()
            compiled = torch.compile(models[name])
            start = time.perf_counter()
            compiled(x)
            print(f"\n--- {name} compiled (default mode), 1 row (compile {time.perf_counter() - start:.0f} s): "
                  f"synced {synced(lambda: compiled(x), 50, 7):.1f} us, host alone "
                  f"{host(lambda: compiled(x), 50, 7):.1f} us, "
                  + attempt("GPU kernels", lambda: kernel_us(lambda: compiled(x))) + " us ---", file=out)
            print(top(lambda: compiled(x), 28, calls=20), file=out)


def _layer_line(layer, inp, _launch) -> str:
    layer(inp)
    product = inference_linear._BOUND[layer][1][(inp.shape, inp.dtype, True)][0]
    plans = layer._weight_view(inp.dtype, layer._weight_source())[1][5]
    rows = inp.reshape(-1, inp.shape[-1]).shape
    plan = [p for k, p in plans.items() if k[0] == rows][0]
    compiled = next(iter(plan.main._compiled.values()))
    launcher = _launch._raw_launcher(compiled)[0]
    split = getattr(plan, "split", None)
    return (f"layer(x) {host(lambda: layer(inp)):.1f} us host, "
            f"{synced(lambda: layer(inp)):.1f} synced, "
            + attempt("GPU", lambda: kernel_us(lambda: layer(inp)))
            + f"; bound product {host(lambda: product(inp, None)):.1f}; {type(plan).__name__}"
            + ("" if split is None else f" split {split}")
            + f", launcher {type(launcher).__name__}, scratch "
            f"{compiled.run.global_scratch_size} / {compiled.run.profile_scratch_size}")


def bound_table(models, out, row_counts) -> None:
    """The eager forward with bound products: per layer (gate, up, down), the host time of a
    call and of its bound product, its plan and the launcher it calls, and the forward's
    kernels one by one; per row count."""
    from torchmx.kernels import _launch
    with torch.no_grad():
        for rows in row_counts:
            x = torch.randn(1, rows, 4096, device="cuda", dtype=torch.bfloat16)
            bf16 = models["bf16"]
            print(f"\n--- {rows} row(s) ---\nbf16 forward: synced "
                  f"{synced(lambda: bf16(x), 50, 7):.1f}, host {host(lambda: bf16(x), 50, 7):.1f}",
                  file=out)
            for name in ("MXFP4", "MXFP8"):
                model = models[name]
                model(x)
                block = model.blocks[0]
                h = F.silu(block["gate"](x)) * block["up"](x)
                for part, inp in (("gate", x), ("up", x), ("down", h)):
                    print(attempt(f"{name} {part}:",
                                  lambda: _layer_line(block[part], inp, _launch)), file=out)
                print(f"{name} forward: synced {synced(lambda: model(x), 50, 7):.1f}, host "
                      f"{host(lambda: model(x), 50, 7):.1f}, "
                      + attempt("GPU", lambda: kernel_us(lambda: model(x))), file=out)
                print(kernel_table(lambda: model(x)), file=out)
        # bench_overhead times each eager model after compiling it twice (default mode and
        # reduce-overhead): the same eager forwards again after the same compiles
        x = torch.randn(1, row_counts[0], 4096, device="cuda", dtype=torch.bfloat16)
        for name in ("bf16", "MXFP4", "MXFP8"):
            model = models[name]
            torch._dynamo.reset()
            for mode in ("default", "reduce-overhead"):
                compiled = torch.compile(model, mode=mode)
                for _ in range(3):
                    compiled(x)
        for name in ("bf16", "MXFP4", "MXFP8"):
            model = models[name]
            print(f"{name} forward after compiles ({row_counts[0]} row(s)): synced "
                  f"{synced(lambda: model(x), 50, 7):.1f}, "
                  f"host {host(lambda: model(x), 50, 7):.1f}, "
                  + attempt("GPU", lambda: kernel_us(lambda: model(x))), file=out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--bound", action="store_true",
                        help="only the eager forward with bound products, layer by layer")
    parser.add_argument("--rows", type=int, nargs="+", default=[1],
                        help="activation rows of --bound's forwards")
    parser.add_argument("--compile-before", type=float, default=1e9,
                        help="skip --compile when this many seconds have passed")
    options = parser.parse_args()
    out = io.StringIO()
    started = time.perf_counter()

    class Tee:
        def write(self, text):
            sys.stdout.write(text)
            sys.stdout.flush()
            out.write(text)

    tee = Tee()
    import triton
    stamp = datetime.datetime.now(datetime.timezone.utc)
    print(f"profile_linear_launch, {stamp:%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"triton {triton.__version__}, {torch.cuda.get_device_name()}", file=tee)
    models = decode_models()
    layers = {name: m.blocks[0]["gate"] for name, m in models.items()}
    if options.bound:
        bound_table(models, tee, options.rows)
    else:
        with torch.no_grad():
            linear_table(layers, tee)
        mlp_table(models, tee, options.compile, started + options.compile_before)
    if options.save:
        RESULTS.mkdir(exist_ok=True)
        slug = "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name().lower())
        path = RESULTS / f"profile_linear_launch_{stamp:%Y-%m-%d_%H%M}_{slug.strip('-')}.txt"
        path.write_text(out.getvalue())
        print(f"written: {path}")


if __name__ == "__main__":
    main()

"""Where the host time of an eager MX decode step goes: bench_overhead's 4 Llama MLP blocks
(hidden 4096, intermediate 14336) with MXFP4 / MXFP8 weights, one eager forward under
cProfile and under torch.profiler (the kernels launched per forward).

    python benchmarks/profile_decode.py                 # CUDA, 1 and 16 rows
    python benchmarks/profile_decode.py --prepack       # also with prepack_weights()
    python benchmarks/profile_decode.py --compile       # also torch.compile (default mode)

Prints, per model: the wall time of a forward with and without a synchronize at the end
(the host time alone, when the GPU keeps up), the functions with the most own host time, and
the GPU kernels of one forward with their counts and durations.
"""

import argparse
import copy
import io
import pstats

import torch

from torchmx.nn.inference_linear import prepack_weights

from _timing import kernel_table, profiled, wall_us
from bench_overhead import decode_models


def _per_call_us(fn, sync: bool, calls=50, rounds=7) -> float:
    return wall_us(fn, calls, rounds, warmup=5, wait=sync)


def _profile(fn, top: int) -> str:
    text = io.StringIO()
    stats = pstats.Stats(profiled(fn, 20), stream=text)
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepack", action="store_true")
    parser.add_argument("--compile", action="store_true",
                        help="also profile each model under torch.compile (default mode)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--formats", nargs="+", default=["MXFP4", "MXFP8"],
                        choices=["MXFP4", "MXFP8"])
    parser.add_argument("--top", type=int, default=30)
    options = parser.parse_args()
    models = decode_models(options.formats)
    if options.prepack:
        for name in options.formats:
            prepacked = copy.deepcopy(models[name])
            prepack_weights(prepacked)
            models[name + " prepacked"] = prepacked
    print(f"profile_decode, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    with torch.no_grad():
        for rows in options.rows:
            x = torch.randn(1, rows, 4096, device="cuda", dtype=torch.bfloat16)
            for name, model in models.items():
                runs = [(name, model)]
                if options.compile:
                    torch._dynamo.reset()
                    runs.append((name + " compiled", torch.compile(model)))
                for label, fn in runs:
                    def step():
                        return fn(x)
                    counters = torch._dynamo.utils.counters
                    counters.clear()
                    synced = _per_call_us(step, True)
                    host = _per_call_us(step, False)
                    print(f"\n=== {label}, {rows} rows: {synced:.1f} us a forward, host alone "
                          f"{host:.1f} us ===")
                    if fn is not model:
                        print(f"  graph breaks {sum(counters['graph_break'].values())}, "
                              f"frames compiled {counters['stats'].get('unique_graphs', 0)}")
                    if name == "bf16" and fn is model:
                        continue
                    print(kernel_table(step))
                    print(_profile(step, options.top))


if __name__ == "__main__":
    main()

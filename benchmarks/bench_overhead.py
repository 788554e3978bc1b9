"""Host cost per call of every public entry point, and a Llama MLP decode three ways.

    python benchmarks/bench_overhead.py                 # CPU (one thread) and, if present, CUDA
    python benchmarks/bench_overhead.py --device cuda --mlp --large-m --qat
    python benchmarks/bench_overhead.py --save          # also writes benchmarks/results/

1. Host cost: the wall time of a loop of calls on a tiny tensor (1 x 64 on CPU, 16 x 64 on
   CUDA, a 64 x 64 weight), synchronized once at the end, next to `x + 1` and the bf16 / fp32
   counterpart on the same device, with issue #8's target ratio. Each call's loops alternate
   with its baseline's (medians of 7 rounds each), so a shared host's changing load moves
   both. `quantize_mx` and `dequantize_mx` are the operators' Python objects
   (`torchmx.ops.*`, which skip the dispatcher in eager); the indented `torch.ops` rows call
   the same operators through `torch.ops.torchmx`, the dispatcher at every call.
2. --mlp (CUDA): 4 Llama MLP blocks (hidden 4096, intermediate 14336, SiLU-gated), batch 1
   and 16 rows of decode, bf16 against `quantize_linear_` MXFP4 and MXFP8 weights, in eager,
   `torch.compile` (default mode) and `torch.compile(mode="reduce-overhead")` (CUDA graphs).
   Every model's output is first compared bit for bit across the three modes and a
   difference printed: inductor fuses the SiLU gate's bf16 elementwise ops without their
   intermediate roundings, so the whole stack differs from eager in bf16 too, while each
   MX linear alone equals eager bit for bit (tests/mx_ops/test_gpu_short_path.py,
   tests/mx_ops/test_mx_tensor_compile.py). Then the host floor of eager decode: the same blocks with
   every linear replaced by a module that returns a preallocated output of the same shape
   (no work, no launch), so what is left is the host time of the SiLU gate, the product, the
   residual add and the module calls. bf16 eager over that floor bounds the eager speedup any
   linear could give; the compiled counterpart is printed beside it. Graph breaks and
   recompilations of the compiled models are counted. Every eager time of a row count is taken
   before any model of it is compiled, and again after all compiles (the last column), with
   the eager models taking turns round after round after an untimed pass over all of them: a
   compile, or a first kernel compile, may leave work behind in the process (inductor's
   compile workers starting), which would otherwise weigh on whichever model came next.
   The table's header says whether inductor launches user-defined Triton kernels (the MX
   linears' under torch.compile) through its own static launcher, which
   `TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1` in the environment switches on
   (off by default in torch 2.11; the compile workers read the environment, not a config set
   later in this process); `--save` then names the file `..._static-launch.txt`.
3. --large-m (CUDA): F.linear of 8192 rows with an MXFP4 weight [8192, 8192], eager, against
   eager cuBLAS bf16 on the dequantized weight (the results must be equal bit for bit).
4. --other-gpu (two CUDA GPUs): the host table again with every tensor on cuda:1 while cuda:0
   is current, as in a model spread over GPUs by device_map; the baselines are torch's own
   calls on cuda:1, which switch devices in C++.
5. --qat (CUDA): training steps of the same 4 MLP blocks on 8192 tokens, eager (forward, a
   mean-square loss, backward, AdamW), bf16 against `prepare_qat_` MXLinear layers (MXFP8:
   float8_e4m3 weights and activations; MXFP4: float4_e2m1 weights, float8_e4m3 activations).
   First, each MX model's first linear must equal F.linear of its operands quantized by the
   reference numerics, bit for bit, and every model's first loss be finite. The models then
   take turns, a few steps each, round after round; the ratios are per round.
"""

import argparse
import copy
import datetime
import io
import pathlib
import platform
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn

import torchmx
from torchmx import MXTensor
from torchmx._allocation import allocator
from torchmx.config import MXConfig, QLinearConfig
from torchmx.kernels import quantize_mx_rowwise_colwise
from torchmx.kernels._common import empty

from _timing import wall_us

RESULTS = pathlib.Path(__file__).parent / "results"


def host_us(fn, device, calls=400, rounds=7) -> float:
    """Median over rounds of the wall time per call of a loop of `calls` calls."""
    return wall_us(fn, calls, rounds, warmup=20, device=device)


def paired_us(fn, baseline, device, calls=400, rounds=7):
    """(us of fn, us of baseline): medians over rounds that alternate a loop of each, so that
    a load coming and going on a shared host weighs on a call and its baseline alike."""
    times, base = [], []
    for _ in range(rounds):
        base.append(host_us(baseline, device, calls, rounds=1))
        times.append(host_us(fn, device, calls, rounds=1))
    return statistics.median(times), statistics.median(base)


def entry_points(device: torch.device):
    """(name, call, baseline name, target ratio) of every public entry point."""
    rows = 1 if device.type == "cpu" else 16
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    x = torch.randn(rows, 64, device=device, dtype=dtype)
    w = torch.randn(64, 64, device=device, dtype=dtype)
    fmt = "float4_e2m1"
    scale, data = torch.ops.torchmx.quantize_mx(x, fmt, 32)
    x_mx = MXTensor.to_mx(x, fmt)
    w_mx = MXTensor.to_mx(w, fmt)
    linear = nn.Linear(64, 64, device=device, dtype=dtype)
    weight_only = QLinearConfig(MXConfig(fmt), None)
    packed = torchmx.MXInferenceLinear.from_float(linear, weight_only)
    qat = torchmx.MXLinear.from_float(linear, weight_only) if hasattr(
        torchmx.MXLinear, "from_float") else None
    cpu = device.type == "cpu"
    ops, operators = torchmx.ops, torch.ops.torchmx
    cases = [
        ("quantize_mx", lambda: ops.quantize_mx(x, fmt, 32), "x + 1", 5 if cpu else 2.5),
        ("dequantize_mx", lambda: ops.dequantize_mx(data, scale, fmt, 32, dtype), "x + 1",
         5 if cpu else 2.5),
        ("  torch.ops quantize", lambda: operators.quantize_mx(x, fmt, 32), "x + 1", None),
        ("  torch.ops dequantize", lambda: operators.dequantize_mx(data, scale, fmt, 32, dtype),
         "x + 1", None),
        ("MXTensor.to_mx", lambda: MXTensor.to_mx(x, fmt), "x + 1", 8 if cpu else 3.5),
        (".dequantize()", lambda: x_mx.dequantize(), "x + 1", 5 if cpu else 2.5),
        ("F.linear(x, w_mx)", lambda: F.linear(x, w_mx), "F.linear", 8 if cpu else 3),
        ("MXInferenceLinear", lambda: packed(x), "nn.Linear", 5 if cpu else 3),
        ("row+column quantize", lambda: quantize_mx_rowwise_colwise(w, fmt), "x + 1", None),
    ]
    if qat is not None:
        cases.append(("MXLinear (QAT)", lambda: qat(x), "nn.Linear", None))
    baselines = {"x + 1": lambda: x + 1, "F.linear": lambda: F.linear(x, w),
                 "nn.Linear": lambda: linear(x)}
    return cases, baselines


def host_table(device: torch.device, out) -> None:
    cases, baselines = entry_points(device)
    # one untimed pass over every call first: the first timed row was slower than the same
    # work timed later, its baseline too (H200 hosts: `x + 1` 11.9 and 12.2 us in the first
    # row, 8.2-8.6 us in the others, overhead_2026-11-28_1636/_1645)
    for _, fn, base_name, _ in cases:
        wall_us(fn, 400, 1, warmup=0, device=device)
        wall_us(baselines[base_name], 400, 1, warmup=0, device=device)
    where = device.type
    if device.index is not None and device.index != torch.cuda.current_device():
        where = f"{device} while cuda:{torch.cuda.current_device()} is current"
    print(f"\nhost cost per call on {where} (us; tiny tensors, grad mode on, "
          f"{torch.get_num_threads()} thread(s); each call timed in alternation with its "
          f"baseline)", file=out)
    print(f"{'call':<22}{'us':>9}  {'baseline':<11}{'us':>8}{'ratio':>8}{'target':>8}", file=out)
    for name, fn, base_name, target in cases:
        us, base = paired_us(fn, baselines[base_name], device)
        ratio = us / base
        verdict = "" if target is None else f"<= {target:g}" + (" ok" if ratio <= target else " MISS")
        print(f"{name:<22}{us:9.1f}  {base_name:<11}{base:8.1f}{ratio:8.2f}x "
              f"{verdict}", file=out)
    if where != device.type:
        return
    # the outputs kernel calls allocate: torchmx/kernels/_common.py `empty` on general paths,
    # torchmx/_allocation.py `allocator` (PyTorch's C allocator, current device) on bound ones
    shape = (16, 64)
    sizes, together = paired_us(lambda: empty(shape, torch.uint8, device),
                                lambda: torch.empty(shape, dtype=torch.uint8, device=device),
                                device)
    print(f"{'torch.empty(*sizes)':<22}{sizes:9.1f}  {'(sizes)':<11}{together:8.1f}"
          f"{sizes / together:8.2f}x  (torch.empty's sizes one by one / as one tuple)", file=out)
    new = allocator(shape, torch.uint8, device)
    c_allocator, sizes = paired_us(new, lambda: empty(shape, torch.uint8, device), device)
    print(f"{'C allocator':<22}{c_allocator:9.1f}  {'*sizes':<11}{sizes:8.1f}"
          f"{c_allocator / sizes:8.2f}x  (torchmx/_allocation.py / torch.empty(*sizes))", file=out)


def _mlp_blocks(hidden, intermediate, blocks, device):
    layers = []
    for _ in range(blocks):
        layers.append(nn.ModuleDict({
            "gate": nn.Linear(hidden, intermediate, bias=False),
            "up": nn.Linear(hidden, intermediate, bias=False),
            "down": nn.Linear(intermediate, hidden, bias=False)}))
    return nn.ModuleList(layers).to(device=device, dtype=torch.bfloat16)


class MLPStack(nn.Module):
    def __init__(self, hidden=4096, intermediate=14336, blocks=4, device="cuda"):
        super().__init__()
        self.blocks = _mlp_blocks(hidden, intermediate, blocks, device)

    def forward(self, x):
        for b in self.blocks:
            x = x + b["down"](F.silu(b["gate"](x)) * b["up"](x))
        return x


class _Preallocated(nn.Module):
    """A linear's stand-in for the host floor: returns one preallocated output (no work)."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def forward(self, x):
        return self.out


def _floor_stack(reference: MLPStack, rows: int) -> MLPStack:
    """`reference`'s blocks with every linear a _Preallocated of its output's shape."""
    stack = copy.deepcopy(reference)
    for block in stack.blocks:
        for name, linear in list(block.items()):
            block[name] = _Preallocated(torch.zeros(1, rows, linear.out_features,
                                                    device=linear.weight.device,
                                                    dtype=linear.weight.dtype))
    return stack


def _gpu_time_us(fn, calls=50, rounds=9) -> float:
    return wall_us(fn, calls, rounds)


def _eager_us(stacks: dict, x, calls=50, rounds=9) -> dict:
    """name -> median wall us per forward of each eager stack: an untimed pass over all first
    (Triton compiles, bound products), then the stacks take turns, round after round, so that
    a slow stretch of the host reaches every stack alike."""
    for stack in stacks.values():
        wall_us(lambda: stack(x), calls, 1)
    times = {name: [] for name in stacks}
    for _ in range(rounds):
        for name, stack in stacks.items():
            times[name].append(wall_us(lambda: stack(x), calls, 1, warmup=1))
    return {name: statistics.median(t) for name, t in times.items()}


def decode_models(formats=("MXFP4", "MXFP8")) -> dict:
    """{"bf16": MLPStack(), and for each name in `formats` its copy with `quantize_linear_`
    weights (MXFP4: float4_e2m1, MXFP8: float8_e4m3)}, the same bf16 weights (seed 0)."""
    import copy
    torch.manual_seed(0)
    reference = MLPStack()
    models = {"bf16": reference}
    for fmt, name in (("float4_e2m1", "MXFP4"), ("float8_e4m3", "MXFP8")):
        if name in formats:
            model = copy.deepcopy(reference)
            torchmx.quantize_linear_(model, QLinearConfig(MXConfig(fmt), None))
            models[name] = model
    return models


def mlp_table(out, row_counts=(1, 16)) -> None:
    models = decode_models()
    print("\n4 Llama MLP blocks (H 4096, I 14336), decode, wall time per forward (us), "
          "torch.no_grad(); inductor's static launcher for user-defined Triton kernels: "
          f"{'on' if _static_user_launch() else 'off'}", file=out)
    print(f"{'rows':>4} {'weights':<7}{'eager':>10}{'compile':>10}{'graphs':>10}"
          f"{'  vs bf16: eager / compile / graphs'}{'   eager after the compiles':>28}",
          file=out)
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch.no_grad():
        for rows in row_counts:
            x = torch.randn(1, rows, 4096, device="cuda", dtype=torch.bfloat16)
            floor = _floor_stack(models["bf16"], rows)
            stacks = dict(models, floor=floor)
            # every eager time before any compile of this row count (see the docstring)
            eager = _eager_us(stacks, x)
            times = {}
            for name, stack in stacks.items():
                torch._dynamo.reset()
                compiled = torch.compile(stack)
                compiled(x)
                graphs = None
                if name != "floor":  # (the floor: no graphs, no outputs to compare)
                    graphs = torch.compile(stack, mode="reduce-overhead")
                    eager_out = stack(x)
                    for mode, fn in (("compile", compiled), ("graphs", graphs)):
                        y = fn(x).clone()
                        if not torch.equal(y, eager_out):
                            diff = (y.float() - eager_out.float()).abs().max().item()
                            print(f"not bit-identical: {name}, {rows} rows, {mode} vs eager "
                                  f"(max |diff| {diff:.3g})", file=out)
                times[name] = [eager[name], _gpu_time_us(lambda: compiled(x)),
                               None if graphs is None else _gpu_time_us(lambda: graphs(x))]
            after = _eager_us(stacks, x)
            b = times["bf16"]
            for name, (e, c, g) in times.items():
                if name == "floor":
                    print(f"{rows:>4} {'floor':<7}{e:10.1f}{c:10.1f}{'':>10}   {b[0] / e:5.2f}x / "
                          f"{b[1] / c:5.2f}x  (linears that cost nothing: the most any could "
                          f"give){after[name]:10.1f}", file=out)
                    continue
                print(f"{rows:>4} {name:<7}{e:10.1f}{c:10.1f}{g:10.1f}   "
                      f"{b[0] / e:5.2f}x / {b[1] / c:5.2f}x / {b[2] / g:5.2f}x"
                      f"{after[name]:28.1f}", file=out)
    breaks = sum(counters["graph_break"].values())
    print(f"compiled: {breaks} graph breaks, {counters['stats'].get('unique_graphs', 0)} graphs "
          f"for {len(row_counts) * (1 + 2 * len(models))} compiled models (floor included; one "
          f"graph each when nothing breaks or recompiles)", file=out)


def _static_user_launch() -> bool:
    import torch._inductor.config as inductor_config
    return bool(getattr(inductor_config, "static_launch_user_defined_triton_kernels", False))


QAT_RECIPES = {  # name -> (weights, activations): MXLinear's forward quantizes both
    "MXFP8 QAT": ("float8_e4m3", "float8_e4m3"),
    "MXFP4 QAT": ("float4_e2m1", "float8_e4m3"),
}


def _fake_quantized(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """t's MX values by the reference numerics (torchmx/numerics/reference.py), in t's dtype."""
    from torchmx.numerics import dequantize_mx_reference, quantize_mx_reference
    scale, data = quantize_mx_reference(t, fmt, 32)
    return dequantize_mx_reference(data, scale, fmt, 32, t.dtype, block_dim_size=t.shape[-1])


def qat_table(out, tokens=8192, steps=5, rounds=5, hidden=4096, intermediate=14336,
              device="cuda") -> None:
    """Training steps of the 4 MLP blocks on `tokens` tokens (8 sequences), eager: forward, a
    mean-square loss, backward and AdamW, bf16 against `prepare_qat_` MXLinear layers."""
    torch.manual_seed(0)
    reference = MLPStack(hidden, intermediate, device=device)
    models = {"bf16": reference}
    for name, (weights, activations) in QAT_RECIPES.items():
        model = copy.deepcopy(reference)
        torchmx.prepare_qat_(model, QLinearConfig(MXConfig(weights), MXConfig(activations)),
                             progress=False)
        models[name] = model
    x = torch.randn(8, tokens // 8, hidden, device=device, dtype=torch.bfloat16)
    with torch.no_grad():  # first: an MX layer's forward is the reference numerics' product
        for name, (weights, activations) in QAT_RECIPES.items():
            gate = models[name].blocks[0]["gate"]
            expected = F.linear(_fake_quantized(x, activations),
                                _fake_quantized(gate.weight, weights))
            if not torch.equal(gate(x), expected):
                raise SystemExit(f"QAT: {name}'s first linear differs from F.linear of the "
                                 "reference's quantized operands")
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-5)
                  for name, m in models.items()}

    def step(name):
        loss = models[name](x).float().square().mean()
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        return loss

    for name in models:
        if not torch.isfinite(step(name)):
            raise SystemExit(f"QAT: {name}'s loss is not finite")
    times = {name: [] for name in models}
    for _ in range(rounds):  # the models take turns, so a drift of the clocks hits all alike
        for name in models:
            times[name].append(wall_us(lambda: step(name), steps, 1, warmup=1,
                                       device=device) / 1000)
    print(f"\n4 Llama MLP blocks (H {hidden}, I {intermediate}), QAT training steps of {tokens} "
          f"tokens, eager (forward, mean-square loss, backward, AdamW), ms per step, median of "
          f"{rounds} rounds of {steps} steps", file=out)
    base = times["bf16"]
    for name, ms in times.items():
        ratios = sorted(a / b for a, b in zip(ms, base))
        print(f"{name:<10}{statistics.median(ms):9.2f} ms   {statistics.median(ratios):5.3f}x "
              f"of bf16 (rounds {ratios[0]:.3f}-{ratios[-1]:.3f})", file=out)
    print("target (issue #44): QAT steps keep their speed, 1.01-1.03x of bf16 before the "
          "issue's changes", file=out)


def large_m_table(out) -> None:
    torch.manual_seed(0)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    w_mx = MXTensor.to_mx(w, "float4_e2m1")
    w_hat = w_mx.dequantize()
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        if not torch.equal(F.linear(x, w_mx), F.linear(x, w_hat)):
            raise SystemExit("8192 rows: the MX linear differs from cuBLAS on the dequantized W")
        mx = _gpu_time_us(lambda: F.linear(x, w_mx), calls=10, rounds=5)
        bf16 = _gpu_time_us(lambda: F.linear(x, w_hat), calls=10, rounds=5)
    print(f"\n8192 x 8192 x 8192, eager: MXFP4 weight {mx:.0f} us, cuBLAS bf16 on the "
          f"dequantized weight {bf16:.0f} us: {mx / bf16:.3f}x (target <= 1.05x)", file=out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all")
    parser.add_argument("--mlp", action="store_true", help="the MLP decode table (CUDA)")
    parser.add_argument("--large-m", action="store_true", help="8192 rows (CUDA)")
    parser.add_argument("--qat", action="store_true", help="QAT training steps (CUDA)")
    parser.add_argument("--other-gpu", action="store_true",
                        help="the host table on cuda:1 while cuda:0 is current (two GPUs)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16],
                        help="activation rows of the MLP decode table")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/")
    options = parser.parse_args()
    out = io.StringIO()

    class Tee:
        def write(self, text):
            sys.stdout.write(text)
            out.write(text)

    tee = Tee()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"bench_overhead, {datetime.date.today()}, torch {torch.__version__}, torchmx "
          f"{torchmx.__version__}, CPU {platform.processor() or platform.machine()}, {gpu}",
          file=tee)
    if options.device in ("cpu", "all"):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        host_table(torch.device("cpu"), tee)
        torch.set_num_threads(threads)
    if options.device in ("cuda", "all") and torch.cuda.is_available():
        host_table(torch.device("cuda"), tee)
        if options.other_gpu:
            if torch.cuda.device_count() < 2:
                raise SystemExit("--other-gpu needs two CUDA GPUs")
            torch.cuda.set_device(0)
            host_table(torch.device("cuda", 1), tee)
        if options.mlp:
            mlp_table(tee, options.rows)
        if options.large_m:
            large_m_table(tee)
        if options.qat:
            qat_table(tee)
    if options.save:
        RESULTS.mkdir(exist_ok=True)
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        slug = "".join(c if c.isalnum() else "-" for c in device.lower()).strip("-")
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d_%H%M")
        suffix = "_static-launch" if options.mlp and _static_user_launch() else ""
        path = RESULTS / f"overhead_{stamp}_{slug}{suffix}.txt"
        path.write_text(out.getvalue())
        print(f"written: {path}")


if __name__ == "__main__":
    main()

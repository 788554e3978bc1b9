"""FSDP2 QAT with MX weights on 2 ranks: correctness first, then bytes all-gathered and step time.

    PYTHONPATH=. torchrun --nproc_per_node 2 benchmarks/bench_distributed.py   # 2 GPUs, NCCL
    PYTHONPATH=. torchrun --nproc_per_node 2 benchmarks/bench_distributed.py --device cpu
                                                             # gloo, a tiny model

1. Checks (a small Llama-style model, fp32 parameters, deterministic algorithms, eager
   attention): after `fully_shard`, every MXLinear weight unsharded by FSDP2 is an MXTensor
   whose codes and scales equal quantizing the whole weight on one rank; then `--check-steps`
   (20) AdamW steps of FSDP2 MX-QAT on 2 ranks give the same losses, bit for bit, as one
   process (rank 0 alone) on the same global batch as the same two micro-batches; and
   FSDP2 over "dp" with tensor parallelism over "tp" on the (1, N) and (N, 1) meshes of the N
   ranks (column-wise then row-wise MXLinear with MX all-gather, exact integer arithmetic):
   3 steps' losses and parameters equal one process's.
2. Timings (`--size 1b`: a Llama-style model of 1.2B parameters, hidden 2048, 16 layers,
   sequence 2048, `--batch` sequences per rank, one table each; `--size tiny` on CPU), every
   run with FSDP2 and
   MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 master weights, AdamW:
   - bf16: nn.Linear layers (the baseline);
   - mxfp8 (hp gather): MXLinear, MXFP8 weights and activations, weights gathered in bf16;
   - mxfp8, mxfp4: the same with `enable_mx_all_gather` (MXFP4 weights with MXFP8
     activations), weights gathered as MX bytes;
   - mxfp4 +lm_head: mxfp4 with lm_head in MX QAT too (gathered as MX bytes); in every other
     recipe the embedding and lm_head stay in bf16 (not quantized).
   One model at a time (`--recipes` picks them), `--rounds` times over (the step-time
   ratio: each round against its own bf16, the median over rounds), and bf16 once more at
   the end: how far the machine's speed drifted during the run.
   It prints the bytes each rank receives from FSDP2's all-gathers in one training step
   (forward and backward; all parameters, and the decoder layers' linear weights alone) and
   the median step time, each as a ratio to bf16 (issue 48's targets: bytes <= 0.55x for
   MXFP8 and <= 0.30x for MXFP4; step time <= 1.10x). The hp-gather and MX-gather runs
   quantize the same bf16 weights: their first-step losses must agree bit for bit, and the
   script says whether they do (later steps may not: the timed runs allow nondeterministic
   kernels). "host ms" is when the host had queued the step: where it is close to the step
   time, the host is the limit. `--compile` adds bf16, mxfp8 and mxfp4 with each decoder
   layer compiled after `fully_shard` (torch.compile, default mode) to the same table.
3. `--profile [RECIPE ...]` instead: torch.profiler over `--profile-steps` steps of each recipe
   on rank 0, printing host and device milliseconds per step by phase (the MX all-gather hooks,
   FSDP2's all-gather, copy-out and reduce-scatter, MXLinear forward and backward, quantize,
   dequantize, matmuls, copies, host syncs), the top kernels and host ops; `--trace-dir`
   writes each profile's Chrome trace (gzipped). `--python-profile [RECIPE ...]`: cProfile
   instead, the Python functions that hold the host longest.

NVLink multicast (NVLS) is left off (NCCL_NVLS_ENABLE=0 unless set).
"""

import argparse
import contextlib
import datetime
import functools
import gzip
import os
import shutil
import statistics
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (checks)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # noqa: E402

import torchmx  # noqa: E402
from torchmx import MXTensor  # noqa: E402
from torchmx.config import MXConfig, QLinearConfig  # noqa: E402
from torchmx.distributed import enable_mx_all_gather  # noqa: E402
from torchmx.distributed.all_gather_weight import gathered_bytes_per_row  # noqa: E402

SIZES = {  # hidden, intermediate, layers, heads, vocab, sequence
    "tiny": (128, 256, 2, 4, 512, 64),
    "small": (256, 512, 2, 4, 1024, 128),
    "1b": (2048, 8192, 16, 16, 32000, 2048),
}
RECIPES = {  # weights, activations, MX all-gather, lm_head in QAT too
    "bf16": None,
    "mxfp8 (hp gather)": ("float8_e4m3", "float8_e4m3", False, False),
    "mxfp8": ("float8_e4m3", "float8_e4m3", True, False),
    "mxfp4": ("float4_e2m1", "float8_e4m3", True, False),
    "mxfp4 +lm_head": ("float4_e2m1", "float8_e4m3", True, True),
}
COMPILED = ("bf16", "mxfp8", "mxfp4")  # the recipes `--compile` also times compiled


def llama(size: str, device, eager_attention=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, intermediate, layers, heads, vocab, _ = SIZES[size]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, vocab_size=vocab,
                         max_position_embeddings=SIZES[size][5], tie_word_embeddings=False)
    config._attn_implementation = "eager" if eager_attention else "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config)


def prepare(model, recipe):
    """MXLinear layers per `recipe` (lm_head excluded unless the recipe says otherwise);
    returns the MX-gathered layers."""
    if recipe is None:
        return []
    weights, activations, mx_gather, lm_head = recipe
    config = QLinearConfig(weights_config=MXConfig(weights),
                           activations_config=MXConfig(activations))
    torchmx.prepare_qat_(model, config, exclude=[] if lm_head else ["lm_head"], progress=False)
    return enable_mx_all_gather(model) if mx_gather else []


def shard(model, mp_policy=None, compile_layers=False):
    """FSDP2 per decoder layer and over the model; `compile_layers`: each layer compiled too
    (FSDP2's hooks, the MX all-gather ones included, run eagerly around it)."""
    kwargs = {} if mp_policy is None else {"mp_policy": mp_policy}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
        if compile_layers:
            layer.compile()
    fully_shard(model, **kwargs)
    return model


def tokens(step, rank, size, device, world, batch=1):
    """Rank `rank`'s `batch` sequences of step `step` (the global batch is every rank's)."""
    _, _, _, _, vocab, seq = SIZES[size]
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (world * batch, seq), generator=g)
    return ids[rank * batch:(rank + 1) * batch].to(device)


def step_loss(model, ids):
    # no KV cache in training (it would also make each compiled layer a graph of its own)
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def optimizer(model, foreach=None):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)


# ------------------------------------------------------------------------------ 1. checks

def check_gathered_weights(size, device, rank):
    """Each MXLinear weight unsharded by FSDP2 equals quantizing the whole weight."""
    reference = llama(size, device)
    prepare(reference, RECIPES["mxfp8"])
    model = llama(size, device)
    names = prepare(model, RECIPES["mxfp8"])
    shard(model)
    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for group in groups:
        group.unshard()
    modules = dict(model.named_modules())
    same = True
    for name in names:
        weight = modules[name].weight
        full = dict(reference.named_modules())[name].weight.detach().hp
        scale, data = modules[name].qconfig.weights_config.quantize(full, -1)
        same &= (isinstance(weight, MXTensor) and torch.equal(weight._scale_e8m0, scale)
                 and torch.equal(weight._data, data))
    for group in groups:
        group.reshard()
    return same, len(names)


def check_losses(size, device, rank, world, steps):
    """FSDP2 MX-QAT losses on `world` ranks against one process, bit for bit."""
    torch.use_deterministic_algorithms(True, warn_only=True)  # a nondeterministic op: NO
    try:
        model = llama(size, device, eager_attention=True)
        prepare(model, RECIPES["mxfp8"])
        shard(model)
        opt = optimizer(model, foreach=False)
        losses = []
        for step in range(steps):
            loss = step_loss(model, tokens(step, rank, size, device, world))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        gathered = [torch.empty(steps, device=device) for _ in range(world)]
        dist.all_gather(gathered, torch.stack(losses))
        if rank != 0:
            dist.barrier()
            return None
        reference = llama(size, device, eager_attention=True)
        prepare(reference, RECIPES["mxfp8"])
        opt = optimizer(reference, foreach=False)
        expected = torch.empty(world, steps, device=device)
        for step in range(steps):
            for r in range(world):  # the global batch as the ranks' micro-batches
                loss = step_loss(reference, tokens(step, r, size, device, world))
                (loss / world).backward()
                expected[r, step] = loss.detach()
            opt.step()
            opt.zero_grad()
        dist.barrier()
        got = torch.stack(gathered)
        return torch.equal(got, expected), (got - expected).abs().max().item()
    finally:
        torch.use_deterministic_algorithms(False)


def tp_mlp(fmt, device):
    """64 -> 128 -> 64 MLP of MXLinear layers (MXFP8 activations) with small integer weights:
    with integer inputs, a sum of the output as the loss and SGD at a power-of-two rate, every
    product and fp32 sum stays exact, so tensor parallel partial sums give one process's bits."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64)).to(device)
    with torch.no_grad():
        for layer in (model[0], model[2]):
            layer.weight.copy_(torch.randint(-3, 4, layer.weight.shape))
            layer.bias.copy_(torch.randint(-3, 4, layer.bias.shape))
    torchmx.prepare_qat_(model, QLinearConfig(weights_config=MXConfig(fmt),
                                              activations_config=MXConfig("float8_e4m3")),
                         progress=False)
    return model


def check_fsdp_tp(device, rank, world, steps=3, lr=2.0 ** -7):
    """FSDP2 over "dp" and tensor parallelism over "tp" (column-wise then row-wise MXLinear,
    MX all-gather) on the 2-d meshes `world` ranks make, (1, world) and (world, 1): the losses
    and parameters after `steps` SGD steps against one process, bit for bit."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    def data(step, dp_rank, dp):
        g = torch.Generator().manual_seed(300 + step)
        x = torch.randint(-3, 4, (dp * 4, 64), generator=g).float()
        return x[dp_rank * 4:(dp_rank + 1) * 4].to(device)

    results = []
    for fmt in ("float8_e4m3", "float4_e2m1"):
        for shape in ((1, world), (world, 1)):
            mesh = init_device_mesh(device.type, shape, mesh_dim_names=("dp", "tp"))
            model = parallelize_module(tp_mlp(fmt, device), mesh["tp"],
                                       {"0": ColwiseParallel(), "2": RowwiseParallel()})
            wrapped = enable_mx_all_gather(model)
            for i in (0, 2):
                fully_shard(model[i], mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            dp_rank, losses = mesh["dp"].get_local_rank(), []
            for step in range(steps):
                loss = model(data(step, dp_rank, shape[0])).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            params = {n: p.full_tensor() for n, p in model.named_parameters()}
            reference = tp_mlp(fmt, device)
            ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
            expected = []
            for step in range(steps):
                for r in range(shape[0]):
                    loss = reference(data(step, r, shape[0])).sum()
                    (loss / shape[0]).backward()
                    expected.append(loss.detach())
                ref_opt.step()
                ref_opt.zero_grad()
            same = wrapped == ["0", "2"] and all(
                torch.equal(losses[s], expected[s * shape[0] + dp_rank]) for s in range(steps))
            same &= all(torch.equal(params[n], p) for n, p in reference.named_parameters())
            flags = torch.tensor([float(same)], device=device)
            dist.all_reduce(flags, op=dist.ReduceOp.MIN)
            results.append((fmt, shape, bool(flags.item())))
    return results


# ------------------------------------------------------------------------------ 2. timings

class AllGatherBytes:
    """Counts the bytes FSDP2's all-gathers write on this rank (it calls dist.all_gather_single,
    or dist.all_gather_into_tensor in older torch)."""

    def __init__(self):
        self.total, self.counting = 0, False
        for name in ("all_gather_single", "all_gather_into_tensor"):
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._counted(original))

    def _counted(self, original):
        def call(output_tensor, input_tensor, *args, **kwargs):
            if self.counting:
                self.total += output_tensor.numel() * output_tensor.element_size()
            return original(output_tensor, input_tensor, *args, **kwargs)
        return call


def linear_weight_bytes(model, mx_gathered) -> int:
    """Bytes of the quantizable linear weights (all but lm_head) in one all-gather pass: MX
    bytes for the MX-gathered layers, bf16 for the others."""
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head":
            continue
        rows, cols = module.out_features, module.in_features
        if name in mx_gathered:
            total += rows * gathered_bytes_per_row(cols, module.qconfig.weights_config)
        else:
            total += rows * cols * 2
    return total


def build_run(name, size, device, compile_layers=False):
    """A model of recipe `name` under FSDP2 (bf16 parameters, fp32 reductions), its optimizer
    and the bytes its linear layers' weights gather per step."""
    model = llama(size, device)
    mx_gathered = prepare(model, RECIPES[name])
    # forward and backward each gather every layer's weights (resharded after forward)
    layer_bytes = 2 * linear_weight_bytes(model, mx_gathered)
    shard(model, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
          compile_layers)
    return {"model": model, "opt": optimizer(model), "layer_bytes": layer_bytes,
            "times": [], "queued": [], "losses": []}


def time_recipes(names, size, device, rank, world, steps, counter, batch=1, compiled=(),
                 rounds=1):
    """Median step time of each recipe in `names`, then of those in `compiled` with each
    decoder layer compiled (labelled "... compiled"), `rounds` times over, then of bf16 once
    more ("bf16 again": how far the machine's speed drifted during the run). One model at a
    time, as in a training run: built, 3 warm-up steps, `steps` timed ones, freed. (In a run
    that kept every model and took turns step by step, the MX recipes' step times rose by tens
    of ms more than bf16's: results/distributed_2026-11-28_1109_2x-nvidia-h200_interleaved.txt.)
    Returns {label: {"step_s": [a median per round], "host_s": [...], ...}}."""
    labels = [(name, False) for name in names] + [(name, True) for name in compiled]
    sequence = labels * rounds + [("bf16", False)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = {}
    for index, (name, compile_layers) in enumerate(sequence):
        run = build_run(name, size, device, compile_layers)
        model, opt = run["model"], run["opt"]
        for step in range(3 + steps):
            ids = tokens(step, rank, size, device, world, batch)
            counter.total, counter.counting = 0, step == 2
            sync()
            start = time.perf_counter()
            loss = step_loss(model, ids)
            loss.backward()
            opt.step()
            opt.zero_grad()
            host = time.perf_counter() - start  # the host has queued the step
            sync()
            counter.counting = False
            if step == 2:
                run["step_bytes"] = counter.total
            if step >= 3:
                run["times"].append(time.perf_counter() - start)
                run["queued"].append(host)
            run["losses"].append(loss.detach().float().cpu())
        label = f"{name} compiled" if compile_layers else name
        if index == len(sequence) - 1:
            label = "bf16 again"
        entry = results.setdefault(label, {
            "step_bytes": run["step_bytes"], "layer_bytes": run["layer_bytes"],
            "step_s": [], "host_s": [], "losses": torch.stack(run["losses"])})
        entry["step_s"].append(statistics.median(run["times"]))
        entry["host_s"].append(statistics.median(run["queued"]))
        del run, model, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


# ------------------------------------------------------------------------------ 3. profile

# Host-side phases of a training step: torch.profiler ranges FSDP2 opens itself (FSDP::...),
# the ones `_label_phases` adds, and the ops that do the work.
PHASES = [
    ("step: forward", "step::forward"),
    ("step: backward", "step::backward"),
    ("step: optimizer", "step::optimizer"),
    ("pre-all-gather quantize (hook)", "mx::fsdp_pre_all_gather"),
    ("all-gather (copy-in + collective)", "FSDP::all_gather"),
    ("all-gather copy-out", "FSDP::all_gather_copy_out"),
    ("post-all-gather (hook)", "mx::fsdp_post_all_gather"),
    ("MXLinear forward", "mx::linear_forward"),
    ("MXLinear backward", "mx::linear_backward"),
    ("quantize (torchmx::quantize_mx)", "torchmx::quantize_mx"),
    ("dequantize (torchmx::dequantize_mx)", "torchmx::dequantize_mx"),
    ("matmuls (aten::mm)", "aten::mm"),
    ("matmuls (aten::addmm)", "aten::addmm"),
    ("matmuls (aten::bmm)", "aten::bmm"),
    ("FSDP pre-backward", "FSDP::pre_backward"),
    ("FSDP reduce-scatter (post_backward_reduce)", "FSDP::post_backward_reduce"),
    ("copies (aten::copy_)", "aten::copy_"),
    ("host syncs (aten::item)", "aten::item"),
    ("host syncs (cudaStreamSynchronize)", "cudaStreamSynchronize"),
]


def _label_phases():
    """Open a profiler range around the MX all-gather hooks and MXLinear's forward and backward
    (profile runs only)."""
    from torch.profiler import record_function

    from torchmx.distributed.all_gather_weight import MXAllGatherWeight
    from torchmx.nn.mx_linear import _MXLinearFunction

    def labelled(fn, label):
        @functools.wraps(fn)  # FSDP2 checks the hooks' signatures
        def call(*args, **kwargs):
            with record_function(label):
                return fn(*args, **kwargs)
        return call

    # fsdp_pre_all_gather is a property handing out a hook that calls _pre_all_gather
    for name, label in (("_pre_all_gather", "fsdp_pre_all_gather"),
                        ("fsdp_post_all_gather", "fsdp_post_all_gather")):
        setattr(MXAllGatherWeight, name, labelled(getattr(MXAllGatherWeight, name), f"mx::{label}"))
    _MXLinearFunction.forward = staticmethod(labelled(_MXLinearFunction.forward,
                                                      "mx::linear_forward"))
    _MXLinearFunction.backward = staticmethod(labelled(_MXLinearFunction.backward,
                                                       "mx::linear_backward"))


def _profiled_setup(name, size, device):
    """(model, optimizer, synchronize) of `recipe` for the profilers below: the Llama of `size`
    prepared and sharded as the timed steps' are."""
    model = llama(size, device)
    prepare(model, RECIPES[name])
    shard(model, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return model, optimizer(model), sync


def profile_recipe(name, size, device, rank, world, steps, say, trace_dir=None, batch=1):
    """`steps` profiled training steps of `recipe` on rank 0 (after 3 warm-up steps): the time
    each phase holds the host (ms per step; ranges nest, so rows overlap) and the device time of
    the kernels it launched, then the kernels that take the most device time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model, opt, sync = _profiled_setup(name, size, device)

    def train_step(step):
        ids = tokens(step, rank, size, device, world, batch)
        with record_function("step::forward"):
            loss = step_loss(model, ids)
        with record_function("step::backward"):
            loss.backward()
        with record_function("step::optimizer"):
            opt.step()
            opt.zero_grad()

    for step in range(3):
        train_step(step)
    sync()
    unprofiled = []
    for step in range(3, 6):
        start = time.perf_counter()
        train_step(step)
        sync()
        unprofiled.append(time.perf_counter() - start)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    host, wall = [], []
    prof = profile(activities=activities) if rank == 0 else contextlib.nullcontext()
    with prof:
        for step in range(6, 6 + steps):
            start = time.perf_counter()
            train_step(step)
            host.append(time.perf_counter() - start)  # the host has queued the step
            sync()
            wall.append(time.perf_counter() - start)
    model = opt = None  # freed before the next recipe (the closure holds the names)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if rank != 0:
        return
    events = prof.key_averages()
    # A profiler range appears twice: on the host (its host time, and the device time of the
    # kernels launched inside it) and as a device-side annotation, which is no kernel.
    host_events = [e for e in events if e.device_type.name == "CPU"]
    by_name = {e.key: e for e in host_events}
    kernels = [e for e in events if e.device_type.name in ("CUDA", "PrivateUse1")
               and e.self_device_time_total > 0 and not getattr(e, "is_user_annotation", False)
               and e.key not in by_name]
    busy = sum(e.self_device_time_total for e in kernels) / 1e3 / steps
    if trace_dir:
        path = os.path.join(trace_dir, f"trace_{name.split()[0]}{'_hp' if 'hp' in name else ''}.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(path)
    say(f"\n## profile: {name}, {batch} sequence{'s' if batch > 1 else ''} per rank ({steps} steps on "
        f"rank 0, profiler on)")
    say(f"step without the profiler {statistics.median(unprofiled) * 1e3:.1f} ms; "
        f"with it: wall {statistics.median(wall) * 1e3:.1f} ms, host queued the step in "
        f"{statistics.median(host) * 1e3:.1f} ms, kernels (all streams) {busy:.1f} ms")
    say(f"{'phase':44} {'calls':>6} {'host ms':>9} {'device ms':>10}")
    for label, key in PHASES:
        e = by_name.get(key)
        if e is None:
            # FSDP2 appends the module name to its ranges: sum over modules
            matches = [x for x in host_events if x.key.startswith(key + " (")]
            if not matches:
                continue
            calls = sum(x.count for x in matches)
            cpu = sum(x.cpu_time_total for x in matches)
            dev = sum(x.device_time_total for x in matches)
        else:
            calls, cpu, dev = e.count, e.cpu_time_total, e.device_time_total
        say(f"{label:44} {calls // steps:6d} {cpu / 1e3 / steps:9.2f} {dev / 1e3 / steps:10.2f}")
    kernels.sort(key=lambda e: -e.self_device_time_total)
    say(f"{'top kernels':80} {'calls':>6} {'ms':>8}")
    for e in kernels[:15]:
        say(f"{e.key[:80]:80} {e.count // steps:6d} {e.self_device_time_total / 1e3 / steps:8.2f}")
    ops = sorted(host_events, key=lambda e: -e.self_cpu_time_total)
    say(f"{'top host ops (self time)':80} {'calls':>6} {'ms':>8}")
    for e in ops[:12]:
        say(f"{e.key[:80]:80} {e.count // steps:6d} {e.self_cpu_time_total / 1e3 / steps:8.2f}")


def python_profile_recipe(name, size, device, rank, world, steps, say, top=30, batch=1):
    """cProfile over `steps` training steps of `recipe` on rank 0 (after 3 warm-up steps): the
    Python functions that hold the host longest (own time and with callees, ms per step), where
    a host-bound step spends its time. cProfile slows Python calls: compare rows, not totals."""
    import cProfile
    import pstats

    model, opt, sync = _profiled_setup(name, size, device)

    def train_step(step):
        loss = step_loss(model, tokens(step, rank, size, device, world, batch))
        loss.backward()
        opt.step()
        opt.zero_grad()

    for step in range(3):
        train_step(step)
    sync()
    profiler = cProfile.Profile()
    for step in range(3, 3 + steps):
        if rank == 0:
            profiler.enable()
        train_step(step)
        if rank == 0:
            profiler.disable()
        sync()
    model = opt = None  # freed before the next recipe (the closure holds the names)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if rank != 0:
        return
    stats = pstats.Stats(profiler).stats  # (file, line, function) -> (cc, calls, tt, ct, callers)
    total = sum(tt for _, _, tt, _, _ in stats.values())
    say(f"\n## python profile: {name}, {batch} sequence{'s' if batch > 1 else ''} per rank ({steps} "
        f"steps on rank 0, cProfile on): "
        f"{total * 1e3 / steps:.1f} ms of host time per step")
    for order, label in ((2, "own"), (3, "with callees")):
        say(f"{'function (' + label + ' time)':86} {'calls':>6} {'own ms':>8} {'cum ms':>8}")
        rows = sorted(stats.items(), key=lambda kv: -kv[1][order])[:top]
        for (file, line, fn), (_, calls, tt, ct, _) in rows:
            where = f"{fn} {os.path.basename(os.path.dirname(file))}/{os.path.basename(file)}:{line}"
            say(f"{where[:86]:86} {calls // steps:6d} {tt * 1e3 / steps:8.2f} {ct * 1e3 / steps:8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=tuple(SIZES), default=None,
                        help="model of the timings (default: 1b on cuda, tiny on cpu)")
    parser.add_argument("--check-size", choices=tuple(SIZES), default=None,
                        help="model of the checks (default: small on cuda, tiny on cpu)")
    parser.add_argument("--check-steps", type=int, default=20)
    parser.add_argument("--no-checks", action="store_true", help="timings only")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the recipes this many times over, one model at a time; "
                             "ratios: each round against its own bf16, median over rounds")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per recipe")
    parser.add_argument("--batch", type=int, nargs="+", default=[1],
                        help="sequences per rank in the timed steps (one table each); "
                             "--profile and --python-profile take the first")
    parser.add_argument("--save", default=None, help="also write the printed output here")
    parser.add_argument("--recipes", nargs="+", choices=tuple(RECIPES), default=list(RECIPES),
                        help="the recipes timed (bf16, the baseline, always)")
    parser.add_argument("--compile", action="store_true",
                        help=f"also time {', '.join(COMPILED)} with each decoder layer compiled "
                             "(torch.compile, default mode)")
    parser.add_argument("--profile", nargs="*", choices=tuple(RECIPES), default=None,
                        help="profile these recipes (all by default) instead of the checks and "
                             "timings")
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument("--python-profile", nargs="*", choices=tuple(RECIPES), default=None,
                        help="cProfile these recipes (all by default) instead of the checks "
                             "and timings: the Python functions holding the host")
    parser.add_argument("--trace-dir", default=None,
                        help="write each profile's Chrome trace here (gzipped)")
    args = parser.parse_args()
    size = args.size or ("1b" if args.device == "cuda" else "tiny")
    args.recipes = ["bf16"] + [r for r in args.recipes if r != "bf16"]
    check_size = args.check_size or ("small" if args.device == "cuda" else "tiny")

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
        name = torch.cuda.get_device_name(device)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        name = "CPU"
    counter = AllGatherBytes()
    printed = []

    def say(*parts):
        if rank == 0:
            print(*parts)
            printed.append(" ".join(str(p) for p in parts))

    say(f"# PYTHONPATH=. torchrun --nproc_per_node {world} benchmarks/bench_distributed.py "
        + " ".join(sys.argv[1:]))
    say(f"# bench_distributed: {world} ranks on {name}, torch {torch.__version__}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")

    if args.python_profile is not None:
        for recipe in args.python_profile or RECIPES:
            python_profile_recipe(recipe, size, device, rank, world, args.profile_steps, say,
                                  batch=args.batch[0])
    if args.profile is not None:
        _label_phases()
        for recipe in args.profile or RECIPES:
            profile_recipe(recipe, size, device, rank, world, args.profile_steps, say,
                           args.trace_dir, batch=args.batch[0])
    if args.profile is not None or args.python_profile is not None:
        if args.save and rank == 0:
            with open(args.save, "w") as f:
                f.write("\n".join(printed) + "\n")
        dist.destroy_process_group()
        return

    if not args.no_checks:
        same, count = check_gathered_weights(check_size, device, rank)
        say(f"check: {count} MXLinear weights gathered by FSDP2 as MXTensors equal to quantizing "
            f"the whole weight: {'yes' if same else 'NO'}")
        losses = check_losses(check_size, device, rank, world, args.check_steps)
        if losses is not None:
            equal, diff = losses
            say(f"check: {args.check_steps} steps of FSDP2 MX-QAT on {world} ranks, losses equal "
                f"to one process: {'yes' if equal else f'NO (max difference {diff:.3g})'}")
        for fmt, shape, same in check_fsdp_tp(device, rank, world):
            say(f"check: FSDP2 + tensor parallel MX-QAT on a {shape} (dp, tp) mesh, {fmt} weights, "
                f"3 steps: losses and parameters equal to one process: {'yes' if same else 'NO'}")

    for batch in args.batch:
        results = time_recipes(args.recipes, size, device, rank, world, args.steps, counter,
                               batch, [r for r in COMPILED if r in args.recipes] if args.compile
                               else (), args.rounds)
        report(results, size, batch, args.steps, say)
        if args.save and rank == 0:  # after each table: a later one may run out of memory
            with open(args.save, "w") as f:
                f.write("\n".join(printed) + "\n")
    dist.destroy_process_group()


def report(results, size, batch, steps, say):
    params = sum(p.numel() for p in llama(size, "meta").parameters())
    say(f"\n{size} Llama-style model ({params / 1e6:,.1f}M parameters), sequence "
        f"{SIZES[size][5]}, {batch} sequence{'s' if batch > 1 else ''} per rank, median of "
        f"{steps} timed steps")
    base = results["bf16"]
    rounds = len(base["step_s"])
    say(f"{'recipe':24} {'gathered/step MB':>17} {'x bf16':>7} {'linear weights MB':>18} "
        f"{'x bf16':>7} {'step ms':>9} {'x bf16':>7} {'host ms':>8}"
        + ("  x bf16 by round" if rounds > 1 else ""))

    def ratio(a, b):
        return f"{a / b:7.3f}" if b else f"{'n/a':>7}"

    for recipe, r in results.items():
        # the step-time ratio: each round's against that round's bf16, the median over rounds
        by_round = [t / b for t, b in zip(r["step_s"], base["step_s"])]
        if recipe == "bf16 again":
            by_round = [r["step_s"][0] / base["step_s"][0]]
        say(f"{recipe:24} {r['step_bytes'] / 1e6:17.1f} "
            f"{ratio(r['step_bytes'], base['step_bytes'])} "
            f"{r['layer_bytes'] / 1e6:18.1f} {ratio(r['layer_bytes'], base['layer_bytes'])} "
            f"{statistics.median(r['step_s']) * 1e3:9.1f} {statistics.median(by_round):7.3f} "
            f"{statistics.median(r['host_s']) * 1e3:8.1f}"
            + ("  " + " ".join(f"{x:.3f}" for x in by_round) if rounds > 1 else ""))
    say("(host ms: when the host had queued the whole step; close to the step time, the step "
        "waits on the host, not the GPU. linear weights: the decoder layers' linear layers, "
        "lm_head not included; gathered/step: every parameter, the embedding and lm_head "
        "included, bf16 unless the recipe's name says \"+lm_head\" (lm_head in MX QAT too). "
        "\"compiled\": each decoder layer compiled, torch.compile default mode)")
    bf16_times = base["step_s"] + results.get("bf16 again", {"step_s": []})["step_s"]
    drift = max(bf16_times) / min(bf16_times)
    if drift > 1.05:
        say(f"warning: bf16's step time varied by {drift:.2f}x during the run (its {rounds} "
            f"round{'s' if rounds > 1 else ''} and the end): step-time ratios are uncertain by "
            f"as much")
    if not base["step_bytes"]:
        say("(FSDP2's all-gather was not counted: this torch calls neither dist.all_gather_single "
            "nor dist.all_gather_into_tensor through the module)")
    if "mxfp8" in results and "mxfp8 (hp gather)" in results:
        mx, hp = results["mxfp8"]["losses"], results["mxfp8 (hp gather)"]["losses"]
        say(f"check: mxfp8 first-step loss with MX gather equal to hp gather (the same quantized "
            f"bf16 weights): {'yes' if torch.equal(mx[0], hp[0]) else 'NO'}; later steps differ "
            f"by up to {(mx - hp).abs().max().item():.3g} (nondeterministic kernels allowed here)")
    for label in results:
        eager = label.removesuffix(" compiled")
        if label != eager and eager in results:
            same = torch.equal(results[label]["losses"][0], results[eager]["losses"][0])
            say(f"check: {label} first-step loss equal to eager: {'yes' if same else 'no'} "
                f"(inductor may fuse and round differently)")


if __name__ == "__main__":
    main()

"""What each of the 2 gloo ranks of tests/distributed/test_distributed.py runs (one spawn for the whole
test module), and the models and data both the ranks and the one-process references build.

Each rank saves what it saw to `<out>/rank<r>.pt`; checkpoints go to `<out>/qat` and `<out>/tp`.
"""

import os

import torch
import torch.distributed as dist
from torch import nn

import torchmx
from torchmx.config import MXConfig, QLinearConfig

WORLD = 2
STEPS = 3            # QAT steps per run; the checkpoint is saved after SAVE_AFTER of them
SAVE_AFTER = 2
MICRO_BATCH = 4      # rows per rank and step; the global batch is WORLD * MICRO_BATCH
QAT_FORMATS = ("float8_e4m3", "float4_e2m1")
# tensor parallel QAT: (weights format, integer-valued model and input: exact sums)
TP_QAT_CASES = (("float4_e2m1", False), ("float8_e4m3", True))


def qat_model(fmt: str) -> nn.Module:
    """Two MXLinear layers: 128 rows shard evenly (MX all-gather), 9 do not (high precision)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 9))
    config = QLinearConfig(weights_config=MXConfig(fmt), activations_config=MXConfig("float8_e4m3"))
    torchmx.prepare_qat_(model, config, progress=False)
    return model


def optimizer(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def batch(step: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s micro-batch of step `step` (the global batch is both ranks' rows)."""
    x = torch.randn(WORLD * MICRO_BATCH, 64, generator=torch.Generator().manual_seed(100 + step))
    return x[rank * MICRO_BATCH:(rank + 1) * MICRO_BATCH]


def loss_of(model, x):
    return model(x).square().mean()


def reference_step(model, opt, step):
    """One step of one process on the global batch, as its two micro-batches (gradient
    accumulation): the fp32 sums then run in the order of the 2-rank run's."""
    losses = []
    for rank in range(WORLD):
        loss = loss_of(model, batch(step, rank))
        (loss / WORLD).backward()
        losses.append(loss.detach())
    opt.step()
    opt.zero_grad()
    return losses


def tp_model(fmt: str, integer_valued: bool) -> nn.Module:
    """An MLP of two MXInferenceLinear layers (64 -> 128 -> 64). `integer_valued`: weights are
    small integers (exact in every MX format here), so with integer inputs every product and
    fp32 sum is exact and any summation order gives the same bits."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    if integer_valued:
        with torch.no_grad():
            for layer in (model[0], model[2]):
                layer.weight.copy_(torch.randint(-3, 4, layer.weight.shape))
                layer.bias.copy_(torch.randint(-3, 4, layer.bias.shape))
    activations = MXConfig("float8_e4m3") if fmt == "float8_e4m3" else None
    torchmx.quantize_linear_(model, QLinearConfig(weights_config=MXConfig(fmt),
                                                  activations_config=activations), progress=False)
    return model


def tp_input(integer_valued: bool, features: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if integer_valued:
        return torch.randint(-3, 4, (5, features), generator=g).float()
    return torch.randn(5, features, generator=g)


def tp_qat_model(fmt: str, integer_valued: bool) -> nn.Module:
    """An MLP of two MXLinear layers (64 -> 128 -> 64) for column-wise then row-wise tensor
    parallel QAT; `integer_valued` as in tp_model (MXFP8 activations, exact on small integers)."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    if integer_valued:
        with torch.no_grad():
            for layer in (model[0], model[2]):
                layer.weight.copy_(torch.randint(-3, 4, layer.weight.shape))
                layer.bias.copy_(torch.randint(-3, 4, layer.bias.shape))
    torchmx.prepare_qat_(model, QLinearConfig(weights_config=MXConfig(fmt),
                                              activations_config=MXConfig("float8_e4m3")),
                         progress=False)
    return model


def qat_forward_backward(model, x):
    """{"hidden": the first layer's output, "output", "input_grad", "grads": parameter
    gradients} of one forward and backward."""
    x = x.clone().requires_grad_()
    seen = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    y = model(x)
    y.square().sum().backward()
    return {"hidden": seen[0], "output": y.detach(), "input_grad": x.grad,
            "grads": {n: p.grad for n, p in model.named_parameters()}}


# ------------------------------------------------------------------------------ the ranks

def run_rank(rank: int, out: str, port: int) -> None:
    torch.set_num_threads(1)  # forked from the test process: one intra-op thread per rank
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        results = {"fsdp": {fmt: fsdp_qat(rank, fmt, out) for fmt in QAT_FORMATS},
                   "fsdp_compiled": fsdp_qat_compiled(rank),
                   "hsdp": {shape: hsdp_qat(rank, shape) for shape in ((1, WORLD), (WORLD, 1))},
                   "ddp": ddp_qat(rank), "tp": tensor_parallel(rank, out),
                   "tp_qat": tensor_parallel_qat(),
                   "fsdp_inference": fsdp_inference(out),
                   "docs": docs_snippets(out), "errors": argument_errors()}
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def fsdp_qat(rank, fmt, out):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from torchmx.distributed import enable_mx_all_gather

    model = qat_model(fmt)
    wrapped = enable_mx_all_gather(model)
    forward_weights, gathered = [], []
    for layer in model:
        if isinstance(layer, torchmx.MXLinear):
            fully_shard(layer)
            layer.register_forward_pre_hook(
                lambda m, args: forward_weights.append(type(m.weight).__name__))
    fully_shard(model)
    opt = optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        if step == 0:
            gathered = [[t.shape for t in p._local_tensor.fsdp_pre_all_gather(
                            p.device_mesh, p.shape, p.stride(), None, None)[0]]
                        for p in model.parameters() if p.dim() == 2]
        loss = loss_of(model, batch(step, rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
        if step + 1 == SAVE_AFTER:
            model_sd, optim_sd = get_state_dict(model, opt)
            dcp.save({"model": model_sd, "optim": optim_sd},
                     checkpoint_id=os.path.join(out, f"qat-{fmt}"))
    params = {name: p.full_tensor() for name, p in model.named_parameters()}
    return {"wrapped": wrapped, "losses": losses, "params": params,
            "forward_weights": forward_weights, "gathered_shapes": gathered}


def hsdp_qat(rank, shape):
    """FSDP2 MX-QAT on a 2-d (replicate, shard) mesh, HSDP: (1, 2) gathers MX bytes over the
    shard dim; (2, 1) makes the ranks unsharded replicas whose gradients are all-reduced (the
    hooks then see a shard group of one rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torchmx.distributed import enable_mx_all_gather

    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    model = qat_model("float4_e2m1")
    enable_mx_all_gather(model)
    for layer in model:
        if isinstance(layer, torchmx.MXLinear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        loss = loss_of(model, batch(step, rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return {"losses": losses,
            "params": {name: p.full_tensor() for name, p in model.named_parameters()}}


def fsdp_qat_compiled(rank):
    """FSDP2 MX-QAT with each MXLinear compiled (`module.compile`, aot_eager: the graph
    torch.compile captures, run without code generation) around the MX all-gather hooks."""
    from torch.distributed.fsdp import fully_shard

    from torchmx.distributed import enable_mx_all_gather

    torch._dynamo.reset()
    model = qat_model("float4_e2m1")
    enable_mx_all_gather(model)
    for layer in model:
        if isinstance(layer, torchmx.MXLinear):
            fully_shard(layer)
            layer.compile(backend="aot_eager", fullgraph=True)
    fully_shard(model)
    opt = optimizer(model.parameters())
    losses = []
    for step in range(2):
        loss = loss_of(model, batch(step, rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return {"losses": losses}


def tensor_parallel_qat():
    """MXLinear QAT under PyTorch's tensor parallelism: the first layer column-wise, the
    second row-wise (parallelize_module); one forward and backward per case."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    import torchmx.distributed  # noqa: F401  (registers the ops' sharding rules)

    mesh = init_device_mesh("cpu", (WORLD,))
    results = {}
    for fmt, integer_valued in TP_QAT_CASES:
        model = parallelize_module(tp_qat_model(fmt, integer_valued), mesh,
                                   {"0": ColwiseParallel(), "2": RowwiseParallel()})
        seen = qat_forward_backward(model, tp_input(integer_valued))
        seen["grads"] = {n: g.full_tensor() for n, g in seen["grads"].items()}
        seen["local_weights"] = [tuple(model[i].weight.to_local().shape) for i in (0, 2)]
        results[fmt, integer_valued] = seen
    return results


def ddp_qat(rank):
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(qat_model("float8_e4m3"))
    opt = optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        loss = loss_of(model, batch(step, rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return {"losses": losses,
            "params": {n: p.detach().clone() for n, p in model.module.named_parameters()}}


def tensor_parallel(rank, out):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from torchmx.distributed import parallelize_mx_inference_linear

    mesh = init_device_mesh("cpu", (WORLD,))
    outputs = {}
    for fmt in ("float8_e4m3", "float4_e2m1"):
        for integer_valued in (False, True):
            x = tp_input(integer_valued)
            column = parallelize_mx_inference_linear(tp_model(fmt, integer_valued), mesh,
                                                     {"0": "colwise"}, gather_output=True)
            row = parallelize_mx_inference_linear(tp_model(fmt, integer_valued), mesh,
                                                  {"2": "rowwise"})
            pair = parallelize_mx_inference_linear(tp_model(fmt, integer_valued), mesh,
                                                   {"0": "colwise", "2": "rowwise"},
                                                   input_is_sharded=True)
            with torch.no_grad():
                outputs[fmt, integer_valued] = {
                    "colwise": column[0](x), "rowwise": row[2](tp_input(integer_valued, 128)),
                    "pair": pair(x)}
            if fmt == "float4_e2m1" and integer_valued:
                dcp.save({"model": pair.state_dict()}, checkpoint_id=os.path.join(out, "tp"))
                # loads back into a parallel model (other weights before): from the DCP
                # checkpoint, and from a whole (one-process) state dict
                reloaded, whole = (parallelize_mx_inference_linear(
                    tp_model(fmt, False), mesh, {"0": "colwise", "2": "rowwise"},
                    input_is_sharded=True) for _ in range(2))
                state = {"model": reloaded.state_dict()}
                dcp.load(state, checkpoint_id=os.path.join(out, "tp"))
                reloaded.load_state_dict(state["model"])
                whole.load_state_dict(tp_model(fmt, True).state_dict())
                with torch.no_grad():
                    outputs["reloaded"] = {"dcp": reloaded(x), "whole": whole(x),
                                           "saved": outputs[fmt, integer_valued]["pair"]}
    return outputs


def inference_model(fmt: str) -> nn.Module:
    """Two MXInferenceLinear layers; the second's 10 rows shard unevenly over 2 ranks."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    activations = MXConfig("float8_e4m3") if fmt == "float8_e4m3" else None
    torchmx.quantize_linear_(model, QLinearConfig(weights_config=MXConfig(fmt),
                                                  activations_config=activations), progress=False)
    return model


def fsdp_inference(out):
    """FSDP2-sharded packed weights: each rank's bytes, the outputs, a DCP checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    from torchmx.distributed import prepare_fsdp_inference_

    results = {}
    for fmt in ("float8_e4m3", "float4_e2m1"):
        model = inference_model(fmt)
        prepare_fsdp_inference_(model)
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        with torch.no_grad():
            y = model(tp_input(False))
        local = [tuple(m.weight_packed.to_local().shape) for m in (model[0], model[2])]
        dcp.save({"model": model.state_dict()},
                 checkpoint_id=os.path.join(out, f"fsdp-inference-{fmt}"))
        results[fmt] = {"output": y, "local_shapes": local}
    return results


def docs_snippets(out):
    """docs/distributed.md's QAT script (2 steps, then resumed from its checkpoint for a third)
    and its tensor-parallel MLP, on CPU."""
    import pathlib
    import contextlib
    import io

    from docs_markdown import blocks

    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "distributed.md"
    namespace = {"__name__": "__docs__"}
    for info, _, code in blocks(page.read_text()):
        if info == "python":
            exec(compile(code, str(page), "exec"), namespace)
    tiny = ["--hidden", "64", "--layers", "1", "--sequence", "16", "--save-every", "1",
            "--checkpoint", os.path.join(out, "docs-qat")]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        namespace["main"](["--steps", "2", *tiny])
        namespace["main"](["--steps", "3", *tiny])
    mlp = namespace["parallel_mlp"]("cpu")
    with torch.no_grad():
        y = mlp(torch.randn(3, 1024, generator=torch.Generator().manual_seed(0)))
    qat_mlp = namespace["parallel_qat_mlp"](tp_qat_model("float8_e4m3", False), "cpu")
    qat = qat_forward_backward(qat_mlp, tp_input(False))
    return {"printed": printed.getvalue(), "mlp_output": y, "qat_mlp_output": qat["output"]}


def argument_errors():
    """(exception type name, message) of each bad argument to the distributed API."""
    from torch.distributed.device_mesh import init_device_mesh

    from torchmx.distributed import (MXAllGatherWeight, MXParallelInferenceLinear,
                                     enable_mx_all_gather, parallelize_mx_inference_linear)

    mesh = init_device_mesh("cpu", (WORLD,))
    model = tp_model("float8_e4m3", integer_valued=False)
    odd_rows = torchmx.MXInferenceLinear.from_float(nn.Linear(64, 9), model[0].qconfig)
    cut_blocks = torchmx.MXInferenceLinear.from_float(nn.Linear(96, 8), model[0].qconfig)
    from torch.distributed.fsdp import fully_shard
    sharded = fully_shard(qat_model("float8_e4m3"))
    calls = {
        "sharded": lambda: enable_mx_all_gather(sharded),
        "model": lambda: enable_mx_all_gather(torch.ones(2)),
        "config": lambda: MXAllGatherWeight(torch.ones(2, 32), "mxfp8"),
        "plan": lambda: parallelize_mx_inference_linear(model, mesh, ["0"]),
        "plan name": lambda: parallelize_mx_inference_linear(model, mesh, {"1": "colwise"}),
        "layer": lambda: MXParallelInferenceLinear.from_layer(nn.Linear(4, 4), mesh, "colwise"),
        "mesh": lambda: MXParallelInferenceLinear.from_layer(model[0], None, "colwise"),
        "style": lambda: MXParallelInferenceLinear.from_layer(model[0], mesh, "diagonal"),
        "rows": lambda: MXParallelInferenceLinear.from_layer(odd_rows, mesh, "colwise"),
        "blocks": lambda: MXParallelInferenceLinear.from_layer(cut_blocks, mesh, "rowwise"),
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - the test checks the type and message
            errors[name] = (type(e).__name__, str(e))
    return errors

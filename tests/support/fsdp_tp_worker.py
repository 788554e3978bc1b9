"""What each of the 4 gloo ranks of tests/distributed/test_fsdp_tensor_parallel.py runs: FSDP2
over "dp" and tensor parallelism over "tp" on a (2, 2) mesh, MXLinear QAT with the MX
all-gather, and the one-process reference both the ranks and the test build.

The model is distributed_worker's column-wise / row-wise MLP with integer-valued weights and
inputs, trained on `loss = output.sum()` with SGD at a power-of-two learning rate: every
product and fp32 sum then stays exact, so the row-wise layer's partial sums (all-reduced over
"tp") give one process's bits in any order, and the test compares bits.
"""

import os

import torch
import torch.distributed as dist

import distributed_worker as base
import torchmx

MESH = (2, 2)  # (dp, tp)
WORLD = MESH[0] * MESH[1]
STEPS = 3
LR = 2.0 ** -7
FORMATS = ("float8_e4m3", "float4_e2m1")


def batch(step: int, dp_rank: int) -> torch.Tensor:
    """dp rank `dp_rank`'s integer-valued micro-batch of step `step` (the tp ranks of one dp
    rank see the same rows)."""
    g = torch.Generator().manual_seed(300 + step)
    x = torch.randint(-3, 4, (MESH[0] * 4, 64), generator=g).float()
    return x[dp_rank * 4:(dp_rank + 1) * 4]


def reference_run(fmt):
    """One process: the global batch as the dp ranks' micro-batches (gradient accumulation)."""
    model = base.tp_qat_model(fmt, integer_valued=True)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        for dp_rank in range(MESH[0]):
            loss = model(batch(step, dp_rank)).sum()
            (loss / MESH[0]).backward()
            losses.append(loss.detach())
        opt.step()
        opt.zero_grad()
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def run_rank(rank: int, out: str, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        results = {fmt: fsdp_tp_qat(fmt) for fmt in FORMATS}
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def fsdp_tp_qat(fmt):
    """parallelize_module on "tp" (first layer column-wise, second row-wise), then
    enable_mx_all_gather, then fully_shard on "dp"; STEPS SGD steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from torchmx.distributed import enable_mx_all_gather

    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("dp", "tp"))
    model = parallelize_module(base.tp_qat_model(fmt, integer_valued=True), mesh["tp"],
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    wrapped = enable_mx_all_gather(model)
    for i in (0, 2):
        fully_shard(model[i], mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])

    # the weights FSDP2 gathers over "dp": this tp rank's shard, as an MXTensor
    for i in (0, 2):
        model[i].unshard()
    gathered = {}
    for i in (0, 2):
        weight = model[i].weight
        local = weight.to_local()
        gathered[i] = {"type": f"{type(weight).__name__}({type(local).__name__})",
                       "placements": tuple(str(p) for p in weight.placements),
                       "scale": local._scale_e8m0.clone(), "data": local._data.clone()}
    for i in (0, 2):
        model[i].reshard()
    assert all(isinstance(m, FSDPModule) for m in (model, model[0], model[2]))

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    dp_rank = mesh["dp"].get_local_rank()
    for step in range(STEPS):
        loss = model(batch(step, dp_rank)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    params = {n: p.full_tensor() for n, p in model.named_parameters()}
    # a row-wise layer whose tp shards would split blocks (96 columns: 48 per rank) keeps the
    # high-precision gather
    split = parallelize_module(
        torch.nn.Sequential(torchmx.MXLinear(96, 64, qconfig=model[0].qconfig)), mesh["tp"],
        {"0": RowwiseParallel()})
    return {"wrapped": wrapped, "gathered": gathered, "losses": losses, "params": params,
            "coordinates": (dp_rank, mesh["tp"].get_local_rank()),
            "split_blocks_wrapped": enable_mx_all_gather(split)}


tp_qat_model = base.tp_qat_model  # the model, for the test's whole-weight quantization

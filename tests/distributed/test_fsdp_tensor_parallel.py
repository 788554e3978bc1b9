"""FSDP2 and tensor parallelism together on a 2-d (dp, tp) mesh of 4 CPU processes over gloo
(tests/support/fsdp_tp_worker.py): MXLinear QAT with the MX all-gather over "dp" inside the
tensor-parallel shards, against one process, bit for bit."""


import pytest
import torch

import fsdp_tp_worker as w
from forked_ranks import assert_equal_bits, one_thread, run_ranks  # noqa: F401 (autouse)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not built")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The 4 ranks' results (forked: they inherit the modules imported here, which would
    otherwise be imported 4 times over on CI's 2 cores)."""
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401

    import torchmx.distributed  # noqa: F401
    out = str(tmp_path_factory.mktemp("fsdp_tp"))
    return run_ranks(w.run_rank, w.WORLD, out)


@pytest.mark.parametrize("fmt", w.FORMATS)
def test_gathered_weight_is_the_tensor_parallel_shard_of_the_whole_weight_quantized(ranks, fmt):
    """Each rank's weight, gathered over "dp" as MX bytes, is its tp shard of the whole weight
    quantized: rows for the column-wise layer, whole blocks of columns for the row-wise one."""
    model = w.tp_qat_model(fmt, integer_valued=True)
    for result in ranks:
        got = result[fmt]
        assert got["wrapped"] == ["0", "2"]
        assert got["split_blocks_wrapped"] == []  # 48 columns per tp rank: not whole blocks
        _, tp = got["coordinates"]
        for i, dim in ((0, 0), (2, 1)):
            gathered = got["gathered"][i]
            assert gathered["type"] == "DTensor(MXTensor)"
            assert gathered["placements"] == (f"S({dim})",)  # Shard(dim) on "tp"
            scale, data = model[i].qconfig.weights_config.quantize(model[i].weight.detach(), -1)
            scale, data = scale.chunk(2, dim)[tp], data.view(torch.uint8).chunk(2, dim)[tp]
            assert torch.equal(gathered["scale"], scale)
            assert torch.equal(gathered["data"].view(torch.uint8), data)


@pytest.mark.parametrize("fmt", w.FORMATS)
def test_fsdp_tensor_parallel_qat_matches_one_process(ranks, fmt):
    losses, params = w.reference_run(fmt)
    for result in ranks:
        got = result[fmt]
        dp, _ = got["coordinates"]
        for step, loss in enumerate(got["losses"]):
            assert_equal_bits(loss, losses[step * w.MESH[0] + dp])
        assert got["params"].keys() == params.keys()
        for name, expected in params.items():
            assert_equal_bits(got["params"][name], expected)

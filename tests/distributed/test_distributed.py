"""torchmx under torch.distributed on CPU: 2 processes over gloo, spawned once for the module
(tests/support/distributed_worker.py), each test checking what they saw against one process.

- FSDP2 QAT with MX all-gather: losses and parameters bit-identical to one process on the same
  global batch (as two micro-batches, so the fp32 sums run in the same order); the gathered
  weight is an MXTensor sent as its uint8 codes and scales.
- DDP QAT: the same.
- distributed checkpoint: the FSDP2 run saved on 2 ranks resumes on 1, bit-identically; a
  tensor-parallel model saved on 2 ranks loads into a plain one.
- tensor parallel MXInferenceLinear: column-wise outputs bit-identical, row-wise (and a
  column-wise/row-wise pair) bit-identical where the sums are exact, else within fp32 rounding.
- docs/distributed.md's QAT script (trains, saves, resumes) and tensor-parallel MLPs run.
- FSDP2 MX-QAT on 2-d meshes (HSDP) and with compiled layers; tensor parallel MXLinear QAT
  (parallelize_module), against one process.
"""

import os

import pytest
import torch

import distributed_worker as w
from forked_ranks import assert_equal_bits, one_thread, run_ranks  # noqa: F401 (autouse)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not built")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both ranks' results (forked: the ranks inherit the modules the test process imported,
    transformers' Llama too, which docs/distributed.md's script uses)."""
    import transformers.models.llama.modeling_llama  # noqa: F401
    out = str(tmp_path_factory.mktemp("distributed"))
    return out, run_ranks(w.run_rank, w.WORLD, out)


def reference_run(fmt, steps=w.STEPS):
    model = w.qat_model(fmt)
    opt = w.optimizer(model.parameters())
    losses = [w.reference_step(model, opt, step) for step in range(steps)]
    return model, losses


@pytest.mark.parametrize("fmt", w.QAT_FORMATS)
def test_fsdp2_qat_matches_one_process(ranks, fmt):
    _, results = ranks
    model, losses = reference_run(fmt)
    for rank, result in enumerate(results):
        got = result["fsdp"][fmt]
        assert got["wrapped"] == ["0", "2"]
        for step in range(w.STEPS):
            assert_equal_bits(got["losses"][step], losses[step][rank])
        for name, p in model.named_parameters():
            assert_equal_bits(got["params"][name], p.detach())


@pytest.mark.parametrize("fmt", w.QAT_FORMATS)
def test_fsdp2_gathers_mx_bytes_where_rows_shard_evenly(ranks, fmt):
    _, results = ranks
    got = results[0]["fsdp"][fmt]
    # 128 rows: 64 per rank, their packed codes and their 2 scale bytes each (64 features);
    # 9 rows: uneven, gathered in high precision (5 padded rows per rank)
    codes = {"float8_e4m3": 64, "float4_e2m1": 32}[fmt]
    assert got["gathered_shapes"] == [[torch.Size([64, codes]), torch.Size([64, 2])],
                                      [torch.Size([5, 128])]]
    assert got["forward_weights"][:2] == ["MXTensor", "Parameter"]
    assert len(got["forward_weights"]) == 2 * w.STEPS


def test_ddp_qat_matches_one_process(ranks):
    _, results = ranks
    model, losses = reference_run("float8_e4m3")
    for rank, result in enumerate(results):
        for step in range(w.STEPS):
            assert_equal_bits(result["ddp"]["losses"][step], losses[step][rank])
        for name, p in model.named_parameters():
            assert_equal_bits(result["ddp"]["params"][name], p.detach())


@pytest.mark.parametrize("fmt", w.QAT_FORMATS)
def test_fsdp2_checkpoint_on_2_ranks_resumes_on_1(ranks, fmt):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    out, results = ranks
    model = w.qat_model(fmt)
    opt = w.optimizer(model.parameters())
    w.reference_step(model, opt, 0)  # creates the optimizer state that the load fills in
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=os.path.join(out, f"qat-{fmt}"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for step in range(w.SAVE_AFTER, w.STEPS):
        losses = w.reference_step(model, opt, step)
        for rank in range(w.WORLD):
            assert_equal_bits(losses[rank], results[rank]["fsdp"][fmt]["losses"][step])
    for name, p in model.named_parameters():
        assert_equal_bits(p.detach(), results[0]["fsdp"][fmt]["params"][name])


@pytest.mark.parametrize("shape", [(1, w.WORLD), (w.WORLD, 1)], ids=["shard2", "replicate2"])
def test_hsdp_qat_matches_one_process(ranks, shape):
    _, results = ranks
    model, losses = reference_run("float4_e2m1")
    for rank, result in enumerate(results):
        got = result["hsdp"][shape]
        for step in range(w.STEPS):
            assert_equal_bits(got["losses"][step], losses[step][rank])
        for name, p in model.named_parameters():
            assert_equal_bits(got["params"][name], p.detach())


def test_fsdp2_qat_compiled_matches_eager(ranks):
    """torch.compile around FSDP2's MX all-gather hooks: the same losses as the eager run."""
    _, results = ranks
    for result in results:
        compiled = result["fsdp_compiled"]["losses"]
        eager = result["fsdp"]["float4_e2m1"]["losses"][:len(compiled)]
        for got, expected in zip(compiled, eager):
            assert_equal_bits(got, expected)


@pytest.mark.parametrize("fmt, integer_valued", w.TP_QAT_CASES,
                         ids=[f"{fmt}-{'exact_sums' if exact else 'random'}"
                              for fmt, exact in w.TP_QAT_CASES])
def test_tensor_parallel_qat_matches_one_process(ranks, fmt, integer_valued):
    """Column-wise then row-wise MXLinear QAT on 2 ranks (parallelize_module): the column-wise
    layer's output columns are one process's bits; what depends on the row-wise partial sums
    (the output, hence every gradient) is too where the sums are exact, else within fp32
    rounding of it."""
    _, results = ranks
    expected = w.qat_forward_backward(w.tp_qat_model(fmt, integer_valued),
                                      w.tp_input(integer_valued))
    for rank, result in enumerate(results):
        got = result["tp_qat"][fmt, integer_valued]
        assert got["local_weights"] == [(64, 64), (64, 64)]  # each rank holds half
        assert_equal_bits(got["hidden"], expected["hidden"][:, rank * 64:(rank + 1) * 64])
        pairs = [(got["output"], expected["output"]), (got["input_grad"], expected["input_grad"])]
        pairs += [(got["grads"][n], g) for n, g in expected["grads"].items()]
        for g, e in pairs:
            if integer_valued:
                assert_equal_bits(g, e)
            else:
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["float8_e4m3", "float4_e2m1"])
def test_tensor_parallel_outputs(ranks, fmt):
    _, results = ranks
    for integer_valued in (False, True):
        model = w.tp_model(fmt, integer_valued)
        x = w.tp_input(integer_valued)
        with torch.no_grad():
            column, pair = model[0](x), model(x)
            row = model[2](w.tp_input(integer_valued, 128))
        for result in results:
            got = result["tp"][fmt, integer_valued]
            assert_equal_bits(got["colwise"], column)
            if integer_valued:  # exact sums: any order gives these bits
                assert_equal_bits(got["rowwise"], row)
                assert_equal_bits(got["pair"], pair)
            else:  # the same exact products, fp32 sums in another order
                torch.testing.assert_close(got["rowwise"], row, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(got["pair"], pair, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["float8_e4m3", "float4_e2m1"])
def test_fsdp2_sharded_inference(ranks, fmt):
    import torch.distributed.checkpoint as dcp

    out, results = ranks
    model = w.inference_model(fmt)
    with torch.no_grad():
        expected = model(w.tp_input(False))
    codes = {"float8_e4m3": 64, "float4_e2m1": 32}[fmt]
    for rank, result in enumerate(results):
        got = result["fsdp_inference"][fmt]
        assert_equal_bits(got["output"], expected)
        # each rank holds its rows' codes and scales (rows 5 + 5 of 10)
        assert got["local_shapes"] == [(64, codes + 2), (5, codes * 2 + 4)]
    # saved on 2 ranks, loaded into the plain model (other weights before)
    plain = w.inference_model(fmt)
    with torch.no_grad():
        for buffer in plain.buffers():
            buffer.zero_()
    state = {"model": plain.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(out, f"fsdp-inference-{fmt}"))
    plain.load_state_dict(state["model"])
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, torch.Tensor):
            assert torch.equal(plain.state_dict()[name], tensor), name


def test_tensor_parallel_loads_its_checkpoint_and_a_whole_state_dict(ranks):
    _, results = ranks
    for result in results:
        got = result["tp"]["reloaded"]
        assert_equal_bits(got["dcp"], got["saved"])
        assert_equal_bits(got["whole"], got["saved"])


def test_tensor_parallel_checkpoint_on_2_ranks_loads_on_1(ranks):
    import torch.distributed.checkpoint as dcp

    out, _ = ranks
    expected = w.tp_model("float4_e2m1", integer_valued=True)
    model = w.tp_model("float4_e2m1", integer_valued=False)  # other weights, overwritten
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(out, "tp"))
    model.load_state_dict(state["model"])
    for name, tensor in expected.state_dict().items():
        if isinstance(tensor, torch.Tensor):
            assert torch.equal(model.state_dict()[name], tensor), name


def test_docs_script_trains_saves_and_resumes(ranks):
    _, results = ranks
    printed = results[0]["docs"]["printed"].splitlines()
    assert [line.split(":")[0] for line in printed] == ["step 0", "step 1", "step 2"]
    assert results[1]["docs"]["printed"] == ""  # rank 0 prints


def test_docs_tensor_parallel_mlp(ranks):
    _, results = ranks
    outputs = [r["docs"]["mlp_output"] for r in results]
    assert outputs[0].shape == (3, 1024) and torch.equal(outputs[0], outputs[1])
    expected = w.qat_forward_backward(w.tp_qat_model("float8_e4m3", False), w.tp_input(False))
    for result in results:  # the QAT pair: row-wise sums in another order
        torch.testing.assert_close(result["docs"]["qat_mlp_output"], expected["output"],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, error, message", [
    ("model", "TypeError", "model must be a torch.nn.Module"),
    ("sharded", "ValueError", "model: call enable_mx_all_gather before fully_shard"),
    ("config", "TypeError", "config must be a torchmx.MXConfig"),
    ("plan", "TypeError", "plan must be a non-empty dict"),
    ("plan name", "ValueError", "plan names '1', which is not an MXInferenceLinear"),
    ("layer", "TypeError", "layer must be an MXInferenceLinear"),
    ("mesh", "TypeError", "mesh must be a 1-d DeviceMesh"),
    ("style", "ValueError", "style must be one of ('colwise', 'rowwise')"),
    ("rows", "ValueError", "out_features divisible by the mesh size 2"),
    ("blocks", "ValueError", "in_features a multiple of 2 * lcm(32, 1) such as 64"),
])
def test_argument_errors(ranks, name, error, message):
    _, results = ranks
    got = results[0]["errors"][name]
    assert got is not None and got[0] == error and message in got[1], got

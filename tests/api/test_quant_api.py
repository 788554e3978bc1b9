"""quantize_linear_ / prepare_qat_: selection by name and filter_fn, summary, progress bar,
shared modules, errors; the torchao quantize_ config, eager and compiled."""

import re

import pytest
import torch
from torch import nn

from torchmx.config import MXConfig, QLinearConfig
from torchmx.nn import MXInferenceLinear, MXLinear
from torchmx.quant_api import (
    OUTPUT_HEADS,
    model_bytes,
    mx_dynamic_activation_mx_weights,
    prepare_qat_,
    quantize_linear_,
    quantize_llm_,
)

W4A8 = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(64)
        self.lm_head = nn.Linear(64, 32, bias=False)
        self.to(dtype)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.lm_head(self.norm(x))


ALL_LINEARS = ["blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down", "lm_head"]


def test_default_swaps_every_linear_the_output_head_included():
    model = Net()
    summary = quantize_linear_(model, W4A8)
    assert summary.swapped == ALL_LINEARS and summary.skipped == []
    assert all(isinstance(model.get_submodule(n), MXInferenceLinear) for n in ALL_LINEARS)


def test_output_heads_excluded_on_request():
    model = Net()
    before = model_bytes(model)
    summary = quantize_linear_(model, W4A8, exclude=OUTPUT_HEADS)
    assert summary.swapped == ALL_LINEARS[:4] and summary.skipped == ["lm_head"]
    assert all(isinstance(model.get_submodule(n), MXInferenceLinear) for n in ALL_LINEARS[:4])
    assert type(model.lm_head) is nn.Linear
    assert summary.bytes_before == before and summary.bytes_after == model_bytes(model)
    # four 64x128 bf16 weights (2 bytes per element) -> fp4 codes and scales (17/32 bytes)
    assert before - summary.bytes_after == 4 * 64 * 128 * 2 - 4 * 64 * 128 * 17 // 32
    assert "swapped 4 linear layers, skipped 1 (lm_head)" in str(summary)
    assert model(torch.randn(3, 64, dtype=torch.bfloat16)).shape == (3, 32)


@pytest.mark.parametrize("kwargs, swapped", [
    (dict(include=r"\.up$"), ["blocks.0.up", "blocks.1.up"]),
    (dict(include=[r"blocks\.1", r"head"], exclude=None), ["blocks.1.up", "blocks.1.down", "lm_head"]),
    (dict(exclude=[OUTPUT_HEADS, r"blocks\.0"]), ["blocks.1.up", "blocks.1.down"]),
    (dict(filter_fn=lambda m, name: m.out_features == 64, exclude=None), ["blocks.0.down", "blocks.1.down"]),
])
def test_selection(kwargs, swapped):
    model = Net()
    summary = quantize_linear_(model, W4A8, **kwargs)
    assert summary.swapped == swapped
    assert sorted(summary.skipped) == sorted(set(ALL_LINEARS) - set(swapped))
    assert {n for n in ALL_LINEARS if isinstance(model.get_submodule(n), MXInferenceLinear)} == set(swapped)


def test_output_heads_matches_last_name_component_only():
    pattern = re.compile(OUTPUT_HEADS)
    for name in ["lm_head", "model.lm_head", "classifier", "score", "output", "model.output"]:
        assert pattern.search(name), name
    for name in ["encoder.layer.0.output.dense", "attention.output.dense", "head", "lm_head.proj"]:
        assert not pattern.search(name), name


def test_shared_module_converted_once():
    shared = nn.Linear(64, 64)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    summary = quantize_linear_(model, W4A8)
    assert summary.swapped == ["0", "2"] and model[0] is model[2]


def test_progress_bar(capsys):
    quantize_linear_(Net(), W4A8, progress=True)
    assert "torchmx: quantizing linear layers" in capsys.readouterr().err
    quantize_linear_(Net(), W4A8, progress=False)
    quantize_linear_(Net(), W4A8)  # few layers: no bar
    assert capsys.readouterr().err == ""


def test_prepare_qat_then_quantize():
    model = Net(torch.float32)
    prepare_qat_(model, W4A8, exclude=OUTPUT_HEADS)
    assert type(model.blocks[0].up) is MXLinear and type(model.lm_head) is nn.Linear
    x = torch.randn(4, 64)
    with torch.no_grad():
        qat_out = model(x)
    summary = quantize_linear_(model, W4A8, exclude=OUTPUT_HEADS)  # MXLinear -> MXInferenceLinear
    assert len(summary.swapped) == 4
    with torch.no_grad():
        assert torch.equal(model(x), qat_out)


@pytest.mark.parametrize("call, error, words", [
    (lambda: quantize_linear_(Net(), 3), TypeError,
     "qconfig must be a torchmx.config.QLinearConfig, an MXConfig or a format name"),
    (lambda: quantize_linear_(Net(), "mxfp5"), ValueError, "unknown elem_dtype 'mxfp5'"),
    (lambda: prepare_qat_(Net(), None), TypeError, "qconfig must be a torchmx.config.QLinearConfig"),
    (lambda: quantize_linear_("model", W4A8), TypeError, "model must be a torch.nn.Module"),
    (lambda: quantize_linear_(Net(), W4A8, include="("), ValueError, "include: invalid regex '\\('"),
    (lambda: quantize_linear_(Net(), W4A8, exclude=[3]), TypeError, "exclude must be a regex string"),
    (lambda: quantize_linear_(Net(), W4A8, filter_fn="up"), TypeError, "filter_fn must be callable"),
    (lambda: quantize_linear_(nn.Linear(4, 4), W4A8), ValueError, "model itself is a Linear"),
])
def test_errors(call, error, words):
    with pytest.raises(error, match=words):
        call()


# ------------------------------------------------------------------------------ torchao

def test_torchao_quantize_eager_and_inductor():
    torchao_quantization = pytest.importorskip("torchao.quantization")
    from torchmx.quant_api import MXInferenceLinearConfig

    # fp32: inductor fuses bf16 elementwise ops without intermediate rounding, fp32 is bitwise
    model = Net(torch.float32)
    x = torch.randn(2, 5, 64)
    reference = Net(torch.float32)
    quantize_linear_(reference, W4A8)  # the same default: every Linear, lm_head included
    torchao_quantization.quantize_(model, MXInferenceLinearConfig(W4A8))
    assert all(isinstance(model.get_submodule(n), MXInferenceLinear) for n in ALL_LINEARS)
    with torch.no_grad():
        eager = model(x)
        assert torch.equal(eager, reference(x))
        torch._dynamo.reset()
        assert torch.equal(torch.compile(model, fullgraph=True)(x), eager)  # inductor


def test_torchmx_010_helper_returns_a_torchao_config():
    pytest.importorskip("torchao")
    from torchao.core.config import AOBaseConfig

    config = mx_dynamic_activation_mx_weights()
    assert isinstance(config, AOBaseConfig)
    assert config.qconfig == QLinearConfig(MXConfig("float6_e3m2"), MXConfig("float8_e4m3"))
    from torchmx.quant_api import MXInferenceLinearConfig, MXQATConfig

    with pytest.raises(TypeError, match="qconfig must be"):
        MXInferenceLinearConfig(3)
    model = Net(torch.float32)
    from torchao.quantization import quantize_

    quantize_(model, MXQATConfig(W4A8))
    assert type(model.blocks[1].down) is MXLinear


def test_packing_an_mxlinear_with_another_config_warns():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    prepare_qat_(model, W4A8, exclude=None)
    other = QLinearConfig(MXConfig("float8_e4m3"))
    with pytest.warns(UserWarning, match=r"0: this MXLinear was trained \(QAT\) with "
                                         r"\[weights=float4_e2m1/32.*packed with \[weights=float8_e4m3"):
        quantize_linear_(model, other, exclude=None)
    assert model[0].qconfig == other
    again = nn.Sequential(nn.Linear(64, 64))
    prepare_qat_(again, W4A8, exclude=None)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_linear_(again, W4A8, exclude=None)  # the training config: no warning


def test_packing_ignores_the_gradient_config():
    # grad_config only shapes QAT's backward: packing without it is packing what was trained
    trained = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"), grad_config=MXConfig("float8_e5m2"))
    model = nn.Sequential(nn.Linear(64, 64))
    prepare_qat_(model, trained)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_linear_(model, W4A8)
    assert isinstance(model[0], MXInferenceLinear) and model[0].qconfig == W4A8
    other_activations = nn.Sequential(nn.Linear(64, 64))
    prepare_qat_(other_activations, trained)
    with pytest.warns(UserWarning, match="was trained"):
        quantize_linear_(other_activations, QLinearConfig(MXConfig("float4_e2m1")))


def test_quantize_llm_leaves_the_model_untouched_on_failure():
    pytest.importorskip("transformers")
    from torchmx.config import QAttentionConfig
    from torchmx.models import tiny_decoder_lm
    from torchmx.nn.attention import CONFIG_ATTRIBUTE

    fp8 = MXConfig("float8_e4m3")
    model = tiny_decoder_lm("llama", attn_implementation="sdpa")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    types = {n: type(m) for n, m in model.named_modules()}

    def boom(module, name):
        if name.endswith("layers.1.mlp.up_proj"):
            raise RuntimeError("filter failed")
        return True

    with pytest.raises(RuntimeError, match="filter failed"):
        quantize_llm_(model, QAttentionConfig(QLinearConfig(fp8), fp8, fp8, fp8, fp8),
                      QLinearConfig(fp8), filter_fn=boom)
    assert {n: type(m) for n, m in model.named_modules()} == types
    assert model.config._attn_implementation == "sdpa"
    assert not any(hasattr(m, CONFIG_ATTRIBUTE) for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

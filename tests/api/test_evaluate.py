"""The evaluation's parts that need no model: recipes, timing, chart labels."""

import statistics

import pytest
import torch
from torch import nn

from torchmx.config import MXConfig, QLinearConfig
from torchmx.evaluate import (WARM_UP_CALLS, EncoderReport, Recipe, RecipeResult, _interleaved_ms, check_block_size,
                              evaluate_encoder)
from torchmx.report import _legend_labels, short_layer_name, write_chart


def test_recipe_one_format_for_both_as_before():
    recipe = Recipe("float8_e4m3", "even", "away", 16)
    assert recipe.qconfig() == QLinearConfig(MXConfig("float8_e4m3", 16, scale_mode="even", rounding="away"),
                                             MXConfig("float8_e4m3", 16, scale_mode="even", rounding="away"))
    assert recipe.activations == "float8_e4m3" and recipe.label == "float8_e4m3 even away b16 W+A"


def test_mixed_recipe():
    recipe = Recipe("float4_e2m1", activation_dtype="float8_e4m3")
    assert recipe.qconfig() == QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))
    assert recipe.label == "float4_e2m1/float8_e4m3 floor even b32 W+A"
    assert Recipe("int8", activation_dtype="int8").label == "int8 floor even b32 W+A"


def test_weights_only_recipe():
    recipe = Recipe("float4_e2m1", weights_only=True)
    assert recipe.qconfig() == QLinearConfig(MXConfig("float4_e2m1"), None)
    assert recipe.activations is None and recipe.label == "float4_e2m1 floor even b32 W"
    with pytest.raises(ValueError, match="activation_dtype='float8_e4m3' with weights_only=True"):
        Recipe("float4_e2m1", weights_only=True, activation_dtype="float8_e4m3")


def test_timing_alternates_after_warm_up():
    calls = []
    times = _interleaved_ms([lambda: calls.append("a"), lambda: calls.append("b")], repeat=3)
    assert calls == ["a"] * WARM_UP_CALLS + ["b"] * WARM_UP_CALLS + ["a", "b"] * 3
    assert [len(t) for t in times] == [3, 3] and all(ms >= 0 for t in times for ms in t)


def test_timing_waits_for_the_device_around_each_call():
    calls = []
    _interleaved_ms([lambda: calls.append("a")], repeat=2, synchronize=lambda: calls.append("sync"))
    assert calls == ["a"] * WARM_UP_CALLS + ["sync", "a", "sync"] * 2


def test_timing_pauses_the_garbage_collector():
    import gc

    seen = []
    _interleaved_ms([lambda: seen.append(gc.isenabled())], repeat=2)
    assert seen == [True] * WARM_UP_CALLS + [False, False] and gc.isenabled()


def test_block_size_checked_on_every_linear():
    model = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 4))
    check_block_size(model, 8)
    with pytest.raises(ValueError, match="block size 16 does not divide in_features 8 of layer 2"):
        check_block_size(model, 16)


def test_short_layer_names():
    assert short_layer_name("encoder.layer.3.attention.self.query") == "3.query"
    assert short_layer_name("encoder.layer.0.attention.output.dense") == "0.attention.output"
    assert short_layer_name("pooler.dense") == "pooler"
    assert short_layer_name("model.layers.1.self_attn.q_proj") == "1.q_proj"


def fake_report(*series):
    layers = ["encoder.layer.0.attention.self.query", "pooler.dense"]
    results = [RecipeResult(Recipe(fmt), dict(zip(layers, values)), 0.99, 0.98, 1.0, 10, 5, 1.0, 1.0)
               for fmt, values in series]
    return EncoderReport("tiny", "cpu", 4, layers, 20, 10, 1.0, {}, results)


def test_legend_names_a_line_lying_on_another():
    report = fake_report(("float8_e5m2", [23.38, 17.58]), ("float8_e4m3", [28.0, 20.0]),
                         ("float6_e3m2", [23.40, 17.50]))
    assert _legend_labels(report) == [
        "float8_e5m2 floor even b32 W+A", "float8_e4m3 floor even b32 W+A",
        "float6_e3m2 floor even b32 W+A (on float8_e5m2: within 0.1 dB)"]


def test_chart_for_more_recipes_than_markers(tmp_path):
    report = fake_report(*[("int8", [30.0 + i, 20.0]) for i in range(14)])
    write_chart(report, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


class Untouchable:
    """An encoder whose use fails the test: the recipes must be refused before any work."""

    model = nn.Sequential(nn.Linear(64, 8))

    def tokenize(self, sentences):
        raise AssertionError("the encoder ran before the recipes were checked")

    embed = tokenize


@pytest.mark.parametrize("recipes, repeat, words", [
    ([Recipe("int8"), Recipe("fp5")], 1, "unknown elem_dtype 'fp5'"),
    ([Recipe("int8", activation_dtype="fp5")], 1, "unknown elem_dtype 'fp5'"),
    ([Recipe("int8", scale_mode="round")], 1, "scale_mode"),
    ([Recipe("int8", block_size=48)], 1, "block size 48 does not divide in_features 64 of layer 0"),
    ([Recipe("int8")], 0, "repeat must be >= 1, got 0"),
])
def test_evaluate_refuses_bad_recipes_before_the_work(recipes, repeat, words):
    with pytest.raises(ValueError, match=words):
        evaluate_encoder(Untouchable(), recipes, repeat=repeat)


@pytest.mark.parametrize("threads", [0, 1.5, True, "2"])
def test_evaluate_refuses_a_bad_thread_count(threads):
    with pytest.raises(ValueError, match="threads must be an int >= 1 or None"):
        evaluate_encoder(Untouchable(), [Recipe("int8")], threads=threads)


class ThreadsSeen(nn.Module):
    """A one-layer encoder model that notes PyTorch's thread count at each forward pass."""

    def __init__(self, seen):
        super().__init__()
        self.linear, self.seen = nn.Linear(32, 32), seen

    def forward(self, input_ids):
        self.seen.append(torch.get_num_threads())
        return self.linear(input_ids)


class TinyEncoder:
    def __init__(self, seen):
        self.model = ThreadsSeen(seen)

    def tokenize(self, sentences):
        return {"input_ids": torch.arange(32.0 * len(sentences)).reshape(len(sentences), 32) / 100}

    def embed(self, sentences):
        with torch.no_grad():
            return torch.nn.functional.normalize(self.model(**self.tokenize(sentences)), dim=1)


def test_evaluate_runs_with_the_thread_count_asked_and_gives_it_back():
    before, seen = torch.get_num_threads(), []
    report = evaluate_encoder(TinyEncoder(seen), [Recipe("float8_e4m3")], ["a", "b", "c", "d"],
                              repeat=2, threads=1)
    assert set(seen) == {1} and torch.get_num_threads() == before
    assert len(report.results[0].forward_ms_samples) == 2 and len(report.forward_ms_samples) == 2
    assert report.timing == {"threads": 1, "warm_up_calls": WARM_UP_CALLS, "rounds": 2}
    assert report.as_dict()["timing"] == report.timing
    result = report.results[0]
    assert result.forward_ms == statistics.median(result.forward_ms_samples)
    assert result.forward_vs_full_precision == statistics.median(
        ms / full_ms for ms, full_ms in zip(result.forward_ms_samples, report.forward_ms_samples))


@pytest.mark.parametrize("pytorch_threads, cpus, expected", [
    (2, 2, 1),  # the shared 2-core machine: one thread, one core left to the rest
    (1, 2, 1), (1, 1, 1), (4, 4, 3),
    (8, 16, 8),  # PyTorch's own count (physical cores) already leaves cores free
])
def test_default_threads_leave_a_core_to_the_rest_of_the_machine(monkeypatch, pytorch_threads, cpus, expected):
    import torchmx.evaluate as evaluate

    monkeypatch.setattr(evaluate, "_usable_cpus", lambda: cpus)
    with evaluate._threads(pytorch_threads):
        assert evaluate.default_threads(torch.device("cpu")) == expected
        assert evaluate.default_threads(torch.device("cuda", 0)) is None  # PyTorch's own


def test_usable_cpus_are_the_ones_this_process_may_run_on():
    import os

    from torchmx.evaluate import _usable_cpus

    assert 1 <= _usable_cpus() <= os.cpu_count()


def test_table_says_how_it_timed():
    from torchmx.report import format_table

    report = fake_report(("int8", [30.0, 20.0]))
    assert "full precision forward 1.0 ms\n" in format_table(report)  # no timing recorded
    report.timing = {"threads": 1, "warm_up_calls": 3, "rounds": 15}
    assert "full precision forward 1.0 ms (1 thread, median of 15 rounds)\n" in format_table(report)
    report.timing["threads"] = 2
    assert "(2 threads, median of 15 rounds)" in format_table(report)


def test_every_model_is_timed_in_the_same_rounds(monkeypatch):
    """One call of each model (full precision first) per round, after every recipe's other
    measurements, whichever the number of recipes."""
    import torchmx.evaluate as evaluate

    calls = []
    monkeypatch.setattr(evaluate, "_interleaved_ms", lambda fns, repeat, synchronize: (
        calls.append((len(fns), repeat)) or [[float(i + 1)] * repeat for i in range(len(fns))]))
    report = evaluate_encoder(TinyEncoder([]), [Recipe("float8_e4m3"), Recipe("int8")],
                              ["a", "b", "c", "d"], repeat=3)
    assert calls == [(3, 3)]
    assert report.forward_ms_samples == [1.0] * 3
    assert [(r.forward_ms, r.forward_vs_full_precision) for r in report.results] == [(2.0, 2.0), (3.0, 3.0)]


def test_the_ratio_to_full_precision_is_the_median_of_each_rounds_ratio(monkeypatch):
    """A slow round slows both models' calls: it moves the medians of their times, not the
    median of their per-round ratios."""
    import torchmx.evaluate as evaluate

    rounds = {"full": [10.0, 40.0, 10.0, 41.0, 10.0], "mx": [20.0, 80.0, 20.0, 82.0, 21.0]}
    monkeypatch.setattr(evaluate, "_interleaved_ms", lambda fns, repeat, synchronize: [
        rounds["full"], rounds["mx"]])
    report = evaluate_encoder(TinyEncoder([]), [Recipe("float8_e4m3")], ["a", "b", "c", "d"], repeat=5)
    result = report.results[0]
    assert (report.forward_ms, result.forward_ms) == (10.0, 21.0)
    assert result.forward_vs_full_precision == 2.0  # 21.0 / 10.0 = 2.1 from the medians


def test_environment_names_versions_device_and_date():
    import datetime

    import torch

    import torchmx
    from torchmx.evaluate import environment

    env = environment(torch.device("cpu"))
    assert (env["torchmx"], env["torch"]) == (torchmx.__version__, torch.__version__)
    assert env["device"].startswith("cpu: ")
    assert env["device"].endswith(f", {torch.get_num_threads()} threads")
    age = datetime.datetime.now(datetime.timezone.utc) - datetime.datetime.fromisoformat(env["date"])
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=1)


def test_table_warns_when_the_timings_are_noisy():
    from torchmx.report import format_table, timing_spread

    report = fake_report(("int8", [30.0, 20.0]))
    report.results[0].forward_ms_samples = [100.0, 110.0, 105.0]
    report.forward_ms_samples = [50.0, 52.0]
    assert timing_spread(report) == pytest.approx(1.1) and "note:" not in format_table(report)
    report.forward_ms_samples = [50.0, 520.0, 51.0]
    assert timing_spread(report) == pytest.approx(10.4)
    assert "note: the calls of one model took up to 10.4x as long as its fastest" in format_table(report)

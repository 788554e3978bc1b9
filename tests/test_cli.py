"""The `torchmx` command end to end on CPU: the real packaged model, the report, the errors."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from torchmx.cli import main
from torchmx.config import MXConfig, QLinearConfig
from torchmx.quant_api import quantize_linear_
from torchmx.serialization import save_safetensors


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert main(["--formats", "float8_e4m3,float4_e2m1", "--out", str(out), "--repeat", "1"]) == 0
    return out


def test_report_fields(report_dir):
    report = json.loads((report_dir / "report.json").read_text())
    assert report["model_name"] == "all-MiniLM-L6-v2" and report["sentences"] == 16
    assert len(report["linear_layers"]) == 37  # 6 layers x (q, k, v, o, 2 MLP) + pooler
    fp8, fp4 = report["results"]
    assert (fp8["elem_dtype"], fp4["elem_dtype"]) == ("float8_e4m3", "float4_e2m1")
    for result in (fp8, fp4):
        assert set(result["per_layer_sqnr_db"]) == set(report["linear_layers"])
        assert result["linear_bytes"] < report["linear_bytes"] and result["forward_ms"] > 0
    # MXFP8 weights and activations keep the embeddings (the bar: cosine > 0.99).
    assert fp8["cosine_min"] > 0.99 and fp8["nearest_neighbour_agreement"] == 1.0
    # fp4 costs more: every layer noisier than fp8, and 4.25 vs 8.25 bits per weight.
    assert all(fp4["per_layer_sqnr_db"][k] < fp8["per_layer_sqnr_db"][k] for k in report["linear_layers"])
    assert fp4["linear_bytes"] < 0.6 * fp8["linear_bytes"]


def test_chart_is_a_png(report_dir):
    png = (report_dir / "per_layer_sqnr.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


@pytest.mark.parametrize("argv, words", [
    (["--formats", "fp5"], "unknown elem_dtype 'fp5'"),
    (["--scale-modes", "round"], "unknown scale mode 'round'; allowed: floor, ceil, even, rceil"),
    (["--block-sizes", "0"], "block sizes must be >= 1"),
    (["--model", "/no/such/dir"], "--model: no such directory: /no/such/dir"),
    (["--block-sizes", "100", "--formats", "int8"], "block size 100 does not divide in_features 384"),
    (["inspect", "/no/such/file.safetensors"], "no such file"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_arguments_give_one_line(argv, words, capsys, tmp_path):
    assert main(argv + ([] if argv[0] == "inspect" else ["--out", str(tmp_path)])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchmx: error: ") and words in err and "\n" not in err


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

"""Writing an EncoderReport: a terminal table, a JSON file and a PNG chart of per-layer SQNR."""

import json
import math
import statistics
from pathlib import Path

from .evaluate import EncoderReport


def _median(values) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else float("nan")


def format_table(report: EncoderReport) -> str:
    lines = [
        f"{report.model_name}: {len(report.linear_layers)} linear layers, "
        f"{report.model_bytes / 1e6:.1f} MB, {report.sentences} sentences, on {report.device}; "
        f"full precision forward {report.forward_ms:.1f} ms",
        "",
        f"{'format':<12} {'scale':<5} {'round':<11} {'block':>5} {'quant':>5} {'cos mean':>8} "
        f"{'cos min':>8} {'NN agree':>8} {'SQNR med':>8} {'SQNR min':>8} {'linear':>6} {'model':>6} "
        f"{'fwd ms':>7}",
    ]
    for r in report.results:
        sqnr = list(r.per_layer_sqnr_db.values())
        rc = r.recipe
        lines.append(
            f"{rc.elem_dtype:<12} {rc.scale_mode:<5} {rc.rounding:<11} {rc.block_size:>5} "
            f"{'W' if rc.weights_only else 'W+A':>5} {r.cosine_mean:>8.4f} {r.cosine_min:>8.4f} "
            f"{r.nearest_neighbour_agreement:>8.0%} {_median(sqnr):>8.2f} {min(sqnr):>8.2f} "
            f"{r.linear_bytes / report.linear_bytes:>5.2f}x {r.model_bytes / report.model_bytes:>5.2f}x "
            f"{r.forward_ms:>7.1f}")
    lines += ["", "cos: cosine similarity of sentence embeddings with full precision; NN agree: "
              "sentences whose nearest neighbour is unchanged;",
              "SQNR: per linear layer, quantized alone on its full-precision input (dB); "
              "linear / model: bytes of the linear layers / of the whole model vs full precision "
              "(embeddings stay in full precision)."]
    return "\n".join(lines)


def write_json(report: EncoderReport, path: Path) -> None:
    path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")


def write_chart(report: EncoderReport, path: Path) -> None:
    """Per-layer SQNR (dB) by layer index, one line per recipe."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(11, 5.5), dpi=110)
    for r in report.results:
        values = [r.per_layer_sqnr_db[name] for name in report.linear_layers]
        axes.plot(range(len(values)), values, marker="o", markersize=3, linewidth=1.2, label=r.recipe.label)
    axes.set_xlabel("linear layer (forward order)")
    axes.set_ylabel("SQNR (dB), layer quantized alone")
    axes.set_title(f"{report.model_name}: per-layer quantization error by MX recipe")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)

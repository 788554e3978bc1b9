"""Writing an EncoderReport: a terminal table, a JSON file and a PNG chart of per-layer SQNR."""

import json
import math
import statistics
from pathlib import Path

from .evaluate import EncoderReport


def _median(values) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else float("nan")


def _how_timed(report: EncoderReport) -> str:
    """` (2 threads, median of 15 rounds)`; empty for a report without its timing."""
    if not report.timing:
        return ""
    threads = report.timing["threads"]
    return f" ({threads} thread{'s' if threads != 1 else ''}, median of {report.timing['rounds']} rounds)"


def format_table(report: EncoderReport) -> str:
    width = max([len("format")] + [len(r.recipe.formats) for r in report.results])
    lines = [
        f"{report.model_name}: {len(report.linear_layers)} linear layers, "
        f"{report.model_bytes / 1e6:.1f} MB, {report.sentences} sentences, on {report.device}; "
        f"full precision forward {report.forward_ms:.1f} ms{_how_timed(report)}",
        "",
        f"{'format':<{width}} {'scale':<5} {'round':<11} {'block':>5} {'quant':>5} {'cos mean':>8} "
        f"{'cos min':>8} {'NN agree':>8} {'SQNR med':>8} {'SQNR min':>8} {'linear':>6} {'model':>6} "
        f"{'fwd ms':>7} {'vs fp':>6}",
    ]
    for r in report.results:
        sqnr = list(r.per_layer_sqnr_db.values())
        rc = r.recipe
        lines.append(
            f"{rc.formats:<{width}} {rc.scale_mode:<5} {rc.rounding:<11} {rc.block_size:>5} "
            f"{'W' if rc.weights_only else 'W+A':>5} {r.cosine_mean:>8.4f} {r.cosine_min:>8.4f} "
            f"{r.nearest_neighbour_agreement:>8.0%} {_median(sqnr):>8.2f} {min(sqnr):>8.2f} "
            f"{r.linear_bytes / report.linear_bytes:>5.2f}x {r.model_bytes / report.model_bytes:>5.2f}x "
            f"{r.forward_ms:>7.1f} {r.forward_vs_full_precision:>5.2f}x")
    lines += ["", "format: weights and activations, or weights/activations; cos: cosine similarity of "
              "sentence embeddings with full precision;",
              "NN agree: sentences whose nearest neighbour is unchanged; SQNR: per linear layer, "
              "quantized alone on its full-precision input (dB);",
              "linear / model: bytes of the linear layers / of the whole model vs full precision "
              "(embeddings stay in full precision);",
              "fwd ms: median forward time of the batch; vs fp: median over rounds of the forward time / "
              "full precision's in the same round (every model timed in each round)."]
    spread = timing_spread(report)
    if spread > NOISY_SPREAD:
        lines += ["", f"note: the calls of one model took up to {spread:.1f}x as long as its fastest: "
                  "something else was using the device (on a CPU, busy threads outnumbering the cores "
                  "make a call up to 10x slower);",
                  "the milliseconds will differ from another run's; the vs fp ratios compare calls "
                  "made side by side."]
    return "\n".join(lines)


NOISY_SPREAD = 2.0


def timing_spread(report: EncoderReport) -> float:
    """The largest slowest / fastest call ratio of one model (1.0: no samples)."""
    samples = [report.forward_ms_samples] + [r.forward_ms_samples for r in report.results]
    return max([max(s) / min(s) for s in samples if s and min(s) > 0], default=1.0)


def write_json(report: EncoderReport, path: Path) -> None:
    path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")


def short_layer_name(name: str) -> str:
    """`encoder.layer.3.attention.self.query` -> `3.query`: the chart's x labels."""
    for noise in ("encoder.layer.", "model.layers.", "attention.self.", "self_attn."):
        name = name.replace(noise, "")
    return name[: -len(".dense")] if name.endswith(".dense") else name


# Formats with the same mantissa width give nearly the same SQNR (float8_e5m2 and float6_e3m2):
# every recipe gets its own marker, size and line style, and the legend names the lines that
# lie on an earlier one, so that no recipe hides unseen.
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "*", "h", "p")
_STYLES = ("-", "--", ":", "-.")
_SAME_DB = 0.1


def _legend_labels(report: EncoderReport) -> list:
    labels, drawn = [], []
    for r in report.results:
        values = [r.per_layer_sqnr_db[name] for name in report.linear_layers]
        label = r.recipe.label
        for other, other_values in drawn:
            if all(abs(a - b) <= _SAME_DB for a, b in zip(values, other_values)):
                label += f" (on {other.recipe.formats}: within {_SAME_DB} dB)"
                break
        labels.append(label)
        drawn.append((r, values))
    return labels


def write_chart(report: EncoderReport, path: Path) -> None:
    """Per-layer SQNR (dB) by layer in forward order, one line per recipe."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    layers = report.linear_layers
    figure, axes = plt.subplots(figsize=(max(11, 0.3 * len(layers)), 6.5), dpi=110)
    for i, (r, label) in enumerate(zip(report.results, _legend_labels(report))):
        values = [r.per_layer_sqnr_db[name] for name in layers]
        axes.plot(range(len(values)), values, marker=_MARKERS[i % len(_MARKERS)],
                  linestyle=_STYLES[i % len(_STYLES)], markersize=8 - 1.5 * (i % 3),
                  markerfacecolor="none", linewidth=1.2, label=label)
    axes.set_xticks(range(len(layers)))
    axes.set_xticklabels([short_layer_name(name) for name in layers], rotation=90, fontsize=7)
    axes.set_xlim(-0.5, len(layers) - 0.5)
    axes.set_xlabel("linear layer (forward order)")
    axes.set_ylabel("SQNR (dB), layer quantized alone")
    axes.set_title(f"{report.model_name}: per-layer quantization error by MX recipe")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside: hides no point
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)

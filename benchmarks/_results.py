"""Where a benchmark script keeps what it printed: benchmarks/results/<kind>_<UTC stamp>_<device>.txt."""

import datetime
import pathlib

RESULTS = pathlib.Path(__file__).parent / "results"


def save(text: str, kind: str, device: str) -> pathlib.Path:
    """Writes `text` to a new results file, says where, and returns its path."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d_%H%M")
    out = RESULTS / f"{kind}_{stamp}_{device}.txt"
    out.write_text(text + "\n")
    print(f"saved {out}")
    return out

"""The `torchmx` command (also `python -m torchmx`).

    torchmx [evaluate] [options]   quantize a sentence encoder to each MX recipe and report
                                   accuracy, size and speed (default: all-MiniLM-L6-v2, every format)
    torchmx inspect FILE           what an MX checkpoint (safetensors or torch) contains

A user mistake ends with one line on stderr and exit status 2, never a traceback.
"""

import argparse
import itertools
import logging
import sys
from pathlib import Path
from typing import List, Optional

from . import dtypes
from .numerics.rounding import ROUNDING_MODES
from .numerics.scale import SCALE_MODES

DEFAULT_FORMATS = ("float8_e4m3", "float8_e5m2", "float6_e2m3", "float6_e3m2", "float4_e2m1", "int8")


class UsageError(Exception):
    """A bad argument: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + message; one line is clearer
        raise UsageError(message)


def _names(value: str, allowed, what: str) -> List[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    for item in items:
        if allowed is not None and item not in allowed:
            raise UsageError(f"unknown {what} {item!r}; allowed: {', '.join(allowed)}")
    if not items:
        raise UsageError(f"no {what} given")
    return items


def _formats(value: str) -> List[str]:
    items = _names(value, None, "format")
    for item in items:
        try:
            dtypes.from_name(item)
        except ValueError as error:
            raise UsageError(str(error)) from None
    return items


def _block_sizes(value: str) -> List[int]:
    try:
        sizes = [int(v) for v in _names(value, None, "block size")]
    except ValueError:
        raise UsageError(f"block sizes must be integers, got {value!r}") from None
    if any(size < 1 for size in sizes):
        raise UsageError(f"block sizes must be >= 1, got {value!r}")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchmx", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("evaluate", help="quantize a sentence encoder to MX and report (default)")
    run.add_argument("--formats", type=_formats, default=list(DEFAULT_FORMATS),
                     help=f"comma-separated element formats (default: {','.join(DEFAULT_FORMATS)}); "
                          "custom minifloats as e.g. e1m2")
    run.add_argument("--scale-modes", type=lambda v: _names(v, SCALE_MODES, "scale mode"),
                     default=["floor"], help=f"comma-separated, of {', '.join(SCALE_MODES)} (default floor)")
    run.add_argument("--rounding", type=lambda v: _names(v, ROUNDING_MODES, "rounding"),
                     default=["even"], help=f"comma-separated, of {', '.join(ROUNDING_MODES)} (default even)")
    run.add_argument("--block-sizes", type=_block_sizes, default=[32],
                     help="comma-separated block sizes; each must divide every layer's in_features (default 32)")
    run.add_argument("--weights-only", action="store_true", help="keep activations in full precision")
    run.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    run.add_argument("--model", type=Path, help="a local Hugging Face model directory (default: the "
                     "packaged all-MiniLM-L6-v2)")
    run.add_argument("--sentences", type=Path, help="a text file, one sentence per line (default: built-in)")
    run.add_argument("--out", type=Path, default=Path("torchmx-report"),
                     help="output directory for report.json and per_layer_sqnr.png (default torchmx-report)")
    run.add_argument("--repeat", type=int, default=5, help="timed forward passes per model (default 5)")
    inspect = commands.add_parser("inspect", help="describe an MX checkpoint")
    inspect.add_argument("file", type=Path)
    return parser


def _quiet_third_party_logs() -> None:
    """transformers imports torchao while loading a model; torchao then logs that its CUDA
    extensions are missing on a CPU machine, and torch that torchao uses a deprecated API.
    transformers' own weight-loading bar would interleave with ours."""
    import transformers

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()


def _load_encoder(model_dir: Optional[Path], device: str):
    import torch

    from .models import MiniLM

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    _quiet_third_party_logs()
    if model_dir is None:
        return MiniLM.load(device=device), "all-MiniLM-L6-v2"
    if not model_dir.is_dir():
        raise UsageError(f"--model: no such directory: {model_dir}")
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--model {model_dir}: cannot load a model from it ({first})") from None
    return MiniLM(model.to(device).eval(), tokenizer), model_dir.name


def _evaluate(opts) -> None:
    from tqdm import tqdm

    from .evaluate import DEMO_SENTENCES, Recipe, evaluate_encoder
    from .report import format_table, write_chart, write_json

    sentences = DEMO_SENTENCES
    if opts.sentences is not None:
        if not opts.sentences.is_file():
            raise UsageError(f"--sentences: no such file: {opts.sentences}")
        sentences = [line.strip() for line in opts.sentences.read_text().splitlines() if line.strip()]
        if len(sentences) < 2:
            raise UsageError("--sentences: need at least 2 non-empty lines")
    if opts.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    recipes = [Recipe(fmt, mode, rnd, block, opts.weights_only) for fmt, mode, rnd, block in
               itertools.product(opts.formats, opts.scale_modes, opts.rounding, opts.block_sizes)]
    encoder, name = _load_encoder(opts.model, opts.device)
    try:
        report = evaluate_encoder(encoder, recipes, sentences, model_name=name, repeat=opts.repeat,
                                  progress=lambda r: tqdm(r, desc="torchmx: recipes", disable=None))
    except ValueError as error:  # e.g. a block size that does not divide a layer
        raise UsageError(str(error)) from None
    opts.out.mkdir(parents=True, exist_ok=True)
    write_json(report, opts.out / "report.json")
    write_chart(report, opts.out / "per_layer_sqnr.png")
    print(format_table(report))
    print(f"\nwrote {opts.out / 'report.json'} and {opts.out / 'per_layer_sqnr.png'}")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, "evaluate")
    try:
        opts = build_parser().parse_args(argv)
        if opts.command == "inspect":
            from .inspect_checkpoint import describe

            try:
                print(describe(opts.file))
            except ValueError as error:
                raise UsageError(str(error)) from None
        else:
            _evaluate(opts)
    except UsageError as error:
        print(f"torchmx: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

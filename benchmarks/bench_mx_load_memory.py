"""Host memory of loading an MX checkpoint: a gpt-oss-style model of over 1 GB in the HF mxfp4
layout (MXFP4 experts, bf16 elsewhere), loaded with torchmx.huggingface.gpt_oss.from_pretrained
in a fresh process; the peak resident memory above that process's baseline (after its imports),
against the checkpoint's bytes (target of issue 47: <= 1.2x).

    PYTHONPATH=. python3 benchmarks/bench_mx_load_memory.py            # builds, saves, loads
    PYTHONPATH=. python3 benchmarks/bench_mx_load_memory.py --layers 2 # a smaller model

The checkpoint is built without full-precision experts (random MXFP4 bytes, scales 2^-9..2^0),
saved with save_pretrained in a temporary folder, and loaded by a child process that reads
its own /proc/self/status (VmRSS before, after importing transformers' model classes; VmHWM
after from_pretrained and again after reading
every loaded tensor once, since tensors that map the file count only once their pages are in). The output is also written to
benchmarks/results/mx_load_memory_<date>_cpu.txt.
"""

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def build(path: str, layers: int, experts: int, hidden: int) -> None:
    """Save a gpt-oss-style checkpoint with random MXFP4 experts in the HF mxfp4 layout."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from torchmx.huggingface import gpt_oss

    config = GptOssConfig(vocab_size=2048, hidden_size=hidden, intermediate_size=hidden,
                          num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=64, num_local_experts=experts, num_experts_per_tok=4,
                          sliding_window=128, layer_types=["full_attention"] * layers,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with torch.device("meta"):
        model = GptOssForCausalLM(config).to(torch.bfloat16)
    for layer in model.model.layers:
        layer.mlp.experts = gpt_oss.MXGptOssExperts(config, dtype=torch.bfloat16, device="meta")
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("_blocks"):
                tensor.copy_(torch.randint(0, 256, tensor.shape, dtype=torch.uint8, generator=g))
            elif name.endswith("_scales"):
                tensor.copy_(torch.randint(118, 128, tensor.shape, dtype=torch.uint8, generator=g))
            elif tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=g) * 0.02)
    model.config.quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    model.save_pretrained(path)


def load(path: str) -> None:
    """In a fresh process: load the checkpoint and print a JSON line of its memory figures."""
    import torch
    from transformers import AutoModelForCausalLM  # noqa: F401 - imported before the baseline
    from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: F401

    from torchmx.huggingface import gpt_oss

    baseline = _status_kib("VmRSS")
    model = gpt_oss.from_pretrained(path, dtype=torch.bfloat16)
    loaded = _status_kib("VmHWM")
    # Every byte read once: tensors that still map the file count when their pages are in.
    for t in model.state_dict().values():
        t.contiguous().view(torch.uint8).max()
    peak, after = _status_kib("VmHWM"), _status_kib("VmRSS")
    experts = [m for m in model.modules() if isinstance(m, gpt_oss.MXGptOssExperts)]
    mx_bytes = sum(b.numel() for m in experts for b in m.buffers())
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    print(json.dumps({"baseline_kib": baseline, "loaded_kib": loaded, "peak_kib": peak,
                      "after_kib": after,
                      "experts": len(experts), "mx_expert_bytes": mx_bytes,
                      "model_bytes": model_bytes}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024, help="H = I")
    parser.add_argument("--load", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.load:
        return load(args.load)
    now = datetime.datetime.now(datetime.timezone.utc)
    lines = [f"device: cpu ({os.cpu_count()} cores), {now:%Y-%m-%d %H:%M} UTC",
             f"command: {' '.join(sys.argv)}"]
    with tempfile.TemporaryDirectory() as path:
        build(path, args.layers, args.experts, args.hidden)
        files = sorted(p for p in pathlib.Path(path).iterdir() if p.suffix == ".safetensors")
        checkpoint = sum(p.stat().st_size for p in files)
        child = subprocess.run([sys.executable, __file__, "--load", path], check=True,
                               capture_output=True, text=True, env=dict(os.environ))
        figures = json.loads(child.stdout.strip().splitlines()[-1])
    loading = (figures["loaded_kib"] - figures["baseline_kib"]) * 1024
    peak = (figures["peak_kib"] - figures["baseline_kib"]) * 1024
    kept = (figures["after_kib"] - figures["baseline_kib"]) * 1024
    lines += [
        f"model: {args.layers} layers, {args.experts} MXFP4 experts of H = I = {args.hidden}; "
        f"checkpoint {checkpoint:,} bytes in {len(files)} file(s), of which MX experts "
        f"{figures['mx_expert_bytes']:,}; loaded state {figures['model_bytes']:,} bytes",
        f"peak resident memory above the process baseline: while from_pretrained ran "
        f"{loading:,} bytes = {loading / checkpoint:.3f}x the checkpoint; with every loaded "
        f"byte then read once {peak:,} bytes = {peak / checkpoint:.3f}x (target <= 1.2x); "
        f"resident at the end {kept:,} bytes = {kept / checkpoint:.3f}x"]
    results = pathlib.Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    text = "\n".join(lines) + "\n"
    (results / f"mx_load_memory_{now:%Y-%m-%d_%H%M}_cpu.txt").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()

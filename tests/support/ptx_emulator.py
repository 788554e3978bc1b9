"""A CPU emulator of the few PTX instructions that torchmx's inline assembly uses, so that the
PTX text that only a GPU runs is still checked on CPU, against the reference numerics.

Registers are int64 tensors holding 32-bit patterns. bf16x2 and f16x2 arithmetic runs per half
in float64 (exact for these operands: products and sums of 16-bit values whose exponents the
kernels keep close) and is rounded once: to bf16 through fp32 (exactly: the results fit fp32),
to fp16 by numpy's float64 -> float16 conversion (one rounding, subnormals included).
"""

import numpy as np
import torch

MASK32 = 0xFFFFFFFF


def _bf16(bits: torch.Tensor) -> torch.Tensor:
    return (bits & 0xFFFF).to(torch.int16).view(torch.bfloat16)


def _bf16_bits(value: torch.Tensor) -> torch.Tensor:
    return value.to(torch.float32).to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _f16(bits: torch.Tensor) -> torch.Tensor:
    return (bits & 0xFFFF).to(torch.int16).view(torch.float16)


def _f16_bits(value: torch.Tensor) -> torch.Tensor:
    half = torch.from_numpy(value.numpy().astype(np.float16))
    return half.view(torch.int16).to(torch.int64) & 0xFFFF


def _per_half(function, *words):
    halves = [function(*[(w >> shift) & 0xFFFF for w in words]) for shift in (0, 16)]
    return halves[0] | (halves[1] << 16)


def _bf16x2(function):
    return lambda *words: _per_half(
        lambda *h: _bf16_bits(function(*[_bf16(v).double() for v in h])), *words)


def _f16x2(function):
    return lambda *words: _per_half(
        lambda *h: _f16_bits(function(*[_f16(v).double() for v in h])), *words)


_OPS = {
    "and.b32": lambda a, b: a & b,
    "or.b32": lambda a, b: a | b,
    "mov.b32": lambda a: a,
    "add.u32": lambda a, b: (a + b) & MASK32,
    "shr.u32": lambda a, n: a >> n,
    "shr.b32": lambda a, n: a >> n,
    "shf.l.wrap.b32": lambda a, _, n: ((a << n) | (a >> (32 - n))) & MASK32,
    "min.u16x2": lambda a, b: _per_half(torch.minimum, a, b),
    "max.u16x2": lambda a, b: _per_half(torch.maximum, a, b),
    "mul.rn.bf16x2": _bf16x2(lambda a, b: a * b),
    "add.rn.bf16x2": _bf16x2(lambda a, b: a + b),
    "fma.rn.bf16x2": _bf16x2(lambda a, b, c: a * b + c),
    "mul.rn.f16x2": _f16x2(lambda a, b: a * b),
    "add.rn.f16x2": _f16x2(lambda a, b: a + b),
    "fma.rn.f16x2": _f16x2(lambda a, b, c: a * b + c),
}


def run_ptx(program: str, inputs: dict) -> dict:
    """Runs `program` (the text given to tl.inline_asm_elementwise) on `inputs` ({"$1": int64
    tensor of 32-bit patterns, ...}); returns every register, outputs ("$0", ...) included."""
    regs = {name: value & MASK32 for name, value in inputs.items()}
    like = next(iter(regs.values()))

    def value(operand):
        return regs[operand] if operand in regs else torch.full_like(like, int(operand, 0))

    for line in program.split(";"):
        line = line.strip().strip("{}").strip()
        if not line or line.startswith(".reg"):
            continue
        opcode, operands = line.split(None, 1)
        if operands.startswith("{"):  # mov.b32 {$a, $b}, p: the halves of p
            halves, source = operands[1:].split("}")
            low, high = (h.strip() for h in halves.split(","))
            v = value(source.strip(" ,"))
            regs[low], regs[high] = v & 0xFFFF, v >> 16
            continue
        if opcode not in _OPS:
            raise AssertionError(f"the emulator does not know {opcode}")
        destination, *args = [o.strip() for o in operands.split(",")]
        if opcode.startswith(("shr", "shf")):
            args = [value(a) for a in args[:-1]] + [int(args[-1], 0)]
        else:
            args = [value(a) for a in args]
        regs[destination] = _OPS[opcode](*args)
    return regs

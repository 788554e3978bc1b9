"""Compile a Triton kernel for sm_90 (Hopper) without a GPU and read its SASS: shared by
sass_matmul.py and sass_quantize.py. The disassembler is the cuobjdump that Triton ships."""

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4,}\*/")  # /*0a30*/, /*10a30*/


def compile_sm90(fn, constants, pointers, divisible, **options):
    """`fn` compiled for sm_90: constexprs `constants`, pointer types `pointers` ({name:
    "*bf16", ...}; other arguments i32), the arguments in `divisible` marked divisible by 16 (as
    Triton's launcher specializes aligned pointers and sizes)."""
    names = fn.arg_names
    signature = {n: "constexpr" if n in constants else pointers.get(n, "i32") for n in names}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(names.index(n),): v for n, v in constants.items()},
                       attrs={(names.index(n),): [["tt.divisibility", 16]]
                              for n in names if n in divisible})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _cuobjdump(cubin: bytes, flag: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def instructions(cubin: bytes):
    """The kernel's SASS instruction lines."""
    return [line for line in _cuobjdump(cubin, "-sass").splitlines() if INSTRUCTION.match(line)]


def resources(cubin: bytes):
    """(registers per thread, bytes of local memory per thread: spills)."""
    usage = _cuobjdump(cubin, "-res-usage")
    return (int(re.search(r"REG:(\d+)", usage).group(1)),
            int(re.search(r"LOCAL:(\d+)", usage).group(1)))


def opcode(line: str) -> str:
    """The opcode of a SASS line, without its predicate and modifiers."""
    return re.sub(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", line).split()[0].split(".")[0]

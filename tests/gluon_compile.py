"""Compile stream_linear's Gluon kernel for sm_90 on any machine (no GPU needed) and read what
ptxas says about it: Gluon kernels do not run under Triton's interpreter, so the CPU tests
check that the kernel compiles, keeps its wgmmas asynchronous and spills nothing.

Gluon cannot compile the interpreter's functions, so `compile_reports` compiles in a child
process without TRITON_INTERPRET (the tests run under it on the CPU).
"""

import json
import os
import subprocess
import sys
import tempfile
from typing import List, Tuple

import torch
import triton

from torchmx import dtypes
from torchmx.kernels import stream_layout, stream_linear


def _signature_type(value) -> str:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    return native_specialize_impl(BaseBackend, value, False, True, True)[0]


def compile_sm90(fmt: dtypes.DType, M: int, N: int, K: int, bias: bool = True,
                 out_dtype: torch.dtype = torch.bfloat16, config=None) -> Tuple[str, bytes]:
    """(ptxas -v output, cubin) of stream_linear_kernel as stream_linear would launch it for
    x [M, K] and a weight [N, K], built from CPU tensors of those shapes."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from torchmx.kernels._gl_stream import stream_linear_kernel
    x = torch.zeros(M, K, dtype=torch.bfloat16)
    codes = torch.zeros(N * K // stream_layout.STEP_CODES * stream_layout.step_bytes(fmt),
                        dtype=torch.uint8)
    scales = torch.zeros(N * K // 32, dtype=torch.uint8)
    w_data = torch.zeros(N, K * fmt.bytes_per_group // fmt.codes_per_group, dtype=torch.uint8)
    w_scale = torch.zeros(N, K // 32, dtype=torch.uint8)
    out = torch.zeros(M, N, dtype=out_dtype)
    _, arguments, constants = stream_linear.kernel_arguments(
        x, codes, scales, w_scale, w_data, fmt, out[0] if bias else None, out, config)
    num_warps = constants.pop("num_warps")
    names = stream_linear_kernel.arg_names
    signature = dict(zip(names, map(_signature_type, arguments)))
    constexprs = dict(constants)
    for name, value in zip(names, arguments):  # Triton specializes ints equal to 1
        if signature[name] == "constexpr":
            constexprs[name] = value
    signature.update({name: "constexpr" for name in constants})
    source = GluonASTSource(fn=stream_linear_kernel, signature=signature, attrs={},
                            constexprs={(names.index(n),): v for n, v in constexprs.items()})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        ptx = os.path.join(d, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        report = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o",
                                 os.path.join(d, "kernel.cubin")],
                                capture_output=True, text=True, check=True)
    return report.stdout + report.stderr, kernel.asm["cubin"]


def compile_reports(cases: List[Tuple[str, int, int, int, bool, str]]) -> List[str]:
    """ptxas -v output for each (format name, M, N, K, bias, out dtype name), compiled in one
    child process with Triton's interpreter off."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (os.path.dirname(here), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path)
    child = subprocess.run([sys.executable, __file__], input=json.dumps(cases), env=env,
                           capture_output=True, text=True, cwd=here)
    if child.returncode:
        raise RuntimeError(f"compiling the stream kernel for sm_90 failed:\n{child.stderr}")
    return json.loads(child.stdout.splitlines()[-1])


if __name__ == "__main__":
    reports = [compile_sm90(dtypes.from_name(f), M, N, K, bias, getattr(torch, out))[0]
               for f, M, N, K, bias, out in json.loads(sys.stdin.read())]
    print(json.dumps(reports))

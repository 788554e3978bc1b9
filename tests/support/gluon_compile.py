"""Compile the Gluon kernels for sm_90 on any machine (no GPU needed) and read what ptxas
says about them: Gluon kernels do not run under Triton's interpreter, so the CPU tests check
that each kernel compiles, keeps its wgmmas asynchronous and spills nothing.

Gluon cannot compile the interpreter's functions, so `compile_reports` compiles in a child
process without TRITON_INTERPRET (the tests run under it on the CPU). A case is a tuple whose
first item names the kernel:

    ("stream", format, M, N, K, bias, out dtype)   stream_linear_kernel
    ("stream-pdl", format, M, N, K, pdl)            its PTX's launch-control lines (PDL)
    ("mx_gemm", x format, w format, M, N, K)        mx_gemm_kernel
    ("dequantize", w format, N, K)                  permuted_dequantize_kernel
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import List, Tuple

import torch
import triton

from torchmx import dtypes
from torchmx.kernels.linear import mx_gemm, stream_matmul
from torchmx.kernels.layouts import tma_stream_layout


def _specialization(value):
    """(signature type, attribute key) as Triton's launcher specializes an argument: key "D"
    for pointers and ints divisible by 16."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    return native_specialize_impl(BaseBackend, value, False, True, True)


def _signature_type(value) -> str:
    return _specialization(value)[0]


def _compile(kernel, arguments, constants) -> Tuple[str, bytes]:
    """(ptxas -v output, cubin) of a Gluon kernel for these launch arguments, for sm_90."""
    compiled = _compiled(kernel, arguments, constants)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        ptx = os.path.join(d, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        report = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o",
                                 os.path.join(d, "kernel.cubin")],
                                capture_output=True, text=True, check=True)
    return report.stdout + report.stderr, compiled.asm["cubin"]


def _compiled(kernel, arguments, constants):
    """Triton's compiled kernel (asm["ptx"], asm["cubin"], ...) of a Gluon kernel for these
    launch arguments, for sm_90."""
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    constants = dict(constants)
    options = {name: constants.pop(name) for name in ("num_warps", "launch_pdl")
               if name in constants}
    names = kernel.arg_names
    signature = dict(zip(names, map(_signature_type, arguments)))
    constexprs = dict(constants)
    for name, value in zip(names, arguments):  # Triton specializes ints equal to 1
        if signature[name] == "constexpr":
            constexprs[name] = value
    signature.update({name: "constexpr" for name in constants})
    # the divisibility a launch would specialize on (16-byte aligned pointers, strides),
    # without which the compiler cannot vectorize loads and stores as it does on the GPU
    attrs = {(i,): BaseBackend.parse_attr(key) for i, (_, key) in
             enumerate(map(_specialization, arguments)) if isinstance(key, str) and key}
    source = GluonASTSource(fn=kernel, signature=signature, attrs=attrs,
                            constexprs={(names.index(n),): v for n, v in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _stream_launch(fmt: dtypes.DType, M: int, N: int, K: int, bias: bool,
                   out_dtype: torch.dtype, config):
    """(arguments, constants) of stream_linear_kernel as stream_linear would launch it for
    x [M, K] and a weight [N, K], built from CPU tensors of those shapes."""
    x = torch.zeros(M, K, dtype=torch.bfloat16)
    codes = torch.zeros(N * K // tma_stream_layout.STEP_CODES * tma_stream_layout.step_bytes(fmt),
                        dtype=torch.uint8)
    scales = torch.zeros(N * K // 32, dtype=torch.uint8)
    w_data = torch.zeros(N, K * fmt.bytes_per_group // fmt.codes_per_group, dtype=torch.uint8)
    w_scale = torch.zeros(N, K // 32, dtype=torch.uint8)
    out = torch.zeros(M, N, dtype=out_dtype)
    _, arguments, constants = stream_matmul.kernel_arguments(
        x, codes, scales, w_scale, w_data, fmt, out[0] if bias else None, out, config)
    return arguments, constants


def compile_sm90(fmt: dtypes.DType, M: int, N: int, K: int, bias: bool = True,
                 out_dtype: torch.dtype = torch.bfloat16, config=None) -> Tuple[str, bytes]:
    """(ptxas -v output, cubin) of stream_linear_kernel as stream_linear would launch it for
    x [M, K] and a weight [N, K] (config None: its default)."""
    from torchmx.kernels.linear._gl_stream import stream_linear_kernel
    return _compile(stream_linear_kernel,
                    *_stream_launch(fmt, M, N, K, bias, out_dtype, config))


def stream_launch_control(fmt: dtypes.DType, M: int, N: int, K: int, pdl: bool) -> List[str]:
    """The PTX lines of stream_linear_kernel (default config, with or without PDL) that control
    its launch or prefetch into L2 (griddepcontrol, cp.async.bulk.prefetch), in order."""
    from torchmx.kernels.linear._gl_stream import stream_linear_kernel
    config = dataclasses.replace(stream_matmul.default_config(fmt, M, K), pdl=pdl)
    ptx = _compiled(stream_linear_kernel, *_stream_launch(fmt, M, N, K, False, torch.bfloat16,
                                                          config)).asm["ptx"]
    return [line.strip() for line in ptx.splitlines()
            if "griddepcontrol" in line or "cp.async.bulk.prefetch" in line]


def _mx_parts(fmt: dtypes.DType, rows: int, K: int):
    return (torch.zeros(rows, K * fmt.bytes_per_group // fmt.codes_per_group, dtype=torch.uint8),
            torch.zeros(rows, K // 32, dtype=torch.uint8))


def compile_mx_gemm_sm90(x_fmt: dtypes.DType, w_fmt: dtypes.DType, M: int, N: int,
                         K: int) -> Tuple[str, bytes]:
    """(ptxas -v output, cubin) of mx_gemm_kernel as mx_gemm launches it for MX x [M, K] and
    W [N, K], built from CPU tensors."""
    from torchmx.kernels.linear._gl_mx_gemm import mx_gemm_kernel
    x_data, x_scale = _mx_parts(x_fmt, M, K)
    w_data, w_scale = _mx_parts(w_fmt, N, K)
    w = torch.zeros(N, K, dtype=torch.bfloat16)
    out = torch.zeros(M, N, dtype=torch.bfloat16)
    counts = torch.zeros(-(-N // mx_gemm.TILE_N) + 1, dtype=torch.int32)
    _, arguments, constants = mx_gemm.gemm_arguments(
        x_data, x_scale, x_fmt, w_data, w_scale, w_fmt, w, out,
        mx_gemm.new_flags(M, N, out.device), counts, 0, sms=132)
    return _compile(mx_gemm_kernel, arguments, constants)


def compile_dequantize_sm90(w_fmt: dtypes.DType, N: int, K: int) -> Tuple[str, bytes]:
    """(ptxas -v output, cubin) of permuted_dequantize_kernel for a weight [N, K]."""
    from torchmx.kernels.linear._gl_mx_gemm import permuted_dequantize_kernel
    w_data, w_scale = _mx_parts(w_fmt, N, K)
    out = torch.zeros(N, K, dtype=torch.bfloat16)
    _, arguments, constants = mx_gemm.dequantize_arguments(w_data, w_scale, w_fmt, out)
    return _compile(permuted_dequantize_kernel, arguments, constants)


def _report(case):
    kind, name, *shape = case
    fmt = dtypes.from_name(name)
    if kind == "stream-pdl":
        return stream_launch_control(fmt, *shape)
    if kind == "stream":
        M, N, K, bias, out = shape
        return compile_sm90(fmt, M, N, K, bias, getattr(torch, out))[0]
    if kind == "mx_gemm":
        return compile_mx_gemm_sm90(fmt, dtypes.from_name(shape[0]), *shape[1:])[0]
    if kind == "dequantize":
        return compile_dequantize_sm90(fmt, *shape)[0]
    raise ValueError(f"unknown kernel {kind!r}")


def compile_reports(cases: List[tuple]) -> list:
    """What each case (the module docstring's tuples) asks for (ptxas -v output, or PTX
    lines), compiled in one child process with Triton's interpreter off."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(here)), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path)
    child = subprocess.run([sys.executable, __file__], input=json.dumps(cases), env=env,
                           capture_output=True, text=True, cwd=here)
    if child.returncode:
        raise RuntimeError(f"compiling Gluon kernels for sm_90 failed:\n{child.stderr}")
    return json.loads(child.stdout.splitlines()[-1])


if __name__ == "__main__":
    reports = [_report(case) for case in json.loads(sys.stdin.read())]
    print(json.dumps(reports))

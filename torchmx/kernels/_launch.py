"""Launching a Triton kernel whose specialization is already known.

`kernel[grid](*args, **kwargs)` binds every argument, asks Triton's specializer about each,
hashes the result into a cache key and looks the compiled kernel up, for every launch: host
time of the order of a small quantize's GPU time with this project's argument lists.
`launch(kernel, grid, *args, **kwargs)` keeps the compiled kernel under a key that refines
Triton's own (`_key`), so a later call with arguments of the same specialization calls the
compiled kernel directly, as `CompiledKernel[grid](...)` does. A GPU test checks over a sweep
that no two launches with one key have different Triton keys.

Off CUDA (Triton's interpreter) and while a launch hook is installed (Triton's profilers),
every call takes `kernel[grid]` itself.
"""

import inspect

import torch

__all__ = ["launch"]

_COMPILED = {}  # (kernel, device, options, argument specializations) -> CompiledKernel
_SIGNATURES = {}  # kernel -> (parameter names, the same as a set, {name: default}, constexpr?)


def _signature(kernel):
    signature = _SIGNATURES.get(kernel)
    if signature is None:
        params = inspect.signature(kernel.fn).parameters
        defaults = {name: p.default for name, p in params.items()
                    if p.default is not inspect.Parameter.empty}
        constexpr = tuple(p.is_constexpr for p in kernel.params)
        signature = _SIGNATURES[kernel] = (tuple(params), frozenset(params), defaults, constexpr)
    return signature


def _key(values, constexpr) -> tuple:
    """What Triton's specializer can tell apart about the arguments, or more: a constexpr's
    value; a tensor's dtype and address modulo 16; an int's range, whether it is 1 and its
    residue modulo 16; a float's type; any other value itself."""
    return tuple([
        value if is_constexpr
        else (value.dtype, value.data_ptr() & 15) if isinstance(value, torch.Tensor)
        else (value == 1, value & 15, -2**31 <= value < 2**31, value < 2**63)
        if type(value) is int
        else float if type(value) is float  # passed as fp32, never specialized
        else (type(value), value)
        for value, is_constexpr in zip(values, constexpr)])


_RUNTIME = []  # [triton.knobs.runtime], looked up on the first launch


def _hooks_installed() -> bool:
    if not _RUNTIME:
        from triton import knobs  # Triton is imported by then: the kernel is a Triton kernel
        _RUNTIME.append(knobs.runtime)
    runtime = _RUNTIME[0]
    return any(getattr(hook, "calls", hook) for hook in (runtime.launch_enter_hook,
                                                         runtime.launch_exit_hook))


def launch(kernel, grid, *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), through the compiled kernel where it is known."""
    if not hasattr(kernel, "device_caches") or _hooks_installed():  # interpreter, profilers
        kernel[grid](*args, **kwargs)
        return
    names, known, defaults, constexpr = _signature(kernel)
    values = list(args)
    for name in names[len(args):]:
        values.append(kwargs[name] if name in kwargs else defaults[name])
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in known))
    device = torch.cuda.current_device()
    key = (kernel, device, options, _key(values, constexpr))
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = kernel[grid](*args, **kwargs)
        return
    grid = tuple(grid) + (1,) * (3 - len(grid))
    stream = torch._C._cuda_getCurrentRawStream(device)
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                 None, None, None, *values)

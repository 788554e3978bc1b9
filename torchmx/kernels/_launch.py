"""Launching a Triton kernel whose specialization is already known.

`kernel[grid](*args, **kwargs)` binds every argument, asks Triton's specializer about each,
hashes the result into a cache key and looks the compiled kernel up, for every launch: host
time of the order of a small quantize's GPU time with this project's argument lists.
`launch(kernel, grid, *args, **kwargs)` keeps the compiled kernel under a key that refines
Triton's own (`_key`), so a later call with arguments of the same specialization calls the
compiled kernel directly, as `CompiledKernel[grid](...)` does. A GPU test checks over a sweep
that no two launches with one key have different Triton keys.

`Launch` goes one step further for a launch decided once (a linear's plan, kernels/linear/dispatch.py):
its kernel, grid and every argument but a few tensors are fixed, so a call after the first
on a device puts the new tensors into the argument list and calls the compiled kernel's
launcher (`Launch.direct`), with no key to build. Its
caller promises that the new tensors specialize as the first call's did (same dtypes, 16-byte
alignment where the first call's were aligned).

`Launch.direct` is the last step, for a caller that keeps some arguments for many calls (a
layer's weight): a function that takes the other tensors (or their addresses) and calls the
kernel's launcher itself. On Triton 3.6 that is the compiled C launcher (`_raw_launcher`),
without the Python wrapper that would only allocate scratch memory these kernels do not use.
benchmarks/profile_linear_launch.py times each of these steps against `kernel[grid](...)`.

Off CUDA (Triton's interpreter) and while a launch hook is installed (Triton's profilers),
every call takes `kernel[grid]` itself.

Triton compiles for and launches on the current CUDA device, on its current stream; PyTorch's
own operators switch to their tensors' device instead. So every launch here runs with the
device of its first tensor argument made current (`_device_switch`): tensors on `cuda:1` while
`cuda:0` is current (a model spread over GPUs by `device_map`) are computed on `cuda:1`, on
that device's current stream. The bound calls built on `Launch.direct` (`bound_product`, the
quantize plans' `device_calls`) belong to one device and make it current where another is
(`on_device`).

`Launch.traced` and `traced_product` are the same launches for torch.compile: recorded by
`torch.library.wrap_triton` in the body of a `torch.library.triton_op`, so that inductor's
generated code launches the kernels itself (mx_ops/weight_matmul_compiled.py).
"""

import contextlib
import inspect

import torch

from .._allocation import allocator
from ._common import empty

__all__ = ["launch", "Launch", "on_device", "hooks_installed", "bound_product", "bind_weight",
           "planned_product", "traced_product"]

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


def hooks_installed() -> bool:
    """Whether a Triton launch hook (a profiler) is installed: launches must then go through
    Triton, which calls it."""
    if not _RUNTIME:
        from triton import knobs  # Triton is imported by then: the kernel is a Triton kernel
        _RUNTIME.append(knobs.runtime)
    runtime = _RUNTIME[0]
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


def _values(kernel, args, kwargs) -> list:
    """Every parameter's value in the kernel's order (defaults filled in)."""
    names, _, defaults, _ = _signature(kernel)
    values = list(args)
    for name in names[len(args):]:
        values.append(kwargs[name] if name in kwargs else defaults[name])
    return values


def _device_of(values) -> int:
    """The CUDA device index of the first tensor among `values`; -1 for a CPU tensor or none
    (Triton's launcher then refuses the CPU tensor itself)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            return value.get_device()
    return -1


def _device_switch(values):
    """None where the first tensor among `values` is on the current CUDA device (or on none),
    else a context that makes its device current."""
    index = _device_of(values)
    if index < 0 or index == torch._C._cuda_getDevice():
        return None
    return torch.cuda.device(index)


def on_device(index: int, call):
    """`call`, run with CUDA device `index` current: a bound call allocates on the current
    device and launches a kernel compiled there. The switch (torch.cuda.device's, in C) is
    taken only where another device is current."""
    current, exchange = torch._C._cuda_getDevice, torch._C._cuda_exchangeDevice
    restore = torch._C._cuda_maybeExchangeDevice

    def on_its_device(*args):
        if current() == index:
            return call(*args)
        previous = exchange(index)
        try:
            return call(*args)
        finally:
            restore(previous)
    return on_its_device


def launch(kernel, grid, *args, **kwargs):
    """kernel[grid](*args, **kwargs) on the device of its first tensor, through the compiled
    kernel where it is known; returns the compiled kernel (None under the interpreter or a
    launch hook)."""
    if not hasattr(kernel, "device_caches"):  # the interpreter
        kernel[grid](*args, **kwargs)
        return None
    values = _values(kernel, args, kwargs)
    guard = _device_switch(values)
    if guard is not None:
        with guard:
            return launch(kernel, grid, *args, **kwargs)
    if hooks_installed():  # profilers: Triton calls their hooks
        kernel[grid](*args, **kwargs)
        return None
    _, known, _, constexpr = _signature(kernel)
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in known))
    device = torch._C._cuda_getDevice()
    key = (kernel, device, options, _key(values, constexpr))
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _COMPILED[key] = kernel[grid](*args, **kwargs)
        return compiled
    grid = tuple(grid) + (1,) * (3 - len(grid))
    stream = torch._C._cuda_getCurrentRawStream(device)
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                 None, None, None, *values)
    return compiled


class Launch:
    """kernel[grid](*args, **kwargs) decided once: a call `launch_(*tensors)` replaces the
    positional arguments at `slots` by `tensors` and launches. The first call on a device
    goes through `launch` (Triton's own specialization: `keyed` False for a kernel whose
    arguments `launch` cannot key, such as Gluon's tensor descriptors, takes kernel[grid]);
    later calls call its compiled kernel directly."""

    __slots__ = ("kernel", "grid", "args", "kwargs", "slots", "keyed", "_values", "_compiled",
                 "_direct")

    def __init__(self, kernel, grid, args, kwargs, slots, keyed: bool = True):
        self.kernel, self.kwargs, self.slots, self.keyed = kernel, kwargs, tuple(slots), keyed
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.args = list(args)
        self._values = _values(kernel, args, kwargs) if hasattr(kernel, "device_caches") else None
        self._compiled = {}  # CUDA device index -> CompiledKernel
        self._direct = {}  # CUDA device index -> self.direct({}, self.slots, index)

    def __call__(self, *tensors) -> None:
        direct = None
        if self._values is not None:
            guard = _device_switch(tensors)
            if guard is not None:
                with guard:
                    return self(*tensors)
            # the C getter: torch.cuda.current_device() adds two Python calls per launch
            device = torch._C._cuda_getDevice()
            direct = self._direct.get(device)
        if direct is None or hooks_installed():
            args = self.args.copy()
            for slot, tensor in zip(self.slots, tensors):
                args[slot] = tensor
            if self.keyed or self._values is None or hooks_installed():
                compiled = launch(self.kernel, self.grid, *args, **self.kwargs)
            else:
                compiled = self.kernel[self.grid](*args, **self.kwargs)
            # (kept for `device` where `launch` compiled it there: the device of the first
            # tensor among all the arguments, which is the first of `tensors` for every plan)
            if (compiled is not None and self._values is not None and not hooks_installed()
                    and _device_of(args) == device):
                self._compiled[device] = compiled
                self._direct[device] = self.direct({}, self.slots, device)
            return
        # later calls: the compiled kernel's launcher, without Triton's Python wrapper
        direct(torch._C._cuda_getCurrentRawStream(device), *tensors)

    def traced(self, *tensors) -> None:
        """The launch with `tensors` at its slots through `torch.library.wrap_triton`: recorded
        into the graph when torch.compile traces a triton_op's body; a plain `kernel[grid]`
        where nothing traces (wrap_triton then returns the kernel itself)."""
        from torch.library import wrap_triton
        args = self.args.copy()
        for slot, tensor in zip(self.slots, tensors):
            args[slot] = tensor
        kernel = wrap_triton(self.kernel)
        # where nothing traces, Triton launches on the current device (inductor's generated
        # code makes the device of the kernels it launches current itself)
        switch = _device_switch(tensors) if kernel is self.kernel else None
        with switch or contextlib.nullcontext():
            kernel[self.grid](*args, **self.kwargs)

    def direct(self, fixed: dict, free: tuple, index: int):
        """For CUDA device `index`, once a call compiled the kernel there: a function
        `f(stream, *values)` that launches it with the arguments of the first call, except
        `fixed` ({slot: tensor}: passed as its address, e.g. a weight's) and the slots `free`,
        which take `values` in that order (tensors or addresses, specialized as the first
        call's were). The function holds the fixed tensors' addresses only: its caller makes
        sure they stay what it means (a layer keeps its weight buffers; mx_weight_linear's memo
        is keyed by the addresses) and calls it with device `index` current (`on_device`).
        None under the interpreter, while a launch hook is installed, or before a first call
        on that device."""
        if self._values is None or hooks_installed():
            return None
        compiled = self._compiled.get(index)
        if compiled is None:
            return None
        values = self._values.copy()
        for slot, tensor in fixed.items():
            values[slot] = tensor.data_ptr()
        launcher, middle = _raw_launcher(compiled)
        grid_x, grid_y, grid_z = self.grid

        def launch_direct(stream, *tensors):
            args = values.copy()
            for slot, tensor in zip(free, tensors):
                args[slot] = tensor
            launcher(grid_x, grid_y, grid_z, stream, *middle, *args)
        return launch_direct


def _raw_launcher(compiled):
    """(launcher, the arguments between the stream and the kernel's own): Triton 3.6's compiled
    C launcher where the kernel needs no scratch memory (what its Python wrapper would
    allocate) and has no tensor descriptors (which its wrapper would expand), else the
    compiled kernel's `run`, as `launch` calls it."""
    import triton
    run = compiled.run
    raw = getattr(run, "launch", None)
    if (triton.__version__.startswith("3.6.") and type(raw).__name__ == "builtin_function_or_method"
            and run.global_scratch_size == 0 and run.profile_scratch_size == 0):
        return raw, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                     compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


def bound_product(main, reduce, out_shape: tuple, out_dtype: torch.dtype, device: torch.device,
                  partials_shape):
    """`f(x, bias) -> out` for a product planned as one main launch and, where K is split, a
    reduce launch: `main` and `reduce` from `Launch.direct` (free slots: x, bias, out, partials;
    and partials, bias, out), `partials_shape` the fp32 split-K partials' (None without a
    reduce). x and bias are tensors or their addresses (bias None when absent). A fresh `out`
    of `out_shape` (contiguous: any shape of the planned output's elements) stands in for an
    absent bias and for absent partials, as the plans' calls do. It runs with `device`
    current (`on_device`), where the launches' kernels were compiled and the C allocator
    allocates."""
    current_stream, index = torch._C._cuda_getCurrentRawStream, device.index
    new_out = allocator(out_shape, out_dtype, device)
    if reduce is None:
        def product(x, bias):
            out = new_out()
            address = out.data_ptr()
            main(current_stream(index), x, address if bias is None else bias, address, address)
            return out
        return on_device(index, product)

    new_partials = allocator(partials_shape, torch.float32, device)

    def split_product(x, bias):
        out = new_out()
        partials = new_partials()
        address, partial_address = out.data_ptr(), partials.data_ptr()
        bias = address if bias is None else bias
        stream = current_stream(index)
        main(stream, x, bias, address, partial_address)
        reduce(stream, partial_address, bias, address)
        return out
    return on_device(index, split_product)


def bind_weight(main: Launch, reduce, w_scale: torch.Tensor, w_data: torch.Tensor,
                out_shape: tuple, out_dtype: torch.dtype, device: torch.device, partials_shape):
    """`bound_product` of a linear plan whose main launch takes (x, w_data, w_scale, bias, out,
    partials) and whose reduce launch, if any, (partials, bias, out): the weight's addresses
    bound; None where either launch cannot be bound yet (`Launch.direct`)."""
    bound_main = main.direct({1: w_data, 2: w_scale}, (0, 3, 4, 5), device.index)
    bound_reduce = None if reduce is None else reduce.direct({}, (0, 1, 2), device.index)
    if bound_main is None or (reduce is not None and bound_reduce is None):
        return None
    return bound_product(bound_main, bound_reduce, out_shape, out_dtype, device,
                         None if reduce is None else partials_shape)


def planned_product(main: Launch, reduce, operands: tuple, bias, out_shape: tuple,
                    out_dtype: torch.dtype, device: torch.device, partials_shape) -> torch.Tensor:
    """A linear plan's call: `main` launched on (*operands, bias, out, partials) and, where K is
    split, `reduce` on (partials, bias, out), with a fresh `out` of `out_shape` and fp32
    partials of `partials_shape`. The output stands in for an absent bias and absent
    partials, which the launches then do not read."""
    out = empty(out_shape, out_dtype, device)
    partials = empty(partials_shape, torch.float32, device) if reduce is not None else out
    bias = bias if bias is not None else out
    main(*operands, bias, out, partials)
    if reduce is not None:
        reduce(partials, bias, out)
    return out


def traced_product(main: Launch, operands: tuple, bias, out_shape: tuple,
                   out_dtype: torch.dtype, device: torch.device):
    """What a linear plan of one launch computes, through `Launch.traced`: `main`'s slots take
    `operands` (the input first, then the weight's tensors), the bias, the output and the
    split-K partials, which a plan without a split does not read. An absent bias and the
    partials take the input, which the launch does not write: torch.compile then sees the
    fresh output as the only tensor written."""
    x = operands[0]
    out = torch.empty(out_shape, dtype=out_dtype, device=device)
    main.traced(*operands, x if bias is None else bias, out, x)
    return out

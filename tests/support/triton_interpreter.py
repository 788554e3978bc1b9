"""Fixes to Triton's interpreter (TRITON_INTERPRET=1), which runs the kernels' tests on the CPU.
tests/conftest.py applies them when the interpreter is on."""

import numpy as np


def fix_scalar_index():
    """Triton 3.6's interpreter holds scalars as 1-element arrays and converts them with
    int(array), which NumPy >= 2.4 rejects: a loop over a runtime bound (`range(n)`) fails
    there. Convert through .item() instead (what NumPy < 2.4 did)."""
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched


def reduce_by_slices(self, input):
    """ReduceOps.generic_reduce (tl.reduce with a combine function of the kernel's own) folded
    over whole slices: the same combines in the same order (element 0, then 1, ... along the
    axis, each result cast back to the input's dtype), applied to every output element at once
    instead of one element at a time in Python (seconds a call, most of some kernels' time)."""
    from triton.runtime.interpreter import ReduceOps
    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    data = [arg.handle.data for arg in input]
    shape = data[0].shape
    out_shape = shape[:axis] + shape[axis + 1:]
    if shape[axis] == 0:
        return ReduceOps._stock_generic_reduce(self, tuple(input))

    def as_tensor(values, i):
        return self.to_tensor(np.ascontiguousarray(values, dtype=data[i].dtype), input[i].dtype)

    acc = [np.take(d, 0, axis=axis) for d in data]
    for k in range(1, shape[axis]):
        result = self.combine_fn.fn(*(as_tensor(a, i) for i, a in enumerate(acc)),
                                    *(as_tensor(np.take(d, k, axis=axis), i)
                                      for i, d in enumerate(data)))
        result = result if isinstance(result, tuple) else (result,)
        acc = [_values(r, data[i].dtype, out_shape) for i, r in enumerate(result)]
    out = []
    for i, values in enumerate(acc):
        values = np.asarray(values, dtype=data[i].dtype).reshape(out_shape)
        if self.keep_dims:
            if original_axis is not None:
                values = np.expand_dims(values, axis)
            else:
                values = values.reshape((1,) * len(shape))
        elif original_axis is None:
            values = values.item()
        out.append(self.to_tensor(values, input[i].dtype))
    return out


def _values(result, dtype, shape):
    """A combine's result (a tensor, or a constant) as an array of the output's shape, cast to
    the input's dtype as the stock reduce casts each step's result."""
    values = np.asarray(result.handle.data if hasattr(result, "handle") else result)
    values = values.astype(dtype)
    if values.size == 1:  # a constant, or a scalar held as a 1-element array
        values = values.reshape(())
    return np.broadcast_to(values, shape).copy()


def fix_slow_generic_reduce():
    from triton.runtime.interpreter import ReduceOps
    if not hasattr(ReduceOps, "_stock_generic_reduce"):
        ReduceOps._stock_generic_reduce = ReduceOps.generic_reduce
        ReduceOps.generic_reduce = reduce_by_slices


def patch_language_once_per_launch():
    """The interpreter patches triton.language (inspecting every member of its modules) at a
    kernel's launch and again at every call of a @triton.jit helper inside it, in every program:
    ~30 ms a call, much of the time of kernels built from helpers. The patches a helper's call
    makes are the launch's own (same modules, same replacements, never undone before the
    launch's end), so a helper whose modules the launch patched skips them."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    stock_patch = interpreter._patch_lang
    launch = interpreter.GridExecutor.__call__
    patched = [None]  # ids of the language modules the launch under way patched (None: none)

    def languages(fn):
        return {id(v) for v in fn.__globals__.values()
                if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch(fn):
        needed = languages(fn)
        if patched[0] is not None and needed <= patched[0]:
            return interpreter._LangPatchScope()  # nothing patched, nothing to undo
        scope = stock_patch(fn)
        if patched[0] is not None:
            patched[0] |= needed
        return scope

    def launch_patching_once(self, *args, **kwargs):
        outer, patched[0] = patched[0], set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched[0] = outer

    interpreter._patch_lang = patch
    interpreter.GridExecutor.__call__ = launch_patching_once

"""How torchmx registers its operators: `custom_op`, a lean form of torch.library.custom_op.

torch.library.custom_op wraps every call in two Python layers (an autograd kernel that checks
whether any input requires grad, then a backend wrapper that runs the function under
torch._dynamo.disable and checks the outputs for aliasing), which cost more host time than a
quantize kernel's launch. The operators here are defined the same way (schema inferred from
the function's annotations, `register_fake`, `register_autograd`, passing
torch.library.opcheck), but the function itself is the dispatcher's kernel for every backend
(the CompositeExplicitAutograd key): a call is one dispatcher lookup and the function.

What that gives up: an operator without `register_autograd` gets PyTorch's autograd fallback
(a warning, not an error, if a gradient is later asked through it); torchmx's own autograd
lives in autograd.Functions above these operators, so none is asked.

Calling the Python object (`torchmx.ops.quantize_mx(...)`, not `torch.ops.torchmx...`) skips
even the dispatcher where nothing could tell the difference: on the short path of _eager.py,
under no TorchFunctionMode, with every argument of exactly the type its annotation names (a
plain tensor, a str, an int that is not a bool, ...). Any other call goes to the operator, so
PyTorch's schema check, subclasses' handlers and modes see it as before. Under torch.profiler
a direct call is recorded by the operator's name ("torchmx::quantize_mx"), so profiles still
attribute the time to it, without the dispatcher's share that the unprofiled call skips.
"""

import inspect
import typing
from typing import Callable, Optional

import torch

from ._eager import untraced
from ._memo import memo

__all__ = ["custom_op"]

_function_mode_on = torch._C._is_torch_function_mode_enabled
_profiling = torch.autograd._profiler_enabled
_record_function = torch.autograd.profiler.record_function
_is_compiling = torch.compiler.is_compiling
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

_LIBRARY = torch.library.Library("torchmx", "FRAGMENT")  # noqa: TOR901 - kept for the process


class CustomOp:
    """A torchmx operator: call it like the function (it dispatches), or through
    `torch.ops.torchmx.<name>`; `register_fake` / `register_autograd` as in torch.library."""

    def __init__(self, qualname: str, fn: Callable):
        namespace, name = qualname.split("::")
        if namespace != "torchmx":
            raise ValueError(f"custom_op: {qualname!r} is not in the torchmx namespace")
        self.name, self.qualname, self.fn = name, qualname, fn
        _LIBRARY.define(name + torch.library.infer_schema(fn, mutates_args=()))
        _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        self.default = getattr(torch.ops.torchmx, name).default
        self.__doc__ = fn.__doc__
        self._signature = inspect.signature(fn)
        self._hints = typing.get_type_hints(fn)
        # Kinds of calls (the arguments' types, the keywords' names) -> the positions and
        # names of their tensors, or False where the call must go to the operator.
        self._kinds = {}

    def __call__(self, *args, **kwargs):
        if _is_compiling():  # (first: torch.compile traces nothing but the operator call)
            return self.default(*args, **kwargs)
        if kwargs:
            kind = (tuple(map(type, args)), tuple(kwargs), tuple(map(type, kwargs.values())))
        else:
            kind = tuple(map(type, args))
        tensors = self._kinds.get(kind)
        if tensors is None:
            tensors = memo(self._kinds, kind, lambda: self._direct_kind(args, kwargs))
        if tensors is not False and untraced() and not _function_mode_on():
            if not torch.is_grad_enabled() or not _grad_asked(tensors, args, kwargs):
                if _profiling():  # a profile names the call as it names the operator's
                    with _record_function(self.qualname):
                        return self.fn(*args, **kwargs)
                return self.fn(*args, **kwargs)
        return self.default(*args, **kwargs)

    def _direct_kind(self, args, kwargs):
        """(positions, names) of the tensors of a call of this kind, if every argument has
        exactly a type its annotation names (what the schema accepts, minus its conversions:
        a bool or a float for an int goes to the operator); else False."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return False
        positions, names = [], []
        for name, value in bound.arguments.items():
            allowed = _plain_types(self._hints[name])
            if allowed is None or type(value) not in allowed:
                return False
            if isinstance(value, torch.Tensor):
                if name in kwargs:
                    names.append(name)
                else:
                    positions.append(list(bound.arguments).index(name))
        return tuple(positions), tuple(names)

    def eager(self) -> Callable:
        """The function itself where a call may take the short path (torchmx/_eager.py), else
        the operator (traced, under a dispatch mode or a torch.func transform)."""
        return self.fn if untraced() else self.default

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(self.qualname, fake, lib=_LIBRARY)
        return fake

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        torch.library.register_autograd(self.qualname, backward, setup_context=setup_context,
                                        lib=_LIBRARY)


def _grad_asked(tensors, args, kwargs) -> bool:
    positions, names = tensors
    for i in positions:
        if args[i].requires_grad:
            return True
    for name in names:
        if kwargs[name].requires_grad:
            return True
    return False


def _plain_types(hint) -> Optional[tuple]:
    """The Python types a call may pass for an argument annotated `hint` and go straight to the
    function; None for a kind of argument that always goes to the operator (lists, ...)."""
    if typing.get_origin(hint) is typing.Union:
        parts = [_plain_types(h) for h in typing.get_args(hint)]
        return None if None in parts else sum(parts, ())
    if hint is type(None):
        return (type(None),)
    if hint is torch.Tensor:
        return _PLAIN_TENSORS
    if hint in (str, int, float, bool, torch.dtype):
        return (hint,)
    return None


def custom_op(qualname: str) -> Callable[[Callable], CustomOp]:
    """Decorator: define `qualname` ("torchmx::name") with the decorated function's schema and
    the function as its implementation on every device (it dispatches on devices itself)."""
    return lambda fn: CustomOp(qualname, fn)

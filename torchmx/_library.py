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
"""

from typing import Callable

import torch

from ._eager import short_path

__all__ = ["custom_op"]

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

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)

    def eager(self) -> Callable:
        """The function itself where a call may take the short path (torchmx/_eager.py), else
        the operator (traced, under a dispatch mode or a torch.func transform)."""
        return self.fn if short_path() else self.default

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(self.qualname, fake, lib=_LIBRARY)
        return fake

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        torch.library.register_autograd(self.qualname, backward, setup_context=setup_context,
                                        lib=_LIBRARY)


def custom_op(qualname: str) -> Callable[[Callable], CustomOp]:
    """Decorator: define `qualname` ("torchmx::name") with the decorated function's schema and
    the function as its implementation on every device (it dispatches on devices itself)."""
    return lambda fn: CustomOp(qualname, fn)

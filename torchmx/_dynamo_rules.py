"""Functions that torch.compile must write into its graph whole (Dynamo's `allow_in_graph`),
registered when Dynamo is imported instead of at `import torchmx`.

Importing torch._dynamo takes seconds (half of `import torchmx` otherwise) and a process that
never compiles, exports or traces never imports it. Every way of tracing a torchmx function
(torch.compile, torch.export, torch._dynamo itself) imports torch._dynamo before tracing, so
registering right after that import is registering in time: `allow_in_graph` below registers at
once if Dynamo is loaded, else when its import finishes (a finder on sys.meta_path that wraps
the loader of torch._dynamo once, then leaves)."""

import importlib.abc
import sys
from typing import Callable, List

__all__ = ["allow_in_graph"]

_DYNAMO = "torch._dynamo"
_PENDING: List[Callable] = []


def _register_pending() -> None:
    from torch._dynamo import allow_in_graph as register

    while _PENDING:
        register(_PENDING.pop(0))


class _RegisterAfterExec(importlib.abc.Loader):
    """torch._dynamo's own loader, then the pending registrations."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register_pending()


class _DynamoImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _DYNAMO:
            return None
        sys.meta_path.remove(self)  # once: the other finders locate the real module
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _RegisterAfterExec(spec.loader)
        return spec


def allow_in_graph(fn: Callable) -> Callable:
    """`torch._dynamo.allow_in_graph(fn)`, now or as soon as Dynamo is imported."""
    _PENDING.append(fn)
    if _DYNAMO in sys.modules:
        _register_pending()
    elif not any(isinstance(f, _DynamoImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DynamoImportFinder())
    return fn

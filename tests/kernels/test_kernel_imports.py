"""The kernels' imports, read from their source with `ast`: no kernel module imports another
module's private (`_`-prefixed) names, the kernel modules import each other without a cycle
(function-level imports count), and nothing in torchmx/kernels imports from the floors above
it (ops, mx_tensor, nn, ...)."""

import ast
import pathlib

import pytest
from repo import ROOT

KERNELS = ROOT / "torchmx" / "kernels"
# What kernel modules may import from torchmx outside kernels/: the floors below them.
BELOW = ("torchmx.dtypes", "torchmx.numerics", "torchmx.cpu_kernels", "torchmx._memo",
         "torchmx._allocation")
# The one call up: the linear dispatch's dequantize + cuBLAS path dequantizes the weight through
# the dequantize op itself (a function-level import, so that torch.compile sees the op).
UP_CALLS = {("torchmx.kernels.linear.dispatch", "torchmx.ops")}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(KERNELS.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    """Whether the dotted name is a module or package of torchmx."""
    path = KERNELS.parent.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: pathlib.Path):
    """(importing module, imported module, imported name or None, line) of every import in
    the file, relative imports resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield module, alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if _is_module(full):  # `from package import module`
                    yield module, full, None, node.lineno
                else:
                    yield module, source, alias.name, node.lineno


def kernel_imports():
    return [edge for path in sorted(KERNELS.rglob("*.py")) for edge in imports(path)]


def private_imports(edges):
    return [f"{m} imports {name} from {source} (line {line})"
            for m, source, name, line in edges
            if name is not None and name.startswith("_") and source != m
            and source.startswith("torchmx.")]


def cycles(edges):
    """The import cycles among the given modules, each as a list of module names."""
    graph = {}
    for m, source, _, _ in edges:
        if source.startswith("torchmx.kernels") and source != m:
            graph.setdefault(m, set()).add(source)
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # importing a.b.c runs a/__init__ and a/b/__init__ too: packages are not edges
            # back, so only module-to-module edges count
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_kernel_module_imports_a_private_name_of_another():
    assert private_imports(kernel_imports()) == []


def test_kernel_modules_import_each_other_without_a_cycle():
    assert cycles(kernel_imports()) == []


def test_kernels_import_only_from_the_floors_below():
    above = [f"{m} imports {source} (line {line})" for m, source, _, line in kernel_imports()
             if source.startswith("torchmx") and not source.startswith("torchmx.kernels")
             and not source.startswith(BELOW) and (m, source) not in UP_CALLS]
    assert above == []


@pytest.mark.parametrize("source, expected", [
    ("from ._common import interpreting\nfrom .mma_linear import _DECODE\n",
     ["torchmx.kernels.linear.x imports _DECODE from torchmx.kernels.linear.mma_linear (line 2)"]),
    ("from ..quantize.triton_backend import _kernels as k\n",
     ["torchmx.kernels.linear.x imports _kernels from torchmx.kernels.quantize.triton_backend "
      "(line 1)"]),
    ("from . import _gl_stream\nfrom .._common import aligned\n", []),  # modules, public names
])
def test_the_private_name_check_catches_what_it_should(tmp_path, source, expected, monkeypatch):
    path = KERNELS / "linear" / "x.py"
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: source)
    assert private_imports(list(imports(path))) == expected


def test_the_cycle_check_finds_a_cycle():
    edges = [("torchmx.kernels.a", "torchmx.kernels.b", None, 1),
             ("torchmx.kernels.b", "torchmx.kernels.c", "f", 1),
             ("torchmx.kernels.c", "torchmx.kernels.a", None, 1),
             ("torchmx.kernels.c", "torchmx.kernels.d", None, 1)]
    assert cycles(edges) == [["torchmx.kernels.a", "torchmx.kernels.b", "torchmx.kernels.c",
                              "torchmx.kernels.a"]]
    assert cycles(edges[:2] + edges[3:]) == []

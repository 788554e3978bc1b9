"""Every ```python block of README.md and docs/ runs, page by page, in order, in one namespace
per page (so a page's later snippets use what its earlier ones built), in a scratch folder.

A snippet that cannot run everywhere says so in its first line, visibly:
    # needs: a CUDA GPU                 run where torch.cuda.is_available(), else skipped
    # needs: torchao (pip install 'torchmx[torchao]')    run where torchao is installed
    # needs: network                    never run here (tests have no network)
Such a snippet is still compiled. No other reason skips a snippet."""

import importlib.util
import re
import textwrap
import warnings

import pytest
import torch

from docs_markdown import PAGES, ROOT, blocks

_NEEDS = re.compile(r"^# needs: (.*)$")
REQUIREMENTS = {
    "a CUDA GPU": lambda: torch.cuda.is_available(),
    "torchao (pip install 'torchmx[torchao]')": lambda: importlib.util.find_spec("torchao") is not None,
    "network": lambda: False,
}


def snippets(page):
    """(line, code, requirement or None) of the page's python blocks."""
    found = []
    for info, line, code in blocks(page.read_text()):
        if info != "python":
            continue
        code = textwrap.dedent(code)
        match = _NEEDS.match(code.splitlines()[0]) if code.strip() else None
        found.append((line, code, match.group(1) if match else None))
    return found


PAGES_WITH_SNIPPETS = [p for p in PAGES if snippets(p)]
MARKED = [(page, line, needs) for page in PAGES for line, _, needs in snippets(page) if needs]


def run_page(page, until=None):
    """Run the page's snippets in order (up to line `until`), skipping those whose requirement
    does not hold here; returns the skipped ones."""
    namespace = {"__name__": "__docs__"}
    skipped = []
    for line, code, needs in snippets(page):
        if until is not None and line > until:
            break
        where = f"{page.relative_to(ROOT)}:{line}"
        compiled = compile(code, where, "exec")  # every snippet is valid Python
        if needs is not None:
            assert needs in REQUIREMENTS, \
                f"{where}: unknown '# needs: {needs}'; use one of {list(REQUIREMENTS)}"
            if not REQUIREMENTS[needs]():
                skipped.append(f"{where} needs {needs}")
                continue
        with warnings.catch_warnings():
            # the docs show no torchmx warning (raised in torchmx or, via stacklevel, in a snippet)
            warnings.filterwarnings("error", module=r"(torchmx|__docs__)($|\.)")
            exec(compiled, namespace)
    return skipped


@pytest.mark.parametrize("page", PAGES_WITH_SNIPPETS,
                         ids=[str(p.relative_to(ROOT)) for p in PAGES_WITH_SNIPPETS])
def test_page_snippets_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_page(page)


@pytest.mark.parametrize("page, line, needs", [
    pytest.param(p, line, needs, marks=[pytest.mark.gpu] if needs == "a CUDA GPU" else [],
                 id=f"{p.relative_to(ROOT)}:{line}") for p, line, needs in MARKED])
def test_marked_snippet(page, line, needs, tmp_path, monkeypatch):
    """Each marked snippet on its own: skipped, with its reason, where its requirement is
    missing; elsewhere run after the page's snippets before it."""
    assert needs in REQUIREMENTS, f"unknown '# needs: {needs}'; use one of {list(REQUIREMENTS)}"
    if not REQUIREMENTS[needs]():
        pytest.skip(f"{page.relative_to(ROOT)}:{line} needs {needs}")
    monkeypatch.chdir(tmp_path)
    assert run_page(page, until=line) == []


def test_the_pages_have_snippets():
    names = {str(p.relative_to(ROOT)) for p in PAGES_WITH_SNIPPETS}
    assert {"README.md", "docs/api.md", "docs/guides/model_api.md"} <= names
    assert {needs for _, _, needs in MARKED} <= set(REQUIREMENTS)

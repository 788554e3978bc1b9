"""Every relative link in README.md and docs/ points to a file that exists and, with a
#fragment, to a heading of that page (GitHub's anchors: lowercase, spaces -> '-', punctuation
dropped)."""

import pytest

from docs_markdown import PAGES, ROOT, anchors, links, slug

EXTERNAL = ("http://", "https://", "mailto:")


def broken_links(page, root=ROOT):
    text = page.read_text()
    broken = []
    for line, target in links(text):
        if target.startswith(EXTERNAL):
            continue
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{line}: {target}"
        if not destination.exists():
            broken.append(f"{where} (no file {path})")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination.read_text()):
            broken.append(f"{where} (no heading with anchor #{fragment})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_and_anchors_resolve(page):
    assert broken_links(page) == []


def test_slugs_are_githubs():
    assert slug("Prepacked MXFP4 weights on Hopper: the fragment layout") == \
        "prepacked-mxfp4-weights-on-hopper-the-fragment-layout"
    assert slug("Configs: `torchmx.config`") == "configs-torchmxconfig"
    assert slug("MX x MX with many rows, a GEMM (Gluon)") == "mx-x-mx-with-many-rows-a-gemm-gluon"
    assert slug("Layers: `torchmx.nn` ([guide](guides/layers.md))") == "layers-torchmxnn-guide"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1", "a-2"}


def test_a_broken_link_is_reported(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Real heading\n")
    page.write_text("[ok](other.md#real-heading) [bad](other.md#missing) [gone](nowhere.md)\n"
                    "`[code](not-a-link.md)` [self](#title)\n# Title\n")
    assert broken_links(page, tmp_path) == [
        "page.md:1: other.md#missing (no heading with anchor #missing)",
        "page.md:1: nowhere.md (no file nowhere.md)"]

"""Reading the project's Markdown: the pages (README.md and docs/), their code blocks, links
and GitHub-style heading anchors. Shared by the docs tests."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")


def blocks(text: str):
    """(info string, first line number, code) of every fenced code block."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info, start, body = match.group(2), match.group(3).strip(), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        found.append((info, start + 1, "\n".join(body)))
        i += 1
    return found


def prose(text: str, keep_code_spans: bool = False) -> str:
    """The text outside fenced code blocks (same line count), inline code spans dropped unless
    `keep_code_spans` (headings such as `## `torchmx.dtypes`` need them)."""
    out, fence = [], None
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(2)
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line if keep_code_spans else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def links(text: str):
    """(line number, target) of every link and image in the prose."""
    found = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        found += [(number, m.group(1)) for m in _LINK.finditer(line)]
        found += [(number, m.group(1)) for m in _IMAGE.finditer(line)]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lowercase, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set:
    """Every heading anchor of a page (repeats get GitHub's -1, -2, ... suffixes)."""
    seen, out = {}, set()
    for line in prose(text, keep_code_spans=True).splitlines():
        match = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out

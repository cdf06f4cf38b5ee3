"""MkDocs hooks (mkdocs.yml `hooks:`): the docs are written for GitHub's Markdown.

The pages are read on GitHub as well as on the site, and they are written as
GitHub (CommonMark) reads them: a list may start right after a line of text,
and a list item's later paragraphs, tables and code are indented by two
spaces. Python-Markdown, which MkDocs uses, needs a blank line before such a
list and four spaces of indent. `mdx_truly_sane_lists` (nested_indent: 2) takes
care of the indent; this hook adds the blank line, so the sources stay as
GitHub shows them.
"""

from __future__ import annotations

import re
from typing import Any

_LIST_ITEM = re.compile(r"^ *(?:[-*+]|\d{1,9}[.)]) +\S")
_FENCE = re.compile(r"^ *(```|~~~)")


def separate_lists(markdown: str) -> str:
    """A blank line before every list item that follows a line of text, outside
    fenced code: where CommonMark starts a list (or a new item), so does
    Python-Markdown then."""
    out: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        opening = _FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1) == fence:
                fence = None
        elif opening:
            fence = opening.group(1)
        elif _LIST_ITEM.match(line) and out and out[-1].strip():
            out.append("")
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return separate_lists(markdown)

"""The README and the docs site: the README stays short and points at every page;
mkdocs.yml's nav holds every page; lists render as GitHub renders them.

`make test` builds the site with `mkdocs build --strict` (broken links and
anchors, pages missing from nav); these tests hold what that build cannot see.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))


def _nav_pages(entries: list) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_the_readme_is_short_and_keeps_the_two_set_up_commands() -> None:
    assert len(README.splitlines()) <= 400
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```sh\n(make run .*?)```", quick_start, re.DOTALL)
    assert [line.split()[:2] for line in commands.splitlines()] == [
        ["make", "run"],
        ["make", "test"],
    ]


def test_the_readme_links_every_page() -> None:
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", README))
    assert set(PAGES) - {"index.md"} <= linked
    assert linked <= set(PAGES)


def test_the_nav_holds_every_page_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    assert sorted(nav) == PAGES


def test_a_list_right_after_text_starts_a_list_as_on_github() -> None:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    source = "\n".join(
        [
            "The rules:",
            "- one",
            "  continued",
            "  - nested",
            "2. ordered",
            "```sh",
            "text",
            "- not a list: code",
            "```",
            "",
            "- after a blank line",
        ]
    )
    assert hooks.separate_lists(source).split("\n") == [
        "The rules:",
        "",
        "- one",
        "  continued",
        "",
        "  - nested",
        "",
        "2. ordered",
        "```sh",
        "text",
        "- not a list: code",
        "```",
        "",
        "- after a blank line",
    ]

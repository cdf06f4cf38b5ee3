"""What every string tether stores must be: valid Unicode, no NUL, in a shallow document.

A lone UTF-16 surrogate (``"\\ud800"``, which JSON can spell) is a Python
``str`` that cannot be encoded as UTF-8: a store that keeps it hands back a
record no response can render, and PostgreSQL refuses it (and NUL) outright
while SQLite and the file store accept both. So the API refuses them in what
clients send (``tether.api.forms``), on every backend alike, and the stores'
read paths repair what an older version let in (``repair_surrogates``).

Depth is bounded for the same reason: a document nested hundreds deep passes
the JSON parser but overflows the recursion of whatever serializes it next.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
"""How deep a request body may nest (objects and arrays, the body itself is 1).
Tether's own shapes need about 8; free-form context gets the rest."""

_SURROGATE = re.compile("[\ud800-\udfff]")
"""After JSON decoding a valid pair is one code point, so any surrogate left is lone."""
_REPLACEMENT = "\ufffd"
_ESCAPED = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPED_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Unsafe:
    """Where a document breaks the rules, and which rule (never the value itself)."""

    path: tuple[str | int, ...]
    reason: str


def _problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    if _SURROGATE.search(text) is not None:
        return "is not valid Unicode (a lone UTF-16 surrogate)"
    return None


def find_unsafe(document: Any, max_depth: int = MAX_DEPTH) -> Unsafe | None:
    """The first string (value or key) with NUL or a lone surrogate, or the
    first container nested deeper than ``max_depth``; None when all is well.

    Iterative, so a hostile depth cannot overflow this check itself.
    """
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(document, (), 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            reason = _problem(value)
            if reason is not None:
                return Unsafe(path, reason)
        elif isinstance(value, dict | list):
            if depth + 1 > max_depth:
                return Unsafe(path, f"nests deeper than {max_depth} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in reversed(list(items)):
                if isinstance(key, str):
                    reason = _problem(key)
                    if reason is not None:
                        return Unsafe(path, f"has a key that {reason}")
                stack.append((item, (*path, key), depth + 1))
    return None


def may_hold_surrogates(raw: str | bytes) -> bool:
    """Whether ASCII JSON text escapes a surrogate at all (a valid pair too):
    a cheap test that spares ``repair_surrogates`` the walk on almost every read."""
    if isinstance(raw, bytes):
        return _ESCAPED_BYTES.search(raw) is not None
    return _ESCAPED.search(raw) is not None


def repair_surrogates(document: Any) -> tuple[Any, int]:
    """``document`` with every lone surrogate replaced by U+FFFD, and how many
    strings changed. The document is rebuilt only where it changes."""
    repaired = 0

    def fix(value: Any) -> Any:
        nonlocal repaired
        if isinstance(value, str):
            if _SURROGATE.search(value) is None:
                return value
            repaired += 1
            return _SURROGATE.sub(_REPLACEMENT, value)
        if isinstance(value, list):
            return [fix(item) for item in value]
        if isinstance(value, dict):
            return {fix(key): fix(item) for key, item in value.items()}
        return value

    return fix(document), repaired


def shown_path(path: tuple[str | int, ...]) -> str:
    """A field path for an error message: dotted, each part cut short and made
    printable, so a hostile key is never echoed as it came."""
    parts = []
    for part in path:
        text = str(part)
        text = text.encode("ascii", "backslashreplace").decode("ascii")
        parts.append(text if len(text) <= 40 else text[:39] + "\u2026")
    return ".".join(parts)

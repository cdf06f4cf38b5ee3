"""Where a file store's rows live: ids as safe path components under the store's directory.

Ids never become paths unescaped. Tenant, user and session ids are turned into
single path components by :func:`encode_component`, an injective encoding
whose output cannot be ``.``, ``..``, empty, or contain a separator, and that
stays distinct on case-insensitive file systems. :func:`child_path` then
checks that the result lies under the store's base directory. A row's files
(:func:`row_files`) are its document and its lock file beside it
(``_files`` reads, writes and locks them).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from tether.domain.store_errors import StoreError

# Kept verbatim: unreserved in URLs and in every file system we care about. Upper
# case letters are escaped too, so "Ab" and "ab" stay apart on case-insensitive
# file systems (macOS, Windows shares); escapes always use upper-case hex, so
# lower-casing an encoded name is still injective.
_VERBATIM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_MAX_COMPONENT = 150
# Markers start with "%" followed by a non-hex letter, which no escape produces,
# so they can never equal the encoding of some other id.
_EMPTY_MARKER = "%none"
_HASHED_MARKER = "%sha256-"
_UPPER_HEX = frozenset("0123456789ABCDEF")


def encode_component(value: str) -> str:
    """``value`` as one safe, collision-free path component.

    Characters outside ``[a-z0-9_-]`` become ``%XX`` escapes of their UTF-8 bytes
    (lone surrogates included), so distinct ids always give distinct names. A name
    that would exceed 150 bytes is replaced by ``%sha256-<hex digest of the id>``,
    which keeps it well under every file system's 255-byte limit even with a
    suffix and a temp-file decoration. The empty id becomes ``%none``.
    """
    if value == "":
        return _EMPTY_MARKER
    encoded = "".join(
        char if char in _VERBATIM else "".join(f"%{byte:02X}" for byte in _utf8(char))
        for char in value
    )
    if len(encoded) > _MAX_COMPONENT:
        return _HASHED_MARKER + hashlib.sha256(_utf8(value)).hexdigest()
    return encoded


def decode_component(name: str) -> str | None:
    """The id ``encode_component`` turned into ``name``; None for a hashed name
    (the id is not in it) or a name it cannot have produced."""
    if name == _EMPTY_MARKER:
        return ""
    if name.startswith(_HASHED_MARKER):
        return None
    raw = bytearray()
    position = 0
    while position < len(name):
        char = name[position]
        if char in _VERBATIM:
            raw += char.encode("ascii")
            position += 1
            continue
        escape = name[position + 1 : position + 3]
        if char != "%" or len(escape) != 2 or not set(escape) <= _UPPER_HEX:
            return None
        raw.append(int(escape, 16))
        position += 3
    try:
        value = bytes(raw).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return value if value and encode_component(value) == name else None


def store_root(base_path: str | os.PathLike[str]) -> Path:
    """The absolute, normalized base directory of a store (not created yet)."""
    return Path(os.path.abspath(os.fspath(base_path)))


def child_path(base: Path, *names: str) -> Path:
    """``base / names...``, refusing anything that would land outside ``base``.

    ``names`` are already-encoded components; the check is defence in depth in
    case a caller forgets to encode, and it is lexical (symlinks an operator
    placed inside the base directory are respected).
    """
    candidate = Path(os.path.normpath(base.joinpath(*names)))
    if any(name in ("", ".", "..") or os.sep in name for name in names) or (
        candidate == base or base not in candidate.parents
    ):
        raise StoreError(f"refusing a store path outside {base}: {names!r}")
    return candidate


@dataclass(frozen=True)
class RowFiles:
    """Where one row lives: its JSON document and its sibling lock file."""

    data: Path
    lock: Path
    top: Path
    """The directory of the row's kind (its first id, as ``stream-recording``):
    the directories below it are named after ids, and go once empty."""


def row_files(base: Path, *ids: str) -> RowFiles:
    """The files of the row addressed by ``ids``: all but the last are directories."""
    *directories, name = (encode_component(part) for part in ids)
    return RowFiles(
        data=child_path(base, *directories, f"{name}.json"),
        lock=child_path(base, *directories, f"{name}.lock"),
        top=child_path(base, directories[0]) if directories else base,
    )


def _utf8(text: str) -> bytes:
    # surrogatepass keeps the encoding total (and injective) for any Python str.
    return text.encode("utf-8", "surrogatepass")

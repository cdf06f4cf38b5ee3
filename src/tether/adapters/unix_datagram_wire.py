"""The wire format of ``unix_datagrams``: an announcement a line, lines in datagrams.

A line is ``{key}:{code}{payload}``: the conversation's key, the kind of change
(``StreamChange``, as one letter), and for a delta its encoding. A delta's
payload is JSON, which holds no raw newline, so newlines split a datagram into
its lines; one call's lines go in as few datagrams as fit ``DATAGRAM_BYTES``,
and a delta too large for any goes as a wake-up without its payload.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from tether.domain.chat_stream_recording_store import EVERYTHING, StreamChange

DATAGRAM_BYTES: Final = 60_000
"""The most one datagram carries: well under the default socket buffer (208 KiB),
so a datagram is never refused for its size on a stock kernel."""

_CODES: Final = {
    StreamChange.RECORDING: "r",
    StreamChange.SUPERVISION: "s",
    StreamChange.WATCH: "w",
    StreamChange.DELTA: "d",
}
_KINDS: Final = {code: frozenset({change}) for change, code in _CODES.items()}


def encode(key: str, change: StreamChange, payload: str = "") -> bytes:
    """One announcement: ``{key}:{code}{payload}``; a delta's payload is JSON,
    which holds no raw newline, so lines split a datagram."""
    return f"{key}:{_CODES[change]}{payload}".encode()


def wake_up(line: bytes) -> bytes:
    """The announcement without its payload: a delta becomes a recording change."""
    key, _, rest = line.partition(b":")
    return key + b":r" if rest[:1] == b"d" else line


def parse(line: str) -> tuple[str, frozenset[StreamChange], str]:
    """The key, the kinds of change, and a delta's encoding (else ``""``); an
    unknown kind (a replica of another release) announces both kinds of write."""
    key, _, rest = line.partition(":")
    kinds = _KINDS.get(rest[:1], EVERYTHING)
    if kinds == _KINDS["d"]:
        return key, kinds, rest[1:]
    return key, kinds, ""


def datagrams(lines: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The lines, grouped into as few datagrams as fit ``DATAGRAM_BYTES``."""
    group: list[bytes] = []
    size = 0
    for line in lines:
        if len(line) > DATAGRAM_BYTES:
            line = wake_up(line)
        if group and size + 1 + len(line) > DATAGRAM_BYTES:
            yield group
            group, size = [], 0
        group.append(line)
        size += len(line) + 1
    if group:
        yield group

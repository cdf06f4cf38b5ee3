"""Reading a server-sent event stream from an ``httpx2`` streaming response.

The one SSE reader of tether's clients: the Python client, ``tether chat``
and the crash test read every stream through it.

Parsing follows the WHATWG event-stream rules: lines end with CRLF, LF or CR
(only those: ``aiter_lines`` would also split on U+2028 and friends, which JSON
may carry unescaped); ``data`` lines of one event join with newlines; comment
lines (``: ping``) are skipped; an event without data is not dispatched; the last
``id`` persists until changed; a half-received event at the end is dropped.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import NamedTuple

import httpx2

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SSEEvent(NamedTuple):
    """One dispatched event. ``event`` is ``"message"`` when the server named none;
    ``id`` is the last event id seen on the stream (``""`` if none yet)."""

    event: str
    id: str
    data: str


class SSEParser:
    """Incremental parser: feed decoded text in any chunking, get events out."""

    def __init__(self) -> None:
        # Pieces of a line not yet terminated, joined once it is (no quadratic +=).
        self._partial: list[str] = []
        self._pending_cr = False
        self._first_line = True
        self._event = ""
        self._data: list[str] = []
        self._last_id = ""

    def feed(self, text: str) -> Iterator[SSEEvent]:
        """The events completed by ``text``."""
        for line in self._lines(text):
            event = self._feed_line(line)
            if event is not None:
                yield event

    def _lines(self, text: str) -> Iterator[str]:
        if not text:
            return
        if self._pending_cr and text.startswith("\n"):
            # The second half of a CRLF split across chunks: that line already ended.
            text = text[1:]
        self._pending_cr = False
        start = 0
        for match in _LINE_BREAK.finditer(text):
            self._partial.append(text[start : match.start()])
            yield "".join(self._partial)
            self._partial = []
            start = match.end()
            # A CR ending the chunk may be the first half of a CRLF.
            self._pending_cr = match.group() == "\r" and start == len(text)
        if start < len(text):
            self._partial.append(text[start:])

    def _feed_line(self, line: str) -> SSEEvent | None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._last_id = value
        # ``retry`` and unknown fields are ignored: the caller decides on reconnects.
        return None

    def _dispatch(self) -> SSEEvent | None:
        event, data = self._event, self._data
        self._event, self._data = "", []
        if not data:
            return None
        return SSEEvent(event or "message", self._last_id, "\n".join(data))


async def iter_sse_text(chunks: AsyncIterable[str]) -> AsyncIterator[SSEEvent]:
    """Events from decoded text chunks."""
    parser = SSEParser()
    async for chunk in chunks:
        for event in parser.feed(chunk):
            yield event


async def iter_sse(response: httpx2.Response) -> AsyncIterator[SSEEvent]:
    """Events from a streaming response (``client.stream(...)``), decoded as UTF-8
    as the event-stream format requires, whatever the content type says."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    parser = SSEParser()
    async for chunk in response.aiter_bytes():
        for event in parser.feed(decoder.decode(chunk)):
            yield event
    for event in parser.feed(decoder.decode(b"", final=True)):
        yield event

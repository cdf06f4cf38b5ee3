"""The producing replica's in-memory stream: one turn's events, fanned out to any readers.

The producer appends every cumulative message; readers iterate from any index
and wait for more. The producer never waits for readers, so a turn runs to its
end whether or not anyone is reading.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum

from tether.domain.chat_message import ChatMessage


@dataclass(frozen=True)
class StreamEvent:
    """One SSE ``new_message``: the whole answer so far, at its stream index."""

    index: int
    message: ChatMessage
    published_at: float = field(default_factory=time.monotonic, compare=False)
    """When the producer published it (monotonic clock): for lag measurements."""


class EndReason(StrEnum):
    """How a stream ended, as readers are told (the SSE ``stream_status``)."""

    DONE = "done"
    """A clean close: the whole answer was streamed."""
    ERRORED = "errored"
    CANCELLED = "cancelled"
    DEAD = "dead"
    """The producer stopped here: resume the turn elsewhere."""
    GONE = "gone"
    """Another producer owns the turn now: ask the status."""


@dataclass(frozen=True)
class StreamEnd:
    """How a stream ended, as readers are told. ``error_code`` and
    ``error_message`` are set for ``errored``. A plain string is taken for
    its ``EndReason`` (a reason read back from a store or a message)."""

    reason: EndReason
    error_code: str | None = None
    error_message: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", EndReason(self.reason))


class ChatStreamBuffer:
    """One turn's stream on its producing replica, starting at ``first_index``.

    Every message is cumulative (the whole answer so far), so the buffer keeps
    only the newest one and its index: memory grows with the answer, not with
    the number of messages it took. A reader that is up to date sees every
    message; one that joins late, or reads slowly, gets the newest state in
    one event and then what follows, which loses nothing, and a reader that
    never reads costs nothing. After the turn only its final message remains.

    A resumed turn starts past every index an earlier producer of the turn
    can have used, so event ids never repeat across a takeover.
    """

    def __init__(self, first_index: int = 0) -> None:
        self.first_index = first_index
        self._latest: StreamEvent | None = None
        self._published = 0
        self._end: StreamEnd | None = None
        self._changed = asyncio.Event()

    @property
    def next_index(self) -> int:
        return self.first_index + self._published

    @property
    def latest(self) -> StreamEvent | None:
        return self._latest

    @property
    def end(self) -> StreamEnd | None:
        return self._end

    def publish(self, message: ChatMessage) -> StreamEvent:
        if self._end is not None:
            raise RuntimeError("publish after the stream ended")
        event = StreamEvent(self.next_index, message)
        self._latest = event
        self._published += 1
        self._wake()
        return event

    def close(self, end: StreamEnd) -> None:
        """End the stream; the first close wins (a late fence cannot rewrite a verdict)."""
        if self._end is None:
            self._end = end
            self._wake()

    def _wake(self) -> None:
        # Swap in a fresh Event so every waiter wakes once per change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def follow(self, start_index: int = 0) -> AsyncIterator[StreamEvent | StreamEnd]:
        """The newest message at or after ``start_index`` each time one is
        published, then the end."""
        sent = start_index - 1
        while True:
            latest = self._latest
            if latest is not None and latest.index > sent:
                sent = latest.index
                yield latest
                continue
            if self._end is not None:
                yield self._end
                return
            await self._changed.wait()

"""A delta-mode stream's pace (``tether.api.coalescing``): staged, never slept past.

The source is a queue the test fills; the window is an hour, so whatever goes
out before the window's end went out because the rules say so, not because
time passed. ``asyncio.wait_for`` bounds are failure guards only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tether.api.coalescing import coalesce
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.store_errors import StoreUnavailableError
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

HOUR = 3600.0
GUARD = 5.0

Item = StreamEvent | StreamEnd | Exception


def _event(index: int) -> StreamEvent:
    return StreamEvent(index, ChatMessage(sender=ChatMessageSender.BOT, content="x" * index))


async def _source(queue: asyncio.Queue[Item]) -> AsyncIterator[StreamEvent | StreamEnd]:
    while True:
        item = await queue.get()
        if isinstance(item, Exception):
            raise item
        yield item
        if isinstance(item, StreamEnd):
            return


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.read = asyncio.Event()
        """Set each time the stream reads the clock: it decides, in that same
        step, whether to send at once or to hold."""

    def __call__(self) -> float:
        self.read.set()
        return self.now


async def _next(stream: AsyncIterator[StreamEvent | StreamEnd]) -> StreamEvent | StreamEnd:
    return await asyncio.wait_for(anext(stream), GUARD)


async def test_the_first_event_goes_at_once_and_the_rest_wait_for_the_window() -> None:
    queue: asyncio.Queue[Item] = asyncio.Queue()
    clock = _Clock()
    stream = coalesce(_source(queue), HOUR, clock=clock)
    queue.put_nowait(_event(1))
    assert await _next(stream) == _event(1)
    clock.read.clear()
    for index in (2, 3, 4):
        queue.put_nowait(_event(index))
    pulled = asyncio.ensure_future(anext(stream))
    # The stream has decided by the time the clock's read wakes this test: it
    # holds what came, for the window has not ended.
    await asyncio.wait_for(clock.read.wait(), GUARD)
    assert not pulled.done()
    # The end is never held: the newest message, then the end, at once.
    queue.put_nowait(StreamEnd(EndReason.DONE))
    assert await asyncio.wait_for(pulled, GUARD) == _event(4)
    assert await _next(stream) == StreamEnd(EndReason.DONE)
    with pytest.raises(StopAsyncIteration):
        await _next(stream)


async def test_an_event_after_a_quiet_window_goes_at_once() -> None:
    queue: asyncio.Queue[Item] = asyncio.Queue()
    clock = _Clock()
    stream = coalesce(_source(queue), HOUR, clock=clock)
    queue.put_nowait(_event(1))
    assert await _next(stream) == _event(1)
    clock.now += HOUR
    queue.put_nowait(_event(2))
    assert await _next(stream) == _event(2)
    queue.put_nowait(StreamEnd(EndReason.CANCELLED))
    assert await _next(stream) == StreamEnd(EndReason.CANCELLED)


async def test_a_failure_comes_after_the_events_before_it() -> None:
    queue: asyncio.Queue[Item] = asyncio.Queue()
    stream = coalesce(_source(queue), HOUR, clock=_Clock())
    queue.put_nowait(_event(1))
    assert await _next(stream) == _event(1)
    queue.put_nowait(_event(2))
    queue.put_nowait(StoreUnavailableError("gone"))
    assert await _next(stream) == _event(2)
    with pytest.raises(StoreUnavailableError):
        await _next(stream)


async def test_a_reader_that_leaves_stops_reading_the_source() -> None:
    queue: asyncio.Queue[Item] = asyncio.Queue()
    closed = asyncio.Event()

    async def source() -> AsyncIterator[StreamEvent | StreamEnd]:
        try:
            async for item in _source(queue):
                yield item
        finally:
            closed.set()

    stream = coalesce(source(), HOUR, clock=_Clock())
    queue.put_nowait(_event(1))
    assert await _next(stream) == _event(1)
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(closed.wait(), GUARD)

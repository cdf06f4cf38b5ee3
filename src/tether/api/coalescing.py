"""A lean stream's pace: at most one ``new_message`` per window, the newest.

In delta mode an event costs about 100 bytes of framing (its id, its type,
``{"index", "delta"}``) whatever text it carries, so an answer streamed a
token at a time (4 to 6 characters) would cost fifteen times its length. A
delta-mode reader is therefore sent what its turn published at most once per
``window``: an event that comes after a quiet window goes out at once (no wait
when nothing is streaming), one that comes sooner waits for the window's end,
and any newer one that comes meanwhile replaces it (messages are cumulative,
so the newest loses nothing; its delta holds the text of both). The end of
the stream is never held: the newest message, then the end, go out at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from tether.runtime.live_buffer import StreamEnd, StreamEvent

DELTA_WINDOW = 0.125
"""Seconds between two events of a delta-mode stream, at least: at 50 tokens
a second, about 40 characters an event (the framing is then under three times
the text), refreshed eight times a second, smooth enough for reading."""


async def coalesce(
    source: AsyncIterator[StreamEvent | StreamEnd],
    window: float = DELTA_WINDOW,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[StreamEvent | StreamEnd, None]:
    """``source``'s events at most once per ``window`` (the newest of those
    that came meanwhile), then its end; its failure is raised after the
    events that came before it."""
    pending: StreamEvent | None = None
    last: StreamEnd | BaseException | None = None
    exhausted = False
    arrived = asyncio.Event()
    finished = asyncio.Event()

    async def read() -> None:
        nonlocal pending, last, exhausted
        try:
            async for item in source:
                if isinstance(item, StreamEnd):
                    last = item
                    break
                pending = item
                arrived.set()
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
        except Exception as failure:  # handed to the reader, in order
            last = failure
        finally:
            exhausted = True
            finished.set()
            arrived.set()

    reader = asyncio.create_task(read())
    sent_at = -float("inf")
    try:
        while True:
            await arrived.wait()
            arrived.clear()
            wait = sent_at + window - clock()
            if wait > 0 and not exhausted:
                # Held to the window's end, unless the stream ends first.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), wait)
            if pending is not None:
                event, pending = pending, None
                sent_at = clock()
                yield event
            if exhausted and pending is None:
                if isinstance(last, StreamEnd):
                    yield last
                elif last is not None:
                    raise last
                return
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader

"""The crash test's SSE readers: each keeps every event of one connection with
the moment it arrived.

A reader either reads its own request in the background (the round's first
stream, a follower) or is fed by the client's recovery (``recovery.py``
drives ``tether.client``'s ``TetherClient.follow``), one reader per
connection it opens. Either survives the replica dying under it; its record
(events, how it ended) is what the invariants are checked against. The SSE
parsing and the event decoding are ``tether.client``'s (``sse``, ``events``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx2

from tether.client import routes
from tether.client.events import ErrorEvent, MessageEvent, StatusEvent, decode
from tether.client.held_message import StreamedMessage
from tether.client.sse import SSEEvent, iter_sse
from tether.crashtest.load_balancer import SERVER_HEADER


@dataclass(frozen=True)
class Received:
    """One SSE event as the client got it."""

    kind: str  # new_message | stream_status | error
    at: float  # time.monotonic() on arrival
    event_id: str = ""
    index: int | None = None
    message: dict[str, Any] | None = None
    reason: str | None = None  # of a stream_status
    error: dict[str, Any] | None = None  # of an error event


class TurnReader:
    """One SSE connection: started with ``open`` and read in the background, or
    fed by the client's recovery (``fed``)."""

    def __init__(self, label: str, replica: str) -> None:
        self.label = label
        self.replica = replica
        self.opened_at = time.monotonic()
        self.ended_at: float | None = None
        self.status_code: int | None = None
        self.message_id: str | None = None
        self.http_error: str | None = None
        self.error: str | None = None
        self.events: list[Received] = []
        self._streamed = StreamedMessage()
        """The message the stream's events make: a client's streams are
        delta-mode, so an event may hold only the text appended."""
        self._task: asyncio.Task[None] | None = None
        self._responded = asyncio.Event()
        self._ended = asyncio.Event()

    @classmethod
    def open(
        cls,
        http: httpx2.AsyncClient,
        method: str,
        url: str,
        *,
        label: str,
        replica: str,
        before: Callable[[], Awaitable[object]] | None = None,
        **kwargs: Any,
    ) -> TurnReader:
        """Send the request and read its stream in the background (after
        ``before``, if given, is done)."""
        reader = cls(label, replica)
        reader._task = asyncio.create_task(reader._open(before, http, method, url, kwargs))
        return reader

    @classmethod
    def fed(cls, label: str, replica: str) -> TurnReader:
        """A reader whose connection the client's recovery drives: it is told
        the response (``got_response``), each event (``_receive``) and the end
        (``finish``)."""
        return cls(label, replica)

    async def _open(
        self,
        before: Callable[[], Awaitable[object]] | None,
        http: httpx2.AsyncClient,
        method: str,
        url: str,
        kwargs: dict[str, Any],
    ) -> None:
        if before is not None:
            await before()
        self.opened_at = time.monotonic()
        await self._run(http, method, url, kwargs)

    async def _run(
        self, http: httpx2.AsyncClient, method: str, url: str, kwargs: dict[str, Any]
    ) -> None:
        http_error = error = None
        try:
            async with http.stream(method, url, **kwargs) as response:
                self.got_response(response.status_code, response.headers)
                if response.status_code >= 300:
                    await response.aread()
                    http_error = response.text
                    return
                async for event in iter_sse(response):
                    self._receive(event.event, event.id, event.data)
        except httpx2.HTTPError as failure:
            error = f"{type(failure).__name__}: {failure}".strip()
        finally:
            self.finish(http_error=http_error, error=error)

    def got_response(self, status_code: int, headers: Any) -> None:
        """The response's status and headers arrived."""
        self.status_code = status_code
        self.message_id = headers.get(routes.MESSAGE_ID_HEADER)
        # Behind the load balancer, the replica that answered is its to say.
        self.replica = headers.get(SERVER_HEADER) or self.replica
        self._responded.set()

    def finish(self, *, http_error: str | None = None, error: str | None = None) -> None:
        """The connection is over: refused with ``http_error`` (the body), broken
        with ``error``, or ended."""
        if http_error is not None:
            self.http_error = http_error[:500]
        if error is not None:
            self.error = error
        self.ended_at = time.monotonic()
        self._responded.set()
        self._ended.set()

    def _receive(self, kind: str, event_id: str, data: str) -> None:
        now = time.monotonic()
        event = decode(SSEEvent(kind, event_id, data))
        if isinstance(event, MessageEvent):
            whole = self._streamed.apply(event.data)
            message = event.data
            if whole is not None and "delta" in event.data:
                message = whole.model_dump(mode="json", exclude_none=True)
            self.events.append(Received(kind, now, event_id, event.index, message=message))
        elif isinstance(event, StatusEvent):
            self.events.append(Received(kind, now, reason=event.reason))
        elif isinstance(event, ErrorEvent):
            detail = {"code": event.code, "message": event.message}
            self.events.append(Received(kind, now, error=detail))

    # ------------------------------------------------------------ what it saw

    @property
    def messages(self) -> list[Received]:
        return [event for event in self.events if event.kind == "new_message"]

    @property
    def done(self) -> bool:
        return self.ended_at is not None

    @property
    def verdict(self) -> str | None:
        """The ``stream_status`` reason, if the stream ended with one."""
        for event in self.events:
            if event.kind == "stream_status":
                return event.reason
        return None

    @property
    def stream_error(self) -> dict[str, Any] | None:
        for event in self.events:
            if event.kind == "error":
                return event.error
        return None

    @property
    def finished_turn(self) -> bool:
        """Ended telling the client the turn is complete: a clean close of a live
        stream, or ``stream_status: done``."""
        if not self.done or self.error or self.http_error or self.stream_error:
            return False
        if self.status_code is None or self.status_code >= 300:
            return False
        return self.verdict in (None, "done")

    @property
    def last_activity(self) -> float:
        return self.events[-1].at if self.events else self.opened_at

    def describe_end(self) -> str:
        if not self.done:
            return "open"
        if self.http_error is not None:
            return f"HTTP {self.status_code}"
        if self.error is not None:
            return "connection lost"
        if self.stream_error is not None:
            return f"error {self.stream_error.get('code')}"
        return self.verdict or "closed"

    # -------------------------------------------------------------- waiting

    async def responded(self, within: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._responded.wait()
        return self._responded.is_set()

    async def wait_for(self, predicate: Callable[[TurnReader], bool], within: float) -> bool:
        """Whether ``predicate`` held within ``within`` seconds (False as soon as
        the stream ends without it)."""
        deadline = time.monotonic() + within
        while not predicate(self):
            if self.done or time.monotonic() > deadline:
                return predicate(self)
            await asyncio.sleep(0.005)
        return True

    async def ended(self, within: float) -> bool:
        with contextlib.suppress(TimeoutError):
            if self._task is not None:
                # Once the request's task is over, connection closed and all.
                await asyncio.wait_for(asyncio.shield(self._task), within)
            else:
                async with asyncio.timeout(within):
                    await self._ended.wait()
        return self.done

    async def aclose(self) -> None:
        """Hang up (the client gives the connection up). A fed reader ends with
        the recovery that feeds it."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

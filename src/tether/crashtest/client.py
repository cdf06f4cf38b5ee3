"""The crash test's client: the HTTP calls a real client makes, and SSE readers that
keep every event with the moment it arrived.

A reader runs in the background and survives the replica dying under it; its
record (events, how it ended) is what the invariants are checked against.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from tether.cli._sse_client import iter_sse

TENANT = "crash-test"
REQUESTER = "crash-test-client"
# The server pings idle streams every 15 s, so a read this long with nothing at
# all means the connection is gone (or its replica is stopped).
TIMEOUT = httpx2.Timeout(5.0, read=30.0)


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


@dataclass(frozen=True)
class StreamStatus:
    """``GET /chat/stream/status``: who occupies the conversation, and its verdict."""

    message_id: str
    status: str
    epoch: int
    heartbeat_at: str | None


class TurnReader:
    """One SSE connection: started with ``open``, read in the background."""

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
        self._task: asyncio.Task[None] | None = None
        self._responded = asyncio.Event()

    @classmethod
    def open(
        cls,
        http: httpx2.AsyncClient,
        method: str,
        url: str,
        *,
        label: str,
        replica: str,
        **kwargs: Any,
    ) -> TurnReader:
        reader = cls(label, replica)
        reader._task = asyncio.create_task(reader._run(http, method, url, kwargs))
        return reader

    async def _run(
        self, http: httpx2.AsyncClient, method: str, url: str, kwargs: dict[str, Any]
    ) -> None:
        try:
            async with http.stream(method, url, **kwargs) as response:
                self.status_code = response.status_code
                self.message_id = response.headers.get("x-tether-message-id")
                self._responded.set()
                if response.status_code >= 300:
                    await response.aread()
                    self.http_error = response.text[:500]
                    return
                async for event in iter_sse(response):
                    self._receive(event.event, event.id, event.data)
        except httpx2.HTTPError as error:
            self.error = f"{type(error).__name__}: {error}".strip()
        finally:
            self.ended_at = time.monotonic()
            self._responded.set()

    def _receive(self, kind: str, event_id: str, data: str) -> None:
        now = time.monotonic()
        payload = _json(data)
        if kind == "new_message" and isinstance(payload, dict):
            # The id is "<message_id>:<index>"; message ids may hold colons, indexes don't.
            index_text = event_id.rpartition(":")[2]
            index = int(index_text) if index_text.isdigit() else None
            self.events.append(Received(kind, now, event_id, index, message=payload))
        elif kind == "stream_status" and isinstance(payload, dict):
            self.events.append(Received(kind, now, reason=str(payload.get("reason"))))
        elif kind == "error":
            detail = payload if isinstance(payload, dict) else {"message": data}
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
        if self._task is None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), within)
        return self.done

    async def aclose(self) -> None:
        """Hang up (the client gives the connection up)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class TetherAPI:
    """The routes of design §3 the crash test uses, as one client identity."""

    def __init__(self, http: httpx2.AsyncClient, agent: str, *, conversations: bool = True) -> None:
        self.http = http
        self.agent = agent
        self.conversations = conversations
        """Whether the servers run with a conversation store (transcripts to read)."""

    @staticmethod
    def client() -> httpx2.AsyncClient:
        return httpx2.AsyncClient(timeout=TIMEOUT, headers={"requester-uuid": REQUESTER})

    def start_turn(self, base_url: str, replica: str, prompt: str, session_id: str) -> TurnReader:
        body = {
            "agent_identifier": self.agent,
            "stateful": True,
            "session_id": session_id,
            "conversation": [{"sender": "user", "content": prompt}],
        }
        return TurnReader.open(
            self.http,
            "POST",
            f"{base_url}/chat/stream",
            params={"tenant": TENANT},
            json=body,
            label="start",
            replica=replica,
        )

    def resume(self, base_url: str, replica: str, message_id: str, session_id: str) -> TurnReader:
        body = {
            "agent_identifier": self.agent,
            "stateful": True,
            "session_id": session_id,
            "conversation": [],
        }
        return TurnReader.open(
            self.http,
            "POST",
            f"{base_url}/chat/stream",
            params={"tenant": TENANT, "resume": "true", "message_id": message_id},
            json=body,
            label="resume",
            replica=replica,
        )

    def attach(
        self,
        base_url: str,
        replica: str,
        message_id: str,
        session_id: str,
        *,
        last_event_id: str | None = None,
        label: str = "attach",
    ) -> TurnReader:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        return TurnReader.open(
            self.http,
            "GET",
            f"{base_url}/chat/stream/{message_id}",
            params={"tenant": TENANT, "session_id": session_id},
            headers=headers,
            label=label,
            replica=replica,
        )

    async def status(self, base_url: str, session_id: str) -> StreamStatus | None:
        """The conversation's turn and verdict; None when the server knows none (404)."""
        response = await self.http.get(
            f"{base_url}/chat/stream/status",
            params={"tenant": TENANT, "session_id": session_id},
        )
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body = response.json()
        return StreamStatus(
            message_id=str(body["message_id"]),
            status=str(body["status"]),
            epoch=int(body["epoch"]),
            heartbeat_at=body.get("heartbeat_at"),
        )

    async def transcript(self, base_url: str, session_id: str) -> list[dict[str, Any]] | None:
        """The conversation's messages; None when it does not exist (404) or the
        servers keep no transcripts."""
        conversation = await self.conversation(base_url, session_id)
        return conversation[1] if conversation is not None else None

    async def conversation(
        self, base_url: str, session_id: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The conversation's summary (``last_turn_status`` and the rest) and its
        messages; None when it does not exist (404) or the servers keep no transcripts."""
        if not self.conversations:
            return None
        response = await self.http.get(
            f"{base_url}/conversations/{session_id}", params={"tenant": TENANT}
        )
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body = response.json()
        return dict(body["conversation"]), list(body["messages"])

    async def cancel(self, base_url: str, message_id: str, session_id: str) -> int:
        """``DELETE /chat/stream/{message_id}``: the HTTP status of the answer
        (204 cancelled, 410 already ended, 409 changed hands meanwhile)."""
        response = await self.http.delete(
            f"{base_url}/chat/stream/{message_id}",
            params={"tenant": TENANT, "session_id": session_id},
        )
        return response.status_code


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass
class ClientView:
    """What the client has shown its user so far, across all its readers."""

    last_event_id: str | None = None
    max_index: int = -1
    longest: int = 0
    consumed: list[tuple[TurnReader, int]] = field(default_factory=list)

    def take(self, reader: TurnReader, upto: int | None = None) -> None:
        """The client has used ``reader``'s first ``upto`` events (all by default)."""
        events = reader.events if upto is None else reader.events[:upto]
        for event in events:
            if event.kind != "new_message":
                continue
            self.last_event_id = event.event_id or self.last_event_id
            if event.index is not None:
                self.max_index = max(self.max_index, event.index)
            if event.message is not None:
                self.longest = max(self.longest, len(str(event.message.get("content", ""))))
        self.consumed.append((reader, len(events)))

"""A test client for turns: start, attach, read SSE events as the wire carries them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx2

from tether.cli._sse_client import SSEEvent, iter_sse


@dataclass
class StreamRead:
    """Everything one reader saw of a turn."""

    status_code: int
    message_id: str | None = None
    events: list[SSEEvent] = field(default_factory=list)

    @property
    def message_events(self) -> list[SSEEvent]:
        return [e for e in self.events if e.event == "new_message"]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(e.data) for e in self.message_events]

    @property
    def indexes(self) -> list[int]:
        return [int(e.id.rpartition(":")[2]) for e in self.events if e.event == "new_message"]

    @property
    def final_text(self) -> str:
        return self.messages[-1]["content"] if self.messages else ""

    def terminal(self, event: str) -> dict[str, Any] | None:
        for e in self.events:
            if e.event == event:
                return dict(json.loads(e.data))
        return None


def turn_body(content: str, agent: str = "writer", **extra: Any) -> dict[str, Any]:
    return {
        "agent_identifier": agent,
        "conversation": [{"sender": "user", "content": content}],
        **extra,
    }


@asynccontextmanager
async def open_stream(
    client: httpx2.AsyncClient, method: str, url: str, **kwargs: Any
) -> AsyncIterator[tuple[httpx2.Response, AsyncIterator[SSEEvent]]]:
    async with client.stream(method, url, **kwargs) as response:
        yield response, iter_sse(response)


async def read_stream(
    client: httpx2.AsyncClient, method: str, url: str, *, limit: int | None = None, **kwargs: Any
) -> StreamRead:
    """Read a whole stream (or its first ``limit`` events, then disconnect)."""
    async with client.stream(method, url, **kwargs) as response:
        read = StreamRead(response.status_code, response.headers.get("x-tether-message-id"))
        if response.status_code >= 300:
            await response.aread()
            read.events.append(SSEEvent("http_error", "", response.text))
            return read
        async for event in iter_sse(response):
            read.events.append(event)
            if limit is not None and len(read.events) >= limit:
                break
        return read

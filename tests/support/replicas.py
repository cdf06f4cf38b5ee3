"""Two replicas on one store set, and the client moves a test makes between them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from tests.support.servers import ServerProcess
from tether.cli._sse_client import SSEEvent, iter_sse


@dataclass
class Replicas:
    one: ServerProcess
    two: ServerProcess
    tool_log: Path

    def tool_runs(self) -> int:
        return len(self.tool_log.read_text().splitlines()) if self.tool_log.exists() else 0

    def restart(self) -> None:
        for replica in (self.one, self.two):
            if replica.process is None or replica.process.poll() is not None:
                replica.start()


@contextlib.contextmanager
def two_replicas(
    project: Path,
    root: Path,
    store_url: str,
    *,
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> Iterator[Replicas]:
    """Two replicas of ``project`` on one store set, logging to ``root``; both are
    stopped on exit (the first too when the second fails to start). A value of
    ``env`` may name a replica's URL as ``{one}`` or ``{two}`` (a callback URL
    both replicas give, as behind a load balancer)."""
    one = ServerProcess(
        project, store_url=store_url, log_path=root / "one.log", extra_args=extra_args
    )
    two = ServerProcess(
        project, store_url=store_url, log_path=root / "two.log", extra_args=extra_args
    )
    one.env = two.env = {
        name: value.replace("{one}", one.url).replace("{two}", two.url)
        for name, value in (env or {}).items()
    }
    try:
        yield Replicas(one.start(), two.start(), root / "tools.log")
    finally:
        one.stop()
        two.stop()


@dataclass
class LiveRead:
    """A stream being read in the background; survives the replica dying under it."""

    events: list[SSEEvent] = field(default_factory=list)
    message_id: str | None = None
    status_code: int | None = None
    error: BaseException | None = None
    task: asyncio.Task[None] | None = None
    _started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(e.data) for e in self.events if e.event == "new_message"]

    def verdict(self) -> str | None:
        for event in self.events:
            if event.event == "stream_status":
                return str(json.loads(event.data)["reason"])
        return None

    async def until(self, predicate: Any, within: float = 20.0) -> None:
        deadline = time.monotonic() + within
        while not predicate(self):
            if self.task is not None and self.task.done():
                raise AssertionError(f"stream ended first: {self.error!r} {self.events[-1:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting; {len(self.events)} events")
            await asyncio.sleep(0.01)

    async def finished(self, within: float = 30.0) -> LiveRead:
        assert self.task is not None
        await asyncio.wait_for(asyncio.shield(self.task), within)
        return self


def read_in_background(
    client: httpx2.AsyncClient, method: str, url: str, **kwargs: Any
) -> LiveRead:
    read = LiveRead()

    async def run() -> None:
        try:
            async with client.stream(method, url, **kwargs) as response:
                read.status_code = response.status_code
                read.message_id = response.headers.get("x-tether-message-id")
                read._started.set()
                if response.status_code >= 300:
                    await response.aread()
                    read.events.append(SSEEvent("http_error", "", response.text))
                    return
                async for event in iter_sse(response):
                    read.events.append(event)
        except httpx2.HTTPError as error:
            read.error = error
        finally:
            read._started.set()

    read.task = asyncio.ensure_future(run())
    return read


async def started(read: LiveRead, within: float = 10.0) -> LiveRead:
    await asyncio.wait_for(read._started.wait(), within)
    return read


def has_completed_tool(read: LiveRead) -> bool:
    return any(
        part["type"] == "tool" and part["tool"]["status"] == "completed"
        for message in read.messages
        for part in message.get("content_parts") or []
    )

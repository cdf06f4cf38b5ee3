"""Live across replicas by push: a follower sees every index, a cancel stops the producer.

Two real ``tether serve`` processes (the crash test's launcher) share one store
set on PostgreSQL, on Redis, or on one host's SQLite file or file store (pushed
by Unix datagrams between the two processes): every shipped backend that
other processes share has a push channel. A turn streams
on replica A. Every fallback through which the other replica could learn of it,
or A of a cancel, is pushed out of reach: the heartbeat and the recording flush
come every 5 s (the dead threshold raised to match) and checkpoints every 30 s.

- A follower on replica B sees every index the direct reader on A saw, with the
  same text. The producer records every message before anyone is shown it, and
  the snapshot's announcement comes before the delta: a follower that took the
  snapshot would skip the index the delta brings (it missed one so, before it
  counted on flowing deltas for a second rather than a quarter).
- A ``DELETE`` sent to B: the replicas are fresh, so this turn starts A's
  heartbeat cycle. The direct reader on A must get its ``cancelled`` end well
  within it: the push channel tells the producer, or its next message's
  recording put is refused (every message is recorded before it is shown).

Waits are on the stream's own events, never on a sleep.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.project import make_project
from tests.support.services import postgres_database, redis_prefix
from tether.crashtest.client import TENANT, TetherAPI
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.reader import TurnReader

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]

HEARTBEAT = 5.0
"""Seconds between the producer's heartbeats, and between its recording flushes."""
PUSHED_WITHIN = 1.0
"""The end must reach the direct reader this soon after the DELETE is answered
(the target is 0.1 s; the margin is for a loaded machine, far below HEARTBEAT)."""

ENV = {
    "TETHER_HEARTBEAT_INTERVAL": str(HEARTBEAT),
    "TETHER_DEAD_AFTER": str(3 * HEARTBEAT),
    "TETHER_RECORDING_FLUSH_INTERVAL": str(HEARTBEAT),
    "TETHER_CHECKPOINT_INTERVAL": "30",
}


class _Reader(TurnReader):
    """A turn reader whose waiters wake on each event and at the end of the stream."""

    def __init__(self, label: str, replica: str) -> None:
        super().__init__(label, replica)
        self._arrived = asyncio.Event()

    def _wake(self) -> None:
        arrived, self._arrived = self._arrived, asyncio.Event()
        arrived.set()

    def _receive(self, kind: str, event_id: str, data: str) -> None:
        super()._receive(kind, event_id, data)
        self._wake()

    async def _run(
        self, http: httpx2.AsyncClient, method: str, url: str, kwargs: dict[str, Any]
    ) -> None:
        try:
            await super()._run(http, method, url, kwargs)
        finally:
            self._wake()

    async def until(self, predicate: Callable[[_Reader], bool], within: float) -> None:
        async with asyncio.timeout(within):
            while not predicate(self):
                if self.done:
                    raise AssertionError(f"the stream ended first: {self.describe_end()}")
                await self._arrived.wait()


def _start(http: httpx2.AsyncClient, producer: Replica, session: str) -> _Reader:
    """A stateful turn on ``producer``, read directly there."""
    reader = _Reader.open(
        http,
        "POST",
        f"{producer.url}/chat/stream",
        params={"tenant": TENANT},
        json={
            "agent_identifier": "plain",
            "stateful": True,
            "session_id": session,
            "conversation": [{"sender": "user", "content": "Tell me about rivers."}],
        },
        label="direct",
        replica=producer.name,
    )
    assert isinstance(reader, _Reader)
    return reader


@pytest.fixture(
    params=[
        "sqlite",
        "file",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The one store URL both replicas use: a fresh database, a key prefix, or
    a file or directory of the test's own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
    elif request.param == "file":
        yield f"file://{tmp_path / 'shared-stores'}"
    elif request.param == "postgres":
        with postgres_database() as url:
            yield url
    else:
        with redis_prefix() as url:
            yield url


async def test_a_cancel_on_another_replica_stops_the_producer_before_its_heartbeat(
    shared_store: str, tmp_path: Path
) -> None:
    # 20 deltas a second for 20 s: the answer is far from done when it is cancelled.
    project = make_project(
        tmp_path / "project", chunks_per_second=20, answer_chunks=400, tool_call_after_chunks=None
    )
    cluster = Cluster(project, shared_store, size=2, workdir=tmp_path, env=ENV)
    async with cluster, TetherAPI.client() as http:
        producer, other = cluster.replicas
        session = f"s-{uuid.uuid4().hex[:12]}"
        direct = _start(http, producer, session)
        try:
            await direct.until(lambda reader: len(reader.messages) >= 5, within=20)
            assert direct.message_id is not None
            response = await http.delete(
                f"{other.url}/chat/stream/{direct.message_id}",
                params={"tenant": TENANT, "session_id": session},
            )
            answered = time.monotonic()
            assert response.status_code == 204, response.text

            await direct.ended(within=3 * HEARTBEAT)
            assert direct.verdict == "cancelled", direct.describe_end()
            end = next(event.at for event in direct.events if event.kind == "stream_status")
            # No heartbeat of A's can have been refused yet: the push or a put did it.
            assert end - direct.opened_at < HEARTBEAT, end - direct.opened_at
            assert end - answered < PUSHED_WITHIN, (
                f"the producer stopped {end - answered:.3f} s after the DELETE was answered"
            )
            assert all(event.at <= end for event in direct.events)
        finally:
            await direct.aclose()


async def test_a_follower_on_another_replica_sees_every_index_the_producer_streams(
    shared_store: str, tmp_path: Path
) -> None:
    # 50 deltas a second for 2 s, every one recorded before it is shown.
    project = make_project(
        tmp_path / "project", chunks_per_second=50, answer_chunks=100, tool_call_after_chunks=None
    )
    cluster = Cluster(project, shared_store, size=2, workdir=tmp_path, env=ENV)
    async with cluster, TetherAPI.client() as http:
        producer, other = cluster.replicas
        session = f"s-{uuid.uuid4().hex[:12]}"
        direct = _start(http, producer, session)
        follower: TurnReader | None = None
        try:
            await direct.until(lambda reader: len(reader.messages) >= 3, within=20)
            follower = TurnReader.open(
                http,
                "GET",
                f"{other.url}/chat/stream/{direct.message_id}",
                params={"tenant": TENANT, "session_id": session},
                label="follower",
                replica=other.name,
            )
            await direct.ended(within=20)
            await follower.ended(within=10)
            # Both are told how the turn ended, the live reader as the follower.
            assert (direct.describe_end(), follower.describe_end()) == ("done", "done")
            seen = {e.index: e.message for e in direct.messages}
            followed = follower.messages
            assert followed, "the follower showed nothing"
            first = followed[0].index
            assert first is not None
            # It followed live, not only the answer's end.
            assert len(followed) > len(seen) // 2, (len(followed), len(seen))
            # The first event is the answer so far; every later index the
            # producer streamed reaches the follower, in order, with its text.
            assert [e.index for e in followed] == sorted({e.index for e in followed})
            missing = sorted(i for i in seen if i is not None and i > first)
            missing = [i for i in missing if i not in {e.index for e in followed}]
            assert missing == [], f"the follower missed indexes {missing}"
            for event in followed:
                if event.index in seen:
                    assert event.message == seen[event.index]
        finally:
            await direct.aclose()
            if follower is not None:
                await follower.aclose()

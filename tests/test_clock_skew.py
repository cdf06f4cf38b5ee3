"""Liveness immune to clock skew, with two real ``tether serve`` replicas.

One replica's local clock is 10 s ahead of the other's, then 10 s behind
(``TETHER_CLOCK_SKEW``). Both stamp and judge heartbeats by the store's clock
(PostgreSQL ``clock_timestamp()``, Redis ``TIME``), so:

- a turn produced on either replica and followed and status-checked on the
  other never reads dead and completes (uncorrected, the replica whose clock
  is ahead reads the other's live producer as dead at once);
- the stamps in the store are the store's time, not the skewed replica's;
- a killed producer reads dead within the usual bound on the other replica
  (uncorrected, the producer whose clock is ahead would look alive 10 s
  longer).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.client import turn_body
from tests.support.project import make_project
from tests.support.replicas import LiveRead, read_in_background, started
from tests.support.servers import ServerProcess
from tests.support.services import postgres_database, redis_prefix
from tether.stores import StoreBundle, compose

pytestmark = pytest.mark.processes

ALICE = {"requester-uuid": "alice"}
SKEW = 10.0
DEAD_AFTER = 3.0
HEARTBEAT = 1.0


@dataclass(frozen=True)
class Place:
    store_url: str
    stream_url: str | None = None

    def serve_args(self) -> list[str]:
        return ["--stream-store", self.stream_url] if self.stream_url else []

    @contextlib.asynccontextmanager
    async def supervision(self) -> AsyncIterator[Any]:
        """The supervision store the replicas write, opened from the test process."""
        bundle: StoreBundle = compose(self.store_url, stream=self.stream_url)
        store: Any = bundle.chat_stream_supervision_store
        await store.open()
        try:
            yield store
        finally:
            await store.aclose()


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "postgres":
        with postgres_database() as url:
            yield Place(url)
    else:
        # Redis serves the supervision and recording stores; files the rest.
        with redis_prefix() as url:
            yield Place(f"file://{tmp_path / 'stores'}", stream_url=url)


@dataclass
class Pair:
    skewed: ServerProcess
    plain: ServerProcess
    skew: float
    """Seconds the skewed replica's local clock is ahead of the plain one's."""


@pytest.fixture(params=[SKEW, -SKEW], ids=["ahead", "behind"])
async def pair(request: pytest.FixtureRequest, place: Place, tmp_path: Path) -> AsyncIterator[Pair]:
    # 60 chunks at 40/s: a 1.5 s answer, longer than a heartbeat interval.
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=60, tool_call_after_chunks=None
    )
    env = {"TETHER_DEAD_AFTER": str(DEAD_AFTER), "TETHER_HEARTBEAT_INTERVAL": str(HEARTBEAT)}
    skewed = ServerProcess(
        project,
        store_url=place.store_url,
        env={**env, "TETHER_CLOCK_SKEW": str(request.param)},
        log_path=tmp_path / "skewed.log",
        extra_args=place.serve_args(),
    )
    plain = ServerProcess(
        project,
        store_url=place.store_url,
        env=env,
        log_path=tmp_path / "plain.log",
        extra_args=place.serve_args(),
    )
    try:
        await asyncio.gather(asyncio.to_thread(skewed.start), asyncio.to_thread(plain.start))
        yield Pair(skewed, plain, request.param)
    finally:
        await asyncio.gather(asyncio.to_thread(skewed.stop), asyncio.to_thread(plain.stop))


def _session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


async def _status(client: httpx2.AsyncClient, url: str, session: str) -> tuple[str, int]:
    """The verdict on replica ``url``, and the epoch of the row it judged."""
    response = await client.get(f"{url}/chat/stream/status?tenant=t&session_id={session}")
    assert response.status_code == 200, response.text
    body = response.json()
    return str(body["status"]), int(body["epoch"])


@dataclass
class Watched:
    """A turn produced on one replica, followed and status-checked on the other."""

    session: str
    producer: LiveRead
    follower: LiveRead
    statuses: list[tuple[str, int]]
    """What the other replica said while the turn ran, and once it had ended."""


async def _produce_and_watch(
    client: httpx2.AsyncClient, producer: ServerProcess, watcher: ServerProcess
) -> Watched:
    session = _session()
    body = turn_body("Tell me about rivers.", agent="plain", stateful=True, session_id=session)
    produced = await started(
        read_in_background(client, "POST", f"{producer.url}/chat/stream?tenant=t", json=body)
    )
    assert produced.status_code == 201, produced.events
    await produced.until(lambda r: len(r.messages) >= 2, within=10)
    follow_url = f"{watcher.url}/chat/stream/{produced.message_id}?tenant=t&session_id={session}"
    follower = read_in_background(client, "GET", follow_url)
    statuses: list[tuple[str, int]] = []
    assert produced.task is not None
    while not produced.task.done():
        statuses.append(await _status(client, watcher.url, session))
        await asyncio.sleep(0.05)
    await produced.finished(within=15)
    await follower.finished(within=15)
    statuses.append(await _status(client, watcher.url, session))
    return Watched(session, produced, follower, statuses)


async def test_skewed_replicas_never_read_a_live_producer_as_dead(pair: Pair, place: Place) -> None:
    async with httpx2.AsyncClient(timeout=30, headers=ALICE) as client:
        # Both directions at once: the skewed replica produces for the plain
        # one, and the plain one for the skewed one.
        turns = await asyncio.gather(
            _produce_and_watch(client, pair.skewed, pair.plain),
            _produce_and_watch(client, pair.plain, pair.skewed),
        )
        for turn in turns:
            # Running at the producer's epoch throughout (no dead verdict, and no
            # takeover, which would take the next epoch), then done at the next.
            (_, epoch), *_ = turn.statuses
            allowed = [("running", epoch), ("done", epoch + 1)]
            assert all(seen in allowed for seen in turn.statuses), turn.statuses
            assert turn.statuses[-1] == ("done", epoch + 1)
            assert turn.producer.verdict() == "done", turn.producer.events[-2:]
            assert turn.follower.status_code == 200
            assert turn.follower.verdict() == "done", turn.follower.events[-2:]
            assert turn.follower.messages[-1]["content"] == turn.producer.messages[-1]["content"]

        # The stamps are the store's time (this test's own clock: the stores run
        # on this host), not the skewed replica's.
        session = _session()
        body = turn_body("And lakes?", agent="plain", stateful=True, session_id=session)
        running = await started(
            read_in_background(client, "POST", f"{pair.skewed.url}/chat/stream?tenant=t", json=body)
        )
        await running.until(lambda r: len(r.messages) >= 2, within=10)
        async with place.supervision() as supervision:
            row = await supervision.read("t", "alice", session)
        assert row is not None and row.status.value == "running"
        assert abs(row.heartbeat_at - datetime.now(UTC)) < timedelta(seconds=HEARTBEAT + 0.5)
        await running.finished(within=15)
        assert running.verdict() == "done"

        # A dead producer reads dead in time, whichever clock is ahead: kill the
        # replica whose stamps would otherwise look newest to the other.
        ahead, judge = (pair.skewed, pair.plain) if pair.skew > 0 else (pair.plain, pair.skewed)
        session = _session()
        body = turn_body("And the sea?", agent="plain", stateful=True, session_id=session)
        doomed = await started(
            read_in_background(client, "POST", f"{ahead.url}/chat/stream?tenant=t", json=body)
        )
        await doomed.until(lambda r: len(r.messages) >= 2, within=10)
        status, epoch = await _status(client, judge.url, session)
        assert status == "running"
        ahead.kill()
        killed_at = time.monotonic()
        while True:
            status, now_epoch = await _status(client, judge.url, session)
            # Dead, or already taken over by the judge: a takeover claims only a
            # dead row, at the next epoch.
            if status == "dead" or now_epoch > epoch:
                break
            assert (status, now_epoch) == ("running", epoch)
            elapsed = time.monotonic() - killed_at
            assert elapsed < DEAD_AFTER + HEARTBEAT + 1.0, f"still running {elapsed:.1f} s on"
            await asyncio.sleep(0.05)

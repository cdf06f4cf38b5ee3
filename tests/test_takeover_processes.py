"""Automatic takeover with real replicas and a real SIGKILL, no client recovering.

Two ``tether serve`` processes share one store set. A turn streams on A with a
follower attached through B; A is SIGKILLed and nobody resumes: B finds the
turn dead by itself, takes it over, and the follower, which never reconnects,
receives the whole answer. The transcript ends as a crash-free run of the same
prompt does. Waits are on stream events and the turn's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from tests.support.metrics import scrape
from tests.support.project import make_project
from tests.support.services import postgres_database, redis_prefix
from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.reader import TurnReader

pytestmark = [pytest.mark.processes, pytest.mark.timeout(90)]

PROMPT = "Tell me about rivers and the towns along them."


@dataclass(frozen=True)
class Stores:
    url: str
    stream_url: str | None = None


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("postgres+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
        pytest.param("sqlite"),
    ]
)
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "postgres":
        with postgres_database() as url:
            yield Stores(url)
    elif request.param == "postgres+redis":
        # The supervision rows (and so the presence locks) on Redis.
        with postgres_database() as url, redis_prefix() as stream_url:
            yield Stores(url, stream_url)
    else:
        yield Stores(f"sqlite:///{tmp_path}/tether.db")


def _cluster(stores: Stores, project: Path, tmp_path: Path, **env: str) -> Cluster:
    return Cluster(
        project,
        stores.url,
        stream_store_url=stores.stream_url,
        size=2,
        workdir=tmp_path,
        env=env,
    )


async def test_a_killed_producers_turn_finishes_on_the_survivor_with_no_client(
    shared_store: Stores, tmp_path: Path
) -> None:
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=160, tool_call_after_chunks=None
    )
    cluster = _cluster(shared_store, project, tmp_path)
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, "plain")
        a, b = cluster.replicas
        crash_free = api.start_turn(b.url, b.name, PROMPT, f"ref-{uuid.uuid4().hex[:8]}")
        assert await crash_free.ended(60) and crash_free.describe_end() == "done"
        reference = (crash_free.messages[-1].message or {})["content"]

        session = f"s-{uuid.uuid4().hex[:10]}"
        direct = api.start_turn(a.url, a.name, PROMPT, session)
        assert await direct.wait_for(lambda r: len(r.messages) >= 10, 30)
        assert direct.message_id is not None
        follower = api.attach(b.url, b.name, direct.message_id, session)
        assert await follower.wait_for(lambda r: len(r.messages) >= 1, 10)
        a.send(signal.SIGKILL)  # no drain, no client will resume
        await direct.aclose()

        assert await follower.ended(45), "the follower's stream did not end"
        assert follower.describe_end() == "done", follower.describe_end()
        contents = [(e.message or {}).get("content", "") for e in follower.messages]
        assert contents[-1] == reference
        _never_shrank(follower, direct)
        status = await api.status(b.url, session)
        assert status is not None and status.status == "done"
        transcript = await api.transcript(b.url, session)
        assert transcript is not None
        bots = [m["content"] for m in transcript if m["sender"] == "bot"]
        assert bots == [reference]


def _never_shrank(follower: TurnReader, direct: TurnReader) -> None:
    """Shown implies kept: the follower on the survivor saw its text only grow
    across the takeover, and what the killed producer's own reader was shown
    is a prefix of the answer the follower ended with."""
    contents = [(e.message or {}).get("content", "") for e in follower.messages]
    for before, after in itertools.pairwise(contents):
        assert after.startswith(before), f"the follower's text went from {before!r} to {after!r}"
    shown = [(e.message or {}).get("content", "") for e in direct.messages]
    assert shown and contents[-1].startswith(shown[-1]), "the direct reader's text was taken back"


async def test_a_poison_turn_that_kills_every_replica_stops_at_the_takeover_limit(
    tmp_path: Path,
) -> None:
    """Its agent SIGKILLs whichever replica runs it. With a limit of one
    takeover: the producer dies, the one replica that takes it over dies, and
    the last survivor ends the turn ``errored`` (``TAKEOVER_LIMIT``) instead
    of running it again, and the transcript keeps the code."""
    project = make_project(tmp_path / "project", chunks_per_second=40, answer_chunks=60)
    poison_log = tmp_path / "poison.log"
    env = {"TETHER_TAKEOVER_LIMIT": "1", "TETHER_TEST_POISON_LOG": str(poison_log)}
    store = f"sqlite:///{tmp_path}/tether.db"
    cluster = Cluster(project, store, size=3, workdir=tmp_path, env=env)
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, "poison")
        first = cluster.replicas[0]
        session = f"s-{uuid.uuid4().hex[:10]}"
        reader = api.start_turn(first.url, first.name, PROMPT, session)
        assert await reader.ended(30)
        await reader.aclose()

        survivor = None
        status = None
        async with asyncio.timeout(45):
            while status is None or status.status != "errored":
                alive = [r for r in cluster.replicas if r.alive]
                assert alive, "every replica died: the poison turn was not stopped"
                survivor = alive[0]
                # It may be the next to take the turn over, and die, meanwhile.
                with contextlib.suppress(httpx2.HTTPError):
                    status = await api.status(survivor.url, session)
                await asyncio.sleep(0.1)  # polling the verdict, not synchronizing on time
        assert survivor is not None
        runs = poison_log.read_text().split()
        assert len(runs) == 2 and len(set(runs)) == 2, runs  # the producer and one taker
        assert sum(1 for replica in cluster.replicas if not replica.alive) == 2
        conversation = await api.conversation(survivor.url, session)
        assert conversation is not None
        summary, transcript = conversation
        assert summary["last_turn_status"] == "errored"
        answer = transcript[-1]
        assert answer["sender"] == "bot", answer
        errors = [p["context"]["turn_error"] for p in answer["content_parts"] or [] if p["context"]]
        assert [e["code"] for e in errors] == ["TAKEOVER_LIMIT"]


@contextlib.asynccontextmanager
async def _streaming_under_a_long_threshold(
    stores: Stores, tmp_path: Path
) -> AsyncIterator[tuple[TetherAPI, Replica, Replica, TurnReader, str]]:
    """Two replicas whose dead threshold is 30 s, and a turn streaming on the
    first (``direct``, 10 messages in): what a heartbeat's age says changes
    nothing within a test's bounds."""
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=160, tool_call_after_chunks=None
    )
    cluster = _cluster(stores, project, tmp_path, TETHER_DEAD_AFTER="30")
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, "plain")
        a, b = cluster.replicas
        session = f"s-{uuid.uuid4().hex[:10]}"
        direct = api.start_turn(a.url, a.name, PROMPT, session)
        assert await direct.wait_for(lambda r: len(r.messages) >= 10, 30)
        yield api, a, b, direct, session


async def test_a_killed_producers_lock_says_it_is_dead_long_before_the_threshold(
    shared_store: Stores, tmp_path: Path
) -> None:
    """With a 30 s dead threshold, a heartbeat's age cannot call the producer
    dead within the test's 20 s: only its free presence lock (an ``flock`` on
    SQLite, an advisory lock's ended session on PostgreSQL, a dropped named
    connection on Redis) can."""
    streaming = _streaming_under_a_long_threshold(shared_store, tmp_path)
    async with streaming as (api, a, b, direct, session):
        assert direct.message_id is not None
        follower = api.attach(b.url, b.name, direct.message_id, session)
        assert await follower.wait_for(lambda r: len(r.messages) >= 1, 10)
        a.send(signal.SIGKILL)
        await direct.aclose()

        assert await follower.ended(20), "not taken over before the heartbeat threshold"
        assert follower.describe_end() == "done", follower.describe_end()
        _never_shrank(follower, direct)
        after = scrape(b.url)
        assert after.value("tether_presence_tests_total", verdict="gone") >= 1
        assert after.value("tether_takeovers_total", cause="automatic") == 1


async def test_a_stopped_producer_holds_its_lock_and_keeps_its_turn(
    shared_store: Stores, tmp_path: Path
) -> None:
    """SIGSTOP is a slow replica, not a dead one: the survivor finds the late
    turn's producer still holding its lock and leaves the turn, which the
    producer finishes once it runs again."""
    streaming = _streaming_under_a_long_threshold(shared_store, tmp_path)
    async with streaming as (api, a, b, direct, session):
        a.send(signal.SIGSTOP)
        try:
            async with asyncio.timeout(20):
                held = 0.0
                while held < 1:  # polling the survivor's verdict, bounded
                    await asyncio.sleep(0.1)
                    held = scrape(b.url).value("tether_presence_tests_total", verdict="held")
        finally:
            a.send(signal.SIGCONT)
        assert await direct.ended(30) and direct.describe_end() == "done"
        assert scrape(b.url).value("tether_takeovers_total") == 0
        status = await api.status(b.url, session)
        assert status is not None and status.status == "done"

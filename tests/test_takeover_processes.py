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
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.project import make_project
from tests.support.services import postgres_database
from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster

pytestmark = [pytest.mark.processes, pytest.mark.timeout(90)]

PROMPT = "Tell me about rivers and the towns along them."


@pytest.fixture(
    params=[pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("sqlite")]
)
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with postgres_database() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path}/tether.db"


async def test_a_killed_producers_turn_finishes_on_the_survivor_with_no_client(
    shared_store: str, tmp_path: Path
) -> None:
    project = make_project(
        tmp_path / "project", chunks_per_second=40, answer_chunks=160, tool_call_after_chunks=None
    )
    cluster = Cluster(project, shared_store, size=2, workdir=tmp_path)
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, "plain")
        a, b = cluster.replicas
        crash_free = api.start_turn(b.url, b.name, PROMPT, f"ref-{uuid.uuid4().hex[:8]}")
        assert await crash_free.ended(60) and crash_free.describe_end() == "closed"
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
        status = await api.status(b.url, session)
        assert status is not None and status.status == "done"
        transcript = await api.transcript(b.url, session)
        assert transcript is not None
        bots = [m["content"] for m in transcript if m["sender"] == "bot"]
        assert bots == [reference]


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

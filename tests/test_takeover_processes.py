"""Automatic takeover with real replicas and a real SIGKILL, no client recovering.

Two ``tether serve`` processes share one store set. A turn streams on A with a
follower attached through B; A is SIGKILLed and nobody resumes: B finds the
turn dead by itself, takes it over, and the follower, which never reconnects,
receives the whole answer. The transcript ends as a crash-free run of the same
prompt does. Waits are on stream events and the turn's status.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

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

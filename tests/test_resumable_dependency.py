"""The "Making a dependency resumable" guide (docs/writing-agents.md), proven with real processes:
a user-written dependency checkpoints each finished section; the producer is
SIGKILLed mid-report; the resume on the other replica writes only what was left.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest

from tests.support.project import make_project
from tests.support.replicas import (
    LiveRead,
    Replicas,
    read_in_background,
    started,
    two_replicas,
)

pytestmark = pytest.mark.processes

SECTIONS = 5


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    project = make_project(tmp_path / "project")
    log = tmp_path / "tools.log"
    store = f"sqlite:///{tmp_path / 'tether.db'}"
    env = {
        "TETHER_TEST_TOOL_LOG": str(log),
        # The guide is about the client's resume: were the survivor to take the
        # dead turn over by itself, the status poll below could miss the short
        # `dead` window and the client's resume would meet a running turn.
        "TETHER_TAKEOVER": "false",
    }
    with two_replicas(project, tmp_path, store, env=env) as pair:
        yield pair


@pytest.fixture
async def client() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=30, headers={"requester-uuid": "alice"}) as http:
        yield http


def _body(session: str) -> dict[str, object]:
    return {
        "agent_identifier": "outliner",
        "conversation": [{"sender": "user", "content": "Write the report."}],
        "stateful": True,
        "session_id": session,
    }


async def test_a_killed_report_resumes_after_its_last_finished_section(
    replicas: Replicas, client: httpx2.AsyncClient
) -> None:
    reference = await client.post(
        f"{replicas.two.url}/chat/response?tenant=t", json=_body(uuid.uuid4().hex)
    )
    assert reference.status_code == 201
    runs_before = replicas.tool_runs()
    session = uuid.uuid4().hex
    read = await started(
        read_in_background(
            client, "POST", f"{replicas.one.url}/chat/stream?tenant=t", json=_body(session)
        )
    )
    # Two sections are finished (and checkpointed) when the producer dies.
    await read.until(lambda r: r.messages and r.messages[-1]["content"].count("## ") >= 2)
    replicas.one.kill()
    resumed = await _resume_when_dead(client, replicas, read.message_id, session)

    assert resumed.verdict() == "done"
    assert resumed.messages[-1]["content"] == reference.json()["content"]
    transcript = (await client.get(f"{replicas.two.url}/conversations/{session}?tenant=t")).json()
    bots = [m["content"] for m in transcript["messages"] if m["sender"] == "bot"]
    assert bots == [reference.json()["content"]]
    # Each finished section was researched once; at most the one in progress
    # when the replica died ran twice.
    runs = Counter(line.split(" ", 1)[1] for line in _lines(replicas)[runs_before:])
    assert sorted(runs) == sorted(f"section {t}" for t in _titles())
    assert sum(runs.values()) <= SECTIONS + 1


async def _resume_when_dead(
    client: httpx2.AsyncClient, replicas: Replicas, message_id: str | None, session: str
) -> LiveRead:
    status_url = f"{replicas.two.url}/chat/stream/status?tenant=t&session_id={session}"
    async with asyncio.timeout(10):
        # The verdict of a real killed process comes with the dead threshold:
        # poll the real server, bounded.
        while (await client.get(status_url)).json()["status"] != "dead":  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    resumed = read_in_background(
        client,
        "POST",
        f"{replicas.two.url}/chat/stream?tenant=t&resume=true&message_id={message_id}",
        json={**_body(session), "conversation": []},
    )
    return await resumed.finished()


def _titles() -> list[str]:
    return ["Background", "Method", "Findings", "Risks", "Next steps"]


def _lines(replicas: Replicas) -> list[str]:
    return replicas.tool_log.read_text().splitlines() if replicas.tool_log.exists() else []

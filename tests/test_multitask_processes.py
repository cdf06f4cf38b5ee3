"""Double texting across real replicas: a turn streams on one replica, and a
new message sent through the other interrupts it, or rolls it back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.support.metrics import scrape
from tests.support.project import make_project
from tests.support.services import postgres_database, redis_prefix
from tether.crashtest.client import TENANT, TetherAPI
from tether.crashtest.cluster import Cluster

pytestmark = [pytest.mark.processes, pytest.mark.timeout(90)]


STORES = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("postgres+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
]
"""The store set-ups the tests run on: SQLite; PostgreSQL; the stream stores
on Redis beside PostgreSQL."""


def _cluster(
    places: contextlib.ExitStack, stores: str, tmp_path: Path, project: Path, size: int
) -> Cluster:
    """Replicas of ``project`` on the store set-up ``stores`` (see ``STORES``)."""
    if stores == "sqlite":
        store, stream_store = f"sqlite:///{tmp_path}/tether.db", None
    else:
        store = places.enter_context(postgres_database())
        stream_store = places.enter_context(redis_prefix()) if "redis" in stores else None
    return Cluster(project, store, size=size, workdir=tmp_path, stream_store_url=stream_store)


@pytest.mark.parametrize("stores", STORES)
@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_a_new_message_through_another_replica_displaces_the_running_turn(
    tmp_path: Path, strategy: str, stores: str
) -> None:
    project = make_project(tmp_path / "project", chunks_per_second=40, answer_chunks=400)
    with contextlib.ExitStack() as places:
        cluster = _cluster(places, stores, tmp_path, project, 2)
        await _displaced_through_another_replica(cluster, strategy)


async def _displaced_through_another_replica(cluster: Cluster, strategy: str) -> None:
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, "plain")
        a, b = cluster.replicas
        session = f"s-{uuid.uuid4().hex[:10]}"
        first = api.start_turn(a.url, a.name, "Tell me about rivers.", session)
        # Past a recording flush (every 0.5 s): the partial a cancel keeps is
        # what was recorded, as for any cancel from another replica.
        assert await first.wait_for(lambda r: len(r.messages) >= 40, 30)
        # A second screen, on the replica the new message goes through.
        elsewhere = api.attach(b.url, b.name, first.message_id, session)
        assert await elsewhere.wait_for(lambda r: len(r.messages) >= 1, 30)

        response = await http.post(
            f"{b.url}/chat/response",
            params={"tenant": TENANT},
            json={
                "agent_identifier": "plain",
                "stateful": True,
                "session_id": session,
                "conversation": [{"sender": "user", "content": "Actually, lakes?"}],
                "multitask_strategy": strategy,
            },
            timeout=60,
        )
        assert response.status_code == 201, response.text
        answer = response.json()["content"]

        assert await first.ended(30) and await elsewhere.ended(30)
        # Each screen hears the turn was cancelled: on its producer's replica
        # from the turn itself; on the other, from the row, or, once the row
        # names the new turn, from the kept answer's mark. A rolled-back
        # turn's answer is gone from the transcript: there, it may be "gone".
        ends = {"cancelled"} if strategy == "interrupt" else {"cancelled", "gone"}
        assert first.describe_end() in ends, first.describe_end()
        assert elsewhere.describe_end() in ends, elsewhere.describe_end()
        transcript = await api.transcript(b.url, session)
        assert transcript is not None
        shape = [(m["sender"], m["content"]) for m in transcript]
        if strategy == "interrupt":
            # The interrupted turn keeps its partial answer, as a cancel does.
            assert [s for s, _ in shape] == ["user", "bot", "user", "bot"]
            assert shape[0][1] == "Tell me about rivers." and shape[1][1]
            assert shape[2:] == [("user", "Actually, lakes?"), ("bot", answer)]
        else:
            assert shape == [("user", "Actually, lakes?"), ("bot", answer)]
        status = await api.status(a.url, session)
        assert status is not None and status.status == "done"


async def test_an_unknown_strategy_is_a_clear_422(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    cluster = Cluster(project, f"sqlite:///{tmp_path}/tether.db", size=2, workdir=tmp_path)
    async with cluster, TetherAPI.client() as http:
        response = await http.post(
            f"{cluster.replicas[0].url}/chat/stream",
            params={"tenant": TENANT},
            json={
                "agent_identifier": "plain",
                "stateful": True,
                "session_id": "s-1",
                "conversation": [{"sender": "user", "content": "Hi"}],
                "multitask_strategy": "shout",
            },
        )
        assert response.status_code == 422
        assert "multitask_strategy" in response.text


def _turn_body(prompt: str, session: str, strategy: str) -> dict[str, object]:
    return {
        "agent_identifier": "plain",
        "stateful": True,
        "session_id": session,
        "conversation": [{"sender": "user", "content": prompt}],
        "multitask_strategy": strategy,
    }


async def _enqueue(http: httpx2.AsyncClient, url: str, prompt: str, session: str) -> dict[str, Any]:
    """Send ``prompt`` with ``enqueue`` and read the answer's head: 202, the
    queued turn's id in the header and in a first ``queued`` event."""
    body = _turn_body(prompt, session, "enqueue")
    async with http.stream(
        "POST", f"{url}/chat/stream", params={"tenant": TENANT}, json=body, timeout=30
    ) as response:
        assert response.status_code == 202, await response.aread()
        lines: list[str] = []
        async for line in response.aiter_lines():
            if not line:
                break
            lines.append(line)
    assert lines[0] == "event: queued", lines
    queued = json.loads(lines[1].removeprefix("data: "))
    assert queued["message_id"] == response.headers["x-tether-message-id"]
    return dict(queued)


async def _status(http: httpx2.AsyncClient, url: str, session: str) -> dict[str, Any]:
    response = await http.get(
        f"{url}/chat/stream/status",
        params={"tenant": TENANT, "session_id": session},
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize("stores", STORES)
async def test_enqueued_messages_from_two_replicas_run_in_order_through_a_killed_producer(
    tmp_path: Path, stores: str
) -> None:
    """Three messages enqueued through two replicas while a turn runs: they run
    one at a time in arrival order; the replica producing the first of them is
    SIGKILLed mid-answer and the queue still drains (automatic takeover). On
    SQLite, on PostgreSQL, and with the stream stores on Redis beside it."""
    project = make_project(tmp_path / "project", chunks_per_second=40, answer_chunks=120)
    with contextlib.ExitStack() as places:
        cluster = _cluster(places, stores, tmp_path, project, 3)
        await _enqueued_turns_drain_through_a_kill(cluster)


async def _enqueued_turns_drain_through_a_kill(cluster: Cluster) -> None:
    async with cluster, TetherAPI.client() as http:
        api = TetherAPI(http, "plain")
        a, b, c = cluster.replicas
        session = f"s-{uuid.uuid4().hex[:10]}"
        first = api.start_turn(a.url, a.name, "Tell me about rivers.", session)
        assert await first.wait_for(lambda r: len(r.messages) >= 5, 30)
        tickets = [
            await _enqueue(http, replica.url, prompt, session)
            for replica, prompt in ((b, "Two?"), (c, "Three?"), (b, "Four?"))
        ]
        assert [t["position"] for t in tickets] == [1, 2, 3]
        ids = [str(t["message_id"]) for t in tickets]
        status = await _status(http, c.url, session)
        assert status["message_id"] == first.message_id
        assert [q["message_id"] for q in status["queue"]] == ids
        assert [q["content"] for q in status["queue"]] == ["Two?", "Three?", "Four?"]

        # Readers of the first queued turn on every replica: it streams once it
        # starts. Kill it mid-answer: once the reader on its producer (which
        # sees every message; a reader elsewhere on SQLite polls snapshots,
        # and may see fewer than ten in the whole answer) has ten.
        readers = [api.attach(r.url, r.name, ids[0], session) for r in cluster.replicas]
        async with asyncio.timeout(60):
            while not any(len(r.messages) >= 10 for r in readers):
                assert not all(r.done for r in readers), "the queued turn's readers all ended"
                await asyncio.sleep(0.005)  # polling what the readers hold, ordering nothing
        producers = [r for r in cluster.replicas if scrape(r.url).value("tether_turns_in_flight")]
        assert len(producers) == 1, "one turn at a time"
        producers[0].send(signal.SIGKILL)
        survivors = [r for r in cluster.replicas if r is not producers[0]]

        async with asyncio.timeout(60):
            while True:
                status = await _status(http, survivors[0].url, session)
                if status["message_id"] == ids[-1] and status["status"] == "done":
                    break
                await asyncio.sleep(0.2)  # polling the outcome, not ordering anything
        assert status["queue"] == []
        transcript = await api.transcript(survivors[0].url, session)
        assert transcript is not None
        assert [(m["sender"], m["content"]) for m in transcript if m["sender"] == "user"] == [
            ("user", "Tell me about rivers."),
            ("user", "Two?"),
            ("user", "Three?"),
            ("user", "Four?"),
        ]
        assert [m["sender"] for m in transcript] == ["user", "bot"] * 4
        assert [m["message_id"] for m in transcript if m["sender"] == "bot"] == [
            first.message_id,
            *ids,
        ]
        assert all(m.get("queued") is None and m["content"] for m in transcript)
        # A reader on a surviving replica read the killed turn to its end.
        alive = [
            reader
            for reader, replica in zip(readers, cluster.replicas, strict=True)
            if replica is not producers[0]
        ]
        for reader in alive:
            assert await reader.ended(30)
            last = reader.messages[-1].message
            assert last is not None and last["content"] == transcript[3]["content"]
            # Its end is the turn's own verdict, also where the row already
            # named the next queued turn when the reader read it.
            assert reader.finished_turn, (reader.replica, reader.verdict)


@pytest.mark.parametrize("stores", STORES)
async def test_chat_response_with_enqueue_answers_once_its_queued_turn_has_run(
    tmp_path: Path, stores: str
) -> None:
    """``POST /chat/response`` with ``enqueue`` on a busy conversation waits and
    answers 201 with its queued turn's answer, also when that turn runs on
    another replica and a turn queued behind it takes the conversation at its
    end (its row then names the next turn: before, the answer was a 410)."""
    # The first answer lasts 5 s: "Three?" must be queued while it still
    # runs, behind "Two?", also with the other set-ups' replicas starting.
    project = make_project(tmp_path / "project", chunks_per_second=40, answer_chunks=200)
    with contextlib.ExitStack() as places:
        cluster = _cluster(places, stores, tmp_path, project, 2)
        async with cluster, TetherAPI.client() as http:
            api = TetherAPI(http, "plain")
            a, b = cluster.replicas
            session = f"s-{uuid.uuid4().hex[:10]}"
            first = api.start_turn(a.url, a.name, "Tell me about rivers.", session)
            assert await first.wait_for(lambda r: len(r.messages) >= 5, 30)
            answering = asyncio.ensure_future(
                http.post(
                    f"{b.url}/chat/response",
                    params={"tenant": TENANT},
                    json=_turn_body("Two?", session, "enqueue"),
                    timeout=60,
                )
            )
            async with asyncio.timeout(30):
                while not (await _status(http, a.url, session))["queue"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)  # polling the queue, ordering nothing
            three = await _enqueue(http, a.url, "Three?", session)
            assert three["position"] == 2

            response = await answering
            assert response.status_code == 201, response.text
            two = response.headers["x-tether-message-id"]
            async with asyncio.timeout(60):
                while True:
                    status = await _status(http, b.url, session)
                    if status["message_id"] == three["message_id"] and status["status"] == "done":
                        break
                    await asyncio.sleep(0.2)  # polling the outcome, not ordering anything
            transcript = await api.transcript(b.url, session)
            assert transcript is not None
            assert [(m["sender"], m["message_id"]) for m in transcript] == [
                ("user", f"{first.message_id}-user"),
                ("bot", first.message_id),
                ("user", f"{two}-user"),
                ("bot", two),
                ("user", f"{three['message_id']}-user"),
                ("bot", three["message_id"]),
            ]
            assert response.json()["content"] == transcript[3]["content"] != ""

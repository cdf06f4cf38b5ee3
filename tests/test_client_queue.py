"""The Python client and double texting (``multitask_strategy``): a message sent
while another turn runs is queued (202), interrupts it, or rolls it back.

The first part scripts the server's answers, one recovery path per test: the
202's ``queued`` event, a queued turn's stream broken while it waits (the
status lists it in ``queue``: attach), and one cancelled while the client was
away (the transcript has no trace of it: ``cancelled``). The second part runs
two real replicas on one SQLite store: two messages queued through the other
replica run after the first, in order; a queued turn is cancelled; the replica
holding a queued turn's stream is SIGKILLed while it waits and the client
carries on through the other; interrupt and rollback.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from tests.support.replicas import Replicas
from tests.test_client import _message, _Scripted, _status, _verdict
from tether.client import QueuedMessage, SyncTetherClient, TetherClient, TurnUpdate

QUEUED = "q1"
SESSION = "s1"


def _queued_event(position: int, message_id: str = QUEUED) -> bytes:
    data = json.dumps({"message_id": message_id, "position": position})
    return f"event: queued\ndata: {data}\n\n".encode()


class _Body(httpx2.AsyncByteStream):
    def __init__(self, *chunks: bytes, broken: bool = False) -> None:
        self.chunks = chunks
        self.broken = broken

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.broken:
            raise httpx2.ReadError("the replica went away")


def _accepted(*chunks: bytes, status: int = 202, broken: bool = False) -> httpx2.Response:
    headers = {"content-type": "text/event-stream", "x-tether-message-id": QUEUED}
    return httpx2.Response(status, headers=headers, stream=_Body(*chunks, broken=broken))


def _status_with_queue(occupant: str, verdict: str, *waiting: str) -> httpx2.Response:
    body = {
        "session_id": SESSION,
        "message_id": occupant,
        "status": verdict,
        "epoch": 3,
        "queue": [
            {"message_id": m, "enqueued_at": "2025-01-01T00:00:00+00:00", "content": "Hi"}
            for m in waiting
        ],
    }
    return httpx2.Response(200, json=body)


def _transcript(*ids: str) -> httpx2.Response:
    summary = {
        "tenant": "t",
        "session_id": SESSION,
        "owner_uuid": "alice",
        "agent_identifier": "writer",
        "created_at": "2025-01-01T00:00:00+00:00",
        "updated_at": "2025-01-01T00:00:00+00:00",
    }
    messages = [
        {"sender": "bot" if "-" not in m else "user", "content": m, "message_id": m} for m in ids
    ]
    return httpx2.Response(200, json={"conversation": summary, "messages": messages})


def _client(script: _Scripted) -> TetherClient:
    return TetherClient(
        "http://a", tenant="t", requester_uuid="alice", transport=httpx2.MockTransport(script)
    )


async def test_a_queued_turn_is_known_at_once_and_streams_when_it_starts() -> None:
    script = _Scripted(
        start=[
            _accepted(
                _queued_event(2),
                _message(0, "A", QUEUED),
                _message(1, "A B", QUEUED),
                _verdict("done"),
            )
        ]
    )
    async with _client(script) as client:
        turn = client.stream(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        )
        assert await turn.start() is turn
        assert (turn.message_id, turn.queued, turn.queue_position) == (QUEUED, True, 2)
        assert turn.latest is None, "start() returns before the turn's first message"
        updates = [update.content async for update in turn]
    assert updates == ["A", "A B"] and turn.outcome == "done" and turn.path == ["start"]
    body = json.loads(script.requests[0][1].content)
    assert body["multitask_strategy"] == "enqueue"


async def test_the_default_strategy_is_left_to_the_server() -> None:
    script = _Scripted(start=[_accepted(_message(0, "A", QUEUED), status=201)])
    async with _client(script) as client:
        turn = await client.stream(agent_identifier="writer", message="Hi").start()
        assert (turn.message_id, turn.queued, turn.queue_position) == (QUEUED, False, None)
        assert [u.content async for u in turn] == ["A"]
    assert "multitask_strategy" not in json.loads(script.requests[0][1].content)


async def test_a_queued_turn_whose_stream_broke_is_attached_while_it_waits() -> None:
    script = _Scripted(
        start=[_accepted(_queued_event(1), broken=True)],
        # The turn before it still runs, and this one waits next in line.
        status=[_status_with_queue("m0", "running", QUEUED)],
        attach=[_accepted(_message(0, "A", QUEUED), _message(1, "A B", QUEUED), _verdict("done"))],
    )
    async with _client(script) as client:
        turn = client.stream(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        )
        updates = [update.content async for update in turn]
    assert updates == ["A", "A B"] and turn.outcome == "done"
    assert script.kinds() == ["start", "status", "attach"]
    attach = script.requests[-1][1]
    assert attach.url.path == f"/chat/stream/{QUEUED}"
    assert "last-event-id" not in attach.headers, "nothing of it was seen: from its start"


async def test_a_queued_turn_that_started_meanwhile_is_attached_after_its_last_event() -> None:
    script = _Scripted(
        start=[_accepted(_queued_event(1), _message(0, "A", QUEUED), broken=True)],
        status=[_status(verdict="running", message_id=QUEUED)],
        attach=[_accepted(_message(1, "A B", QUEUED), _verdict("done"))],
    )
    async with _client(script) as client:
        turn = client.stream(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        )
        updates = [update.content async for update in turn]
    assert updates == ["A", "A B"]
    assert script.requests[-1][1].headers["last-event-id"] == f"{QUEUED}:0"


async def test_a_queued_turn_cancelled_while_the_client_was_away_ends_cancelled() -> None:
    script = _Scripted(
        start=[_accepted(_queued_event(1), broken=True)],
        # Another turn holds the conversation and nothing waits: it left the queue.
        status=[_status_with_queue("m0", "done")],
        conversation=[_transcript("m0-user", "m0")],
    )
    async with _client(script) as client:
        turn = client.stream(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        )
        assert await turn.answer() is None
    assert turn.outcome == "cancelled"
    assert script.kinds() == ["start", "status", "conversation"]


async def test_a_queued_turn_cancelled_on_its_stream_ends_cancelled() -> None:
    script = _Scripted(start=[_accepted(_queued_event(3), _verdict("cancelled"))])
    async with _client(script) as client:
        turn = client.stream(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        )
        assert await turn.answer() is None
    assert turn.outcome == "cancelled" and turn.queue_position == 3


async def test_a_lost_enqueue_follows_the_queued_message_it_left() -> None:
    script = _Scripted(
        start=[httpx2.ReadError("the answer was lost")],
        status=[_status_with_queue("m0", "running", "q0", QUEUED)],
        attach=[_accepted(_message(0, "A", QUEUED), _verdict("done"))],
    )
    async with _client(script) as client:
        turn = client.stream(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        )
        await turn.start()
        assert (turn.message_id, turn.queue_position) == (QUEUED, 2)
        assert [u.content async for u in turn] == ["A"]
    assert script.kinds() == ["start", "status", "attach"]


async def test_the_status_lists_the_queue_in_order() -> None:
    script = _Scripted(status=[_status_with_queue("m0", "running", "q1", "q2")])
    async with _client(script) as client:
        status = await client.status(SESSION)
    assert status is not None
    assert [entry.message_id for entry in status.queue] == ["q1", "q2"]
    assert isinstance(status.queue[0], QueuedMessage) and status.queue[0].content == "Hi"
    assert (status.queue_position("q2"), status.queue_position("m0")) == (2, None)


def test_the_sync_client_starts_and_reads_a_queued_turn() -> None:
    script = _Scripted(
        start=[_accepted(_queued_event(1), _message(0, "A", QUEUED), _verdict("done"))]
    )
    with (
        SyncTetherClient("http://a", tenant="t", transport=httpx2.MockTransport(script)) as client,
        client.stream(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        ) as turn,
    ):
        assert turn.start() is turn and turn.queued and turn.queue_position == 1
        assert [u.content for u in turn] == ["A"] and turn.outcome == "done"


# ------------------------------------------------------ real replicas

PROMPT = "Tell me about rivers and the towns along them."

# 160 chunks at 40/s: a 4 s answer, time enough to queue behind it.
pytestmark = pytest.mark.replica_cluster(
    chunks_per_second=40, answer_chunks=160, tool_call_after_chunks=None
)


async def _running(client: TetherClient, prompt: str, session: str, *, after: int = 1) -> Any:
    """A turn streaming in ``session``, read in the background once ``after``
    of its messages are in."""
    turn = client.stream(agent_identifier="plain", message=prompt, session_id=session)
    seen = [await anext(turn) for _ in range(after)]
    rest = asyncio.ensure_future(_collect(turn))
    return turn, seen, rest


async def _collect(turn: Any) -> list[TurnUpdate]:
    return [update async for update in turn]


def _shape(messages: list[Any]) -> list[tuple[str, str | None]]:
    return [(m.sender.value, m.message_id) for m in messages]


@pytest.mark.processes
@pytest.mark.timeout(120)
async def test_messages_queued_through_another_replica_run_after_in_order(
    replicas: Replicas,
) -> None:
    one, two = replicas.one, replicas.two
    session = f"s-{uuid.uuid4().hex[:10]}"
    async with (
        TetherClient(one.url, tenant="t", requester_uuid="ines") as first_screen,
        TetherClient(two.url, tenant="t", requester_uuid="ines") as second_screen,
    ):
        running, _, reading = await _running(first_screen, PROMPT, session)
        queued = []
        for words in ("And lakes?", "And seas?"):
            turn = second_screen.stream(
                agent_identifier="plain",
                message=words,
                session_id=session,
                multitask_strategy="enqueue",
            )
            queued.append(await turn.start())
        assert [(t.queued, t.queue_position) for t in queued] == [(True, 1), (True, 2)]

        status = await second_screen.status(session)
        assert status is not None and status.message_id == running.message_id
        assert [(e.message_id, e.content) for e in status.queue] == [
            (queued[0].message_id, "And lakes?"),
            (queued[1].message_id, "And seas?"),
        ]
        # Shown in the transcript at once, marked queued, before they run.
        conversation = await first_screen.get_conversation(session)
        waiting = [m for m in conversation.messages if m.queued is not None]
        assert [m.queued.message_id for m in waiting if m.queued] == [t.message_id for t in queued]

        answers = await asyncio.gather(reading, *(_collect(t) for t in queued))
        assert running.outcome == "done"
        # Each one on its 202's stream; one that follows from the other replica
        # may find the next queued turn in the conversation's row before its
        # own end (a verdict of "gone"), and reads its end from the transcript.
        assert all(t.outcome == "done" and t.path[0] == "start" for t in queued)
        for updates, turn in zip(answers[1:], queued, strict=True):
            assert updates and all(u.message_id == turn.message_id for u in updates)

        conversation = await second_screen.get_conversation(session)
        ids = [running.message_id, *(t.message_id for t in queued)]
        assert _shape(conversation.messages) == [
            (sender, f"{mid}-user" if sender == "user" else mid)
            for mid in ids
            for sender in ("user", "bot")
        ]
        answered = {m.message_id: m.content for m in conversation.messages}
        for updates in answers:
            assert answered[updates[-1].message_id] == updates[-1].content
        status = await first_screen.status(session)
        assert status is not None and status.message_id == queued[-1].message_id
        assert status.status == "done" and status.queue == ()


@pytest.mark.processes
@pytest.mark.timeout(120)
async def test_a_queued_turn_is_cancelled_before_it_runs(replicas: Replicas) -> None:
    one, two = replicas.one, replicas.two
    session = f"s-{uuid.uuid4().hex[:10]}"
    async with (
        TetherClient(one.url, tenant="t", requester_uuid="jon") as client,
        TetherClient(two.url, tenant="t", requester_uuid="jon") as other,
    ):
        running, _, reading = await _running(client, PROMPT, session)
        turn = await client.stream(
            agent_identifier="plain",
            message="Never mind",
            session_id=session,
            multitask_strategy="enqueue",
        ).start()
        assert turn.queued and turn.message_id is not None
        waiting = asyncio.ensure_future(turn.answer())

        assert await other.cancel(session, turn.message_id) is True
        assert await asyncio.wait_for(waiting, 30) is None
        assert turn.outcome == "cancelled"
        status = await other.status(session)
        assert status is not None and status.queue == ()

        await reading
        assert running.outcome == "done"
        conversation = await client.get_conversation(session)
        assert _shape(conversation.messages) == [
            ("user", f"{running.message_id}-user"),
            ("bot", running.message_id),
        ]
        # It never ran: the conversation's last turn is still the first one.
        status = await other.status(session)
        assert status is not None and status.message_id == running.message_id


@pytest.mark.processes
@pytest.mark.timeout(120)
async def test_a_queued_turn_survives_the_death_of_the_replica_it_waited_on(
    replicas: Replicas,
) -> None:
    """The 202's stream is on replica two; two is SIGKILLed while the turn
    waits. The client (given both URLs) finds it in the status's queue on
    one, attaches there, and gets the whole answer once it runs."""
    one, two = replicas.one, replicas.two
    session = f"s-{uuid.uuid4().hex[:10]}"
    async with (
        TetherClient(one.url, tenant="t", requester_uuid="kai") as first_screen,
        TetherClient([two.url, one.url], tenant="t", requester_uuid="kai") as client,
    ):
        reference = await first_screen.stream(
            agent_identifier="plain", message="And lakes?"
        ).answer()
        assert reference is not None
        running, _, reading = await _running(first_screen, PROMPT, session)
        turn = await client.stream(
            agent_identifier="plain",
            message="And lakes?",
            session_id=session,
            multitask_strategy="enqueue",
        ).start()
        assert turn.queued and turn.connections[0].url == two.url

        await asyncio.to_thread(two.kill)  # SIGKILL: no drain, no goodbye
        updates = await _collect(turn)

        await reading
        assert running.outcome == "done"
        assert turn.outcome == "done" and turn.recovered
        assert turn.path[0] == "start" and "attach" in turn.path, turn.path
        assert all(c.url == one.url for c in turn.connections[1:])
        assert updates[-1].content == reference.content
        indexes = [u.index for u in updates]
        assert indexes == sorted(set(i for i in indexes if i is not None))


@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_a_message_that_interrupts_starts_at_once(replicas: Replicas, strategy: str) -> None:
    one, two = replicas.one, replicas.two
    session = f"s-{uuid.uuid4().hex[:10]}"
    async with (
        TetherClient(one.url, tenant="t", requester_uuid="lea") as client,
        TetherClient(two.url, tenant="t", requester_uuid="lea") as other,
    ):
        # Past a recording flush (every 0.5 s; the client's delta-mode stream
        # brings at most one update per 0.125 s): the partial answer an
        # interrupt keeps is what was recorded, as for any cancel from another replica.
        running, seen, reading = await _running(client, PROMPT, session, after=8)
        turn = await other.stream(
            agent_identifier="plain",
            message="Actually, lakes?",
            session_id=session,
            multitask_strategy=strategy,  # type: ignore[arg-type]
        ).start()
        assert not turn.queued and turn.queue_position is None
        answer = await turn.answer()
        rest = await reading
        # The interrupted turn's reader ends without an error. Its outcome is
        # "done" or "cancelled": the server ends the stream of a displaced
        # turn "gone" (the new turn holds the conversation's row before the
        # old producer reads it), and the transcript cannot tell an answer cut
        # short from a whole one.
        assert running.outcome in ("cancelled", "done")
        assert turn.outcome == "done" and answer is not None
        conversation = await client.get_conversation(session)
        kept = {m.message_id: m.content for m in conversation.messages}
        if strategy == "interrupt":
            assert [*seen, *rest][-1].content.startswith(kept[running.message_id])
        expected = [("user", f"{turn.message_id}-user"), ("bot", turn.message_id)]
        if strategy == "interrupt":
            # The interrupted turn keeps its partial answer, as a cancel does.
            expected = [
                ("user", f"{running.message_id}-user"),
                ("bot", running.message_id),
                *expected,
            ]
        assert _shape(conversation.messages) == expected

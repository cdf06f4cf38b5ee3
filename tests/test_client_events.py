"""The Python client's turn events: what ``Turn.events()`` yields and a
``TurnObserver`` hears, with the TypeScript client's types and fields
(``clients/typescript/src/types.js``, ``TurnEvent``), against scripted answers."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import httpx2
import pytest

from tests.test_client import (
    MID,
    SESSION,
    _client,
    _error_event,
    _message,
    _refusal,
    _Scripted,
    _status,
    _stream,
    _verdict,
)
from tests.test_client_queue import QUEUED, _accepted, _queued_event
from tether.client import (
    ConversationBusyError,
    SyncTetherClient,
    TurnFailedError,
    TurnObserver,
)
from tether.client.turn_events import EVENT_TYPES, TurnEvent


def _brief(event: TurnEvent) -> tuple[Any, ...]:
    """The event's type and its telling fields (the message as its text)."""
    fields = asdict(event)
    kind = fields.pop("type")
    if kind == "stream":
        return (kind, fields["via"])
    if kind in ("message", "dropped"):
        return (kind, event.message.content, fields["index"])  # type: ignore[union-attr]
    if kind == "recovering":
        return (kind, fields["cause"])
    if kind == "end":
        error = fields["error"]
        return (kind, fields["reason"], error["code"] if error else None)
    return (kind, *fields.values())


class _Heard(TurnObserver):
    def __init__(self) -> None:
        self.events: list[TurnEvent] = []

    def event(self, event: TurnEvent) -> None:
        self.events.append(event)


async def test_a_recovered_turn_tells_its_events_in_order() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[_status("running")],
        attach=[_stream(_message(1, "A B"), _verdict("done"))],
    )
    heard = _Heard()
    async with _client(script) as client:
        turn = client.stream(agent_identifier="writer", message="Hi", observer=heard)
        events = [event async for event in turn.events()]
    assert [_brief(e) for e in events] == [
        ("turn", MID),
        ("stream", "start"),
        ("message", "A", 0),
        ("recovering", "disconnected"),
        ("stream", "attach"),
        ("message", "A B", 1),
        ("end", "done", None),
    ]
    assert heard.events == events, "the observer hears what events() yields"
    assert {e.type for e in events} <= set(EVENT_TYPES)
    assert isinstance(events[3].error, httpx2.ReadError)  # type: ignore[union-attr]
    assert turn.outcome == "done" and turn.message is not None
    assert turn.message.content == "A B" and turn.last_event_id == f"{MID}:1"


async def test_a_refused_resume_and_a_dead_stream_say_why_they_recover() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), _verdict("dead"))],
        status=[_status("dead"), _status("running")],
        resume=[_refusal(409, "CONVERSATION_BUSY", message_id=MID)],
        attach=[_stream(_message(20000, "A B"), _verdict("done"))],
    )
    async with _client(script) as client:
        turn = await client.start_turn(agent_identifier="writer", message="Hi")
        assert turn.message_id == MID, "start_turn returns once a replica accepted the turn"
        causes = [e.cause async for e in turn.events() if e.type == "recovering"]
    assert causes == ["dead", "refused"]


async def test_a_turn_read_from_the_transcript_and_an_update_going_backwards() -> None:
    conversation = {
        "conversation": {
            "tenant": "t",
            "session_id": SESSION,
            "owner_uuid": "alice",
            "agent_identifier": "writer",
            "created_at": "2030-01-01T00:00:00Z",
            "updated_at": "2030-01-01T00:00:01Z",
            "last_turn_status": "complete",
        },
        "messages": [
            {"sender": "user", "content": "Hi", "message_id": f"{MID}-user"},
            {"sender": "bot", "content": "A B C", "message_id": MID},
        ],
    }
    script = _Scripted(
        start=[_stream(_message(0, "A B"), _message(1, "A"), broken=True)],
        status=[_status("done")],
        attach=[_refusal(410, "TURN_GONE")],
        conversation=[httpx2.Response(200, json=conversation)],
    )
    async with _client(script) as client:
        turn = client.stream(agent_identifier="writer", message="Hi")
        events = [_brief(e) async for e in turn.events()]
    assert events == [
        ("turn", MID),
        ("stream", "start"),
        ("message", "A B", 0),
        ("dropped", "A", 1),
        ("recovering", "disconnected"),
        ("message", "A B C", None),
        ("end", "done", None),
    ]
    # As the TypeScript Turn's dropped and url: " B" kept off the screen.
    assert (turn.dropped.updates, turn.dropped.characters) == (1, 2)
    assert turn.url == "http://a"


async def test_an_errored_turn_ends_with_its_error_rather_than_raising() -> None:
    script = _Scripted(start=[_stream(_message(0, "A"), _error_event("INTERNAL"))])
    async with _client(script) as client:
        events = [e async for e in client.stream(agent_identifier="w", message="Hi").events()]
        assert [_brief(e) for e in events][-1] == ("end", "errored", "INTERNAL")
        # Its updates raise, as ever.
        script.answers["start"] = [_stream(_message(0, "A"), _error_event("INTERNAL"))]
        with pytest.raises(TurnFailedError):
            await client.stream(agent_identifier="w", message="Hi").answer()


async def test_a_queued_turn_tells_where_it_waits() -> None:
    script = _Scripted(
        start=[_accepted(_queued_event(2), _message(0, "A", QUEUED), _verdict("done"))]
    )
    async with _client(script) as client:
        turn = await client.start_turn(
            agent_identifier="writer",
            message="Hi",
            session_id=SESSION,
            multitask_strategy="enqueue",
        )
        assert (turn.queued, turn.queue_position) == (True, 2)
        events = [_brief(e) async for e in turn.events()]
    assert events == [
        ("turn", QUEUED),
        ("stream", "start"),
        ("queued", QUEUED, 2),
        ("message", "A", 0),
        ("end", "done", None),
    ]


async def test_a_turn_is_read_once_by_its_updates_or_its_events() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), _verdict("done"))],
    )
    async with _client(script) as client:
        turn = client.stream(agent_identifier="writer", message="Hi")
        assert (await turn.answer()) is not None
        with pytest.raises(TypeError):
            [e async for e in turn.events()]


async def test_a_refusal_raises_from_start_turn() -> None:
    script = _Scripted(start=[_refusal(409, "CONVERSATION_BUSY", message_id="m0")])
    async with _client(script) as client:
        with pytest.raises(ConversationBusyError):
            await client.start_turn(agent_identifier="writer", message="Hi", session_id=SESSION)


def test_the_sync_client_tells_the_same_events() -> None:
    script = _Scripted(
        start=[_stream(_message(0, "A"), broken=True)],
        status=[_status("running")],
        attach=[_stream(_message(1, "A B"), _verdict("done"))],
    )
    with SyncTetherClient("http://a", tenant="t", transport=httpx2.MockTransport(script)) as client:
        turn = client.start_turn(agent_identifier="writer", message="Hi")
        assert turn.message_id == MID
        kinds = [event.type for event in turn.events()]
    assert kinds == ["turn", "stream", "message", "recovering", "stream", "message", "end"]

"""Wire compatibility with the seed's SDK clients, and errors that tell a client nothing secret.

- a 409 names its occupant in ``detail`` (``{"session_id", "message_id"}``);
- ``DELETE /chat/stream/{message_id}`` needs no ``session_id``: the turn is found
  by its message id, on any replica, among the requester's own turns only;
- ``POST /chat/response`` answers with ``conversation`` (the request's, with the
  bot's message appended);
- a resumable dependency whose ``load`` takes no ``resuming_turn`` works;
- an agent's internal error reaches the client as a code and an error id, and
  the log as the whole story under that id.

Apps run in the test's process over real stores (every shipped backend where
the stores matter), driven through ASGI.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from tests.support.inprocess import (
    SECRET_DETAIL,
    SeedNotebook,
    build,
    client_of,
    handler_of,
    turn,
)
from tests.support.scripted import Scripts, question
from tests.support.seed_only import SeedOnlySupervisionStore
from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
)
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.turn import Turn
from tether.runtime.turn_stores import TurnStores
from tether.stores import StoreBundle
from tether.testing.contracts import ManualClock

ALICE = {"requester-uuid": "alice"}
BOB = {"requester-uuid": "bob"}


def _memory(clock: ManualClock) -> TurnStores:
    return TurnStores(
        agent_state=InMemoryChatAgentStateStore(),
        recording=InMemoryChatStreamRecordingStore(),
        supervision=InMemoryChatStreamSupervisionStore(),
        conversation=InMemoryChatConversationStore(clock=clock),
    )


async def _scripted_turn(handler: ChatHandler, session: str, requester: str = "alice") -> Turn:
    request = ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid=requester),
        agent_identifier="scripted",
        conversation=[question("What is it?")],
        stateful=True,
        session_id=session,
    )
    return await handler.start_turn(request)


# 1. A busy conversation's 409 --------------------------------------------------------


async def test_every_409_names_the_occupant_in_detail_as_the_sdk_reads_it() -> None:
    clock = ManualClock()
    scripts = Scripts()
    app = build(_memory(clock), clock=clock, scripts=scripts)
    async with client_of(app) as client:
        running = await _scripted_turn(handler_of(app), "s1")
        await scripts.of(running.message_id).started.wait()
        busy = await client.post(
            "/chat/stream?tenant=t",
            headers=ALICE,
            json=turn("again", agent="scripted", stateful=True, session_id="s1"),
        )
        resume = await client.post(
            f"/chat/stream?tenant=t&resume=true&message_id={running.message_id}",
            headers=ALICE,
            json={
                "agent_identifier": "scripted",
                "stateful": True,
                "session_id": "s1",
                "conversation": [],
            },
        )
    for refused in (busy, resume):
        assert refused.status_code == 409, refused.text
        body = refused.json()
        assert body["detail"] == {"session_id": "s1", "message_id": running.message_id}
        assert body["code"] == "CONVERSATION_BUSY" and body["message"]


# 2. Cancel by message id alone, on any replica ---------------------------------------


def _turn_stores(bundle: StoreBundle, clock: ManualClock) -> TurnStores:
    return TurnStores(
        agent_state=bundle.agent_state_store,
        recording=bundle.chat_stream_recording_store,
        supervision=bundle.chat_stream_supervision_store,
        conversation=bundle.chat_conversation_store or InMemoryChatConversationStore(clock=clock),
    )


async def test_a_cancel_naming_only_the_turn_finds_it_on_another_replica(
    bundle: StoreBundle,
) -> None:
    clock = ManualClock()
    stores = _turn_stores(bundle, clock)
    scripts = Scripts()
    producer = build(stores, clock=clock, scripts=scripts)
    other = build(stores, clock=clock, scripts=scripts)
    session = "s-cancel-by-id"
    async with client_of(producer), client_of(other) as client:
        running = await _scripted_turn(handler_of(producer), session)
        await scripts.of(running.message_id).started.wait()
        by_bob = await client.delete(f"/chat/stream/{running.message_id}?tenant=t", headers=BOB)
        assert by_bob.status_code == 404, by_bob.text  # not Bob's turn: it does not exist
        unknown = await client.delete("/chat/stream/no-such-turn?tenant=t", headers=ALICE)
        assert unknown.status_code == 404, unknown.text
        cancelled = await client.delete(
            f"/chat/stream/{running.message_id}?tenant=t", headers=ALICE
        )
        assert cancelled.status_code == 204, cancelled.text
    assert stores.supervision is not None
    row = await stores.supervision.read("t", "alice", session)
    assert row is not None and row.status is ChatStreamStatus.CANCELLED
    assert row.message_id == running.message_id


async def test_with_a_seed_only_supervision_store_a_cancel_still_needs_the_session() -> None:
    clock = ManualClock()
    stores = TurnStores(
        agent_state=InMemoryChatAgentStateStore(),
        recording=InMemoryChatStreamRecordingStore(),
        supervision=SeedOnlySupervisionStore(),
    )
    scripts = Scripts()
    producer, other = build(stores, clock=clock, scripts=scripts), build(stores, clock=clock)
    async with client_of(producer), client_of(other) as client:
        running = await _scripted_turn(handler_of(producer), "s1")
        refused = await client.delete(f"/chat/stream/{running.message_id}?tenant=t", headers=ALICE)
        assert refused.status_code == 400, refused.text
        assert "session_id" in refused.json()["message"]
        named = await client.delete(
            f"/chat/stream/{running.message_id}?tenant=t&session_id=s1", headers=ALICE
        )
        assert named.status_code == 204, named.text


# 3. POST /chat/response --------------------------------------------------------------


async def test_chat_response_answers_the_conversation_with_the_bots_message_appended() -> None:
    clock = ManualClock()
    app = build(_memory(clock), clock=clock)
    history = [
        {"sender": "user", "content": "Hi"},
        {"sender": "bot", "content": "Hello"},
        {"sender": "user", "content": "Say it back"},
    ]
    body = {"agent_identifier": "echo", "conversation": history, "bot_params": None}
    async with client_of(app) as client:
        response = await client.post("/chat/response?tenant=t", headers=ALICE, json=body)
    assert response.status_code == 201, response.text
    answer = response.json()
    conversation = answer["conversation"]
    assert [(m["sender"], m["content"]) for m in conversation] == [
        ("user", "Hi"),
        ("bot", "Hello"),
        ("user", "Say it back"),
        ("bot", "echo: Say it back"),
    ]
    assert answer["agent_identifier"] == "echo"
    message_id = response.headers["x-tether-message-id"]
    assert conversation[-1]["message_id"] == message_id
    # The bot's message stays at the top level too (tether's clients read it there).
    assert (answer["sender"], answer["content"], answer["message_id"]) == (
        "bot",
        "echo: Say it back",
        message_id,
    )


# 4. A dependency written against the seed's load(self, state) -------------------------


async def test_a_resumable_dependency_whose_load_takes_only_the_state_works() -> None:
    clock = ManualClock()
    app = build(_memory(clock), clock=clock)
    SeedNotebook.loaded.clear()
    body = turn("count", agent="seed-dependency", stateful=True, session_id="s-seed")
    async with client_of(app) as client:
        first = await client.post("/chat/response?tenant=t", headers=ALICE, json=body)
        second = await client.post("/chat/response?tenant=t", headers=ALICE, json=body)
    assert first.status_code == 201, first.text
    assert second.status_code == 201, second.text
    assert (first.json()["content"], second.json()["content"]) == ("turn 1", "turn 2")
    assert SeedNotebook.loaded == [{}, {"turns": 1}]


# 8. Internal errors --------------------------------------------------------------------


async def test_an_internal_error_reaches_the_client_as_a_code_and_an_id_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    app = build(_memory(clock), clock=clock)
    caplog.set_level(logging.ERROR, logger="tether")
    async with client_of(app) as client:
        streamed = await client.post(
            "/chat/stream?tenant=t", headers=ALICE, json=turn("x", agent="broken")
        )
        answered = await client.post(
            "/chat/response?tenant=t", headers=ALICE, json=turn("x", agent="broken")
        )
    assert streamed.status_code == 201
    errors = [
        json.loads(block.split("data:", 1)[1].strip())
        for block in streamed.text.replace("\r\n", "\n").split("\n\n")
        if block.startswith("event: error")
    ]
    assert answered.status_code == 500
    for said in (errors[0], answered.json()):
        assert said["code"] == "INTERNAL"
        assert SECRET_DETAIL not in json.dumps(said) and "RuntimeError" not in json.dumps(said)
        match = re.search(r"error id ([0-9a-f]{16})", said["message"])
        assert match is not None, said
        logged = [r for r in caplog.records if match.group(1) in r.getMessage()]
        assert logged and logged[0].exc_info is not None
        assert SECRET_DETAIL in str(logged[0].exc_info[1])

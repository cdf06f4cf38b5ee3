"""Every attach, status, cancel and resume is bound to the full key (tenant, session, turn).

A reader names a conversation and a turn; only a turn *of that conversation*
that the reader may read is served, on every path: the producing replica's
live buffer as much as a follower on another replica. The attack each test
stages: Bob (or Alice in another tenant or conversation) names the
``message_id`` of Alice's private turn together with a conversation he may
read (Alice's shared one).

Replicas are ``ChatHandler``s in one process over in-memory stores.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.scripted import ScriptedCluster, ScriptedRegistries, question
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.message_bus import MessageBus
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import NotOwnerError, TurnRequestError
from tether.handlers.turn import Turn
from tether.runtime.turn_stores import TurnStores

SHARED, PRIVATE = "s-shared", "s-private"


def _request(
    requester: str, session: str, *, resume: bool = False, tenant: str = "t"
) -> ChatRequest:
    return ChatRequest(
        tenant=tenant,
        request_headers=RequestHeaders(requester_uuid=requester),
        agent_identifier="scripted",
        conversation=[] if resume else [question(f"{requester}'s question")],
        stateful=True,
        session_id=session,
    )


class World:
    def __init__(self, cluster: ScriptedCluster) -> None:
        self.cluster = cluster
        self.producer = cluster.replica()
        self.other = cluster.replica()
        self.private: Turn | None = None
        self.shared: Turn | None = None

    @property
    def secret(self) -> Turn:
        assert self.private is not None
        return self.private


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """Alice's shared conversation (a finished turn) and her private one, whose
    turn is live on ``producer``."""
    cluster = ScriptedCluster()
    world = World(cluster)
    try:
        shared = await world.producer.start_turn(_request("alice", SHARED))
        script = cluster.scripts.of(shared.message_id)
        script.say("for everyone")
        script.finish()
        assert await cluster.ended(shared) == "done"
        assert cluster.stores.conversation is not None
        await cluster.stores.conversation.set_shared("t", "alice", SHARED, True)
        world.shared = shared
        world.private = await world.producer.start_turn(_request("alice", PRIVATE))
        secret = cluster.scripts.of(world.private.message_id)
        secret.say("the private plan")
        await secret.spoken()
        yield world
    finally:
        await cluster.aclose()


async def _refused_attach(
    handler: ChatHandler, tenant: str, requester: str, session: str | None, message_id: str
) -> int:
    """The status the attach is refused with; fails the test if it is served."""
    try:
        _events, live = await handler.attach(tenant, requester, session, message_id, 0)
    except TurnRequestError as error:
        return error.status_code
    pytest.fail(f"attach served {'the live buffer' if live else 'a follower'} of {message_id}")


async def test_attach_on_the_producing_replica_serves_no_turn_outside_the_named_key(
    world: World,
) -> None:
    m = world.secret.message_id
    for handler in (world.producer, world.other):
        # Bob names the private turn with the shared conversation he may read.
        assert await _refused_attach(handler, "t", "bob", SHARED, m) in (404, 410)
        assert await _refused_attach(handler, "t", "bob", PRIVATE, m) == 403
        # Alice herself, through the wrong conversation or the wrong tenant.
        assert await _refused_attach(handler, "t", "alice", SHARED, m) in (404, 410)
        assert await _refused_attach(handler, "t2", "alice", PRIVATE, m) in (404, 410)
    # The key that holds the turn is served, live where it is produced.
    events, live = await world.producer.attach("t", "alice", PRIVATE, m, 0)
    assert live
    await events.aclose()  # type: ignore[attr-defined]
    events, live = await world.producer.attach("t", "alice", None, m, 0)
    assert live
    await events.aclose()  # type: ignore[attr-defined]


async def test_status_answers_only_the_named_conversations_turn(world: World) -> None:
    assert world.shared is not None
    for handler in (world.producer, world.other):
        shared = await handler.status("t", "bob", SHARED)
        assert shared.message_id == world.shared.message_id and shared.status == "done"
        with pytest.raises(NotOwnerError):
            await handler.status("t", "bob", PRIVATE)
        with pytest.raises(TurnRequestError) as elsewhere:
            await handler.status("t2", "alice", PRIVATE)
        assert elsewhere.value.status_code == 404


async def test_cancel_stops_only_a_turn_of_the_named_conversation(world: World) -> None:
    m = world.secret.message_id
    for handler in (world.producer, world.other):
        with pytest.raises(NotOwnerError):
            await handler.cancel("t", "bob", SHARED, m)
        with pytest.raises(TurnRequestError) as wrong_session:
            await handler.cancel("t", "alice", SHARED, m)
        assert wrong_session.value.status_code == 404
        with pytest.raises(TurnRequestError) as wrong_tenant:
            await handler.cancel("t2", "alice", PRIVATE, m)
        assert wrong_tenant.value.status_code == 404
    assert world.secret.buffer.end is None  # still running
    await world.other.cancel("t", "alice", PRIVATE, m)
    assert await world.cluster.ended(world.secret) == "cancelled"


async def test_resume_takes_over_only_a_turn_of_the_named_conversation(world: World) -> None:
    m = world.secret.message_id
    world.cluster.kill_by_silence()  # the private turn reads dead: resumable
    with pytest.raises(NotOwnerError):
        await world.other.start_turn(_request("bob", SHARED, resume=True), resume_message_id=m)
    with pytest.raises(TurnRequestError) as wrong_session:
        await world.other.start_turn(_request("alice", SHARED, resume=True), resume_message_id=m)
    assert wrong_session.value.status_code == 410
    with pytest.raises(TurnRequestError) as wrong_tenant:
        await world.other.start_turn(
            _request("alice", PRIVATE, resume=True, tenant="t2"), resume_message_id=m
        )
    assert wrong_tenant.value.status_code == 410


async def test_without_stream_stores_a_local_turn_is_cancelled_only_through_its_own_key() -> None:
    cluster = ScriptedCluster()
    handler = ChatHandler(
        ScriptedRegistries(cluster.scripts), TurnStores(), cluster.settings, MessageBus()
    )
    request = ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid="alice"),
        agent_identifier="scripted",
        conversation=[question("stateless")],
        session_id="s1",
    )
    running = await handler.start_turn(request)
    try:
        with pytest.raises(TurnRequestError) as other_session:
            await handler.cancel("t", "alice", "s2", running.message_id)
        assert other_session.value.status_code == 404
        with pytest.raises(TurnRequestError) as events_of_other_session:
            await handler.attach("t", "alice", "s2", running.message_id, 0)
        assert events_of_other_session.value.status_code == 404
        assert running.buffer.end is None
        await handler.cancel("t", "alice", "s1", running.message_id)
        assert await cluster.ended(running) == "cancelled"
    finally:
        await handler.shutdown()
        await cluster.aclose()

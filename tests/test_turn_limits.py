"""Fair limits: turns one requester and one tenant may run at once, messages
one conversation may queue (``tether.handlers.limits``, ``handlers.queue``).

Turns are scripted (``tests.support.scripted``): each runs until the test
answers it, which is how a turn whose client left goes on costing model calls.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.inprocess import build, client_of, handler_of, turn
from tests.support.scripted import AGENT, ScriptedCluster, enqueued, question
from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.chat_request import ChatRequest, RequestHeaders
from tether.domain.queued_messages import waiting_in
from tether.handlers.errors import ConversationBusyError, QueueFullError, TooManyTurnsError
from tether.runtime.lease import ConversationKey
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings
from tether.testing.interleavings import hold

pytestmark = pytest.mark.cluster(
    max_turns_per_requester=2, max_turns_per_tenant=3, max_queued_turns=2, limit_retry_after=7
)


def _request(requester: str, session: str, text: str = "Go?") -> ChatRequest:
    return ChatRequest(
        tenant="t",
        request_headers=RequestHeaders(requester_uuid=requester),
        agent_identifier=AGENT,
        conversation=[question(text)],
        stateful=True,
        session_id=session,
    )


async def test_a_requester_runs_at_most_its_limit_and_a_turn_that_ends_frees_a_place(
    cluster: ScriptedCluster,
) -> None:
    a = cluster.replica()
    first = await a.start_turn(_request("u", "s1"))
    await a.start_turn(_request("u", "s2"))
    with pytest.raises(TooManyTurnsError) as refused:
        await a.start_turn(_request("u", "s3"))
    assert refused.value.status_code == 429
    assert refused.value.headers() == {"Retry-After": "7"}
    assert refused.value.body()["code"] == "TOO_MANY_TURNS"
    # Refused before any claim: the conversation is untouched.
    assert cluster.stores.supervision is not None
    assert await cluster.stores.supervision.read("t", "u", "s3") is None

    other = await a.start_turn(_request("v", "s4"))  # another requester is not held back
    cluster.answer(first.message_id, "Done.")
    assert await cluster.ended(first) == "done"
    third = await a.start_turn(_request("u", "s3"))
    for started in (other, third):
        cluster.answer(started.message_id, "Done.")
        assert await cluster.ended(started) == "done"
    assert a.limits.running("t", "u") == 1


async def test_a_tenant_runs_at_most_its_limit_across_its_requesters(
    cluster: ScriptedCluster,
) -> None:
    a = cluster.replica()
    for requester, session in (("u", "s1"), ("v", "s2"), ("w", "s3")):
        await a.start_turn(_request(requester, session))
    with pytest.raises(TooManyTurnsError):
        await a.start_turn(_request("x", "s4"))
    assert a.limits.running("t") == 3


async def test_a_turn_that_fails_to_start_gives_its_place_back(cluster: ScriptedCluster) -> None:
    a = cluster.replica()
    await a.start_turn(_request("u", "s1"))
    for _ in range(3):  # busy: refused 409 after taking a place, each time
        with pytest.raises(ConversationBusyError):
            await a.start_turn(_request("u", "s1"))
    assert a.limits.running("t", "u") == 1


async def test_a_conversation_queues_at_most_its_limit(cluster: ScriptedCluster) -> None:
    a = cluster.replica()
    await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(a, "s1", "Two?")
    await cluster.enqueue(a, "s1", "Three?")
    with pytest.raises(QueueFullError) as refused:
        await a.queue.submit(enqueued("s1", "Four?"))
    assert refused.value.body()["code"] == "QUEUE_FULL"
    assert refused.value.headers() == {"Retry-After": "7"}
    assert "Four?" not in [m.content for m in await cluster.transcript("s1")]

    await a.cancel("t", "u", "s1", two.message_id)
    assert (await cluster.enqueue(a, "s1", "Four?")).position == 2


async def test_messages_enqueued_together_past_the_last_place_are_refused_and_removed(
    cluster: ScriptedCluster,
) -> None:
    """Both read the queue with one place left, and both append: the one
    placed beyond the limit leaves the queue and is refused."""
    a, b = cluster.replica(), cluster.replica()
    await cluster.start(a, "s1", "One?")
    await cluster.enqueue(a, "s1", "Two?")
    conversations = cluster.stores.conversation
    assert conversations is not None
    appending = [
        hold(
            conversations,
            "append_messages",
            when=lambda *args, text=text, **kwargs: args[4][-1].content == text,
        )
        for text in ("Three?", "Four?")
    ]
    sent = [
        asyncio.create_task(replica.queue.submit(enqueued("s1", text)))
        for replica, text in ((a, "Three?"), (b, "Four?"))
    ]
    for held in appending:  # both read the queue, one place left, before either appends
        await held.reached()
    for held in appending:
        held.release()
    results = await asyncio.gather(*sent, return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["QueueFullError", "Ticket"]
    waiting = [w.message.content for w in waiting_in(await cluster.transcript("s1"))]
    assert waiting[0] == "Two?" and len(waiting) == 2
    assert len(await a.queue.waiting(ConversationKey("t", "u", "s1"))) == 2


async def test_over_the_limit_the_api_answers_429_with_retry_after_and_a_code() -> None:
    stores = TurnStores(
        agent_state=InMemoryChatAgentStateStore(),
        recording=InMemoryChatStreamRecordingStore(),
        supervision=InMemoryChatStreamSupervisionStore(),
        conversation=InMemoryChatConversationStore(),
    )
    app = build(stores, max_turns_per_requester=1, limit_retry_after=3)
    async with client_of(app) as client:
        await handler_of(app).start_turn(_request("alice", "s1"))  # runs until shut down
        answer = await client.post(
            "/chat/stream?tenant=t",
            json=turn("Another?", agent=AGENT, stateful=True, session_id="s2"),
            headers={"requester-uuid": "alice"},
        )
        assert answer.status_code == 429
        assert answer.headers["retry-after"] == "3"
        assert answer.json()["code"] == "TOO_MANY_TURNS"
        assert answer.json()["message"]


def test_the_limits_are_settings_with_a_way_to_turn_them_off() -> None:
    assert TetherSettings(max_turns_per_requester=0).max_turns_per_requester == 0
    with pytest.raises(ValueError, match="TETHER_MAX_QUEUED_TURNS"):
        TetherSettings(max_queued_turns=-1)
    with pytest.raises(ValueError, match="TETHER_LIMIT_RETRY_AFTER"):
        TetherSettings(limit_retry_after=0)

"""Double texting: a new turn while one is still being answered (``multitask_strategy``).

In-process replicas over one set of in-memory stores (``tests.support.scripted``):
the new turn is started on a replica other than the producer's, so every
strategy is shown to work across replicas.
"""

from __future__ import annotations

import pytest

from tests.support.scripted import ScriptedCluster
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import MultitaskStrategy
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.handlers.errors import ConversationBusyError
from tether.handlers.turn import Turn


async def _answering(cluster: ScriptedCluster) -> tuple[str, ScriptedCluster]:
    a = cluster.replica()
    first = await cluster.start(a, "s1", "Tell me about rivers.")
    script = cluster.scripts.of(first.message_id)
    script.say("Rivers run")
    await script.spoken()
    assert a.flusher is not None
    await a.flusher.flush()  # what its readers saw is recorded
    return first.message_id, cluster


async def _displaced(cluster: ScriptedCluster, strategy: MultitaskStrategy) -> tuple[str, Turn]:
    """A turn answering on one replica, and a new message through another with
    ``strategy``, answered to its end: the first turn's id, and the new turn."""
    first, _ = await _answering(cluster)
    second = await cluster.start(cluster.replica(), "s1", "Actually, lakes?", strategy=strategy)
    script = cluster.scripts.of(second.message_id)
    script.say("Lakes are still.")
    script.finish()
    assert await cluster.ended(second) == "done"
    return first, second


def _shape(transcript: list[ChatMessage]) -> list[tuple[str, str]]:
    return [(m.sender.value, m.content) for m in transcript]


async def test_reject_is_the_default_and_names_the_occupant(cluster: ScriptedCluster) -> None:
    first, _ = await _answering(cluster)
    with pytest.raises(ConversationBusyError) as busy:
        await cluster.start(cluster.replica(), "s1", "And lakes?")
    assert busy.value.message_id == first


async def test_interrupt_cancels_the_running_turn_keeping_its_partial_answer(
    cluster: ScriptedCluster,
) -> None:
    first, second = await _displaced(cluster, "interrupt")
    assert _shape(await cluster.transcript("s1")) == [
        ("user", "Tell me about rivers."),
        ("bot", "Rivers run"),
        ("user", "Actually, lakes?"),
        ("bot", "Lakes are still."),
    ]
    producer = cluster.replicas[0].local_turn(first)
    # Its own readers hear it was cancelled, though the row names the new turn by then.
    assert producer.buffer.end is not None and producer.buffer.end.reason == "cancelled"
    assert cluster.stores.supervision is not None
    row = await cluster.stores.supervision.read("t", "u", "s1")
    assert row is not None and row.message_id == second.message_id
    assert row.status is ChatStreamStatus.DONE


async def test_interrupt_with_nothing_running_is_a_plain_turn(cluster: ScriptedCluster) -> None:
    turn = await cluster.start(cluster.replica(), "s1", "Hello?", strategy="interrupt")
    script = cluster.scripts.of(turn.message_id)
    script.say("Hi.")
    script.finish()
    assert await cluster.ended(turn) == "done"
    bots = [m for m in await cluster.transcript("s1") if m.sender is ChatMessageSender.BOT]
    assert [m.content for m in bots] == ["Hi."]


async def test_rollback_also_removes_the_interrupted_turn_from_the_transcript(
    cluster: ScriptedCluster,
) -> None:
    first, _ = await _displaced(cluster, "rollback")
    assert _shape(await cluster.transcript("s1")) == [
        ("user", "Actually, lakes?"),
        ("bot", "Lakes are still."),
    ]
    assert first not in {m.message_id for m in await cluster.transcript("s1")}

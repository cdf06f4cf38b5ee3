"""Presence: a killed replica's turns read dead at once, a slow one's do not.

In-process replicas over one set of in-memory stores and one hand-moved
clock (``tests.support.scripted``), each holding a presence lock until it
shuts down (its death); the surviving replica's takeover loop runs one scan
at a time. The real locks (``flock``, PostgreSQL's advisory lock) are tested
with real processes and signals in ``tests/test_presence_locks.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from tests.support.scripted import SETTINGS, ScriptedCluster, ScriptedRegistries, Scripts
from tether.adapters.file import LocalFileChatStreamSupervisionStore
from tether.domain.chat_message import ChatMessageSender
from tether.domain.message_bus import MessageBus
from tether.handlers.chat_handler import ChatHandler
from tether.runtime.turn_stores import TurnStores
from tether.testing.contracts import ManualClock
from tether.testing.interleavings import hold

SUSPECT_AFTER = timedelta(seconds=0.5)
"""Half a heartbeat interval: what ``tether serve``'s defaults give."""
LATE = 0.75
"""Seconds past the producer's last heartbeat: suspect, far from the 3 s threshold."""


pytestmark = pytest.mark.cluster(takeover_scan_interval=0.01)


async def _survivor(cluster: ScriptedCluster) -> ChatHandler:
    survivor = await cluster.present(cluster.replica())
    survivor.takeovers.suspect_after = SUSPECT_AFTER
    return survivor


async def _ends_saying(
    cluster: ScriptedCluster, replica: ChatHandler, message_id: str, producer: int, text: str
) -> None:
    """The turn's ``producer``-th producer (on ``replica``) starts, says ``text``
    and ends done."""
    script = cluster.scripts.of(message_id, producer)
    async with asyncio.timeout(10):
        await script.started.wait()
    script.say(text)
    script.finish()
    assert await cluster.ended(replica.local_turn(message_id)) == "done"


def _tests(replica: ChatHandler, verdict: str) -> float | None:
    return replica.metrics.registry.get_sample_value(
        "tether_presence_tests_total", {"verdict": verdict}
    )


async def test_a_killed_producers_turn_is_taken_over_before_the_dead_threshold(
    cluster: ScriptedCluster,
) -> None:
    a = await cluster.present(cluster.replica())
    b = await _survivor(cluster)
    turn = await cluster.start(a, "s1", "Where do rivers go?")
    first = cluster.scripts.of(turn.message_id, 0)
    first.say("To the sea")
    first.checkpoint()
    await first.spoken()
    row = await cluster.stores.supervision.read("t", "u", "s1")  # type: ignore[union-attr]
    assert row is not None and row.producer == a.presence.replica_id
    await a.shutdown()  # SIGKILL: no verdict, and the process's lock is gone
    cluster.clock.advance(LATE)

    assert await b.takeovers.scan() == 1
    assert _tests(b, "gone") == 1
    await _ends_saying(cluster, b, turn.message_id, 1, ", always.")
    bots = [m.content for m in await cluster.transcript("s1") if m.sender is ChatMessageSender.BOT]
    assert bots == ["To the sea, always."]
    taken = b.metrics.registry.get_sample_value
    assert taken("tether_takeovers_total", {"cause": "automatic"}) == 1


async def test_a_slow_producer_keeps_its_turn_until_the_threshold(
    cluster: ScriptedCluster,
) -> None:
    """Its heartbeats are late (held at the store), but it lives and holds its
    lock: the survivor tests the lock, finds it held, and leaves the turn."""
    a = await cluster.present(cluster.replica())
    b = await _survivor(cluster)
    assert cluster.stores.supervision is not None
    late = hold(cluster.stores.supervision, "compare_and_swap_many")
    turn = await cluster.start(a, "s1")
    first = cluster.scripts.of(turn.message_id, 0)
    assert a.heartbeats is not None
    beat = asyncio.create_task(a.heartbeats.beat())  # goes out, and waits at the store
    await late.reached()
    cluster.clock.advance(LATE)

    assert await b.takeovers.scan() == 0
    assert _tests(b, "held") == 1
    status = await b.status("t", "u", "s1")
    assert status.status == "running"

    late.release()
    await beat
    first.say("Slow, but mine.")
    first.finish()
    assert await cluster.ended(turn) == "done"
    bots = [m.content for m in await cluster.transcript("s1") if m.sender is ChatMessageSender.BOT]
    assert bots == ["Slow, but mine."]


async def test_a_replica_that_loses_its_lock_holds_a_new_one_and_keeps_its_turn(
    cluster: ScriptedCluster,
) -> None:
    """Its lock went with its connection (a database restart), so others read
    its id gone for good. Its next check holds a new lock under a new id, its
    running turn's next heartbeat names that id, and a survivor that finds
    the row late tests the new lock, finds it held and leaves the turn. (Before,
    the replica kept naming the lost id, and every turn it produced was taken
    over: up to the takeover limit.)"""
    a = await cluster.present(cluster.replica())
    b = await _survivor(cluster)
    turn = await cluster.start(a, "s1")
    first = cluster.scripts.of(turn.message_id, 0)
    await first.started.wait()
    lost = a.presence.producer
    assert lost is not None and await a.presence.keep() is False  # held: nothing to do
    cluster.presence.held.discard(lost)  # the lock's connection ended

    assert await a.presence.keep() is True
    assert a.presence.producer not in (None, lost)
    assert a.heartbeats is not None
    await a.heartbeats.beat()
    row = await cluster.stores.supervision.read("t", "u", "s1")  # type: ignore[union-attr]
    assert row is not None and row.producer == a.presence.producer
    cluster.clock.advance(LATE)
    assert await b.takeovers.scan() == 0
    assert _tests(b, "held") == 1
    assert await b.presence.find_gone({lost}) == {lost}
    assert await a.presence.find_gone({lost}) == set()  # never its own

    first.say("Still mine.")
    first.finish()
    assert await cluster.ended(turn) == "done"
    bots = [m.content for m in await cluster.transcript("s1") if m.sender is ChatMessageSender.BOT]
    assert bots == ["Still mine."]
    changes = a.metrics.registry.get_sample_value("tether_presence_changes_total")
    assert changes == 1


async def test_without_presence_a_late_turn_waits_for_the_threshold(
    cluster: ScriptedCluster,
) -> None:
    """A replica with no lock names no producer: its turns read dead by age alone."""
    a = cluster.replica()  # no presence lock (a backend without one)
    b = await _survivor(cluster)
    turn = await cluster.start(a, "s1")
    await cluster.scripts.of(turn.message_id, 0).started.wait()
    row = await cluster.stores.supervision.read("t", "u", "s1")  # type: ignore[union-attr]
    assert row is not None and row.producer is None
    await a.shutdown()
    cluster.clock.advance(LATE)
    assert await b.takeovers.scan() == 0
    assert _tests(b, "gone") is None

    cluster.kill_by_silence()
    assert await b.takeovers.scan() == 1


async def test_a_row_naming_no_replica_is_never_tested(cluster: ScriptedCluster) -> None:
    """What a row says is data: a producer that is not a replica id (another
    release, a hand-edited row) never reaches the lock, nor becomes a path."""
    b = await _survivor(cluster)
    assert await b.presence.find_gone({"../../etc/passwd", "x"}) == set()


@pytest.mark.parametrize("presence", [True, False])
async def test_tether_presence_false_leaves_the_turns_to_their_heartbeats_age(
    tmp_path: Path, presence: bool
) -> None:
    """On a store with a presence lock (the file store's ``flock``), a replica
    holds one unless ``TETHER_PRESENCE=false``; without one it names no
    producer in its rows."""
    stores = TurnStores(supervision=LocalFileChatStreamSupervisionStore(tmp_path))
    settings = replace(SETTINGS, presence=presence)
    replica = ChatHandler(
        ScriptedRegistries(Scripts()), stores, settings, MessageBus(), ManualClock()
    )
    await replica.start()
    try:
        assert replica.presence.available is presence
        assert (replica.presence.producer == replica.presence.replica_id) is presence
    finally:
        await replica.shutdown()
    assert replica.presence.producer is None  # released with the replica


async def test_a_turn_whose_producer_died_before_is_taken_over_again_only_past_its_back_off(
    cluster: ScriptedCluster,
) -> None:
    """The turn's first producer dies and a survivor takes it over at once (its
    lock says gone). The survivor dies too, its lock free just as fast, but a
    turn taken over once already waits the dead threshold from its last
    heartbeat: a third replica's scans leave it until then, and take it
    after. So an agent that kills its replicas is not re-driven at the pace
    of the kills. (Before, the third replica took it at its first scan.)"""
    a = await cluster.present(cluster.replica())
    b, c = await _survivor(cluster), await _survivor(cluster)
    turn = await cluster.start(a, "s1", "Where do rivers go?")
    first = cluster.scripts.of(turn.message_id, 0)
    first.say("To the sea")
    first.checkpoint()
    await first.spoken()
    await a.shutdown()
    cluster.clock.advance(LATE)
    assert await b.takeovers.scan() == 1  # at once: no earlier takeover
    second = cluster.scripts.of(turn.message_id, 1)
    async with asyncio.timeout(10):
        await second.started.wait()
    second.say(", on and on")
    second.checkpoint()
    await second.spoken()

    await b.shutdown()  # its lock is free at once, like the first one's
    cluster.clock.advance(LATE)
    assert await c.takeovers.scan() == 0
    assert _tests(c, "gone") == 1  # read gone, and left to its back-off
    cluster.clock.advance(SETTINGS.dead_after - LATE - 0.01)
    assert await c.takeovers.scan() == 0
    cluster.clock.advance(0.02)  # the dead threshold past its last heartbeat
    assert await c.takeovers.scan() == 1
    await _ends_saying(cluster, c, turn.message_id, 2, ", always.")

"""No turn left behind: replicas take dead turns over by themselves, or end them.

In-process replicas over one set of in-memory stores and one hand-moved clock
(``tests.support.scripted``): a producer "dies" when its replica shuts down
without a verdict and the clock passes the dead threshold; a surviving
replica's takeover loop is run one scan at a time by the test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from typing import Any

import pytest

from tests.support.scripted import Script, ScriptedCluster
from tether.adapters.memory import InMemoryChatStreamSupervisionStore
from tether.domain.chat_message import ChatMessageSender
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervisionStore,
    StaleTurn,
)
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import ConversationBusyError, TurnEndedError
from tether.handlers.takeover import AutomaticTakeover
from tether.handlers.turn import Turn
from tether.runtime.live_buffer import StreamEvent
from tether.testing.interleavings import hold

pytestmark = pytest.mark.cluster(takeover_scan_interval=0.01, takeover_limit=2)


async def _dies(cluster: ScriptedCluster, replica: ChatHandler) -> None:
    """``replica`` stops with no verdict (as SIGKILL leaves it), and its turns read dead."""
    await replica.shutdown()
    cluster.kill_by_silence()


async def _started(cluster: ScriptedCluster, message_id: str, producer: int) -> Script:
    """The script of the turn's ``producer``-th producer, once its agent runs."""
    script = cluster.scripts.of(message_id, producer)
    async with asyncio.timeout(10):
        await script.started.wait()
    return script


async def _checkpointed(
    cluster: ScriptedCluster, replica: ChatHandler, question: str = "What is the question?"
) -> Turn:
    """A turn of ``s1`` on ``replica`` whose agent said "To the sea" and
    checkpointed it."""
    turn = await cluster.start(replica, "s1", question)
    first = cluster.scripts.of(turn.message_id, 0)
    first.say("To the sea")
    first.checkpoint()
    await first.spoken()
    return turn


async def _a_dead_turn_and_two_survivors(
    cluster: ScriptedCluster,
) -> tuple[Turn, ChatHandler, ChatHandler]:
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    await _started(cluster, turn.message_id, 0)
    await _dies(cluster, a)
    return turn, b, c


def _producing(replica: ChatHandler, message_id: str) -> Turn:
    turn = replica.local_turn(message_id)
    assert turn is not None, f"{message_id} is not produced here"
    return turn


async def _row_status(cluster: ScriptedCluster, session: str) -> ChatStreamStatus | None:
    assert cluster.stores.supervision is not None
    row = await cluster.stores.supervision.read("t", "u", session)
    return None if row is None else row.status


async def test_a_dead_turn_is_taken_over_and_finished_with_no_client(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await _checkpointed(cluster, a, "Where do rivers go?")
    await _dies(cluster, a)

    assert await b.takeovers.scan() == 1
    resumed = _producing(b, turn.message_id)
    second = await _started(cluster, turn.message_id, 1)
    # The takeover answers the turn's own question, from its checkpoint.
    assert [m.content for m in second.inputs[0]][-1] == "Where do rivers go?"
    second.say(", always.")
    second.finish()
    assert await cluster.ended(resumed) == "done"
    transcript = await cluster.transcript("s1")
    bots = [m.content for m in transcript if m.sender is ChatMessageSender.BOT]
    assert bots == ["To the sea, always."]
    taken = b.metrics.registry.get_sample_value
    assert taken("tether_takeovers_total", {"cause": "automatic"}) == 1
    assert taken("tether_takeover_first_content_seconds_count", {"cause": "automatic"}) == 1
    assert await b.takeovers.scan() == 0  # nothing dead is left


async def _transcript_error(cluster: ScriptedCluster) -> str | None:
    """The code of the ``turn_error`` part the reaper kept with the last answer."""
    last = (await cluster.transcript("s1"))[-1]
    assert last.sender is ChatMessageSender.BOT
    errors = [p.context["turn_error"] for p in last.content_parts or [] if p.context]
    return errors[0]["code"] if errors else None


async def _seconds_to_new_content(
    cluster: ScriptedCluster, taker: ChatHandler, turn: Turn, cause: str
) -> float | None:
    """Let the taker speak 0.5 s after it started; what its metrics say: one
    takeover of ``cause``, and the seconds from dead to that new content."""
    second = await _started(cluster, turn.message_id, 1)
    cluster.clock.advance(0.5)
    second.say(", always.")
    await second.spoken()
    value = taker.metrics.registry.get_sample_value
    assert value("tether_takeovers_total", {"cause": cause}) == 1
    assert value("tether_takeover_first_content_seconds_count", {"cause": cause}) == 1
    return value("tether_takeover_first_content_seconds_sum", {"cause": cause})


async def test_the_takeover_metrics_say_the_cause_and_the_time_to_new_content(
    cluster: ScriptedCluster,
) -> None:
    """From the dead verdict (the last heartbeat plus the threshold) to the
    taker's first new content, by the replicas' one clock."""
    a, b = cluster.replica(), cluster.replica()
    turn = await _checkpointed(cluster, a)
    await a.shutdown()
    cluster.clock.advance(cluster.settings.dead_after + 0.25)  # dead for 0.25 s
    assert await b.takeovers.scan() == 1
    assert await _seconds_to_new_content(cluster, b, turn, "automatic") == pytest.approx(0.75)


async def test_a_taker_records_its_first_new_content_at_once_not_a_repeat_of_what_was_shown(
    cluster: ScriptedCluster,
) -> None:
    """A taker's agent may first say again what clients were shown (it goes on
    from a checkpoint taken at that point): that is no new content. The first
    message past it is recorded at once, for followers on other replicas, and
    ends the measured outage. Before, the repeat was recorded and measured, and
    the new text waited for the next periodic flush."""
    a, b = cluster.replica(), cluster.replica()
    turn = await _checkpointed(cluster, a)
    assert a.flusher is not None
    await a.flusher.flush()  # what clients were shown: "To the sea"
    await _dies(cluster, a)  # dead for 1 s

    assert await b.takeovers.scan() == 1
    second = await _started(cluster, turn.message_id, 1)
    second.say("")  # "To the sea" again
    await second.spoken()
    cluster.clock.advance(0.5)
    second.say(", always.")
    await second.spoken(2)
    value = b.metrics.registry.get_sample_value
    labels = {"cause": "automatic"}
    assert value("tether_takeover_first_content_seconds_count", labels) == 1
    assert value("tether_takeover_first_content_seconds_sum", labels) == pytest.approx(1.5)
    assert cluster.stores.recording is not None
    async with asyncio.timeout(10):
        while True:  # the first flush is the turn's own task; nothing else writes
            record = await cluster.stores.recording.read("t", "u", "s1")
            if record is not None and record.message.content == "To the sea, always.":
                break
            await asyncio.sleep(0)


@pytest.mark.cluster(push=False, takeover_scan_interval=3600.0)
async def test_a_follower_on_the_taker_reads_its_live_buffer_not_the_flushes(
    cluster: ScriptedCluster,
) -> None:
    """A second screen attached through a replica that then takes the turn over
    gets the taker's messages as it shows them, as a client attached to it
    from the start would: each as soon as it is recorded, never before (here
    the put of the second one is held: nobody is shown it meanwhile), and
    with no deltas on the channel."""
    a, b = cluster.replica(), cluster.replica()
    await b.start()  # its followers wait for a takeover; the test scans itself
    turn = await _checkpointed(cluster, a)
    events, live = await b.attach("t", "u", "s1", turn.message_id, 0)
    assert not live  # followed from the stores: a produces it
    seen = {
        "To the sea, always": asyncio.Event(),
        "To the sea, always, and back.": asyncio.Event(),
    }

    async def read() -> None:
        async for item in events:
            if isinstance(item, StreamEvent) and item.message.content in seen:
                seen[item.message.content].set()

    reading = asyncio.ensure_future(read())
    assert cluster.stores.recording is not None
    unrecorded = hold(
        cluster.stores.recording,
        "put_many",
        when=lambda puts: any("and back" in p.event.message.content for p in puts),
    )
    no_deltas = hold(cluster.stores.recording, "publish_deltas", times=1_000_000)
    await _dies(cluster, a)
    assert await b.takeovers.scan() == 1
    second = await _started(cluster, turn.message_id, 1)
    second.say(", always")
    async with asyncio.timeout(10):
        await seen["To the sea, always"].wait()
    second.say(", and back.")
    await unrecorded.reached()
    resumed = _producing(b, turn.message_id)
    assert resumed.buffer.latest is not None
    assert resumed.buffer.latest.message.content == "To the sea, always"
    assert not seen["To the sea, always, and back."].is_set()
    unrecorded.release()
    async with asyncio.timeout(10):
        await seen["To the sea, always, and back."].wait()
    no_deltas.release()
    second.finish()
    async with asyncio.timeout(10):
        await reading


@pytest.mark.cluster(takeover_scan_interval=0.01, drain_grace=0.0)
async def test_a_drained_turn_is_taken_over_at_once_as_a_hand_off(cluster: ScriptedCluster) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    first = cluster.scripts.of(turn.message_id, 0)
    first.say("To the sea")
    await first.spoken()
    await a.drain()
    # No clock moved: a handed-off turn reads dead at once.
    assert await b.takeovers.scan() == 1
    assert await _seconds_to_new_content(cluster, b, turn, "drain_handoff") == pytest.approx(0.5)


@pytest.mark.cluster(takeover_scan_interval=3600.0, drain_grace=0.0)
async def test_a_hand_off_wakes_the_other_replicas_takeover_loops_at_once(
    cluster: ScriptedCluster,
) -> None:
    """A drain announces its hand-offs (``announce_dead_turns``, pushed where
    the store has a channel): a replica whose loop scans only once an hour
    takes the turn over at once. Unannounced, it would wait out the hour."""
    a, b = cluster.replica(), cluster.replica()
    await b.start()
    assert b.takeovers.running
    turn = await cluster.start(a, "s1")
    first = await _started(cluster, turn.message_id, 0)
    first.say("To the sea")
    await first.spoken()
    await a.drain()
    second = await _started(cluster, turn.message_id, 1)
    assert _producing(b, turn.message_id).lease is not None
    second.say("To the sea, and back.")
    second.finish()
    assert await cluster.ended(_producing(b, turn.message_id)) == "done"


async def test_of_two_replicas_racing_for_one_dead_turn_exactly_one_produces(
    cluster: ScriptedCluster,
) -> None:
    turn, b, c = await _a_dead_turn_and_two_survivors(cluster)
    taken = await asyncio.gather(b.takeovers.scan(), c.takeovers.scan())
    assert sorted(taken) == [0, 1]
    producers = [r for r in (b, c) if r.local_turn(turn.message_id) is not None]
    assert len(producers) == 1
    await _started(cluster, turn.message_id, 1)
    assert not cluster.scripts.of(turn.message_id, 2).started.is_set()


async def test_a_clients_resume_racing_the_automatic_takeover_leaves_one_producer(
    cluster: ScriptedCluster,
) -> None:
    turn, b, c = await _a_dead_turn_and_two_survivors(cluster)
    scanned, resumed = await asyncio.gather(
        b.takeovers.scan(),
        cluster.start(c, "s1", resume=turn.message_id),
        return_exceptions=True,
    )
    won_by_client = isinstance(resumed, Turn)
    assert won_by_client != (scanned == 1), (scanned, resumed)
    if not won_by_client:
        assert isinstance(resumed, ConversationBusyError | TurnEndedError)
    script = await _started(cluster, turn.message_id, 1)
    assert not cluster.scripts.of(turn.message_id, 2).started.is_set()
    script.say("One answer.")
    script.finish()
    producer = _producing(c if won_by_client else b, turn.message_id)
    assert await cluster.ended(producer) == "done"
    bots = [m for m in await cluster.transcript("s1") if m.sender is ChatMessageSender.BOT]
    assert [m.content for m in bots] == ["One answer."]


async def test_a_turn_whose_producers_keep_dying_ends_errored_at_the_takeover_limit(
    cluster: ScriptedCluster,
) -> None:
    a = cluster.replica()
    turn = await cluster.start(a, "s1")
    await _started(cluster, turn.message_id, 0)
    dying = a
    for takeover in (1, 2):  # TETHER_TAKEOVER_LIMIT is 2 here
        await _dies(cluster, dying)
        dying = cluster.replica()
        assert await dying.takeovers.scan() == 1
        await _started(cluster, turn.message_id, takeover)
    await _dies(cluster, dying)
    last = cluster.replica()
    assert await last.takeovers.scan() == 1
    assert last.local_turn(turn.message_id) is None  # ended, not run a third time
    assert not cluster.scripts.of(turn.message_id, 3).started.is_set()
    assert await _row_status(cluster, "s1") is ChatStreamStatus.ERRORED
    assert cluster.stores.conversation is not None
    summary = await cluster.stores.conversation.get_conversation("t", "u", "s1")
    assert summary is not None and summary.last_turn_status == "errored"
    assert await _transcript_error(cluster) == "TAKEOVER_LIMIT"
    assert last.metrics.turns_reaped.labels("TAKEOVER_LIMIT")._value.get() == 1
    assert await last.takeovers.scan() == 0


@pytest.mark.cluster(takeover=False, takeover_scan_interval=0.01)
async def test_with_takeover_off_a_dead_turn_waits_for_a_clients_resume(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    await _started(cluster, turn.message_id, 0)
    await _dies(cluster, a)
    assert await b.takeovers.scan() == 0
    assert await _row_status(cluster, "s1") is ChatStreamStatus.RUNNING
    resumed = await cluster.start(b, "s1", resume=turn.message_id)
    assert resumed.message_id == turn.message_id


async def test_a_dead_turn_that_cannot_be_resumed_ends_errored_producer_lost(
    cluster: ScriptedCluster,
) -> None:
    """The reaper: here the turn's checkpoint holds no marker of it (a producer
    of an older release), so nobody can rebuild its request."""
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = await _started(cluster, turn.message_id, 0)
    script.say("To the sea")
    await script.spoken()
    assert a.flusher is not None
    await a.flusher.flush()  # what its readers saw is recorded
    await _dies(cluster, a)
    assert cluster.stores.agent_state is not None
    await cluster.stores.agent_state.save("t", "u", "s1", {})
    assert await b.takeovers.scan() == 1
    assert b.local_turn(turn.message_id) is None
    assert await _row_status(cluster, "s1") is ChatStreamStatus.ERRORED
    assert cluster.stores.conversation is not None
    summary = await cluster.stores.conversation.get_conversation("t", "u", "s1")
    assert summary is not None and summary.last_turn_status == "errored"
    assert await _transcript_error(cluster) == "PRODUCER_LOST"
    # The partial answer its readers saw is kept, with the code.
    assert (await cluster.transcript("s1"))[-1].content == "To the sea"
    assert b.metrics.turns_reaped.labels("PRODUCER_LOST")._value.get() == 1


async def test_a_live_turn_is_never_taken(cluster: ScriptedCluster) -> None:
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    await _started(cluster, turn.message_id, 0)
    assert await b.takeovers.scan() == 0
    assert b.local_turn(turn.message_id) is None


async def test_a_lease_is_renewed_while_the_turn_waits_for_its_first_writes(
    cluster: ScriptedCluster,
) -> None:
    """A thousand turns starting at once queue for their first writes (the user
    message, the checkpoint marker): their leases must be renewed meanwhile, or
    they age past the dead threshold before their agents start (they were only
    renewed from the agent's start: 96 of 1,000 PostgreSQL turns completed)."""
    a = cluster.replica()
    store = cluster.stores.agent_state
    held = hold(store, "save_fenced" if hasattr(type(store), "save_fenced") else "save")
    starting = asyncio.ensure_future(cluster.start(a, "s1"))
    await held.reached()  # claimed; the marker's write waits in the store
    cluster.clock.advance(2)
    assert a.heartbeats is not None
    await a.heartbeats.beat()
    assert cluster.stores.supervision is not None
    row = await cluster.stores.supervision.read("t", "u", "s1")
    assert row is not None and row.heartbeat_at == cluster.clock()
    held.release()
    held.restore()
    turn = await starting
    await _started(cluster, turn.message_id, 0)


class _SeedOnlySupervision(InMemoryChatStreamSupervisionStore):
    """A supervision store written against the seed's interface: it cannot
    list its dead turns (``list_stale_running`` is the interface's default)."""

    list_stale_running = ChatStreamSupervisionStore.list_stale_running  # type: ignore[assignment]


@pytest.mark.cluster(takeover_scan_interval=0.01)
async def test_a_seed_only_supervision_store_keeps_the_clients_resume_and_says_so(
    cluster: ScriptedCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No takeover loop (nothing to list dead turns with), a warning at
    start-up naming the store, and a dead turn left to a client's resume,
    which still works."""
    cluster.stores = dataclasses.replace(cluster.stores, supervision=_SeedOnlySupervision())
    a, b = cluster.replica(), cluster.replica()
    with caplog.at_level(logging.WARNING, logger="tether.handlers.takeover"):
        await b.start()
    assert not b.takeovers.running
    [warning] = [r.getMessage() for r in caplog.records if "list dead turns" in r.getMessage()]
    assert "_SeedOnlySupervision" in warning and "client's resume" in warning

    turn = await cluster.start(a, "s1")
    first = await _started(cluster, turn.message_id, 0)
    first.say("Half")
    await first.spoken()
    await _dies(cluster, a)
    resumed = await cluster.start(b, "s1", resume=turn.message_id)
    second = await _started(cluster, turn.message_id, 1)
    second.say("Half, then whole.")
    second.finish()
    assert await cluster.ended(resumed) == "done"


async def _dead_turns_of_one_replica(cluster: ScriptedCluster, count: int) -> list[Turn]:
    """``count`` turns of one replica, in conversations s0, s1, ..., all dead."""
    a = cluster.replica()
    turns = [await cluster.start(a, f"s{n}") for n in range(count)]
    for turn in turns:
        await _started(cluster, turn.message_id, 0)
    await _dies(cluster, a)
    return turns


async def test_the_dead_turns_of_one_replica_are_taken_over_side_by_side(
    cluster: ScriptedCluster,
) -> None:
    """A killed replica's turns die together: the survivor does not wait for
    one takeover's store calls before it starts the next (it did, and the
    last of 20 started half a second after the first)."""
    first, second = await _dead_turns_of_one_replica(cluster, 2)
    b = cluster.replica()
    b.takeovers = AutomaticTakeover(b, interval=0.01, limit=2, order=_InOrder())
    store = cluster.stores.agent_state
    assert store is not None
    # The first takeover's checkpoint read waits in the store...
    held = hold(store, "load", when=lambda tenant, requester, session: session == "s0")
    scan = asyncio.ensure_future(b.takeovers.scan())
    await held.reached()
    # ...and the second turn is taken over meanwhile.
    await _started(cluster, second.message_id, 1)
    held.release()
    assert await scan == 2
    await _started(cluster, first.message_id, 1)


class _InOrder(random.Random):
    """Takes the dead turns in the order they were listed."""

    def shuffle(self, x: Any) -> None:
        x.sort(key=lambda stale: stale.session_id)


class _Refusing(AutomaticTakeover):
    """A takeover whose every attempt is refused (another replica was first),
    recording which turns it tried, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tried: list[str] = []

    async def _take(self, stale: StaleTurn) -> bool | None:
        self.tried.append(stale.session_id)
        return False


async def test_each_replica_walks_the_dead_turns_in_an_order_of_its_own(
    cluster: ScriptedCluster,
) -> None:
    # Twelve turns of one requester on one replica: over the default limit.
    cluster.settings = dataclasses.replace(cluster.settings, max_turns_per_requester=0)
    await _dead_turns_of_one_replica(cluster, 12)
    orders = []
    for seed in (1, 2):
        takeover = _Refusing(cluster.replica(), interval=0.01, limit=2, order=random.Random(seed))
        await takeover.scan()
        orders.append(takeover.tried)
    assert sorted(orders[0]) == sorted(orders[1]) == sorted(f"s{n}" for n in range(12))
    assert orders[0] != orders[1]


async def test_a_turn_a_replica_failed_to_take_is_left_to_the_others_for_a_growing_while(
    cluster: ScriptedCluster,
) -> None:
    await _dead_turns_of_one_replica(cluster, 1)
    now = [100.0]
    takeover = _Refusing(cluster.replica(), interval=0.5, limit=2, monotonic=lambda: now[0])

    async def tries_at(at: float) -> int:
        now[0] = at
        before = len(takeover.tried)
        await takeover.scan()
        return len(takeover.tried) - before

    assert await tries_at(100.0) == 1  # refused: left alone for 0.5 * 2 s
    assert await tries_at(100.9) == 0
    assert await tries_at(101.0) == 1  # refused again: for 0.5 * 4 s
    assert await tries_at(102.9) == 0
    assert await tries_at(103.0) == 1


async def test_a_scan_that_read_the_count_before_another_taker_died_does_not_run_it_again(
    cluster: ScriptedCluster,
) -> None:
    """The scan checks the takeover count, then claims. Before, a scan that read
    the count, then waited (a loaded replica) while another replica took the
    turn over, counted one more and died, claimed after all and ran the turn
    once past the limit (tests/test_takeover_processes.py saw every replica
    die, once, under load). Now the count is read again once the claim has
    fenced the checkpoint, and the turn is ended at the limit instead."""
    a = cluster.replica()
    turn = await cluster.start(a, "s1")
    await _started(cluster, turn.message_id, 0)
    await _dies(cluster, a)
    first = cluster.replica()
    assert await first.takeovers.scan() == 1  # takeover 1 of the limit of 2
    await _started(cluster, turn.message_id, 1)
    await _dies(cluster, first)

    late, other = cluster.replica(), cluster.replica()
    assert cluster.stores.supervision is not None
    resuming = hold(cluster.stores.supervision, "read")  # the late scan's claim, past its count
    scan = asyncio.create_task(late.takeovers.scan())
    await resuming.reached()
    assert await other.takeovers.scan() == 1  # takeover 2: the limit
    await _started(cluster, turn.message_id, 2)
    await _dies(cluster, other)
    resuming.release()
    assert await scan == 0
    assert late.local_turn(turn.message_id) is None  # not run a third time
    assert await cluster.replica().takeovers.scan() == 1  # (the late one backs off)
    assert await _row_status(cluster, "s1") is ChatStreamStatus.ERRORED
    assert await _transcript_error(cluster) == "TAKEOVER_LIMIT"

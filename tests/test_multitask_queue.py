"""Double texting with ``multitask_strategy="enqueue"``: the conversation's queue.

In-process replicas over one set of in-memory stores (``tests.support.scripted``),
each agent driven step by step by the test: messages are enqueued through
replicas other than the producer's, and every queued turn starts on whichever
replica ended the turn before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from tests.support.scripted import ScriptedCluster, dies_after_its_last_write, enqueued
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.queued_messages import QUEUED_SUFFIX, waiting_in
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import NotImplementedByStoreError
from tether.handlers.turn import Turn
from tether.runtime.conversation_row import CANCELLER
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent
from tether.testing.interleavings import hold

KEY = ConversationKey("t", "u", "s1")


async def _ran(cluster: ScriptedCluster, message_id: str) -> Turn:
    """Turn ``message_id`` once it has started on some replica, run to its end."""
    async with asyncio.timeout(10):
        await cluster.scripts.of(message_id).started.wait()
    turns = [r.local_turn(message_id) for r in cluster.replicas]
    started = [t for t in turns if t is not None]
    assert len(started) == 1, "exactly one replica runs a queued turn"
    assert await cluster.ended(started[0]) == "done"
    return started[0]


def _shape(transcript: list[ChatMessage]) -> list[tuple[str, str]]:
    return [(m.sender.value, m.content) for m in transcript]


async def test_queued_turns_run_one_at_a_time_in_arrival_order_from_any_replica(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    three = await cluster.enqueue(a, "s1", "Three?")
    four = await cluster.enqueue(b, "s1", "Four?")
    assert [two.position, three.position, four.position] == [1, 2, 3]

    # Recorded at once, marked queued; the status shows the queue in order.
    transcript = await cluster.transcript("s1")
    assert [m.message_id for m in transcript if m.queued is not None] == [
        f"{t.message_id}{QUEUED_SUFFIX}" for t in (two, three, four)
    ]
    status = await b.status("t", "u", "s1")
    assert status.message_id == first.message_id and status.status == "running"
    assert [w.message_id for w in status.queue] == [
        two.message_id,
        three.message_id,
        four.message_id,
    ]

    for ticket, text in ((two, "Answer two."), (three, "Answer three."), (four, "Answer four.")):
        cluster.answer(ticket.message_id, text)
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    for ticket in (two, three, four):
        await _ran(cluster, ticket.message_id)

    # One at a time: each agent read the answers of every turn before it, and
    # none of the messages still waiting behind it.
    assert _shape(cluster.scripts.of(four.message_id).inputs[0]) == [
        ("user", "One?"),
        ("bot", "Answer one."),
        ("user", "Two?"),
        ("bot", "Answer two."),
        ("user", "Three?"),
        ("bot", "Answer three."),
        ("user", "Four?"),
    ]
    assert _shape(cluster.scripts.of(two.message_id).inputs[0])[-1] == ("user", "Two?")
    assert ("user", "Three?") not in _shape(cluster.scripts.of(two.message_id).inputs[0])
    final = await cluster.transcript("s1")
    assert _shape(final) == [
        ("user", "One?"),
        ("bot", "Answer one."),
        ("user", "Two?"),
        ("bot", "Answer two."),
        ("user", "Three?"),
        ("bot", "Answer three."),
        ("user", "Four?"),
        ("bot", "Answer four."),
    ]
    assert all(m.queued is None for m in final)
    assert [m.message_id for m in final if m.sender.value == "bot"][1:] == [
        two.message_id,
        three.message_id,
        four.message_id,
    ], "each queued turn answers under the id its client was given"


async def test_an_idle_conversation_with_nothing_waiting_starts_at_once(
    cluster: ScriptedCluster,
) -> None:
    started = await cluster.replica().queue.submit(enqueued("s1", "Hello?"))
    assert isinstance(started, Turn)
    cluster.answer(started.message_id, "Hi.")
    assert await cluster.ended(started) == "done"


async def test_a_queued_turn_can_be_cancelled_from_any_replica(cluster: ScriptedCluster) -> None:
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(a, "s1", "Two?")
    three = await cluster.enqueue(a, "s1", "Three?")
    await b.cancel("t", "u", "s1", two.message_id)
    status = await a.status("t", "u", "s1")
    assert [w.message_id for w in status.queue] == [three.message_id]
    assert "Two?" not in [m.content for m in await cluster.transcript("s1")]

    cluster.answer(three.message_id, "Answer three.")
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    await _ran(cluster, three.message_id)
    assert not cluster.scripts.of(two.message_id).started.is_set()


async def _read(events: AsyncIterator[StreamEvent | StreamEnd]) -> tuple[list[str], StreamEnd]:
    texts: list[str] = []
    async with asyncio.timeout(10):
        async for item in events:
            if isinstance(item, StreamEvent):
                texts.append(item.message.content)
            else:
                return texts, item
    raise AssertionError("the stream ended without a verdict")


async def test_attaching_to_a_queued_turn_streams_it_once_it_starts(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    three = await cluster.enqueue(b, "s1", "Three?")
    events, _ = await b.attach("t", "u", "s1", two.message_id, 0)
    reading = asyncio.create_task(_read(events))
    cancelled_events, _ = await b.attach("t", "u", "s1", three.message_id, 0)
    cancelled = asyncio.create_task(_read(cancelled_events))
    await a.cancel("t", "u", "s1", three.message_id)
    assert await cancelled == ([], StreamEnd(EndReason.CANCELLED))

    cluster.answer(two.message_id, "Answer two.")
    cluster.answer(first.message_id, "Answer one.")
    texts, end = await reading
    assert texts[-1] == "Answer two." and end.reason == "done"


async def test_the_queue_drains_when_the_producer_dies(cluster: ScriptedCluster) -> None:
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    cluster.scripts.of(first.message_id).say("Half")
    await cluster.scripts.of(first.message_id).spoken()
    two = await cluster.enqueue(b, "s1", "Two?")
    cluster.answer(two.message_id, "Answer two.")

    cluster.kill_by_silence()  # a is gone; b's takeover finishes its turn
    resumed = cluster.scripts.of(first.message_id, 1)
    resumed.say(" and whole.")
    resumed.finish()
    assert await b.takeovers.scan() == 1
    taken = b.local_turn(first.message_id)
    assert taken is not None and await cluster.ended(taken) == "done"
    await _ran(cluster, two.message_id)
    assert _shape(await cluster.transcript("s1"))[-2:] == [
        ("user", "Two?"),
        ("bot", "Answer two."),
    ]


@pytest.mark.cluster(finished_turn_grace=0.0)
async def test_a_draining_replica_hands_the_next_queued_turn_to_another(
    cluster: ScriptedCluster,
) -> None:
    # No grace: a replica's background work (clean-up, the kick) ends, and is waited for.
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    cluster.answer(two.message_id, "Answer two.")
    a.draining = True
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    await a.clean_ups_done()
    supervision = cluster.stores.supervision
    assert supervision is not None
    row = await supervision.read("t", "u", "s1")
    assert row is not None and row.message_id == two.message_id
    assert row.status is ChatStreamStatus.RUNNING
    assert row.is_dead(cluster.clock(), b.dead_after), "handed off: dead at once"
    assert not cluster.scripts.of(two.message_id).started.is_set()
    assert await b.takeovers.scan() == 1
    turn = await _ran(cluster, two.message_id)
    assert b.local_turn(two.message_id) is turn


async def test_an_idle_queue_is_started_by_whoever_looks_and_by_one_replica_only(
    cluster: ScriptedCluster,
) -> None:
    """The replica that ended a turn died before it kicked the queue: the next
    status read starts the queued turn; two at once start it once."""
    gone, a, b = cluster.replica(), cluster.replica(), cluster.replica()
    first = await cluster.start(gone, "s1", "One?")
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    await gone.shutdown()  # its background work (the kick) is over or cancelled
    # A queued message as a dead kicker leaves it: recorded, never started.
    ticket = await a.queue._append(
        KEY, enqueued("s1", "Two?")
    )  # staged: as a kicker that died left it
    assert [w.message_id for w in waiting_in(await cluster.transcript("s1"))] == [ticket.message_id]
    cluster.answer(ticket.message_id, "Answer two.")
    first_look, second_look = await asyncio.gather(
        a.status("t", "u", "s1"), b.status("t", "u", "s1")
    )
    await _ran(cluster, ticket.message_id)
    assert ticket.message_id in (first_look.message_id, second_look.message_id)
    assert len(cluster.scripts.of(ticket.message_id).inputs) == 1


@pytest.mark.cluster(conversation=False)
async def test_enqueue_needs_a_store_that_keeps_the_queue(cluster: ScriptedCluster) -> None:
    with pytest.raises(NotImplementedByStoreError):
        await cluster.replica().queue.submit(enqueued("s1", "Hello?"))


async def test_an_attach_to_a_queued_turn_starting_here_follows_its_live_buffer(
    cluster: ScriptedCluster,
) -> None:
    """The queued turn is claimed on replica A and still starting (its user
    message being written) when a reader attaches to it on A: the row already
    names it, but the reader waits for the start and then reads A's live
    buffer, every message, instead of the stores' snapshots (every 0.5 s on a
    polling backend; before, that was what a queued turn's own 202 stream
    got, as it attaches the moment the row names the turn)."""
    a = cluster.replica()
    first = await cluster.start(a, "s1", "Rivers?")
    ticket = await cluster.enqueue(a, "s1", "Lakes?")
    assert cluster.stores.conversation is not None
    writing = hold(
        cluster.stores.conversation,
        "append_fenced",
        when=lambda *args, **kwargs: any(
            m.message_id == f"{ticket.message_id}-user" for m in args[4]
        ),
    )
    cluster.answer(first.message_id, "To the sea.")
    await writing.reached()  # claimed, its user message in flight
    row = await cluster.stores.supervision.read("t", "u", "s1")  # type: ignore[union-attr]
    assert row is not None and row.message_id == ticket.message_id
    attaching = asyncio.create_task(a.attach("t", "u", "s1", ticket.message_id, 0))
    await asyncio.sleep(0)  # let it look (no store call stands between)
    assert not attaching.done()
    writing.release()
    _, local = await attaching
    assert local, "read from the stores: the live buffer was not there yet"
    cluster.answer(ticket.message_id, "Still.")
    await _ran(cluster, ticket.message_id)


def _watch_start_passed_on(replica: ChatHandler) -> asyncio.Event:
    """An event set once ``replica`` has done what it does after one of its
    turns handed the conversation on (``TurnQueue.start_passed_on``)."""
    done = asyncio.Event()
    original = replica.queue.start_passed_on

    async def watched(key: ConversationKey, message_id: str, epoch: int) -> None:
        try:
            await original(key, message_id, epoch)
        finally:
            done.set()

    replica.queue.start_passed_on = watched  # type: ignore[method-assign]
    return done


@pytest.mark.parametrize("found_by", ["takeover", "status"])
async def test_a_queue_whose_replica_dies_right_after_a_turns_end_still_drains(
    cluster: ScriptedCluster, found_by: str
) -> None:
    """The turn's last write hands the conversation to the next queued turn
    (its row, dead at once), so a replica killed right after it leaves a row
    any replica's takeover (or a client's look) starts. Before, it wrote its
    verdict and its kick claimed the next turn after: killed between the two,
    the queue waited for a client to look."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    cluster.answer(two.message_id, "Answer two.")
    dies_after_its_last_write(a)
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    assert cluster.stores.supervision is not None
    row = await cluster.stores.supervision.read("t", "u", "s1")
    assert row is not None and row.message_id == two.message_id
    assert row.status is ChatStreamStatus.RUNNING and b.reads_dead(row)
    if found_by == "takeover":
        assert await b.takeovers.scan() == 1
    else:
        assert (await b.status("t", "u", "s1")).message_id == two.message_id
    assert await _ran(cluster, two.message_id) is b.local_turn(two.message_id)
    assert _shape(await cluster.transcript("s1")) == [
        ("user", "One?"),
        ("bot", "Answer one."),
        ("user", "Two?"),
        ("bot", "Answer two."),
    ]


async def test_a_queued_turn_cancelled_once_handed_the_conversation_never_runs(
    cluster: ScriptedCluster,
) -> None:
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    dies_after_its_last_write(a)
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    await b.cancel("t", "u", "s1", two.message_id)
    assert await b.queue.kick(KEY) is None  # as the cancel's own kick finds it
    assert await b.takeovers.scan() == 0
    assert not cluster.scripts.of(two.message_id).started.is_set()
    assert waiting_in(await cluster.transcript("s1")) == []
    assert (await b.status("t", "u", "s1")).status == "cancelled"


async def test_a_queued_turn_cancelled_while_the_turn_before_hands_it_over_is_skipped(
    cluster: ScriptedCluster,
) -> None:
    """The cancel lands between the ending turn's read of the queue and its
    hand-off: the hand-off names a turn that no longer waits, whose row then
    ends cancelled, and the one behind it starts."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    three = await cluster.enqueue(b, "s1", "Three?")
    cluster.answer(three.message_id, "Answer three.")
    assert cluster.stores.supervision is not None
    handing = hold(
        cluster.stores.supervision,
        "compare_and_swap",
        when=lambda *args: args[4].message_id == two.message_id,
    )
    cluster.answer(first.message_id, "Answer one.")
    await handing.reached()
    await b.cancel("t", "u", "s1", two.message_id)
    handing.release()
    assert await cluster.ended(first) == "done"
    await _ran(cluster, three.message_id)
    assert not cluster.scripts.of(two.message_id).started.is_set()
    assert _shape(await cluster.transcript("s1")) == [
        ("user", "One?"),
        ("bot", "Answer one."),
        ("user", "Three?"),
        ("bot", "Answer three."),
    ]


@pytest.mark.parametrize("ending", ["done", "errored", "cancelled", "reaped"])
async def test_a_reader_elsewhere_hears_how_the_turn_ended_once_its_row_names_the_next(
    cluster: ScriptedCluster, ending: str
) -> None:
    """A reader on another replica follows the turn; by the time it reads the
    row again, the row names the next turn: the queued one the turn handed the
    conversation to at its end (done, errored), the one an interrupt started
    (cancelled), the one queued behind a turn the reaper ended. It hears the
    turn's verdict and its last answer, from the transcript (where the answer
    says how it ended), never ``gone``, which both clients had to guess from."""
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1", "One?")
    script = cluster.scripts.of(turn.message_id)
    script.say("Half")
    await script.spoken()
    assert a.flusher is not None
    await a.flusher.flush()  # "Half" is recorded: what a cancel or the reaper keeps
    if ending != "cancelled":
        cluster.answer((await cluster.enqueue(b, "s1", "Two?")).message_id, "Answer two.")
    events, local = await b.attach("t", "u", "s1", turn.message_id, 0)
    assert not local
    first = await anext(events)
    assert isinstance(first, StreamEvent) and first.message.content == "Half"
    # The reader waits to read on (a slow client) while the turn ends and the
    # next one claims the conversation.
    if ending == "done":
        script.say(" and whole.")
        script.finish()
        assert await cluster.ended(turn) == "done"
    elif ending == "errored":
        script.fail("the model's server said no")
        assert await cluster.ended(turn) == "errored"
    elif ending == "cancelled":
        interrupting = await cluster.start(b, "s1", "Other?", strategy="interrupt")
        cluster.answer(interrupting.message_id, "Answer other.")
    else:
        await a.shutdown()
        cluster.kill_by_silence()
        assert await b.endings.end_dead_turn(
            KEY, turn.message_id, "PRODUCER_LOST", "its replica died"
        )
    async with asyncio.timeout(10):
        while (await b.status("t", "u", "s1")).message_id == turn.message_id:  # noqa: ASYNC110
            await asyncio.sleep(0)  # the next turn's claim, in the background
    texts, end = await _read(events)
    expected = {
        "done": StreamEnd(EndReason.DONE),
        "errored": StreamEnd(EndReason.ERRORED, "INTERNAL", end.error_message),
        "cancelled": StreamEnd(EndReason.CANCELLED),
        "reaped": StreamEnd(EndReason.ERRORED, "PRODUCER_LOST", "its replica died"),
    }[ending]
    assert end == expected
    assert end.error_message or ending not in ("errored", "reaped")
    answer = next(m for m in await cluster.transcript("s1") if m.message_id == turn.message_id)
    assert answer.content == ("Half and whole." if ending == "done" else "Half")
    if ending != "done":
        assert texts[-1:] == ["Half"], "the answer as kept, with the part saying why"
    else:
        assert texts[-1] == "Half and whole."
    # A reader attaching only now is told the same, not 410.
    again, _ = await b.attach("t", "u", "s1", turn.message_id, 5)
    told = [item async for item in again]
    assert told == [StreamEvent(5, answer), end]


async def test_a_handed_off_turn_started_elsewhere_is_not_cancelled_by_the_replica_handing_it(
    cluster: ScriptedCluster,
) -> None:
    """The replica whose turn handed the conversation to the next queued turn
    loses the race to start it (another replica's takeover claims first) and
    reads the queue after that turn has recorded its own user message. Its
    "no longer waiting, so cancelled before it started" must not end the
    row: the row is no longer the hand-off. Before, it wrote ``cancelled``
    over the running turn, whose answer was then lost."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    three = await cluster.enqueue(b, "s1", "Three?")
    assert cluster.stores.supervision is not None and first.lease is not None
    hand_off_epoch = first.lease.epoch + 1
    claiming = hold(
        cluster.stores.supervision,
        "compare_and_swap",
        when=lambda *args: args[4].message_id == two.message_id and args[3] == hand_off_epoch,
    )
    passed_on = _watch_start_passed_on(a)
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    await claiming.reached()  # a's claim of "Two?", in flight
    assert await b.takeovers.scan() == 1
    async with asyncio.timeout(10):
        await cluster.scripts.of(two.message_id).started.wait()
    claiming.release()  # a's claim lands late, and loses
    async with asyncio.timeout(10):
        await passed_on.wait()
    row = await cluster.stores.supervision.read("t", "u", "s1")
    assert row is not None and row.message_id == two.message_id
    assert row.status is ChatStreamStatus.RUNNING and not b.reads_dead(row)
    cluster.answer(two.message_id, "Answer two.")
    cluster.answer(three.message_id, "Answer three.")
    assert await _ran(cluster, two.message_id) is b.local_turn(two.message_id)
    await _ran(cluster, three.message_id)
    assert _shape(await cluster.transcript("s1")) == [
        ("user", "One?"),
        ("bot", "Answer one."),
        ("user", "Two?"),
        ("bot", "Answer two."),
        ("user", "Three?"),
        ("bot", "Answer three."),
    ]


def _claims_turn(message_id: str) -> Callable[..., bool]:
    """A supervision compare-and-swap that grants ``message_id`` a running row
    for its own producer (a start's claim, not a cancel's)."""

    def matches(*args: object) -> bool:
        row = args[4]
        assert isinstance(row, ChatStreamSupervision)
        return (
            row.message_id == message_id
            and row.status is ChatStreamStatus.RUNNING
            and row.producer != CANCELLER
        )

    return matches


async def test_a_queued_turn_is_cancelled_while_a_start_of_the_one_before_it_holds_the_fences(
    cluster: ScriptedCluster,
) -> None:
    """Cancelling the running turn kicks the queue: the start of the head has
    fenced the transcript at the next epoch and its grant is on the way. A
    cancel of a turn further back read the row below that fence, so its
    removal is refused, and every read again finds the same row until the
    grant lands. Before, it gave up after four reads with 409, and a client
    cancelling a whole queue at once had to retry most of them."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    three = await cluster.enqueue(b, "s1", "Three?")
    cluster.answer(two.message_id, "Answer two.")
    assert cluster.stores.supervision is not None
    granting = hold(
        cluster.stores.supervision, "compare_and_swap", when=_claims_turn(two.message_id)
    )
    await a.cancel("t", "u", "s1", first.message_id)
    await granting.reached()  # the kick's start of "Two?": fences raised, grant held

    await b.cancel("t", "u", "s1", three.message_id)

    granting.release()
    await _ran(cluster, two.message_id)
    assert not cluster.scripts.of(three.message_id).started.is_set()
    assert waiting_in(await cluster.transcript("s1")) == []
    assert "Three?" not in [m.content for m in await cluster.transcript("s1")]


async def test_a_queued_turn_is_cancelled_after_a_start_gave_up_with_the_fences_raised(
    cluster: ScriptedCluster,
) -> None:
    """A kick's start of the head finds it cancelled once the transcript is
    fenced, and gives up without taking the row: the fence stays one epoch
    above the row. A cancel of the next queued turn, made before the kick
    tries again, must not depend on that kick to move the row on."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    three = await cluster.enqueue(b, "s1", "Three?")
    four = await cluster.enqueue(b, "s1", "Four?")
    cluster.answer(four.message_id, "Answer four.")
    conversations = cluster.stores.conversation
    supervision = cluster.stores.supervision
    assert conversations is not None and supervision is not None
    after = (await supervision.last_epoch("t", "u", "s1")) + 2  # the cancel's END and FINISH
    fencing = hold(conversations, "fence", when=lambda *args: args[3] == after + 1)
    await a.cancel("t", "u", "s1", first.message_id)
    await fencing.reached()  # the kick's start of "Two?", before its fence
    # Taken out below the fence (its own kick left out: one kicker is staged).
    await b.cancel("t", "u", "s1", two.message_id, kick=False)
    restarting = hold(supervision, "compare_and_swap", when=_claims_turn(three.message_id))
    fencing.release()
    await restarting.reached()  # "Two?" was gone: the kick tries "Three?"

    await b.cancel("t", "u", "s1", three.message_id)

    restarting.release()
    await _ran(cluster, four.message_id)
    for cancelled in (two, three):
        assert not cluster.scripts.of(cancelled.message_id).started.is_set()
    assert _shape(await cluster.transcript("s1"))[-2:] == [
        ("user", "Four?"),
        ("bot", "Answer four."),
    ]


async def test_a_queued_turn_is_cancelled_while_a_cancel_of_the_running_one_holds_the_fences(
    cluster: ScriptedCluster,
) -> None:
    """Cancelling a whole queue at once, running turn included: the cancel of
    the running turn has fenced the stores at the next epoch and its write of
    the row is on the way. A cancel of a queued turn made meanwhile is refused
    at the row's epoch and reads the same row again: it waits for that write,
    not answers 409."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    three = await cluster.enqueue(b, "s1", "Three?")
    conversations, supervision = cluster.stores.conversation, cluster.stores.supervision
    assert conversations is not None and supervision is not None
    ending = hold(
        supervision,
        "compare_and_swap",
        when=lambda *args: args[4].message_id == first.message_id and args[4].producer == CANCELLER,
    )
    cancelling_first = asyncio.create_task(a.cancel("t", "u", "s1", first.message_id))
    await ending.reached()
    removals: list[int] = []
    fifth = asyncio.Event()

    def counted(*args: object, **kwargs: object) -> bool:
        if args[3] == [f"{three.message_id}{QUEUED_SUFFIX}"]:
            removals.append(int(str(kwargs["epoch"])))
            if len(removals) == 5:
                fifth.set()
        return False  # only counted, never held

    hold(conversations, "remove_fenced", when=counted)
    cancelling_three = asyncio.create_task(b.cancel("t", "u", "s1", three.message_id))
    # Five refused removals, the cancel still going (before, it gave up after four).
    fifth_seen = asyncio.create_task(fifth.wait())
    done, _ = await asyncio.wait(
        {cancelling_three, fifth_seen}, timeout=10, return_when="FIRST_COMPLETED"
    )
    if cancelling_three in done:
        await cancelling_three  # its error, if it gave up
    assert fifth_seen in done and not cancelling_three.done()
    ending.release()

    await cancelling_three
    await cancelling_first
    cluster.answer(two.message_id, "Answer two.")  # only now: its end would start "Three?"
    await _ran(cluster, two.message_id)
    assert not cluster.scripts.of(three.message_id).started.is_set()
    assert "Three?" not in [m.content for m in await cluster.transcript("s1")]

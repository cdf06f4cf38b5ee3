"""The conversation's row under the races that broke it (``runtime.conversation_row``).

Each test stages one interleaving that lost an answer, ran a cancelled turn
or left erased data behind, deterministically: in-process replicas over one
set of in-memory stores (``tests.support.scripted``), a manual clock, and a
store call held at a named point (``tether.testing.interleavings.hold``)
while another replica acts. Each failed before the row had one owner.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.scripted import ScriptedCluster, dies_after_its_last_write
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_request import MultitaskStrategy
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.domain.queued_messages import queued_id, waiting_in
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.erase import erase_conversation
from tether.handlers.errors import ConversationBusyError, TurnEndedError, TurnNotFoundError
from tether.handlers.queue import Ticket
from tether.handlers.turn import Turn
from tether.handlers.turn_ends import ending_of
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent
from tether.testing.interleavings import Hold, hold

KEY = ConversationKey("t", "u", "s1")


async def _half_said(cluster: ScriptedCluster, replica: ChatHandler, turn: Turn) -> None:
    """``turn`` has said "Half", checkpointed it, and its recording holds it,
    as after a flush."""
    script = cluster.scripts.of(turn.message_id)
    script.say("Half")
    script.checkpoint()
    script.say("")  # spoken once the checkpoint is made
    await script.spoken(2)
    assert replica.flusher is not None
    await replica.flusher.flush()


def _shape(transcript: list[ChatMessage]) -> list[tuple[str, str]]:
    return [(m.sender.value, m.content) for m in transcript if m.queued is None]


def _bot(transcript: list[ChatMessage], message_id: str) -> ChatMessage:
    return next(
        m for m in transcript if m.message_id == message_id and m.sender is ChatMessageSender.BOT
    )


async def _events(replica: ChatHandler, message_id: str) -> list[StreamEvent | StreamEnd]:
    events, _ = await replica.attach("t", "u", "s1", message_id, 0)
    async with asyncio.timeout(10):
        return [item async for item in events]


async def _passed_on_to_a_queued_turn(
    cluster: ScriptedCluster,
) -> tuple[ChatHandler, ChatHandler, Ticket]:
    """Turn One ended and passed the row on to the queued turn Two, and its
    replica died before starting Two; two more replicas live."""
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    dies_after_its_last_write(a)
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    return b, c, two


def _holding_its_copy(cluster: ScriptedCluster, queued: Ticket) -> Hold:
    """Hold the first removal of ``queued``'s copy from the transcript."""
    assert cluster.stores.conversation is not None
    return hold(
        cluster.stores.conversation,
        "remove_fenced",
        when=lambda *args, **kwargs: queued_id(queued.message_id) in args[3],
    )


# 1 -------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["reject", "enqueue", "interrupt", "rollback"])
async def test_a_new_message_over_a_dead_turn_keeps_that_turns_answer(
    cluster: ScriptedCluster, strategy: MultitaskStrategy
) -> None:
    """Its producer died and no takeover has claimed it yet. Before, the new
    turn's claim took the dead row: the dead turn got no verdict, its recorded
    partial never reached the transcript, and two user messages stood in a
    row. Now each strategy keeps it: the seed's ends it with what it recorded,
    enqueue waits for its takeover, interrupt cancels it (rollback removes it)."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    await _half_said(cluster, a, first)
    cluster.kill_by_silence()

    if strategy == "enqueue":
        second_id = (await cluster.enqueue(b, "s1", "Two?")).message_id
        cluster.answer(first.message_id, " and whole.", producer=1)
        cluster.answer(second_id, "Answer two.")
        assert await b.takeovers.scan() == 1  # the dead turn first
    else:
        second = await cluster.start(b, "s1", "Two?", strategy=strategy)
        second_id = second.message_id
        cluster.answer(second_id, "Answer two.")
    async with asyncio.timeout(10):
        await cluster.scripts.of(second_id).started.wait()
    runs = [t for r in cluster.replicas if (t := r.local_turn(second_id)) is not None]
    assert await cluster.ended(runs[0]) == "done"

    transcript = await cluster.transcript("s1")
    expected = {
        "reject": [("user", "One?"), ("bot", "Half")],
        "enqueue": [("user", "One?"), ("bot", "Half and whole.")],
        "interrupt": [("user", "One?"), ("bot", "Half")],
        "rollback": [],
    }[strategy]
    assert _shape(transcript) == [*expected, ("user", "Two?"), ("bot", "Answer two.")]
    if strategy != "rollback":
        verdict = {"reject": "errored", "enqueue": "done", "interrupt": "cancelled"}[strategy]
        assert ending_of(_bot(transcript, first.message_id)).reason == verdict


# 2 -------------------------------------------------------------------------


async def test_a_queued_turn_whose_cancel_returned_never_produces(
    cluster: ScriptedCluster,
) -> None:
    """The turn before passed the row on to the queued turn and its replica
    died before starting it. Before, the cancel wrote the verdict, then took
    the turn out of the queue; a status poll elsewhere started it in between,
    the removal was refused unseen, and the cancel answered OK while the
    turn ran on. Now the turn leaves the queue first; a start that wins the
    race is cancelled as a running turn before the cancel answers."""
    b, c, two = await _passed_on_to_a_queued_turn(cluster)
    removing = _holding_its_copy(cluster, two)
    cancel = asyncio.create_task(b.cancel("t", "u", "s1", two.message_id))
    await removing.reached()
    await c.status("t", "u", "s1")  # kicks the queue
    removing.release()
    await cancel  # it answered OK

    cluster.answer(two.message_id, "Answer two.")
    (started,) = [t for r in cluster.replicas if (t := r.local_turn(two.message_id)) is not None]
    assert await cluster.ended(started) == "cancelled"
    # The poll's start won the race, and was cancelled before it produced.
    transcript = await cluster.transcript("s1")
    assert _shape(transcript) == [
        ("user", "One?"),
        ("bot", "Answer one."),
        ("user", "Two?"),
        ("bot", ""),
    ]
    assert ending_of(_bot(transcript, two.message_id)).reason == "cancelled"
    assert waiting_in(transcript) == []
    assert (await b.status("t", "u", "s1")).status == "cancelled"


# 3 -------------------------------------------------------------------------


async def test_an_erase_racing_the_takeover_of_a_dead_turn_leaves_nothing(
    cluster: ScriptedCluster,
) -> None:
    """Before, the erase raised the fences but never took the row: the
    takeover claimed the next epoch and, after the erase had returned, the
    taker wrote the checkpoint (with the user's question), the recording and
    a row back. Now the erase holds the row while it erases."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    await _half_said(cluster, a, first)
    cluster.kill_by_silence()
    stores = cluster.stores
    assert stores.agent_state is not None and stores.recording is not None
    assert stores.supervision is not None and stores.conversation is not None

    erasing = hold(stores.agent_state, "delete")
    erase = asyncio.create_task(
        erase_conversation(stores, "t", "u", "s1", clock=b.clock, dead_after=b.dead_after)
    )
    await erasing.reached()
    cluster.answer(first.message_id, " and whole.", producer=1)
    await b.takeovers.scan()
    erasing.release()
    assert await erase
    for replica in cluster.replicas:
        if (turn := replica.local_turn(first.message_id)) is not None and turn.task is not None:
            async with asyncio.timeout(10):
                await asyncio.wait([turn.task])
    await b.takeovers.scan()

    assert await stores.agent_state.load("t", "u", "s1") == {}
    assert await stores.recording.read("t", "u", "s1") is None
    assert await stores.supervision.read("t", "u", "s1") is None
    assert await stores.conversation.get_transcript("t", "u", "s1") == []
    assert await stores.conversation.get_conversation("t", "u", "s1") is None


# 4 -------------------------------------------------------------------------


async def test_a_cancels_partial_answer_is_kept_before_the_next_turn_starts(
    cluster: ScriptedCluster,
) -> None:
    """Before, the cancel freed the conversation and then appended the
    partial answer; a queued turn kicked by a status poll claimed in the gap
    and the append was refused unseen, and readers of the cancelled turn got
    410. Now the partial is kept while the cancel still holds the row."""
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    await _half_said(cluster, a, first)
    two = await cluster.enqueue(b, "s1", "Two?")
    cluster.answer(two.message_id, "Answer two.")

    assert cluster.stores.conversation is not None
    keeping = hold(
        cluster.stores.conversation,
        "append_fenced",
        when=lambda *args, **kwargs: any(m.message_id == first.message_id for m in args[4]),
    )
    cancel = asyncio.create_task(b.cancel("t", "u", "s1", first.message_id))
    await keeping.reached()
    await c.status("t", "u", "s1")  # kicks the queue
    keeping.release()
    await cancel

    async with asyncio.timeout(10):
        await cluster.scripts.of(two.message_id).started.wait()
    runs = [t for r in cluster.replicas if (t := r.local_turn(two.message_id)) is not None]
    assert await cluster.ended(runs[0]) == "done"
    transcript = await cluster.transcript("s1")
    assert _shape(transcript) == [
        ("user", "One?"),
        ("bot", "Half"),
        ("user", "Two?"),
        ("bot", "Answer two."),
    ]
    assert ending_of(_bot(transcript, first.message_id)).reason == "cancelled"
    events = await _events(c, first.message_id)
    assert events[-1] == StreamEnd(EndReason.CANCELLED)


# 5 -------------------------------------------------------------------------


async def test_a_queued_turn_cancelled_during_the_hand_off_ends_cancelled(
    cluster: ScriptedCluster,
) -> None:
    """The cancel takes the queued turn out of the queue while the turn
    before is handing the row to it, and that replica dies before starting
    it. Before, the takeover then ended it errored (PRODUCER_LOST), with an
    empty answer after no question, and the conversation's last turn read
    errored. Now a turn whose question was never recorded ends cancelled,
    and nothing is written to its transcript."""
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    two = await cluster.enqueue(b, "s1", "Two?")
    dies_after_its_last_write(a)
    assert cluster.stores.supervision is not None and cluster.stores.conversation is not None
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

    await c.takeovers.scan()
    assert not cluster.scripts.of(two.message_id).started.is_set()
    assert _shape(await cluster.transcript("s1")) == [("user", "One?"), ("bot", "Answer one.")]
    row = await cluster.stores.supervision.read("t", "u", "s1")
    assert row is not None and row.message_id == two.message_id
    assert row.status is ChatStreamStatus.CANCELLED
    summary = await cluster.stores.conversation.get_conversation("t", "u", "s1")
    assert summary is not None and summary.last_turn_status == "complete"


# Found by the simulator after the row had one owner ----------------------


async def test_a_cancel_that_died_half_way_ends_cancelled_under_a_new_message(
    cluster: ScriptedCluster,
) -> None:
    """A cancel took the row (``ENDING``) and its replica died before it wrote
    the verdict. Before, the next message ended the turn as a dead producer's
    (``errored``), and the cancel's own retry, finding the row taken again,
    then wrote ``cancelled`` into the row over the errored answer: the row
    and the transcript told two endings (``tether simulate`` seed
    1005424036). Now whoever finishes a cancel that died half way finishes
    it as a cancel."""
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    await _half_said(cluster, a, first)
    assert cluster.stores.conversation is not None
    keeping = hold(
        cluster.stores.conversation,
        "append_fenced",
        when=lambda *args, **kwargs: any(m.message_id == first.message_id for m in args[4]),
    )
    cancel = asyncio.create_task(b.cancel("t", "u", "s1", first.message_id))
    await keeping.reached()
    cancel.cancel()  # the cancel's replica dies holding the row
    with pytest.raises(asyncio.CancelledError):
        await cancel
    keeping.release()
    cluster.kill_by_silence()

    second = await cluster.start(c, "s1", "Two?")
    cluster.answer(second.message_id, "Answer two.")
    assert await cluster.ended(second) == "done"
    transcript = await cluster.transcript("s1")
    assert _shape(transcript) == [
        ("user", "One?"),
        ("bot", "Half"),
        ("user", "Two?"),
        ("bot", "Answer two."),
    ]
    assert ending_of(_bot(transcript, first.message_id)).reason == "cancelled"


async def test_a_verdict_written_before_its_writer_died_is_the_one_the_row_keeps(
    cluster: ScriptedCluster,
) -> None:
    """The producer sealed its whole answer in the transcript and died before
    its row said ``done``. Before, a cancel then took the row, kept the
    sealed answer (the append is idempotent) and wrote ``cancelled`` into the
    row, answering OK for a turn the transcript says was done. Now the taker
    finishes the row with the verdict already written, and the cancel says
    the turn had ended."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    assert cluster.stores.supervision is not None
    finishing = hold(
        cluster.stores.supervision,
        "compare_and_swap",
        when=lambda *args: args[4].status is ChatStreamStatus.DONE,
    )
    cluster.answer(first.message_id, "Answer one.")
    await finishing.reached()
    assert first.task is not None
    first.task.cancel()  # the producer dies between its seal and its row
    async with asyncio.timeout(10):
        await asyncio.wait([first.task])
    finishing.release()
    cluster.kill_by_silence()

    with pytest.raises(TurnEndedError):
        await b.cancel("t", "u", "s1", first.message_id)
    row = await cluster.stores.supervision.read("t", "u", "s1")
    assert row is not None and row.status is ChatStreamStatus.DONE
    transcript = await cluster.transcript("s1")
    assert _shape(transcript) == [("user", "One?"), ("bot", "Answer one.")]
    assert ending_of(_bot(transcript, first.message_id)).reason == "done"


@pytest.mark.cluster(push=False)
async def test_a_turn_cancelled_before_its_agent_starts_never_starts_it(
    cluster: ScriptedCluster,
) -> None:
    """The turn was claimed and marked; before its agent ran, a cancel on
    another replica took the row and answered OK (no push channel: the
    producer hears of it only at a fenced write). Before, the agent started
    all the same and made its model call (``tether simulate`` seed
    661026026). Now a turn renews its lease, fenced, after reading its input
    and right before its agent starts: a cancel that came first stops it."""
    a, b = cluster.replica(), cluster.replica()
    creating = hold(a.registries, "create_agent")
    first = await cluster.start(a, "s1", "One?")
    await creating.reached()
    await b.cancel("t", "u", "s1", first.message_id)  # answered OK
    cluster.answer(first.message_id, "Answer one.")
    creating.release()
    assert first.task is not None
    async with asyncio.timeout(10):
        await asyncio.wait([first.task])

    assert not cluster.scripts.of(first.message_id).started.is_set()
    transcript = await cluster.transcript("s1")
    assert _shape(transcript) == [("user", "One?"), ("bot", "")]
    assert ending_of(_bot(transcript, first.message_id)).reason == "cancelled"


# Found by the crash test's erase rounds -------------------------------------


async def test_an_erased_conversation_is_not_told_of_from_a_replicas_memory(
    cluster: ScriptedCluster,
) -> None:
    """The turn ended on replica a, then its conversation was erased. Before,
    a's memory of the turn (kept for late readers) still answered the status
    (``done``) and streamed the whole erased answer to an attach. Now a
    finished turn is served from memory only while its row names it."""
    a = cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    cluster.answer(first.message_id, "Answer one.")
    assert await cluster.ended(first) == "done"
    assert a.local_turn(first.message_id) is not None  # still remembered

    assert await erase_conversation(
        cluster.stores, "t", "u", "s1", clock=a.clock, dead_after=a.dead_after
    )
    with pytest.raises(TurnNotFoundError):
        await a.status("t", "u", "s1")
    with pytest.raises(TurnEndedError):
        await a.attach("t", "u", "s1", first.message_id, 0)


async def test_a_cancel_between_the_seal_and_its_row_leaves_the_answer_done(
    cluster: ScriptedCluster,
) -> None:
    """The producer wrote its whole answer into the transcript; before its row
    said ``done``, a cancel from another replica took the row. The cancel
    finishes the row with the verdict written (``done``) and answers that the
    turn had ended. Before, the producer's refused row write told its readers
    ``cancelled`` (or ``gone``) for a turn the transcript and the row say was
    done (the crash test's cancel-at-end rounds)."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    assert cluster.stores.supervision is not None and first.lease is not None
    epoch = first.lease.epoch
    finishing = hold(
        cluster.stores.supervision,
        "compare_and_swap",
        when=lambda *args: args[4].status is ChatStreamStatus.DONE and args[3] == epoch,
    )
    cluster.answer(first.message_id, "Answer one.")
    await finishing.reached()
    with pytest.raises(TurnEndedError):
        await b.cancel("t", "u", "s1", first.message_id)
    finishing.release()

    assert await cluster.ended(first) == "done"
    row = await cluster.stores.supervision.read("t", "u", "s1")
    assert row is not None and row.status is ChatStreamStatus.DONE
    transcript = await cluster.transcript("s1")
    assert ending_of(_bot(transcript, first.message_id)).reason == "done"


async def test_an_erase_that_died_half_way_is_finished_by_the_takeover_scan(
    cluster: ScriptedCluster,
) -> None:
    """An erase (or retention's) killed after it took the row left a dead
    tombstone that nothing finished: the conversation stayed half erased, its
    row RUNNING for ever, and every takeover scan listed it again, a batch
    slot lost for good (``tether simulate`` seeds 640167408, 869320828,
    1011549266). Now the scan finishes a dead erase, as it does a dead cancel:
    the owner (or the retention policy) asked for it."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    cluster.answer(first.message_id, "One.")
    assert await cluster.ended(first) == "done"
    stores = cluster.stores
    assert stores.agent_state is not None and stores.supervision is not None
    assert stores.conversation is not None

    erasing = hold(stores.agent_state, "delete")
    erase = asyncio.create_task(
        erase_conversation(stores, "t", "u", "s1", clock=a.clock, dead_after=a.dead_after)
    )
    await erasing.reached()
    erase.cancel()  # the erasing replica dies holding the tombstone
    with pytest.raises(asyncio.CancelledError):
        await erase
    erasing.release()
    tombstone = await stores.supervision.read("t", "u", "s1")
    assert tombstone is not None and tombstone.status is ChatStreamStatus.RUNNING

    cluster.kill_by_silence()
    await b.takeovers.scan()

    assert await stores.supervision.read("t", "u", "s1") is None
    assert await stores.conversation.get_conversation("t", "u", "s1") is None
    assert await stores.agent_state.load("t", "u", "s1") == {}


async def test_a_rolled_back_turn_whose_start_was_fenced_never_runs_again(
    cluster: ScriptedCluster,
) -> None:
    """A queued turn's start recorded its question, then stopped before it
    took its queued copy out; a rollback cancelled the turn and removed its
    question and answer. Before, the lone copy read as waiting again, so the
    next turn's end passed the conversation on to it and the cancelled turn
    ran (``tether simulate`` seed 2030845472). Now the cancel, and the
    rollback, take the copy out too. And the status poll whose kick made
    that start was itself answered with the start's ``FencedError`` (a 500
    over HTTP); now a kick reads the conversation again."""
    b, c, two = await _passed_on_to_a_queued_turn(cluster)
    taking_out = _holding_its_copy(cluster, two)
    poll = asyncio.create_task(c.status("t", "u", "s1"))  # kicks the queue: Two starts
    await taking_out.reached()  # its question is recorded, its copy not yet out
    third = await cluster.start(b, "s1", "Three?", strategy="rollback")
    taking_out.release()
    await poll
    cluster.answer(third.message_id, "Answer three.")
    assert await cluster.ended(third) == "done"
    for replica in cluster.replicas:
        await replica.queue.kick(KEY)

    transcript = await cluster.transcript("s1")
    assert _shape(transcript) == [
        ("user", "One?"),
        ("bot", "Answer one."),
        ("user", "Three?"),
        ("bot", "Answer three."),
    ]
    assert waiting_in(transcript) == []
    assert not cluster.scripts.of(two.message_id).started.is_set()  # its agent never ran
    assert (await b.status("t", "u", "s1")).message_id == third.message_id


async def test_an_interrupt_never_cancels_an_erase_in_progress(cluster: ScriptedCluster) -> None:
    """An interrupt cancels the turn that occupies the conversation. Before,
    it took an erase's tombstone for a turn: it "cancelled" it (a verdict for
    ``tether/erasing``), deleted the row and claimed the conversation while
    the erase was half way (``tether simulate`` seed 2045729741). Now the
    cancel refuses an erase, and the interrupt answers 409 while it runs."""
    a, b = cluster.replica(), cluster.replica()
    first = await cluster.start(a, "s1", "One?")
    cluster.answer(first.message_id, "One.")
    assert await cluster.ended(first) == "done"
    stores = cluster.stores
    assert stores.agent_state is not None and stores.conversation is not None

    erasing = hold(stores.agent_state, "delete")
    erase = asyncio.create_task(b.erase("t", "u", "s1"))
    await erasing.reached()  # the erase holds the row
    with pytest.raises(ConversationBusyError):
        await cluster.start(a, "s1", "Two?", strategy="interrupt")
    erasing.release()
    assert await erase
    assert await stores.conversation.get_conversation("t", "u", "s1") is None
    assert await stores.conversation.get_transcript("t", "u", "s1") == []


async def test_readers_hear_cancelled_once_the_kept_answer_is_in_the_transcript(
    cluster: ScriptedCluster,
) -> None:
    """A chat page re-reads the transcript when its stream says ``cancelled``.
    Before, the producer's readers heard it as soon as the canceller took the
    row, before it had kept the partial answer: the page then found no answer
    and showed an empty bubble (``tests/test_chat_page.py`` failed so, under
    load). Now they hear it once the cancel's verdict is written: here the
    cancel is the producing replica's own; a producer fenced by another
    replica's cancel waits for the verdict too (``producer_watch``)."""
    a = cluster.replica()
    turn = await cluster.start(a, "s1", "One?")
    await _half_said(cluster, a, turn)
    store = cluster.stores.supervision
    assert store is not None
    order: list[str] = []
    swap = store.compare_and_swap

    async def logged(*args: object, **kwargs: object) -> bool:
        written = await swap(*args, **kwargs)  # type: ignore[arg-type]
        row = args[4] if len(args) > 4 else kwargs.get("supervision")
        if written and getattr(row, "status", None) is ChatStreamStatus.CANCELLED:
            order.append("verdict")
        return written

    store.compare_and_swap = logged  # type: ignore[method-assign]
    events, _ = await a.attach("t", "u", "s1", turn.message_id, 0)

    async def read() -> None:
        async for item in events:
            if isinstance(item, StreamEnd):
                order.append(f"told {item.reason}")

    reader = asyncio.create_task(read())
    await a.cancel("t", "u", "s1", turn.message_id)
    async with asyncio.timeout(10):
        await reader
    assert order == ["verdict", "told cancelled"]
    assert _shape(await cluster.transcript("s1")) == [("user", "One?"), ("bot", "Half")]

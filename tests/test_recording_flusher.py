"""The replica's recording flusher: one batch in flight for all turns, fenced per turn, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from tether.adapters.memory import InMemoryChatStreamRecordingStore
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingPut
from tether.domain.store_errors import StoreCorruptedError, StoreUnavailableError
from tether.runtime.recording_flusher import RecordingFencedOut, RecordingFlusher


class CountingStore(InMemoryChatStreamRecordingStore):
    """The real in-memory store, counting batches and able to go down or break."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.single_puts = 0
        self.down = False
        self.broken_session: str | None = None
        self.gate: asyncio.Event | None = None
        self.batch_started = asyncio.Event()

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        if self.down:
            raise StoreUnavailableError("store unreachable")
        if self.broken_session in {p.session_id for p in puts}:
            raise StoreCorruptedError("one damaged row")
        self.batches.append([f"{p.session_id}:{p.event.index}" for p in puts])
        self.batch_started.set()
        if self.gate is not None:
            await self.gate.wait()
        return await super().put_many(puts)

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        self.single_puts += 1
        if session_id == self.broken_session:
            raise StoreCorruptedError("one damaged row")
        await super().put(tenant, requester_uuid, session_id, event)


def _put(session: str, index: int, epoch: int = 1) -> RecordingPut:
    message = ChatMessage(sender=ChatMessageSender.BOT, content=f"{session} {index}")
    event = RecordedStreamEvent(index=index, message=message, message_id=session, epoch=epoch)
    return RecordingPut("t", "u", session, event)


class FakeTurn:
    """What a turn gives the flusher: its newest unflushed message, and its fate."""

    def __init__(self, session: str, epoch: int = 1) -> None:
        self.session = session
        self.epoch = epoch
        self.latest = -1
        self.flushed = -1
        self.fenced = False
        self.failed: BaseException | None = None

    def pending(self) -> RecordingPut | None:
        if self.latest <= self.flushed or self.fenced:
            return None
        return _put(self.session, self.latest, self.epoch)

    def written(self, put: RecordingPut) -> None:
        self.flushed = max(self.flushed, put.event.index)

    def on_fenced(self) -> None:
        self.fenced = True

    def on_failed(self, error: BaseException) -> None:
        self.failed = error

    def hold(self, flusher: RecordingFlusher) -> None:
        flusher.add(self, self.pending, self.written, self.on_fenced, self.on_failed)


def _turns(count: int, flusher: RecordingFlusher) -> list[FakeTurn]:
    turns = [FakeTurn(f"s{i}") for i in range(count)]
    for turn in turns:
        turn.hold(flusher)
    return turns


async def test_one_batch_writes_every_turn_with_something_new() -> None:
    store = CountingStore()
    flusher = RecordingFlusher(store, retry_interval=60.0)
    turns = _turns(50, flusher)
    for turn in turns[:40]:
        turn.latest = 3
    await flusher.flush()
    assert len(store.batches) == 1 and len(store.batches[0]) == 40
    await flusher.flush()  # nothing new since: no round trip at all
    assert len(store.batches) == 1
    assert [t.flushed for t in turns] == [3] * 40 + [-1] * 10
    assert (await store.read("t", "u", "s0")) == _put("s0", 3).event
    await flusher.aclose()


async def test_a_fenced_put_stops_only_its_own_turn_and_it_is_never_flushed_again() -> None:
    store = CountingStore()
    flusher = RecordingFlusher(store, retry_interval=60.0)
    first, second = _turns(2, flusher)
    successor = _put("s0", 9, epoch=2)
    await store.put("t", "u", "s0", successor.event)
    store.batches.clear()
    first.latest = second.latest = 1
    await flusher.flush()
    assert first.fenced and not second.fenced
    assert (await store.read("t", "u", "s0")) == successor.event  # untouched
    first.fenced = False  # even if the turn kept producing, it is no longer held
    first.latest = second.latest = 2
    await flusher.flush()
    assert store.batches == [["s0:1", "s1:1"], ["s1:2"]]
    await flusher.aclose()


async def test_an_outage_is_retried_next_interval_and_fails_no_turn() -> None:
    store = CountingStore()
    flusher = RecordingFlusher(store, retry_interval=60.0)
    (turn,) = _turns(1, flusher)
    turn.latest = 1
    store.down = True
    await flusher.flush()
    assert turn.flushed == -1 and turn.failed is None and not turn.fenced
    store.down = False
    await flusher.flush()
    assert turn.flushed == 1
    await flusher.aclose()


async def test_a_batch_that_fails_otherwise_is_narrowed_to_the_turn_whose_put_fails() -> None:
    store = CountingStore()
    flusher = RecordingFlusher(store, retry_interval=60.0)
    turns = _turns(3, flusher)
    for turn in turns:
        turn.latest = 1
    store.broken_session = "s1"
    await flusher.flush()
    assert [t.flushed for t in turns] == [1, -1, 1]
    assert isinstance(turns[1].failed, StoreCorruptedError)
    assert turns[0].failed is None and turns[2].failed is None
    turns[1].latest = 2
    store.broken_session = None
    await flusher.flush()  # the failed turn was let go; the others have nothing new
    assert turns[1].flushed == -1
    await flusher.aclose()


async def test_a_message_goes_out_at_once_and_messages_wait_only_for_the_batch_in_flight() -> None:
    store = CountingStore()
    flusher = RecordingFlusher(store, retry_interval=60.0)
    turns = _turns(3, flusher)
    store.gate = asyncio.Event()
    turns[0].latest = 1
    flusher.wake()  # the channel is idle: the message goes out at once
    await store.batch_started.wait()
    assert store.batches == [["s0:1"]]
    # While that batch is in flight, the turns' new messages accumulate (only
    # each turn's newest) and go together in the next batch.
    turns[0].latest = 2
    flusher.wake()
    turns[0].latest = 3
    for turn in turns[1:]:
        turn.latest = 1
        flusher.wake()
    recorded = asyncio.create_task(flusher.flush_now(turns[2]))
    assert store.batches == [["s0:1"]]
    store.gate.set()
    await recorded
    assert store.batches == [["s0:1"], ["s0:3", "s1:1", "s2:1"]]
    assert [t.flushed for t in turns] == [3, 1, 1]
    await flusher.aclose()


async def test_flush_now_waits_for_what_the_turn_produced_after_the_batch_in_flight() -> None:
    store = CountingStore()
    flusher = RecordingFlusher(store, retry_interval=60.0)
    (turn,) = _turns(1, flusher)
    turn.latest = 4
    store.gate = asyncio.Event()
    flusher.wake()
    await store.batch_started.wait()  # index 4 is in flight
    turn.latest = 9
    final = asyncio.create_task(flusher.flush_now(turn))
    store.gate.set()
    await final
    # Not answered by the batch in flight: its own came after it, in order.
    assert store.batches == [["s0:4"], ["s0:9"]]
    assert (await store.read("t", "u", "s0")) == _put("s0", 9).event
    assert turn.flushed == 9
    await flusher.flush_now(turn)  # nothing new: no batch at all
    assert len(store.batches) == 2
    await flusher.aclose()


async def test_flush_nows_of_many_turns_share_one_batch_and_a_fenced_one_raises() -> None:
    store = CountingStore()
    flusher = RecordingFlusher(store, retry_interval=60.0)
    await store.put("t", "u", "s2", _put("s2", 5, epoch=3).event)
    store.batches.clear()
    turns = _turns(5, flusher)
    for turn in turns:
        turn.latest = 1
    finals = [asyncio.create_task(flusher.flush_now(turn)) for turn in turns]
    outcomes = await asyncio.gather(*finals, return_exceptions=True)
    assert len(store.batches) == 1 and len(store.batches[0]) == 5
    assert [isinstance(o, RecordingFencedOut) for o in outcomes] == [
        False,
        False,
        True,
        False,
        False,
    ]
    assert turns[2].fenced and [t.flushed for t in turns] == [1, 1, -1, 1, 1]
    store.down = True
    turns[0].latest = 2
    with pytest.raises(StoreUnavailableError):
        await flusher.flush_now(turns[0])
    store.down = False
    await flusher.flush_now(turns[0])  # asked again: not left to the outage's pause
    assert turns[0].flushed == 2
    await flusher.aclose()

"""Following a turn through the stores: snapshots at their own ids, verdicts, takeovers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from tether.adapters.memory import (
    InMemoryChangeChannel,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.chat_message import ChatMessage, ChatMessageSender, ContentPart, ContentPartType
from tether.domain.chat_stream_recording_store import DeltaPublication, RecordedStreamEvent
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.stream_delta import StreamDelta, step_between
from tether.runtime.follower import RecordingFollower
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent


def _bot(text: str) -> ChatMessage:
    return ChatMessage(
        sender=ChatMessageSender.BOT,
        content=text,
        content_parts=[ContentPart(type=ContentPartType.TEXT, text=text)],
    )


async def test_a_follower_sends_each_snapshot_at_its_own_index_and_ends_with_the_verdict() -> None:
    """A stream id names the producer's message at that index: a follower never
    invents messages for the indexes between two snapshots (it used to pace a
    flush's growth out in steps at those indexes, so a client reading the
    producer and one reading a follower got one id with two contents)."""
    channel = InMemoryChangeChannel()
    recording = InMemoryChatStreamRecordingStore(channel)
    supervision = InMemoryChatStreamSupervisionStore(channel)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=now, message_id="m", epoch=1
    )
    assert await supervision.compare_and_swap("t", "u", "s", None, row)
    await recording.put(
        "t", "u", "s", RecordedStreamEvent(index=0, message=_bot("One"), message_id="m", epoch=1)
    )
    follower = RecordingFollower(
        recording, supervision, ConversationKey("t", "u", "s"), "m",
        clock=lambda: now, dead_after=timedelta(seconds=3),
        poll_interval=10_000.0,  # woken by the channel only: no timing involved
    )  # fmt: skip
    events = follower.follow(0)
    async with asyncio.timeout(5):
        assert await anext(events) == StreamEvent(0, _bot("One"))
        # Ten indexes in one flush: the follower sends the snapshot it read.
        text = "One two three four five six seven eight nine ten"
        grown = RecordedStreamEvent(index=10, message=_bot(text), message_id="m", epoch=1)
        await recording.put("t", "u", "s", grown)
        assert await anext(events) == StreamEvent(10, _bot(text))
        # The verdict is written one epoch up, as the lease's final write is.
        done = row.model_copy(update={"status": ChatStreamStatus.DONE, "epoch": 2})
        assert await supervision.compare_and_swap("t", "u", "s", 1, done)
        assert await anext(events) == StreamEnd(EndReason.DONE)


async def test_a_follower_says_dead_when_the_heartbeat_is_stale() -> None:
    recording, supervision = (
        InMemoryChatStreamRecordingStore(),
        InMemoryChatStreamSupervisionStore(),
    )
    stale = datetime.now(UTC) - timedelta(seconds=10)
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=stale, message_id="m", epoch=1
    )
    await supervision.compare_and_swap("t", "u", "s", None, row)
    follower = RecordingFollower(
        recording, supervision, ConversationKey("t", "u", "s"), "m",
        clock=lambda: datetime.now(UTC), dead_after=timedelta(seconds=3),
        poll_interval=0.01,
    )  # fmt: skip
    items = [item async for item in follower.follow(0)]
    assert items == [StreamEnd(EndReason.DEAD)]


async def test_a_change_announced_while_the_follower_is_busy_is_not_lost() -> None:
    """Level-triggered push: the follower subscribes before its first read, so a
    put that lands while it is busy handing an event to its client wakes its
    next wait at once. A lost wake-up would sleep out the (here endless)
    fallback interval."""
    channel = InMemoryChangeChannel()
    recording = InMemoryChatStreamRecordingStore(channel)
    supervision = InMemoryChatStreamSupervisionStore(channel)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=now, message_id="m", epoch=1
    )
    assert await supervision.compare_and_swap("t", "u", "s", None, row)
    await recording.put(
        "t", "u", "s", RecordedStreamEvent(index=0, message=_bot("one"), message_id="m", epoch=1)
    )
    follower = RecordingFollower(
        recording,
        supervision,
        ConversationKey("t", "u", "s"),
        "m",
        clock=lambda: now,
        dead_after=timedelta(seconds=3),
        poll_interval=10_000.0,
    )
    events = follower.follow(0)
    first = await anext(events)  # the follower now waits on its client, not the stores
    assert isinstance(first, StreamEvent) and first.index == 0
    await recording.put(
        "t",
        "u",
        "s",
        RecordedStreamEvent(index=1, message=_bot("one two"), message_id="m", epoch=1),
    )
    async with asyncio.timeout(5):
        second = await anext(events)
    assert isinstance(second, StreamEvent) and (second.index, second.message.content) == (
        1,
        "one two",
    )
    await events.aclose()


def _event(index: int, text: str) -> RecordedStreamEvent:
    return RecordedStreamEvent(index=index, message=_bot(text), message_id="m", epoch=1)


async def test_a_follower_whose_turn_was_followed_by_the_next_at_once_still_gets_its_end() -> None:
    """The turn's last flush, its verdict and the claim of the next turn (a
    queued one) all land between the follower's read of the snapshot and its
    read of the row: the row it reads names the next turn. It reads the
    snapshot once more, which the next turn has not overwritten yet, and so
    ends with the turn's last message (before, it ended ``gone`` without it).
    Staged: the writes are made by the recording store's second read, after it
    has answered."""
    recording = _LandsAfterRead()
    supervision = InMemoryChatStreamSupervisionStore()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=now, message_id="m", epoch=1
    )
    assert await supervision.compare_and_swap("t", "u", "s", None, row)
    await recording.put("t", "u", "s", _event(0, "One"))

    async def the_turn_ends_and_the_next_starts() -> None:
        await recording.put("t", "u", "s", _event(5, "One two three four five six"))
        done = row.model_copy(update={"status": ChatStreamStatus.DONE, "epoch": 2})
        assert await supervision.compare_and_swap("t", "u", "s", 1, done)
        nxt = row.model_copy(update={"message_id": "n", "epoch": 3})
        assert await supervision.compare_and_swap("t", "u", "s", 2, nxt)

    recording.after_read[2] = the_turn_ends_and_the_next_starts
    follower = RecordingFollower(
        recording, supervision, ConversationKey("t", "u", "s"), "m",
        clock=lambda: now, dead_after=timedelta(seconds=3),
        poll_interval=0.0,  # every pass reads both: the staging orders the writes
    )  # fmt: skip
    async with asyncio.timeout(5):
        items = [item async for item in follower.follow(0)]
    assert items == [
        StreamEvent(0, _bot("One")),
        StreamEvent(5, _bot("One two three four five six")),
        StreamEnd(EndReason.GONE),
    ]


class _LandsAfterRead(InMemoryChatStreamRecordingStore):
    """A recording store whose Nth ``read`` runs ``after_read[N]`` once it has
    its answer, before handing it back: writes staged between two reads."""

    def __init__(self) -> None:
        super().__init__()
        self.after_read: dict[int, Callable[[], Awaitable[None]]] = {}
        self._reads = 0

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        self._reads += 1
        answer = await super().read(tenant, requester_uuid, session_id)
        staged = self.after_read.pop(self._reads, None)
        if staged is not None:
            await staged()
        return answer


async def test_a_follower_whose_loop_stalled_takes_the_deltas_before_the_snapshot() -> None:
    """Deltas flowed; then the follower's loop stalled past ``_FLOWING`` (a
    loaded machine) while the producer recorded index 3 and 4 and published
    both deltas. It woke to both announcements at once and, counting the
    deltas not yet applied as stopped, read the snapshot (index 4) first: the
    delta of index 3 then came too late and the client never saw index 3
    (``tests/test_cross_replica_live.py`` missed an index so, on Redis,
    under load). Now the deltas heard are applied before the snapshot is
    judged."""
    channel = InMemoryChangeChannel()
    recording = InMemoryChatStreamRecordingStore(channel)
    supervision = InMemoryChatStreamSupervisionStore(channel)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    elapsed = [0.0]
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=now, message_id="m", epoch=1
    )
    assert await supervision.compare_and_swap("t", "u", "s", None, row)
    texts = ["one", "one two", "one two three", "one two three four", "one two three four five"]

    async def produce(index: int) -> None:
        """Record the message at ``index``, then publish its delta (as the producer does)."""
        await recording.put("t", "u", "s", _event(index, texts[index]))
        previous = _bot(texts[index - 1]) if index else None
        delta = StreamDelta("m", 1, index, (step_between(previous, _bot(texts[index])),))
        await recording.publish_deltas([DeltaPublication("t", "u", "s", delta)])

    await produce(0)
    follower = RecordingFollower(
        recording, supervision, ConversationKey("t", "u", "s"), "m",
        clock=lambda: now, dead_after=timedelta(seconds=3),
        poll_interval=10_000.0, monotonic=lambda: elapsed[0],
    )  # fmt: skip
    events = follower.follow(0)
    seen: list[int] = []
    async with asyncio.timeout(5):
        seen.append((await anext(events)).index)  # type: ignore[union-attr]
        for index in (1, 2):
            await produce(index)
            seen.append((await anext(events)).index)  # type: ignore[union-attr]
        elapsed[0] += 2.0  # the stall: no delta applied for longer than _FLOWING
        await produce(3)
        await produce(4)
        while seen[-1] < 4:
            seen.append((await anext(events)).index)  # type: ignore[union-attr]
    await events.aclose()
    assert seen == [0, 1, 2, 3, 4]

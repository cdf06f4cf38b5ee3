"""The delta channel: a producer's messages reach followers on other replicas between snapshots.

Deterministic: the in-memory channel, the publisher's window driven by the test
(``flush``), a channel wrapper that loses chosen deltas, and a manual clock.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.adapters.memory import (
    InMemoryChangeChannel,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
)
from tether.domain.chat_stream_recording_store import (
    HELD_DELTAS,
    DeltaPublication,
    PendingChanges,
    RecordedStreamEvent,
    StreamChange,
)
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.stream_delta import (
    MAX_DELTA_BYTES,
    Append,
    StreamDelta,
    apply_step,
    step_between,
)
from tether.runtime.delta_publisher import DeltaPublisher
from tether.runtime.follower import RecordingFollower
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

KEY = ConversationKey("t", "u", "s")
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _bot(text: str, *, tool: bool = False) -> ChatMessage:
    parts = [ContentPart(type=ContentPartType.TEXT, text=text)]
    if tool:
        parts.insert(
            0,
            ContentPart(
                type=ContentPartType.TOOL,
                tool=ContentPartTool(tool_call_id="c1", name="calc", params={"x": 1}),
            ),
        )
    return ChatMessage(sender=ChatMessageSender.BOT, content=text, content_parts=parts)


# Steps ---------------------------------------------------------------------------------


@given(st.lists(st.text(max_size=8), min_size=1, max_size=30), st.integers(0, 29))
def test_steps_rebuild_every_message_exactly(pieces: list[str], tool_at: int) -> None:
    """Appends (to the text and its last part) and whole messages, through the
    wire encoding, rebuild each message of a cumulative stream exactly."""
    messages, text = [], ""
    for i, piece in enumerate(pieces):
        text += piece
        messages.append(_bot(text, tool=i >= tool_at))
    previous: ChatMessage | None = None
    for message in messages:
        step = step_between(previous, message)
        (decoded,) = StreamDelta.decode(StreamDelta("m", 1, 0, (step,)).encode()).steps  # type: ignore[union-attr]
        assert apply_step(previous, decoded) == message
        previous = message


def test_a_token_is_a_few_bytes_and_a_tool_part_is_sent_whole() -> None:
    step = step_between(_bot("Hello"), _bot("Hello, wor"))
    assert step == Append(", wor", ", wor")
    assert len(StreamDelta("m", 1, 7, (step,)).encode()) < 50
    assert isinstance(step_between(_bot("Hello"), _bot("Hello", tool=True)), ChatMessage)
    assert isinstance(step_between(_bot("Hello"), _bot("Help")), ChatMessage)


def test_an_append_has_nothing_to_apply_to_without_the_message_before() -> None:
    assert apply_step(None, Append("x")) is None
    assert StreamDelta.decode("not json") is None


def test_a_subscription_holds_a_bounded_number_of_deltas_for_a_reader_that_never_reads() -> None:
    subscription: PendingChanges[str] = PendingChanges("k", lambda s: None)
    subscription.hear_delta(StreamDelta("m", 1, 0, (Append("x"),)))
    assert subscription.take_deltas() == []  # a producer's own subscription keeps none
    subscription.want_deltas()
    for index in range(HELD_DELTAS * 4):
        subscription.hear_delta(StreamDelta("m", 1, index, (Append("x"),)))
    held = subscription.take_deltas()
    assert len(held) == HELD_DELTAS
    assert held[-1].first_index == HELD_DELTAS * 4 - 1  # the newest are kept


# Following with deltas -----------------------------------------------------------------


class LossyRecording(InMemoryChatStreamRecordingStore):
    """The in-memory store, whose channel loses the deltas starting at chosen indexes."""

    def __init__(self, channel: InMemoryChangeChannel) -> None:
        super().__init__(channel)
        self.lose: set[int] = set()
        self.announced_watches = 0

    async def publish_deltas(self, deltas: Sequence[DeltaPublication]) -> None:
        await super().publish_deltas([d for d in deltas if d.delta.first_index not in self.lose])

    async def announce_watch(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> None:
        self.announced_watches += 1
        await super().announce_watch(tenant, requester_uuid, session_id)


class Producer:
    """One producer of the turn at ``epoch``: publishes messages as a turn does,
    and answers a follower's watch as a turn does (with its newest message)."""

    def __init__(self, publisher: DeltaPublisher, epoch: int, first_index: int) -> None:
        self.publisher = publisher
        self.epoch = epoch
        self.index = first_index
        self.latest: StreamEvent | None = None

    async def say(self, text: str) -> StreamEvent:
        event = StreamEvent(self.index, _bot(text))
        self.index += 1
        self.latest = event
        self.publisher.offer(self, event)
        await self.publisher.flush()
        return event

    def watched(self) -> None:
        self.publisher.watch(self, KEY, "m", self.epoch, self.latest)


async def _attach(
    follower: AsyncIterator[StreamEvent | StreamEnd],
    recording: InMemoryChatStreamRecordingStore,
    *producers: Producer,
) -> asyncio.Task[StreamEvent | StreamEnd]:
    """Start ``follower`` (its first event is the task's result) and let the
    producers hear its watch, as a producing turn does on its channel."""
    async with recording.subscribe("t", "u", "s") as producer_hears:
        first = asyncio.ensure_future(anext(follower))
        async with asyncio.timeout(5):
            while StreamChange.WATCH not in await producer_hears.wait(5):
                pass
    for producer in producers:
        producer.watched()
        await producer.publisher.flush()
    return first


@pytest.fixture
async def stores() -> AsyncIterator[tuple[LossyRecording, InMemoryChatStreamSupervisionStore]]:
    channel = InMemoryChangeChannel()
    recording = LossyRecording(channel)
    supervision = InMemoryChatStreamSupervisionStore(channel)
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=NOW, message_id="m", epoch=1
    )
    assert await supervision.compare_and_swap("t", "u", "s", None, row)
    yield recording, supervision


@dataclass
class Following:
    """A turn's first producer (epoch 1, from index 0) and a follower not started yet."""

    recording: LossyRecording
    supervision: InMemoryChatStreamSupervisionStore
    producer: Producer
    follower: AsyncGenerator[StreamEvent | StreamEnd, None]


@pytest.fixture
async def following(
    stores: tuple[LossyRecording, InMemoryChatStreamSupervisionStore],
) -> AsyncIterator[Following]:
    recording, supervision = stores
    publisher = DeltaPublisher(recording, window=3600)
    follower = _follower(recording, supervision).follow(0)
    yield Following(recording, supervision, Producer(publisher, epoch=1, first_index=0), follower)


def _follower(
    recording: InMemoryChatStreamRecordingStore, supervision: InMemoryChatStreamSupervisionStore
) -> RecordingFollower:
    return RecordingFollower(
        recording, supervision, KEY, "m",
        clock=lambda: NOW, dead_after=timedelta(seconds=3),
        poll_interval=10_000.0,  # woken by the channel only: no timing involved
    )  # fmt: skip


async def _next(events: AsyncIterator[StreamEvent | StreamEnd]) -> StreamEvent | StreamEnd:
    async with asyncio.timeout(5):
        return await anext(events)


async def test_a_follower_sees_every_index_from_deltas_alone_and_announces_its_watch(
    following: Following,
) -> None:
    """No snapshot is ever flushed: every message reaches the follower as a delta,
    at its own index, from the one the producer had when the watch came."""
    recording = following.recording
    producer, follower = following.producer, following.follower
    before = await producer.say("zero ")  # published before anyone watched
    first = await _attach(follower, recording, producer)
    assert await asyncio.wait_for(first, 5) == before  # sent whole when the watch was heard
    text = before.message.content
    for word in "one two three four five six".split():
        text += word + " "
        said = await producer.say(text)
        assert await _next(follower) == said
    assert recording.announced_watches == 1


async def test_a_lost_delta_is_bridged_from_the_snapshot_and_nothing_else_is_shown(
    following: Following,
) -> None:
    recording = following.recording
    producer, follower = following.producer, following.follower
    first = await _attach(follower, recording, producer)
    said = await producer.say("a ")
    assert await asyncio.wait_for(first, 5) == said
    recording.lose = {1}
    lost = await producer.say("a b ")
    await producer.say("a b c ")  # cannot apply: its base was lost
    # The follower shows nothing it cannot vouch for until the snapshot comes.
    await recording.put(
        "t", "u", "s", RecordedStreamEvent(index=1, message=lost.message, message_id="m", epoch=1)
    )
    assert await _next(follower) == lost
    assert await _next(follower) == StreamEvent(2, _bot("a b c "))
    said = await producer.say("a b c d ")
    assert await _next(follower) == said


async def test_across_a_takeover_the_old_producer_is_ignored_and_text_only_grows(
    following: Following,
) -> None:
    recording, supervision = following.recording, following.supervision
    old, follower = following.producer, following.follower
    first = await _attach(follower, recording, old)
    said = await old.say("one ")
    shown = [await asyncio.wait_for(first, 5)]
    assert shown == [said]
    said = await old.say("one two ")
    shown.append(await _next(follower))
    assert shown[-1] == said
    # Another replica takes the turn over at epoch 2 and resumes it past every
    # index the first producer can have used, from the last snapshot ("one ").
    row = await supervision.read("t", "u", "s")
    assert row is not None
    taken = row.model_copy(update={"epoch": 2})
    assert await supervision.compare_and_swap("t", "u", "s", 1, taken)
    other = DeltaPublisher(recording, window=3600)
    new = Producer(other, epoch=2, first_index=1000)
    new.watched()
    # The paused old producer still publishes: nobody shows it.
    await old.say("one two WRONG ")
    await new.say("one ")  # behind what the client shows: held back
    said = await new.say("one two three ")
    assert await _next(follower) == said
    shown.append(said)
    texts = [e.message.content for e in shown if isinstance(e, StreamEvent)]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    done = taken.model_copy(update={"status": ChatStreamStatus.DONE, "epoch": 3})
    assert await supervision.compare_and_swap("t", "u", "s", 2, done)
    assert await _next(follower) == StreamEnd(EndReason.DONE)
    await other.aclose()


async def test_a_message_too_large_for_the_channel_is_left_to_the_snapshot(
    following: Following,
) -> None:
    recording = following.recording
    producer, follower = following.producer, following.follower
    first = await _attach(follower, recording, producer)
    big = "x" * (MAX_DELTA_BYTES + 10)
    large = await producer.say(big)  # whole (the first message): too large to send
    await recording.put(
        "t", "u", "s", RecordedStreamEvent(index=0, message=large.message, message_id="m", epoch=1)
    )
    assert await asyncio.wait_for(first, 5) == large
    # What follows is a small append again, carried by the channel.
    said = await producer.say(big + " y")
    assert await _next(follower) == said


async def test_an_unwatched_turn_publishes_nothing() -> None:
    recording = LossyRecording(InMemoryChangeChannel())
    publisher = DeltaPublisher(recording, window=3600)
    owner = object()
    publisher.offer(owner, StreamEvent(0, _bot("hello")))
    await publisher.flush()
    assert publisher.published == 0
    await publisher.aclose()


async def test_a_snapshot_ahead_of_flowing_deltas_does_not_skip_their_indexes(
    following: Following,
) -> None:
    """The recording flush can land before the deltas of the same messages: a
    follower that took the snapshot then would jump over the indexes in
    between (two real replicas skipped 2 of 597 so)."""
    recording = following.recording
    producer, follower = following.producer, following.follower
    first = await _attach(follower, recording, producer)
    said = await producer.say("a ")
    assert await asyncio.wait_for(first, 5) == said
    said = await producer.say("a b ")
    assert await _next(follower) == said
    # Two more messages are handed to the publisher, and the flush of the
    # newest lands before their delta goes out.
    pending = [StreamEvent(2, _bot("a b c ")), StreamEvent(3, _bot("a b c d "))]
    for event in pending:
        producer.publisher.offer(producer, event)
    await recording.put(
        "t",
        "u",
        "s",
        RecordedStreamEvent(index=3, message=pending[1].message, message_id="m", epoch=1),
    )
    await producer.publisher.flush()
    assert [await _next(follower), await _next(follower)] == pending

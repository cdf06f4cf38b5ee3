"""Following a turn through the stores: pacing, verdicts, takeover regressions."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta

from tether.adapters.stream_buffer import (
    InMemoryChangeChannel,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.chat_message import ChatMessage, ChatMessageSender, ContentPart, ContentPartType
from tether.domain.chat_stream_recording_store import RecordedStreamEvent
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.runtime.follower import RecordingFollower, interpolate
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import StreamEnd, StreamEvent


def _bot(text: str) -> ChatMessage:
    return ChatMessage(
        sender=ChatMessageSender.BOT,
        content=text,
        content_parts=[ContentPart(type=ContentPartType.TEXT, text=text)],
    )


def test_interpolate_splits_text_growth_into_cumulative_steps() -> None:
    steps = interpolate(_bot("Hello"), _bot("Hello, wide world!"), 4)
    assert len(steps) == 4 and steps[-1] == _bot("Hello, wide world!")
    contents = [m.content for m in steps]
    assert all(b.startswith(a) and len(b) > len(a) for a, b in itertools.pairwise(contents))
    assert all(m.content == (m.content_parts or [])[0].text for m in steps)


def test_interpolate_does_not_invent_messages_it_cannot_split() -> None:
    assert interpolate(None, _bot("new"), 5) == [_bot("new")]
    assert interpolate(_bot("abc"), _bot("xyz and more"), 5) == [_bot("xyz and more")]


async def test_a_follower_paces_each_flush_and_ends_with_the_verdict() -> None:
    recording, supervision = (
        InMemoryChatStreamRecordingStore(),
        InMemoryChatStreamSupervisionStore(),
    )
    now = datetime.now(UTC)
    key = ConversationKey("t", "u", "s")
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=now, message_id="m", epoch=1
    )
    await supervision.compare_and_swap("t", "u", "s", None, row)
    await recording.put(
        "t", "u", "s", RecordedStreamEvent(index=0, message=_bot("One"), message_id="m", epoch=1)
    )
    follower = RecordingFollower(
        recording, supervision, key, "m",
        clock=lambda: datetime.now(UTC), dead_after=timedelta(seconds=3),
        poll_interval=0.01, pace_interval=0.001, flush_interval=0.01 * 10,
    )  # fmt: skip
    seen: list[StreamEvent | StreamEnd] = []

    async def follow() -> None:
        async for item in follower.follow(0):
            seen.append(item)

    task = asyncio.ensure_future(follow())
    await asyncio.sleep(0.05)
    text = "One two three four five six seven eight nine ten"
    await recording.put(
        "t", "u", "s", RecordedStreamEvent(index=10, message=_bot(text), message_id="m", epoch=1)
    )
    await asyncio.sleep(0.1)
    done = row.model_copy(update={"status": ChatStreamStatus.DONE})
    await supervision.compare_and_swap("t", "u", "s", 1, done)
    await asyncio.wait_for(task, 2)
    events = [e for e in seen if isinstance(e, StreamEvent)]
    assert events[0].index == 0 and events[-1].message.content == text
    assert len(events) > 3  # one flush of ten indexes came out as several steps
    assert [e.index for e in events] == sorted({e.index for e in events})
    assert seen[-1] == StreamEnd("done")


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
        poll_interval=0.01, pace_interval=0.001, flush_interval=0.5,
    )  # fmt: skip
    items = [item async for item in follower.follow(0)]
    assert items == [StreamEnd("dead")]


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
        pace_interval=0.05,
        flush_interval=0.05,  # one step per flush: no pacing between indexes
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

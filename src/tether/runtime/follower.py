"""Follow a turn produced on another replica, through the recording and supervision rows.

The recording holds only the newest cumulative message, flushed at most every
0.5 s. A follower diffs by index, and paces the new text out in small steps
over the flush interval, so its client sees a smooth stream rather than one
jump per flush. It ends when the supervision row gives a verdict.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta

from tether.domain.chat_message import ChatMessage, ContentPart, ContentPartType
from tether.domain.chat_stream_recording_store import (
    ChangeSubscription,
    ChatStreamRecordingStore,
    RecordedStreamEvent,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
)
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import StreamEnd, StreamEvent

Clock = Callable[[], datetime]

_TERMINAL = {
    ChatStreamStatus.DONE: "done",
    ChatStreamStatus.ERRORED: "errored",
    ChatStreamStatus.CANCELLED: "cancelled",
}


def interpolate(previous: ChatMessage | None, new: ChatMessage, steps: int) -> list[ChatMessage]:
    """Up to ``steps`` cumulative messages growing from ``previous`` to ``new``.

    Only text growth at the end of the message is split; anything else (a new
    tool part, a changed status) arrives as the one new message.
    """
    if steps <= 1 or previous is None or not new.content.startswith(previous.content):
        return [new]
    grown = len(new.content) - len(previous.content)
    parts = new.content_parts or []
    tail = parts[-1] if parts else None
    if grown <= steps or (
        parts
        and (
            tail is None
            or tail.type is not ContentPartType.TEXT
            or len(parts) != len(previous.content_parts or [])
            or len(tail.text or "") < grown
        )
    ):
        return [new]
    messages = []
    for step in range(1, steps):
        cut = grown - (grown * step) // steps
        update: dict[str, object] = {"content": new.content[:-cut]}
        if parts and tail is not None:
            text = tail.text or ""
            update["content_parts"] = [
                *parts[:-1],
                ContentPart(type=ContentPartType.TEXT, text=text[:-cut]),
            ]
        messages.append(new.model_copy(update=update))
    messages.append(new)
    return messages


class RecordingFollower:
    """Reads one turn from the stores and yields what its client has not seen."""

    def __init__(
        self,
        recording: ChatStreamRecordingStore,
        supervision: ChatStreamSupervisionStore,
        key: ConversationKey,
        message_id: str,
        *,
        clock: Clock,
        dead_after: timedelta,
        poll_interval: float,
        pace_interval: float,
        flush_interval: float,
    ) -> None:
        self._recording = recording
        self._supervision = supervision
        self._key = key
        self._message_id = message_id
        self._clock = clock
        self._dead_after = dead_after
        self._poll_interval = poll_interval
        self._pace_interval = pace_interval
        self._flush_interval = flush_interval

    async def _read(self) -> tuple[RecordedStreamEvent | None, ChatStreamSupervision | None]:
        k = self._key
        record = await self._recording.read(k.tenant, k.requester_uuid, k.session_id)
        row = await self._supervision.read(k.tenant, k.requester_uuid, k.session_id)
        if record is not None and record.message_id != self._message_id:
            record = None
        return record, row

    async def follow(self, start_index: int = 0) -> AsyncIterator[StreamEvent | StreamEnd]:
        k = self._key
        # Subscribed before the first read, and level-triggered: a change that
        # lands while this follower paces text out or reads is seen by its next
        # wait, so it never sleeps out the fallback interval with news waiting.
        async with self._recording.subscribe(k.tenant, k.requester_uuid, k.session_id) as changes:
            async for item in self._follow(start_index, changes):
                yield item

    async def _follow(
        self, start_index: int, changes: ChangeSubscription
    ) -> AsyncIterator[StreamEvent | StreamEnd]:
        sent_index = start_index - 1
        sent: ChatMessage | None = None
        while True:
            record, row = await self._read()
            if record is not None and record.index > sent_index:
                if is_regression(sent, record.message):
                    # A takeover restarts from an older checkpoint: hold back until
                    # the new producer has passed what this client already shows.
                    sent_index = record.index
                else:
                    async for event in self._paced(sent, sent_index, record):
                        yield event
                    sent, sent_index = record.message, record.index
            end = self._verdict(row)
            if end is not None:
                if end.reason in ("done", "errored", "cancelled"):
                    # The producer flushes before it writes the terminal status;
                    # read once more so the final message is never missed.
                    final, _ = await self._read()
                    if final is not None and final.index > sent_index:
                        yield StreamEvent(final.index, final.message)
                yield end
                return
            # Push where the backend has it (PostgreSQL NOTIFY, Redis pub/sub);
            # the default subscription sleeps, which makes this a poll.
            await changes.wait(self._poll_interval)

    async def _paced(
        self, sent: ChatMessage | None, sent_index: int, record: RecordedStreamEvent
    ) -> AsyncIterator[StreamEvent]:
        spare_indexes = record.index - sent_index
        steps = min(spare_indexes, max(1, int(self._flush_interval / self._pace_interval)))
        messages = interpolate(sent, record.message, steps)
        first = record.index - len(messages) + 1
        for offset, message in enumerate(messages):
            if offset:
                await asyncio.sleep(self._pace_interval)
            yield StreamEvent(first + offset, message)

    def _verdict(self, row: ChatStreamSupervision | None) -> StreamEnd | None:
        if row is None or row.message_id != self._message_id:
            return StreamEnd("gone")
        if row.status in _TERMINAL:
            reason = _TERMINAL[row.status]
            if reason == "errored":
                return StreamEnd(reason, "TURN_ERRORED", "the turn failed on its producing replica")
            return StreamEnd(reason)
        if row.is_dead(self._clock(), self._dead_after):
            return StreamEnd("dead")
        return None


def has_push(recording: ChatStreamRecordingStore) -> bool:
    """Whether the store announces changes itself (it overrides ``subscribe``)."""
    return type(recording).subscribe is not ChatStreamRecordingStore.subscribe


def is_regression(sent: ChatMessage | None, new: ChatMessage) -> bool:
    """Whether ``new`` is an older state of what the client already has (a
    takeover restarted from a checkpoint behind the recording)."""
    return (
        sent is not None
        and len(new.content) < len(sent.content)
        and sent.content.startswith(new.content)
        and len(new.content_parts or []) <= len(sent.content_parts or [])
    )

"""Follow a turn produced on another replica, through the recording and supervision rows.

The recording holds only the newest cumulative message, flushed at most every
0.5 s. A follower sends each newer snapshot as the event it is, at its own
index: a stream id ``message_id:index`` always names the producer's message at
that index, whichever replica a client reads it from. (An earlier follower
paced a flush's growth out in invented steps at the indexes in between; a
client reading the producer and a follower then got one id with two contents.
Smoother following needs the producer's own messages between snapshots: the
delta channel of issue 11.) It ends when the supervision row gives a verdict.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta

from tether.domain.chat_message import ChatMessage
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
    ) -> None:
        self._recording = recording
        self._supervision = supervision
        self._key = key
        self._message_id = message_id
        self._clock = clock
        self._dead_after = dead_after
        self._poll_interval = poll_interval

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
        # lands while this follower hands an event out or reads is seen by its next
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
                    yield StreamEvent(record.index, record.message)
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

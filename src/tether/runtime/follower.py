"""Follow a turn produced on another replica, through the stores and the producer's deltas.

The recording holds only the newest cumulative message, flushed at most every
0.5 s. Where the stores have a push channel, the follower also announces that
it watches the turn, and the producer then publishes each new message as a
delta (see ``tether.domain.stream_delta``), coalesced over 20 ms: the follower
applies each delta onto the message it holds, in index order, and sends every
index it learns at its own id. A stream id ``message_id:index`` always names
the producer's message at that index, whichever replica a client reads it
from. On a gap (a delta lost or too large, a follower that joined late) it
reads the snapshot and goes on from there; a delta of an older epoch (a fenced
producer) is ignored, one of a newer epoch makes it read the supervision row
first. It ends when the supervision row gives a verdict. Once the replica
it runs on produces the turn itself (it took it over), it reads the live
buffer there, at the producer's own pace, as a client attached to that
replica from the start would.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import (
    HELD_DELTAS,
    ChangeSubscription,
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    StreamChange,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
)
from tether.domain.stream_delta import StreamDelta, apply_step
from tether.runtime.delta_publisher import WATCH_SECONDS
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

Clock = Callable[[], datetime]
LiveHere = Callable[[int, int], "AsyncIterator[StreamEvent | StreamEnd] | None"]
"""The turn's live stream from a start index, when this replica produces it
at the given epoch (it took the turn over); None when it does not."""

_FLOWING = 1.0
"""Seconds after its last delta that a follower still counts on deltas rather
than snapshots. The producer records every message before it publishes its
delta, so the snapshot's announcement always comes first; a follower that read
it would skip the indexes the delta is about to bring. Longer than the
publisher's back-pressure pause (at most 0.25 s) and a slow round trip: the
deltas of a loaded producer still count as flowing."""

_REWATCH = 0.5
"""Seconds between a follower's watches while no delta of the current owner came."""

_TERMINAL = {
    ChatStreamStatus.DONE: EndReason.DONE,
    ChatStreamStatus.ERRORED: EndReason.ERRORED,
    ChatStreamStatus.CANCELLED: EndReason.CANCELLED,
}


class RecordingFollower:
    """Reads one turn from the stores and the channel and yields what its client
    has not seen."""

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
        await_takeover: float = 0.0,
        live_here: LiveHere | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recording = recording
        self._supervision = supervision
        self._key = key
        self._message_id = message_id
        self._clock = clock
        self._dead_after = dead_after
        self._poll_interval = poll_interval
        # Where replicas take dead turns over by themselves, a dead producer is
        # not the end: keep following this long for the new one.
        self._await_takeover = await_takeover
        self._dead_since: float | None = None
        # Once this replica produces the turn (its takeover, a resume here),
        # its live buffer is ahead of every flush: follow that instead.
        self._live_here = live_here
        self._left_live_epoch = -1
        self._monotonic = monotonic
        # The producer's newest message this follower knows (from a snapshot or
        # a delta), shown or held back, and the epoch that produced it.
        self._known_index = -1
        self._known: ChatMessage | None = None
        self._known_epoch = -1
        # What the client was sent.
        self._sent_index = -1
        self._sent: ChatMessage | None = None
        # The current producer's epoch, from the newest supervision row read.
        self._owner_epoch = -1
        # Deltas that did not apply yet (ahead of what is known): they may once
        # the snapshot has caught up.
        self._ahead: deque[StreamDelta] = deque(maxlen=HELD_DELTAS)
        self._new_gap = False
        self._delta_at = float("-inf")
        self._delta_epoch = -1

    async def follow(self, start_index: int = 0) -> AsyncIterator[StreamEvent | StreamEnd]:
        k = self._key
        self._sent_index = start_index - 1
        # Subscribed before the first read, and level-triggered: a change that
        # lands while this follower hands an event out or reads is seen by its next
        # wait, so it never sleeps out the fallback interval with news waiting.
        async with self._recording.subscribe(k.tenant, k.requester_uuid, k.session_id) as changes:
            changes.want_deltas()
            async for item in self._follow(changes):
                yield item

    async def _follow(self, changes: ChangeSubscription) -> AsyncIterator[StreamEvent | StreamEnd]:
        k = self._key
        read_recording = read_row = True
        watched_at: float | None = None
        row_read_at = 0.0
        while True:
            now = self._monotonic()
            # Announce the watch at the start and again before the producer's
            # watch runs out; more often while no delta of the current owner has
            # come (a new producer, after a takeover, or one that was not yet
            # listening when the watch was first announced).
            if (
                watched_at is None
                or now - watched_at > WATCH_SECONDS / 3
                or (self._delta_epoch < self._owner_epoch and now - watched_at > _REWATCH)
            ):
                await self._watch()
                watched_at = now
            if now - row_read_at >= self._poll_interval:
                read_recording = read_row = True  # a dead producer announces nothing
            if read_recording:
                self._new_gap = False
                # The deltas heard go first, unless the row changed (a new
                # owner's row is read before a delta is trusted): a follower
                # whose loop stalled (a loaded machine, a slow client) wakes
                # to them and to the snapshot's announcement at once, and the
                # snapshot, ahead of them, must not make it skip their indexes.
                caught_up = [] if read_row else list(self._apply_pending(changes))
                flowing = (bool(caught_up) and not self._ahead) or self._flowing()
                record = await self._recording.read(k.tenant, k.requester_uuid, k.session_id)
                for event in [*caught_up, *self._take_snapshot(record, flowing=flowing)]:
                    yield event
            if read_row:
                row = await self._supervision.read(k.tenant, k.requester_uuid, k.session_id)
                row_read_at = self._monotonic()
                end = self._verdict(row)
                if end is not None:
                    if end.reason in (
                        EndReason.DONE,
                        EndReason.ERRORED,
                        EndReason.CANCELLED,
                        EndReason.GONE,
                    ):
                        # The producer publishes its last deltas and flushes before
                        # it writes the terminal status: apply those, then read the
                        # snapshot once more so the final message is never missed.
                        # Also when the row already names the next turn (a queued
                        # one claimed it between two reads): its first put comes
                        # later, so the snapshot is usually still this turn's last.
                        for event in self._apply_pending(changes):
                            yield event
                        final = await self._recording.read(k.tenant, k.requester_uuid, k.session_id)
                        for event in self._take_snapshot(final, final=True):
                            yield event
                    yield end
                    return
                assert row is not None
                self._owner_epoch = row.epoch
                live = self._live(row.epoch)
                if live is not None:
                    end = None
                    async for item in live:
                        if isinstance(item, StreamEnd):
                            end = item
                        else:
                            for event in self._learn(item.index, item.message, row.epoch):
                                yield event
                    if end is not None and end.reason not in (EndReason.DEAD, EndReason.GONE):
                        yield end
                        return
                    # This replica gave the turn up (a drain, a takeover
                    # elsewhere): follow its new producer through the stores.
                    self._left_live_epoch = row.epoch
                    read_recording = read_row = True
                    continue
            for event in self._apply_pending(changes):
                yield event
            if not read_row and any(d.epoch > self._owner_epoch for d in self._ahead):
                # A delta of a newer producer than the row read: read them again.
                read_recording = read_row = True
                continue
            if self._new_gap:
                # A delta did not continue what is known: bridge from the snapshot
                # now (once; later it waits for the next flush's announcement).
                read_recording, read_row = True, False
                continue
            # Push where the backend has it (PostgreSQL NOTIFY, Redis pub/sub);
            # the default subscription sleeps, which makes this a poll.
            wait = max(0.0, self._poll_interval - (self._monotonic() - row_read_at))
            heard = await changes.wait(wait)
            # While deltas flow they are ahead of every snapshot: reading one would
            # only let the client skip indexes the deltas are about to bring.
            read_recording = StreamChange.RECORDING in heard and not self._flowing()
            read_row = StreamChange.SUPERVISION in heard

    def _live(self, epoch: int) -> AsyncIterator[StreamEvent | StreamEnd] | None:
        """The turn's live stream past what the client has, if this replica
        produces it at ``epoch`` (and did not give it up at that epoch)."""
        if self._live_here is None or epoch == self._left_live_epoch:
            return None
        return self._live_here(epoch, self._sent_index + 1)

    def _flowing(self) -> bool:
        """Whether deltas keep this follower up to date (one applied lately, none
        waiting for a snapshot)."""
        return not self._ahead and self._monotonic() - self._delta_at < _FLOWING

    async def _watch(self) -> None:
        """Ask the producer for its deltas (best effort: without them this
        follower reads snapshots)."""
        k = self._key
        try:
            await self._recording.announce_watch(k.tenant, k.requester_uuid, k.session_id)
        except Exception:
            return

    def _take_snapshot(
        self, record: RecordedStreamEvent | None, *, final: bool = False, flowing: bool = False
    ) -> Iterator[StreamEvent]:
        """``record``'s message, unless the deltas bring it (``flowing``: they
        did just now, or lately) or the client has it."""
        if record is None or record.message_id != self._message_id:
            return
        if record.epoch < self._known_epoch or record.index <= self._known_index:
            return  # older than what deltas already told
        if not final and record.epoch == self._known_epoch and flowing:
            return  # the deltas bring every index up to it, one by one
        yield from self._learn(record.index, record.message, record.epoch)
        yield from self._apply(self._take_ahead(), fresh=False)

    def _take_ahead(self) -> list[StreamDelta]:
        ahead = list(self._ahead)
        self._ahead.clear()
        return ahead

    def _apply_pending(self, changes: ChangeSubscription) -> Iterator[StreamEvent]:
        """Apply the deltas that waited for a snapshot, then the ones heard since."""
        yield from self._apply(self._take_ahead(), fresh=False)
        yield from self._apply(changes.take_deltas(), fresh=True)

    def _apply(self, deltas: list[StreamDelta], *, fresh: bool) -> Iterator[StreamEvent]:
        """Apply every delta that continues what is known; keep the ones ahead
        (a ``fresh`` one kept is a new gap, to bridge from the snapshot)."""
        for delta in deltas:
            if delta.message_id != self._message_id or delta.epoch < self._owner_epoch:
                continue  # another turn, or a fenced producer
            if delta.epoch > self._owner_epoch:
                self._ahead.append(delta)  # a new owner: read its row first
                continue
            for offset, step in enumerate(delta.steps):
                index = delta.first_index + offset
                same_epoch = delta.epoch == self._known_epoch
                if same_epoch and index <= self._known_index:
                    continue  # known already
                if same_epoch and index == self._known_index + 1:
                    message = apply_step(self._known, step)
                else:
                    message = apply_step(None, step)  # only a whole message starts afresh
                if message is None:
                    # A gap: wait for the snapshot to reach this far.
                    rest = StreamDelta(delta.message_id, delta.epoch, index, delta.steps[offset:])
                    self._ahead.append(rest)
                    self._new_gap = self._new_gap or fresh
                    break
                self._delta_at = self._monotonic()
                self._delta_epoch = delta.epoch
                yield from self._learn(index, message, delta.epoch)

    def _learn(self, index: int, message: ChatMessage, epoch: int) -> Iterator[StreamEvent]:
        """The producer's message at ``index``: send it, unless the client has it."""
        self._known_index, self._known, self._known_epoch = index, message, epoch
        if index <= self._sent_index:
            return
        if is_regression(self._sent, message):
            # A takeover restarts from an older checkpoint: hold back until
            # the new producer has passed what this client already shows.
            self._sent_index = index
            return
        self._sent_index, self._sent = index, message
        yield StreamEvent(index, message)

    def _verdict(self, row: ChatStreamSupervision | None) -> StreamEnd | None:
        if row is None or row.message_id != self._message_id:
            return StreamEnd(EndReason.GONE)
        if row.status in _TERMINAL:
            reason = _TERMINAL[row.status]
            if reason is EndReason.ERRORED:
                return StreamEnd(reason, "TURN_ERRORED", "the turn failed on its producing replica")
            return StreamEnd(reason)
        if row.is_dead(self._clock(), self._dead_after):
            now = self._monotonic()
            if self._dead_since is None:
                self._dead_since = now
            if now - self._dead_since >= self._await_takeover:
                return StreamEnd(EndReason.DEAD)
            return None
        self._dead_since = None
        return None


def has_push(recording: ChatStreamRecordingStore) -> bool:
    """Whether the store announces changes itself (``Capability.RECORDING_SUBSCRIBE``)."""
    return supports(recording, Capability.RECORDING_SUBSCRIBE)


def has_deltas(recording: ChatStreamRecordingStore) -> bool:
    """Whether the store carries producers' deltas (``Capability.RECORDING_PUBLISH_DELTAS``)."""
    return supports(recording, Capability.RECORDING_PUBLISH_DELTAS)


def shows_the_same(shown: ChatMessage, new: ChatMessage) -> bool:
    """Whether ``new`` shows a client exactly what ``shown`` did."""
    return new.content == shown.content and (new.content_parts or []) == (shown.content_parts or [])


def is_regression(sent: ChatMessage | None, new: ChatMessage) -> bool:
    """Whether ``new`` is an older state of what the client already has (a
    takeover restarted from a checkpoint behind the recording)."""
    return (
        sent is not None
        and len(new.content) < len(sent.content)
        and sent.content.startswith(new.content)
        and len(new.content_parts or []) <= len(sent.content_parts or [])
    )

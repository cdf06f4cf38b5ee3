"""The snapshot a follower on another replica streams a reconnect from."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from pydantic import BaseModel

from tether.domain.chat_message import ChatMessage
from tether.domain.stream_delta import StreamDelta


class RecordedStreamEvent(BaseModel):
    """The newest cumulative message of a turn, with its stream index and lease epoch."""

    index: int
    message: ChatMessage
    message_id: str
    epoch: int


class RecordingFencedError(Exception):
    """A put was refused because the stored record has a higher epoch."""


@dataclass(frozen=True)
class RecordingPut:
    """One fenced put of a batch (see ``ChatStreamRecordingStore.put_many``)."""

    tenant: str
    requester_uuid: str | None
    session_id: str
    event: RecordedStreamEvent


class StreamChange(StrEnum):
    """What a change notification is about."""

    RECORDING = "recording"
    """A put: new content to read."""
    SUPERVISION = "supervision"
    """The row changed hands or ended (a claim, a cancel, a verdict, a hand-off);
    heartbeats are not announced (readers judge liveness by age)."""
    DELTA = "delta"
    """The producer published new messages (``ChangeSubscription.take_deltas``)."""
    WATCH = "watch"
    """A follower on some replica wants the producer's deltas (see
    ``ChatStreamRecordingStore.announce_watch``)."""


EVERYTHING = frozenset({StreamChange.RECORDING, StreamChange.SUPERVISION})
"""What a holder hears when announcements may have been missed: re-read both rows.
(Deltas missed are not replayed: a follower sees the gap and reads the
snapshot; a watch missed is announced again by its follower.)"""


@dataclass(frozen=True)
class DeltaPublication:
    """One turn's delta for ``ChatStreamRecordingStore.publish_deltas``."""

    tenant: str
    requester_uuid: str | None
    session_id: str
    delta: StreamDelta


class ChangeSubscription:
    """The changes of one conversation, heard from the moment of subscribing.

    Level-triggered: a change announced while its holder was busy (pacing text
    out to a client, reading the stores) is returned by the next ``wait`` at
    once, never lost. The default, for a store with no push channel, announces
    nothing: every ``wait`` sleeps out its ``max_wait`` and the holder polls.
    """

    async def wait(self, max_wait: float) -> frozenset[StreamChange]:
        """What changed since the previous ``wait`` (at once if anything did), or
        after up to ``max_wait`` seconds; empty when the time ran out. Spurious
        answers are allowed (a holder always re-reads); a missed change is not."""
        await asyncio.sleep(max_wait)
        return frozenset()

    wants_deltas = False
    """Whether this subscription keeps the producer's deltas (``want_deltas``)."""

    def want_deltas(self) -> None:
        """Keep the producer's deltas for ``take_deltas`` (a follower does; a
        producer, hearing its own conversation, does not, so its own deltas
        are neither parsed nor held for it)."""
        self.wants_deltas = True

    def take_deltas(self) -> list[StreamDelta]:
        """The deltas heard since the previous call, oldest first (a bounded
        number: when a holder falls behind the oldest are dropped, a gap it
        bridges from the snapshot)."""
        return []

    async def aclose(self) -> None:
        """Stop hearing changes."""

    async def __aenter__(self) -> ChangeSubscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


K = TypeVar("K", bound=Hashable)

HELD_DELTAS = 256
"""The deltas a subscription keeps for a holder that is not reading (about five
seconds of one turn at the publisher's 20 ms window): bounded, so a follower
that stalls costs no more memory than this."""


class PendingChanges(ChangeSubscription, Generic[K]):
    """A subscription fed by a push channel (PostgreSQL LISTEN, Redis pub/sub,
    the in-memory channel): one conversation's announcements, level-triggered.

    Every announcement (``hear``) adds its kinds to the pending set, which the
    next ``wait`` returns (at once, if it is already non-empty) and clears. The
    channel keeps the subscriptions by ``key`` and is told of a closed one by
    ``drop``.
    """

    def __init__(self, key: K, drop: Callable[[PendingChanges[K]], None]) -> None:
        self.key = key
        """The conversation, in the channel's own terms."""
        self.missed = False
        """Set by the channel while announcements may go unheard (it is not
        listening yet, or lost its connection); it announces everything once
        it listens again."""
        self._drop = drop
        self._pending: set[StreamChange] = set()
        self._deltas: deque[StreamDelta] = deque(maxlen=HELD_DELTAS)
        self._heard = asyncio.Event()
        self._closed = False

    def hear(self, changes: Iterable[StreamChange]) -> None:
        """An announcement for this conversation (called by the channel)."""
        self._pending.update(changes)
        self._heard.set()

    def hear_delta(self, delta: StreamDelta) -> None:
        """A delta for this conversation (called by the channel); kept only
        if the holder wants deltas."""
        if not self.wants_deltas:
            return
        self._deltas.append(delta)
        self.hear((StreamChange.DELTA,))

    def take_deltas(self) -> list[StreamDelta]:
        """The deltas heard since the previous call, oldest first."""
        deltas = list(self._deltas)
        self._deltas.clear()
        return deltas

    def release(self) -> None:
        """End a ``wait`` in progress with what is pending (the channel is closing)."""
        self._heard.set()

    async def wait(self, max_wait: float) -> frozenset[StreamChange]:
        """What was announced since the previous ``wait`` (at once if anything
        was), or empty after ``max_wait`` seconds without an announcement."""
        if self._closed:
            await asyncio.sleep(max(max_wait, 0))
            return frozenset()
        if not self._pending and max_wait > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max_wait):
                    await self._heard.wait()
        heard, self._pending = frozenset(self._pending), set()
        self._heard.clear()
        return heard

    async def aclose(self) -> None:
        """Stop hearing changes (a ``wait`` in progress returns). Idempotent."""
        if not self._closed:
            self._closed = True
            self._drop(self)
            self._heard.set()


def deliver(
    subscriptions: Iterable[PendingChanges[K]], changes: frozenset[StreamChange], delta: str
) -> None:
    """Hand one announcement from a channel to a conversation's subscriptions:
    ``changes`` heard, or, for ``DELTA``, the encoded ``delta`` to those that
    want deltas (decoded once, and only if one does; one that does not parse
    is dropped, a gap its followers bridge)."""
    if StreamChange.DELTA not in changes:
        for subscription in subscriptions:
            subscription.hear(changes)
        return
    wanting = [subscription for subscription in subscriptions if subscription.wants_deltas]
    decoded = StreamDelta.decode(delta) if wanting else None
    if decoded is not None:
        for subscription in wanting:
            subscription.hear_delta(decoded)


class ChatStreamRecordingStore(ABC):
    """One overwritten record per conversation, not an append log.

    Every streamed message is cumulative, so keeping only the newest loses
    nothing. The producer flushes at most every 0.5 seconds; a follower diffs
    by index to serve only what its client has not seen. Writes are atomic at
    the record level: a concurrent reader never sees a torn record.

    Fencing: a put is refused when the conversation's fence is above its epoch.
    The fence is the highest epoch of any put or ``fence`` call accepted for
    the conversation; the shipped backends keep it when ``delete`` removes the
    record, so a paused producer can never write again after a newer turn
    took the conversation, even once that turn's record is cleaned up. A
    seed-only adapter fences only by the record it holds (its epoch, gone with
    ``delete``), and ``fence`` does nothing there.
    """

    @abstractmethod
    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``, unless the stored record's epoch is higher.

        The epoch check and the write are one atomic step, so a fenced producer
        can never overwrite its successor's snapshot. A refused write raises
        ``RecordingFencedError``.
        """

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Several independent fenced puts; one result per put, in order: True
        when it was written, False when it was fenced (where ``put`` would have
        raised ``RecordingFencedError``).

        Optional: lets a replica flush the recordings of all its turns in one
        round trip per flush interval. Each put keeps its own epoch fence: a
        fenced put changes nothing and does not stop the others, and puts of
        one conversation are applied in order. The batch is not a transaction
        across rows. Any other failure (the store is unreachable) raises for
        the whole batch; then each put may or may not have been written.

        The default calls ``put`` for each, one after another, so an adapter
        implementing only ``put`` is correct; backends override it with one
        round trip (a transaction, a statement, a pipeline).
        """
        results: list[bool] = []
        for item in puts:
            try:
                await self.put(item.tenant, item.requester_uuid, item.session_id, item.event)
            except RecordingFencedError:
                results.append(False)
            else:
                results.append(True)
        return results

    @abstractmethod
    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """The stored record, or None."""

    @abstractmethod
    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record only if it still belongs to ``message_id``."""

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse every later put below ``epoch`` for the conversation, as an
        accepted put at ``epoch`` would; the stored record itself is unchanged.

        A new owner calls this before it reads the record (a takeover, a
        cancel), so that anything a fenced producer writes afterwards is
        refused by the store itself. Optional: the default does nothing (see
        the class docstring for what a seed-only adapter gives up).
        """
        return None  # a seed-only adapter has nothing to fence with

    def subscribe(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChangeSubscription:
        """Hear the conversation's recording and supervision changes from now on
        (use it as ``async with``): a follower subscribes before its first read,
        a producer to hear a cancel or a takeover at once.

        Optional. The default announces nothing (followers poll, a producer
        hears of a cancel at its next fenced write). Backends with a push
        channel (PostgreSQL LISTEN/NOTIFY, Redis pub/sub) announce every put
        and every supervision write that changes the epoch.
        """
        return ChangeSubscription()

    async def publish_deltas(self, deltas: Sequence[DeltaPublication]) -> None:
        """Announce each turn's newest messages to that conversation's
        subscribers on every replica (``StreamChange.DELTA``), in one round trip.

        Optional, and best effort: a delta lost on the way is a gap its
        follower bridges from the snapshot. Each encoded delta is at most
        ``MAX_DELTA_BYTES``. The default does nothing (no channel: followers
        read snapshots); so a store that overrides it also says it has one.
        """
        return None  # no channel: followers read the snapshots

    async def announce_watch(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> None:
        """Ask the conversation's producer, wherever it runs, to publish its
        deltas (``StreamChange.WATCH``) for the next few seconds; a follower
        announces this when it starts and again while it follows. Producers
        publish deltas only for watched turns, so the channel carries only what
        some follower reads. Optional; the default does nothing."""
        return None  # no channel: nobody to tell

    async def wait_for_change(
        self, tenant: str, requester_uuid: str | None, session_id: str, max_wait: float
    ) -> bool:
        """Wait until the conversation's recording or supervision row may have
        changed, or ``max_wait`` seconds pass; return whether a change was signalled.

        Optional. The default sleeps out ``max_wait`` (the follower then polls).
        Backends with a push channel (PostgreSQL LISTEN/NOTIFY, Redis pub/sub)
        wake followers on every put and every supervision write instead. A
        spurious wake-up is harmless: followers always re-read.
        """
        await asyncio.sleep(max_wait)
        return False

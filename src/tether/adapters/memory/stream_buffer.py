"""Supervision rows and recordings in dicts: correct within one process only."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from tether.domain.chat_stream_recording_store import (
    ChangeSubscription,
    ChatStreamRecordingStore,
    DeltaPublication,
    PendingChanges,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
    StreamChange,
    deliver,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    StaleTurn,
)
from tether.domain.stream_delta import StreamDelta
from tether.domain.tombstones import TombstoneKey

_Key = tuple[str, str, str]

_DEAD_TURNS: _Key = ("", "", "\0dead turns")
"""The channel's key for ``announce_dead_turns`` (no conversation has a NUL
in its session id)."""


def _key(tenant: str, requester_uuid: str | None, session_id: str) -> _Key:
    return (tenant, requester_uuid or "", session_id)


class InMemoryChangeChannel:
    """Change announcements within one process: the in-memory push channel.

    ``memory://`` gives its recording and supervision stores one channel, so
    followers and producers hear puts and epoch changes at once, as they would
    over PostgreSQL NOTIFY or Redis pub/sub.
    """

    def __init__(self) -> None:
        # Each key's subscriptions in the order they came (a dict, not a set,
        # whose order is their addresses'): the simulator's seeded histories
        # wake followers in the same order on every run.
        self._subscriptions: dict[_Key, dict[PendingChanges[_Key], None]] = {}

    def subscribe(self, key: _Key) -> ChangeSubscription:
        subscription = PendingChanges(key, self._drop)
        self._subscriptions.setdefault(key, {})[subscription] = None
        return subscription

    def announce(self, key: _Key, change: StreamChange) -> None:
        for subscription in self._subscriptions.get(key, ()):
            subscription.hear((change,))

    def announce_delta(self, key: _Key, delta: StreamDelta) -> None:
        # Through its encoding, as over a real channel: a subscriber never
        # shares objects with the producer.
        deliver(self._subscriptions.get(key, ()), frozenset({StreamChange.DELTA}), delta.encode())

    def _drop(self, subscription: PendingChanges[_Key]) -> None:
        subscriptions = self._subscriptions.get(subscription.key)
        if subscriptions is not None:
            subscriptions.pop(subscription, None)
            if not subscriptions:
                del self._subscriptions[subscription.key]


class InMemoryChatStreamSupervisionStore(ChatStreamSupervisionStore):
    """``ChatStreamSupervisionStore`` in this process's memory.

    An ``asyncio.Lock`` makes each check-and-write one step for every task of
    one event loop; other processes (or replicas) see nothing of it. Rows are
    copied in and out, so no caller ever shares an object with the store.
    """

    def __init__(
        self,
        channel: InMemoryChangeChannel | None = None,
        tombstone_key: TombstoneKey | None = None,
    ) -> None:
        self._lock = asyncio.Lock()
        self._channel = channel
        self._rows: dict[_Key, ChatStreamSupervision] = {}
        # The highest epoch ever written per conversation; outlives its row,
        # under the conversation's tombstone (``domain.tombstones``).
        self._tombstones = tombstone_key or TombstoneKey.from_env()
        self._epochs: dict[str, int] = {}
        # (tenant, requester, message_id) -> session_id of the row holding it.
        self._by_message: dict[_Key, str] = {}

    async def compare_and_swap(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        expected_epoch: int | None,
        supervision: ChatStreamSupervision,
    ) -> bool:
        """Write ``supervision`` iff the row's epoch is ``expected_epoch`` (None: no row)."""
        key = _key(tenant, requester_uuid, session_id)
        tombstone = self._tombstones.of(tenant, requester_uuid, session_id)
        async with self._lock:
            current = self._rows.get(key)
            if (None if current is None else current.epoch) != expected_epoch:
                return False
            if current is None and supervision.epoch <= self._epochs.get(tombstone, 0):
                return False  # that epoch was granted before the row was removed
            self._rows[key] = supervision.model_copy(deep=True)
            self._epochs[tombstone] = max(self._epochs.get(tombstone, 0), supervision.epoch)
            if current is not None and current.message_id != supervision.message_id:
                self._unindex(key, current.message_id)
            self._by_message[(key[0], key[1], supervision.message_id)] = session_id
        if self._channel is not None and supervision.epoch != expected_epoch:
            # A new owner or a verdict; heartbeats (the same epoch) go unannounced.
            self._channel.announce(key, StreamChange.SUPERVISION)
        return True

    def _unindex(self, key: _Key, message_id: str) -> None:
        index = (key[0], key[1], message_id)
        if self._by_message.get(index) == key[2]:
            del self._by_message[index]

    async def find_by_message_id(
        self, tenant: str, requester_uuid: str | None, message_id: str
    ) -> str | None:
        """The requester's session whose row holds ``message_id``, or None."""
        async with self._lock:
            return self._by_message.get(_key(tenant, requester_uuid, message_id))

    async def list_stale_running(self, heartbeat_before: datetime, limit: int) -> list[StaleTurn]:
        """RUNNING rows older than ``heartbeat_before``, oldest first (a scan)."""
        async with self._lock:
            stale = [
                StaleTurn(key[0], key[1] or None, key[2], row.model_copy(deep=True))
                for key, row in self._rows.items()
                if row.status is ChatStreamStatus.RUNNING and row.heartbeat_at < heartbeat_before
            ]
        stale.sort(key=lambda turn: turn.supervision.heartbeat_at)
        return stale[:limit]

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written, also after the row was deleted."""
        async with self._lock:
            return self._epochs.get(self._tombstones.of(tenant, requester_uuid, session_id), 0)

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        """A copy of the current row, or None."""
        async with self._lock:
            current = self._rows.get(_key(tenant, requester_uuid, session_id))
            return None if current is None else current.model_copy(deep=True)

    async def delete(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_id: str,
        epoch: int,
    ) -> None:
        """Remove the row iff it still holds exactly ``message_id`` at ``epoch``."""
        key = _key(tenant, requester_uuid, session_id)
        async with self._lock:
            current = self._rows.get(key)
            if current is not None and (current.message_id, current.epoch) == (message_id, epoch):
                del self._rows[key]
                self._unindex(key, message_id)

    async def announce_dead_turns(self) -> None:
        """Wake every takeover loop subscribed on this store's channel."""
        if self._channel is not None:
            self._channel.announce(_DEAD_TURNS, StreamChange.SUPERVISION)

    def subscribe_dead_turns(self) -> ChangeSubscription:
        """Hear ``announce_dead_turns`` (without a channel: nothing, as the default)."""
        if self._channel is None:
            return ChangeSubscription()
        return self._channel.subscribe(_DEAD_TURNS)


class InMemoryChatStreamRecordingStore(ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` in this process's memory.

    The epoch fence and the write happen under one ``asyncio.Lock``. Records are
    kept as JSON, so nothing is shared with a caller, and because serializing
    costs a quarter of a deep copy: a replica's batch of a thousand puts holds
    the event loop for milliseconds, not tens of them.
    """

    def __init__(
        self,
        channel: InMemoryChangeChannel | None = None,
        tombstone_key: TombstoneKey | None = None,
    ) -> None:
        self._lock = asyncio.Lock()
        self._channel = channel if channel is not None else InMemoryChangeChannel()
        self._records: dict[_Key, _Record] = {}
        # The fence of each conversation: the highest epoch put or fenced. Kept
        # apart from the record, so ``delete`` leaves it, under the
        # conversation's tombstone (``domain.tombstones``).
        self._tombstones = tombstone_key or TombstoneKey.from_env()
        self._fences: dict[str, int] = {}

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the stored epoch is higher."""
        (written,) = await self.put_many([RecordingPut(tenant, requester_uuid, session_id, event)])
        if not written:
            fence = self._fences[self._tombstones.of(tenant, requester_uuid, session_id)]
            raise RecordingFencedError(
                f"recording is fenced at epoch {fence}; a write at epoch {event.epoch} is refused"
            )

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse later puts below ``epoch``; the record is unchanged."""
        tombstone = self._tombstones.of(tenant, requester_uuid, session_id)
        async with self._lock:
            self._fences[tombstone] = max(self._fences.get(tombstone, 0), epoch)

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Every put, in order, under one acquisition of the lock."""
        results: list[bool] = []
        async with self._lock:
            for put in puts:
                key = _key(put.tenant, put.requester_uuid, put.session_id)
                tombstone = self._tombstones.of(put.tenant, put.requester_uuid, put.session_id)
                if put.event.epoch < self._fences.get(tombstone, 0):
                    results.append(False)
                    continue
                event = put.event
                self._records[key] = _Record(event.epoch, event.message_id, event.model_dump_json())
                self._fences[tombstone] = event.epoch
                results.append(True)
                self._channel.announce(key, StreamChange.RECORDING)
        return results

    def subscribe(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChangeSubscription:
        """Hear this conversation's puts (and, with a shared channel, its
        supervision store's epoch changes) from now on."""
        return self._channel.subscribe(_key(tenant, requester_uuid, session_id))

    async def publish_deltas(self, deltas: Sequence[DeltaPublication]) -> None:
        """Hand each delta to its conversation's subscribers."""
        for item in deltas:
            self._channel.announce_delta(
                _key(item.tenant, item.requester_uuid, item.session_id), item.delta
            )

    async def announce_watch(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> None:
        """Tell the conversation's subscribers (its producer) that a follower watches."""
        self._channel.announce(_key(tenant, requester_uuid, session_id), StreamChange.WATCH)

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """A copy of the stored record, or None."""
        async with self._lock:
            current = self._records.get(_key(tenant, requester_uuid, session_id))
            return (
                None if current is None else RecordedStreamEvent.model_validate_json(current.event)
            )

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record iff it still belongs to ``message_id``."""
        key = _key(tenant, requester_uuid, session_id)
        async with self._lock:
            current = self._records.get(key)
            if current is not None and current.message_id == message_id:
                del self._records[key]


@dataclass(frozen=True)
class _Record:
    epoch: int
    message_id: str
    event: str

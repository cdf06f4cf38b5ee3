"""Supervision rows and recordings in dicts: correct within one process only."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
)

_Key = tuple[str, str, str]


def _key(tenant: str, requester_uuid: str | None, session_id: str) -> _Key:
    return (tenant, requester_uuid or "", session_id)


class InMemoryChatStreamSupervisionStore(ChatStreamSupervisionStore):
    """``ChatStreamSupervisionStore`` in this process's memory.

    An ``asyncio.Lock`` makes each check-and-write one step for every task of
    one event loop; other processes (or replicas) see nothing of it. Rows are
    copied in and out, so no caller ever shares an object with the store.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._rows: dict[_Key, ChatStreamSupervision] = {}
        # The highest epoch ever written per conversation; outlives its row.
        self._epochs: dict[_Key, int] = {}

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
        async with self._lock:
            current = self._rows.get(key)
            if (None if current is None else current.epoch) != expected_epoch:
                return False
            if current is None and supervision.epoch <= self._epochs.get(key, 0):
                return False  # that epoch was granted before the row was removed
            self._rows[key] = supervision.model_copy(deep=True)
            self._epochs[key] = max(self._epochs.get(key, 0), supervision.epoch)
            return True

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written, also after the row was deleted."""
        async with self._lock:
            return self._epochs.get(_key(tenant, requester_uuid, session_id), 0)

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


class InMemoryChatStreamRecordingStore(ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` in this process's memory.

    The epoch fence and the write happen under one ``asyncio.Lock``. Records are
    kept as JSON, so nothing is shared with a caller, and because serializing
    costs a quarter of a deep copy: a replica's batch of a thousand puts holds
    the event loop for milliseconds, not tens of them.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._records: dict[_Key, _Record] = {}
        # The fence of each conversation: the highest epoch put or fenced. Kept
        # apart from the record, so ``delete`` leaves it.
        self._fences: dict[_Key, int] = {}

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the stored epoch is higher."""
        (written,) = await self.put_many([RecordingPut(tenant, requester_uuid, session_id, event)])
        if not written:
            fence = self._fences[_key(tenant, requester_uuid, session_id)]
            raise RecordingFencedError(
                f"recording is fenced at epoch {fence}; a write at epoch {event.epoch} is refused"
            )

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse later puts below ``epoch``; the record is unchanged."""
        key = _key(tenant, requester_uuid, session_id)
        async with self._lock:
            self._fences[key] = max(self._fences.get(key, 0), epoch)

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Every put, in order, under one acquisition of the lock."""
        results: list[bool] = []
        async with self._lock:
            for put in puts:
                key = _key(put.tenant, put.requester_uuid, put.session_id)
                if put.event.epoch < self._fences.get(key, 0):
                    results.append(False)
                    continue
                event = put.event
                self._records[key] = _Record(event.epoch, event.message_id, event.model_dump_json())
                self._fences[key] = event.epoch
                results.append(True)
        return results

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

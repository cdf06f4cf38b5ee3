"""The snapshot a follower on another replica streams a reconnect from."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

from pydantic import BaseModel

from tether.domain.chat_message import ChatMessage


class RecordedStreamEvent(BaseModel):
    """The newest cumulative message of a turn, with its stream index and lease epoch."""

    index: int
    message: ChatMessage
    message_id: str
    epoch: int


class RecordingFencedError(Exception):
    """A put was refused because the stored record has a higher epoch."""


class ChatStreamRecordingStore(ABC):
    """One overwritten record per conversation, not an append log.

    Every streamed message is cumulative, so keeping only the newest loses
    nothing. The producer flushes at most every 0.5 seconds; a follower diffs
    by index to serve only what its client has not seen. Writes are atomic at
    the record level: a concurrent reader never sees a torn record.
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

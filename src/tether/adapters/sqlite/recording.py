"""Stream recordings as one overwritten row per conversation, fenced by epoch."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from pydantic import ValidationError

from tether.adapters.sqlite import _codec, queries
from tether.adapters.sqlite._codec import RowKey
from tether.adapters.sqlite._store import SQLiteStore
from tether.adapters.sqlite.database import Lane
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
)
from tether.domain.store_errors import StoreCorruptedError


class SQLiteChatStreamRecordingStore(SQLiteStore, ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` in the ``stream_recording`` table.

    ``put`` reads the stored epoch and upserts inside one ``BEGIN IMMEDIATE``
    transaction, so no other process can slip a write between the fence check
    and the write; a lower epoch raises ``RecordingFencedError`` and changes
    nothing. A row is replaced whole in one statement, so readers never see a
    torn record. Stream lane: atomic, not fsynced (rewritten every half second).
    ``put_many`` makes a whole batch of puts in one such transaction, each
    still fenced on its own row.

    No push channel: ``wait_for_change`` keeps the default, and followers on
    other processes poll, which costs one indexed read per poll.
    """

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the stored epoch is higher."""
        batch = [RecordingPut(tenant, requester_uuid, session_id, event)]
        (stored,) = await self._database.write(Lane.STREAM, lambda c: _put_all(c, batch))
        if stored is not None:
            raise RecordingFencedError(
                f"recording is at epoch {stored}; a write at epoch {event.epoch} is fenced"
            )

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Every put in one transaction (one lock, one commit), each fenced on its
        own row; True per written put, False per fenced one, in order."""
        if not puts:
            return []
        batch = list(puts)
        fenced = await self._database.write(Lane.STREAM, lambda c: _put_all(c, batch))
        return [stored is None for stored in fenced]

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """The stored record, or None; a record that cannot be read back raises
        ``StoreCorruptedError``."""
        row = RowKey(tenant, requester_uuid, session_id)
        return await self._database.read(Lane.STREAM, lambda c: _read(c, row))

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record iff it still belongs to ``message_id``."""
        values = {
            **RowKey(tenant, requester_uuid, session_id).params(),
            "message_id": _codec.key(message_id),
        }
        await self._database.write(
            Lane.STREAM, lambda c: c.execute(queries.RECORDING_DELETE, values)
        )


_Put = tuple[dict[str, bytes], dict[str, object], int]
"""A put's row key parameters, its values, and its epoch."""


def _values(put: RecordingPut) -> _Put:
    event = put.event
    key = RowKey(put.tenant, put.requester_uuid, put.session_id).params()
    values: dict[str, object] = {
        **key,
        "epoch": event.epoch,
        "message_id": _codec.key(event.message_id),
        "stream_index": event.index,
        "message": _codec.dump_model(event.message),
    }
    return key, values, event.epoch


def _put_all(connection: sqlite3.Connection, batch: list[RecordingPut]) -> list[int | None]:
    """Each put unless fenced; per put, None when written or the stored (higher)
    epoch that fenced it. Serializes in the lane's thread, off the event loop."""
    fenced: list[int | None] = []
    for key, values, epoch in map(_values, batch):
        found = connection.execute(queries.RECORDING_EPOCH, key).fetchone()
        if found is not None and epoch < found[0]:
            fenced.append(found[0])
            continue
        connection.execute(queries.RECORDING_PUT, values)
        fenced.append(None)
    return fenced


def _read(connection: sqlite3.Connection, row: RowKey) -> RecordedStreamEvent | None:
    found = connection.execute(queries.RECORDING_READ, row.params()).fetchone()
    if found is None:
        return None
    what = row.describe("stream_recording")
    epoch, message_id, index, message = found
    try:
        return RecordedStreamEvent(
            index=index,
            message=_codec.load_model(ChatMessage, message, what),
            message_id=_codec.text(message_id, what),
            epoch=epoch,
        )
    except ValidationError as exc:
        raise StoreCorruptedError(
            f"{what} does not hold a valid recording ({exc}); left as is"
        ) from exc

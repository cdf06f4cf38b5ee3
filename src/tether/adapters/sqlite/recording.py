"""Stream recordings as one overwritten row per conversation, fenced by epoch."""

from __future__ import annotations

import sqlite3

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
)
from tether.domain.store_errors import StoreCorruptedError


class SQLiteChatStreamRecordingStore(SQLiteStore, ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` in the ``stream_recording`` table.

    ``put`` reads the stored epoch and upserts inside one ``BEGIN IMMEDIATE``
    transaction, so no other process can slip a write between the fence check
    and the write; a lower epoch raises ``RecordingFencedError`` and changes
    nothing. A row is replaced whole in one statement, so readers never see a
    torn record. Stream lane: atomic, not fsynced (rewritten every half second).

    No push channel: ``wait_for_change`` keeps the default, and followers on
    other processes poll, which costs one indexed read per poll.
    """

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the stored epoch is higher."""
        row = RowKey(tenant, requester_uuid, session_id)
        values: dict[str, object] = {
            **row.params(),
            "epoch": event.epoch,
            "message_id": _codec.key(event.message_id),
            "stream_index": event.index,
            "message": _codec.dump_model(event.message),
        }

        def fenced_put(connection: sqlite3.Connection) -> None:
            found = connection.execute(queries.RECORDING_EPOCH, row.params()).fetchone()
            if found is not None and event.epoch < found[0]:
                raise RecordingFencedError(
                    f"recording is at epoch {found[0]}; a write at epoch {event.epoch} is fenced"
                )
            connection.execute(queries.RECORDING_PUT, values)

        await self._database.write(Lane.STREAM, fenced_put)

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

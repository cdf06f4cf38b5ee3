"""Stream recordings as one overwritten row per conversation, fenced by epoch."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from pydantic import ValidationError

from tether.adapters.sqlite import _codec, queries
from tether.adapters.sqlite._codec import RowKey
from tether.adapters.sqlite._store import SQLiteStore, wake_channel
from tether.adapters.sqlite.database import Lane, SQLiteDatabase
from tether.adapters.unix_datagrams import PushesOnThisHost, conversation_key
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
    StreamChange,
)
from tether.domain.store_errors import StoreCorruptedError


class SQLiteChatStreamRecordingStore(PushesOnThisHost, SQLiteStore, ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` in the ``stream_recording`` table, fenced by
    the ``stream_fence`` table.

    The fence of a conversation (the highest epoch of any accepted put or
    ``fence``) is a row of its own, so ``delete`` removes the record and leaves
    the fence, and a fence holds on a conversation with no record. ``put``
    moves the fence to its epoch with a statement that refuses to lower it,
    and upserts the record only if that statement wrote, both inside one
    ``BEGIN IMMEDIATE`` transaction, so no other process can slip a write
    between the fence check and the write; a lower epoch raises
    ``RecordingFencedError`` and changes nothing. A row is replaced whole in one
    statement, so readers never see a torn record. Stream lane: atomic, not
    fsynced (rewritten every half second). ``put_many`` makes a whole batch of
    puts in one such transaction, each still fenced on its own conversation.

    Push: every accepted put and every delete that removed a record is
    announced, once committed, as a datagram to each replica sharing the
    database (``tether.adapters.unix_datagrams``, sockets in ``{file}.wake``);
    so are a follower's watch and a producer's deltas. ``subscribe`` and
    ``wait_for_change`` hear them. A datagram lost is a change the follower
    reads at its next fallback poll; a replica that cannot listen polls.
    """

    def __init__(self, database: SQLiteDatabase) -> None:
        super().__init__(database)
        self._channel = wake_channel(database)

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event`` and raise the fence to its epoch; raise
        ``RecordingFencedError`` and change nothing if the fence is higher."""
        batch = [RecordingPut(tenant, requester_uuid, session_id, event)]
        (fence,) = await self._database.write(Lane.STREAM, lambda c: _put_all(c, batch))
        if fence is not None:
            raise RecordingFencedError(
                f"recording is fenced at epoch {fence}; a write at epoch {event.epoch} is refused"
            )
        self._channel.announce(
            [(conversation_key(tenant, requester_uuid, session_id), StreamChange.RECORDING)]
        )

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Every put in one transaction (one lock, one commit), in order, each
        fenced by its own conversation's fence; True per written put, False per
        fenced one."""
        if not puts:
            return []
        batch = list(puts)
        fences = await self._database.write(Lane.STREAM, lambda c: _put_all(c, batch))
        written = [fence is None for fence in fences]
        self._channel.announce(
            (
                conversation_key(put.tenant, put.requester_uuid, put.session_id),
                StreamChange.RECORDING,
            )
            for put, wrote in zip(batch, written, strict=True)
            if wrote
        )
        return written

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
        """Remove the record iff it still belongs to ``message_id``; the fence stays."""
        values = {
            **RowKey(tenant, requester_uuid, session_id).params(),
            "message_id": _codec.key(message_id),
        }
        removed = await self._database.write(
            Lane.STREAM, lambda c: c.execute(queries.RECORDING_DELETE, values).rowcount
        )
        if removed:
            self._channel.announce(
                [(conversation_key(tenant, requester_uuid, session_id), StreamChange.RECORDING)]
            )

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse every later put below ``epoch`` (the fence never falls); the
        record, if any, is unchanged. One statement, committed when it returns."""
        values = {**RowKey(tenant, requester_uuid, session_id).params(), "epoch": epoch}
        await self._database.write(
            Lane.STREAM, lambda c: c.execute(queries.RECORDING_RAISE_FENCE, values)
        )

    async def aclose(self) -> None:
        """Close this store's socket, and give back its hold on the database."""
        await self._channel.aclose()
        await super().aclose()


_Put = tuple[dict[str, bytes], dict[str, object]]
"""A put's row key parameters, and its values."""


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
    return key, values


def _put_all(connection: sqlite3.Connection, batch: list[RecordingPut]) -> list[int | None]:
    """Each put unless fenced; per put, None when written or the (higher) fence
    that refused it. Run inside one transaction, so each fence check and its
    write are atomic; serializes in the lane's thread, off the event loop."""
    fences: list[int | None] = []
    for key, values in map(_values, batch):
        if connection.execute(queries.RECORDING_ADVANCE_FENCE, values).rowcount == 1:
            connection.execute(queries.RECORDING_PUT, values)
            fences.append(None)
            continue
        # Refused: the fence row exists and is above the put (no other case
        # leaves the upsert without a row); read it for the error message.
        (fence,) = connection.execute(queries.RECORDING_FENCE, key).fetchone()
        fences.append(fence)
    return fences


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

"""Stream recordings in PostgreSQL: one epoch-fenced upsert per put, pushed by NOTIFY."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from tether.adapters.postgres import queries
from tether.adapters.postgres._keys import check_ids, session_key, written_per_item
from tether.adapters.postgres._notifications import delta_payload, watch_payload
from tether.adapters.postgres._store import PostgresStore
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import (
    ChangeSubscription,
    ChatStreamRecordingStore,
    DeltaPublication,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
)
from tether.domain.store_errors import StoreCorruptedError


class PostgresChatStreamRecordingStore(PostgresStore, ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` on PostgreSQL, with push for followers.

    Table ``tether_stream_recording``, one overwritten row per conversation, and
    ``tether_stream_recording_fence``, the conversation's fence (the highest
    epoch of any accepted put or ``fence``), which ``delete`` leaves in place. A
    put is one statement: it raises the fence to its epoch unless the fence is
    higher (an upsert that locks the fence row and re-checks its newest value),
    and writes the record only if that succeeded, so the fence and the write
    are one atomic step, and whether a row came back tells an accepted put
    from a fenced one. Readers see the old row or the new one, never a mix.
    Puts at the stored epoch skip the fsync wait; the put that raises the epoch
    does not (see ``PostgresDatabase``).

    ``put_many`` sends a batch of puts as one statement (one round trip), each
    fenced on its own row.

    Every put and delete, and every supervision write that changes the epoch
    (not a heartbeat), sends ``pg_notify`` with the conversation's key and the
    kind of change; :meth:`subscribe` (and :meth:`wait_for_change`) hear those
    on the database's one shared LISTEN connection.
    """

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event`` and raise the fence to its epoch, atomically; raise
        ``RecordingFencedError`` (and change nothing) if the fence is higher."""
        check_ids(event.message_id)
        message = _message_json(event)
        row = await self._database.fetch_one(
            queries.PUT_RECORDING,
            {
                "key": session_key(tenant, requester_uuid, session_id),
                "tenant": tenant,
                "requester_uuid": requester_uuid or "",
                "session_id": session_id,
                "epoch": event.epoch,
                "stream_index": event.index,
                "message_id": event.message_id,
                "message": message,
            },
        )
        if row is None or row["written"] != 1:
            raise RecordingFencedError(
                f"the recording is fenced above epoch {event.epoch}; this put is refused"
            )

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Independent fenced puts in one round trip; True per written put, False
        per fenced one, in order.

        One statement over ``unnest()`` arrays. Puts of the same conversation are
        applied in order: the batch is cut into rounds where no conversation
        repeats, one statement each (a flush of distinct turns is one round trip).
        """

        async def write_round(batch: list[tuple[int, Any, bytes]]) -> list[Any]:
            return await self._database.fetch_all(queries.PUT_RECORDING_MANY, _batch_params(batch))

        return await written_per_item(puts, write_round)

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """The stored record, or None."""
        key = session_key(tenant, requester_uuid, session_id)
        row = await self._database.fetch_one(queries.READ_RECORDING, {"key": key})
        if row is None:
            return None
        try:
            return RecordedStreamEvent(
                index=row["stream_index"],
                message=ChatMessage.model_validate(row["message"]),
                message_id=row["message_id"],
                epoch=row["epoch"],
            )
        except ValidationError as error:
            raise StoreCorruptedError(
                f"tether_stream_recording row for {(tenant, requester_uuid, session_id)!r} "
                f"is not a valid recording ({error}); left as is"
            ) from error

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record iff it still belongs to ``message_id``; the fence stays."""
        check_ids(message_id)
        key = session_key(tenant, requester_uuid, session_id)
        await self._database.execute(
            queries.DELETE_RECORDING, {"key": key, "message_id": message_id}
        )

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse every later put below ``epoch``, durably, from the moment this
        returns; the record is unchanged, and a lower fence never lowers it."""
        await self._database.execute(
            queries.FENCE_RECORDING,
            {
                "key": session_key(tenant, requester_uuid, session_id),
                "tenant": tenant,
                "requester_uuid": requester_uuid or "",
                "session_id": session_id,
                "epoch": epoch,
            },
        )

    def subscribe(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChangeSubscription:
        """Hear this conversation's puts and deletes (``RECORDING``) and its
        supervision writes that change the epoch (``SUPERVISION``) from now on,
        level-triggered (see ``ChangeSubscription``).

        Registers with the database's shared LISTEN connection, starting it if
        needed; a subscription made before LISTEN is in effect hears both kinds
        once it is, and so does every subscription after a reconnect (changes
        made meanwhile were announced to nobody). While the connection is down,
        ``wait`` sleeps out its ``max_wait``: holders poll.
        """
        return self._database.subscribe(session_key(tenant, requester_uuid, session_id))

    async def publish_deltas(self, deltas: Sequence[DeltaPublication]) -> None:
        """Every delta as a NOTIFY, in one statement; a payload over PostgreSQL's
        limit is left out (its followers bridge the gap from the snapshot)."""
        payloads = []
        for item in deltas:
            payload = delta_payload(
                session_key(item.tenant, item.requester_uuid, item.session_id), item.delta
            )
            if len(payload.encode()) <= queries.MAX_PAYLOAD_BYTES:
                payloads.append(payload)
        if payloads:
            await self._database.execute(queries.PUBLISH, {"payloads": payloads})

    async def announce_watch(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> None:
        """NOTIFY the conversation's producer that a follower wants its deltas."""
        payload = watch_payload(session_key(tenant, requester_uuid, session_id))
        await self._database.execute(queries.PUBLISH, {"payloads": [payload]})

    async def listen(self) -> None:
        """Start the shared LISTEN connection now and wait until it is in effect
        (optional: the first subscription starts it); ``StoreUnavailableError``
        if it is not within the database's ``timeout``."""
        await self._database.listen()

    async def wait_for_change(
        self, tenant: str, requester_uuid: str | None, session_id: str, max_wait: float
    ) -> bool:
        """True as soon as a recording write or an epoch-changing supervision write
        to this conversation is notified, False after ``max_wait`` seconds
        without one. Only what is announced during the call counts: prefer
        :meth:`subscribe`, which never loses a change.

        While the LISTEN connection is down (it reconnects in the background)
        this sleeps out ``max_wait``, so followers fall back to polling.
        """
        key = session_key(tenant, requester_uuid, session_id)
        return await self._database.wait_for_change(key, max_wait)


def _message_json(event: RecordedStreamEvent) -> str:
    return json.dumps(event.message.model_dump(mode="json"), allow_nan=False, separators=(",", ":"))


def _batch_params(puts: list[tuple[int, RecordingPut, bytes]]) -> dict[str, Any]:
    for _, put, _ in puts:
        check_ids(put.event.message_id)
    return {
        "keys": [key for _, _, key in puts],
        "tenants": [put.tenant for _, put, _ in puts],
        "requester_uuids": [put.requester_uuid or "" for _, put, _ in puts],
        "session_ids": [put.session_id for _, put, _ in puts],
        "epochs": [put.event.epoch for _, put, _ in puts],
        "stream_indexes": [put.event.index for _, put, _ in puts],
        "message_ids": [put.event.message_id for _, put, _ in puts],
        "messages": [_message_json(put.event) for _, put, _ in puts],
    }

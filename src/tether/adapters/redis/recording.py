"""Stream recordings on Redis: epoch-fenced put and guarded delete, plus pub/sub wake-ups."""

from __future__ import annotations

from tether.adapters.redis._store import RedisStore, corrupt, parse_row
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
)

# Lua numbers are doubles: beyond 2^53 the fence's comparison would round.
_EXACT_EPOCHS = 2**53


class RedisChatStreamRecordingStore(RedisStore, ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` on Redis, correct for any number of replicas.

    One hash per conversation, ``{prefix}stream-recording:{conversation}``
    (fields ``epoch``, ``message_id``, ``event`` JSON), overwritten by every
    put. The fence (refuse a put below the stored epoch) and the write are one
    Lua script; so is the guarded delete. A reader fetches the hash with one
    command, so it never sees a torn record. Every put refreshes the
    connection's ``stream_ttl`` on the record and announces the conversation on
    the change channel, which ``wait_for_change`` listens to.
    """

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the stored epoch is higher.

        Epochs must lie within +-2^53 (``ValueError`` otherwise), where the
        script compares them exactly.
        """
        if not -_EXACT_EPOCHS < event.epoch < _EXACT_EPOCHS:
            raise ValueError(f"epoch {event.epoch} is out of the Redis backend's range (2^53)")
        connection = self._connection
        layout = connection.keys
        conversation = layout.conversation(tenant, requester_uuid, session_id)
        args: list[str | int] = [
            str(event.epoch),
            event.message_id,
            event.model_dump_json(),
            connection.stream_ttl,
            layout.channel,
            conversation,
        ]
        with connection.translate_errors("put a recording"):
            written, stored = await connection.scripts.recording_put(
                layout.recording(conversation), args
            )
        if int(written) != 1:
            raise RecordingFencedError(
                f"recording is at epoch {int(stored)}; a write at epoch {event.epoch} is fenced"
            )

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """The stored record, or None. One HMGET: the record is never torn."""
        layout = self._connection.keys
        key = layout.recording(layout.conversation(tenant, requester_uuid, session_id))
        with self._connection.translate_errors("read a recording"):
            epoch, document = await self._connection.client.hmget(key, ["epoch", "event"])
        if epoch is None and document is None:
            return None
        if epoch is None or document is None:
            raise corrupt(key, "is a recording missing its epoch or event field")
        return parse_row(RecordedStreamEvent, document, epoch, key)

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record iff it still belongs to ``message_id``."""
        layout = self._connection.keys
        conversation = layout.conversation(tenant, requester_uuid, session_id)
        with self._connection.translate_errors("delete a recording"):
            await self._connection.scripts.recording_delete(
                layout.recording(conversation), [message_id, layout.channel, conversation]
            )

    async def wait_for_change(
        self, tenant: str, requester_uuid: str | None, session_id: str, max_wait: float
    ) -> bool:
        """True as soon as a put, delete or supervision write of this conversation
        is announced on the change channel (by any process); False after
        ``max_wait`` seconds without one.

        Listens on the connection's one shared subscription, started on the first
        call. While that subscription is down, this sleeps out ``max_wait`` (the
        caller polls) and the subscription is restored in the background; once
        it is back every waiter is woken, since changes may have been missed. A
        change that lands between the caller's read and this call is not seen
        here; a running producer writes again within a second.
        """
        layout = self._connection.keys
        conversation = layout.conversation(tenant, requester_uuid, session_id)
        return await self._connection.wait_for_change(conversation, max_wait)

"""Stream recordings on Redis: epoch-fenced put and guarded delete, plus pub/sub wake-ups."""

from __future__ import annotations

from collections.abc import Sequence

from tether.adapters.redis._changes import announcement, delta_announcement
from tether.adapters.redis._store import RedisStore, corrupt, parse_row
from tether.domain.chat_stream_recording_store import (
    ChangeSubscription,
    ChatStreamRecordingStore,
    DeltaPublication,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
    StreamChange,
)

# Lua numbers are doubles: beyond 2^53 the fence's comparison would round.
_EXACT_EPOCHS = 2**53


class RedisChatStreamRecordingStore(RedisStore, ChatStreamRecordingStore):
    """``ChatStreamRecordingStore`` on Redis, correct for any number of replicas.

    One hash per conversation, ``{prefix}stream-recording:{conversation}``
    (fields ``epoch``, ``message_id``, ``event`` JSON), overwritten by every
    put. The fence lives beside it in ``{prefix}recording-fence:{conversation}``
    (the highest epoch of any accepted put or ``fence``; no TTL, so neither the
    record's ``delete`` nor its expiry lowers it). The fence check and the write
    are one Lua script; so are ``fence`` and the guarded delete. A reader
    fetches the hash with one command, so it never sees a torn record. Every
    put refreshes the connection's ``stream_ttl`` on the record and announces
    the conversation (kind ``RECORDING``) on the change channel, which
    ``subscribe`` and ``wait_for_change`` listen to; so does a delete. One
    fence key stays per conversation.
    """

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        """Store ``event``; raise ``RecordingFencedError`` if the fence is higher.

        Epochs must lie within +-2^53 (``ValueError`` otherwise), where the
        script compares them exactly.
        """
        keys, args = self._script_call(RecordingPut(tenant, requester_uuid, session_id, event))
        scripts = self._connection.scripts
        written, fence = await self._connection.call(
            "put a recording", lambda: scripts.recording_put(keys, args)
        )
        if int(written) != 1:
            raise RecordingFencedError(
                f"recording is fenced at epoch {int(fence)}; a write at epoch {event.epoch}"
                " is refused"
            )

    async def put_many(self, puts: Sequence[RecordingPut]) -> list[bool]:
        """Every put in ONE round trip: a pipeline of the ``put`` script, one call
        per put, each fenced by its own conversation's fence and run in order. True per written
        put, False per fenced one. Not a transaction: the first error (a damaged
        record) raises for the batch, after the other calls ran."""
        if not puts:
            return []
        calls = [self._script_call(put) for put in puts]
        scripts = self._connection.scripts
        replies = await self._connection.call(
            "put recordings", lambda: scripts.recording_put_many(calls)
        )
        return [int(written) == 1 for written, _ in replies]

    def _script_call(self, put: RecordingPut) -> tuple[list[str], list[str | int]]:
        event = put.event
        _check_range(event.epoch)
        connection = self._connection
        layout = connection.keys
        conversation = layout.conversation(put.tenant, put.requester_uuid, put.session_id)
        args: list[str | int] = [
            str(event.epoch),
            event.message_id,
            event.model_dump_json(),
            connection.stream_ttl,
            layout.channel,
            announcement(conversation, StreamChange.RECORDING),
        ]
        return [layout.recording(conversation), layout.recording_fence(conversation)], args

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse every later put below ``epoch`` (within +-2^53, ``ValueError``
        otherwise); the record is unchanged. One script: the fence never goes
        down, and holds on a conversation without a record too."""
        _check_range(epoch)
        layout = self._connection.keys
        key = layout.recording_fence(layout.conversation(tenant, requester_uuid, session_id))
        scripts = self._connection.scripts
        await self._connection.call(
            "fence a recording", lambda: scripts.recording_fence([key], [str(epoch)])
        )

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        """The stored record, or None. One HMGET: the record is never torn."""
        layout = self._connection.keys
        key = layout.recording(layout.conversation(tenant, requester_uuid, session_id))
        client = self._connection.client
        epoch, document = await self._connection.call(
            "read a recording", lambda: client.hmget(key, ["epoch", "event"])
        )
        if epoch is None and document is None:
            return None
        if epoch is None or document is None:
            raise corrupt(key, "is a recording missing its epoch or event field")
        return parse_row(RecordedStreamEvent, document, epoch, key)

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        """Remove the record iff it still belongs to ``message_id``; its fence stays."""
        layout = self._connection.keys
        conversation = layout.conversation(tenant, requester_uuid, session_id)
        keys = [layout.recording(conversation), layout.recording_fence(conversation)]
        args: list[str | int] = [
            message_id,
            layout.channel,
            announcement(conversation, StreamChange.RECORDING),
        ]
        scripts = self._connection.scripts
        await self._connection.call(
            "delete a recording", lambda: scripts.recording_delete(keys, args)
        )

    def subscribe(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChangeSubscription:
        """Hear this conversation's puts and deletes (``RECORDING``) and its
        supervision writes that change the epoch, and deletes (``SUPERVISION``),
        from now on, level-triggered (see ``ChangeSubscription``).

        Registers with the connection's one shared pub/sub subscription,
        starting it if needed; a subscription made before the channel is
        subscribed hears both kinds once it is, and so does every subscription
        after a resubscribe (changes made meanwhile were heard by nobody). While
        the channel is down, ``wait`` sleeps out its ``max_wait``: holders poll.
        """
        layout = self._connection.keys
        return self._connection.subscribe(layout.conversation(tenant, requester_uuid, session_id))

    async def publish_deltas(self, deltas: Sequence[DeltaPublication]) -> None:
        """Every delta as a PUBLISH on the change channel, in one pipeline."""
        if not deltas:
            return
        layout, client = self._connection.keys, self._connection.client

        async def publish() -> None:
            async with client.pipeline(transaction=False) as pipe:
                for item in deltas:
                    conversation = layout.conversation(
                        item.tenant, item.requester_uuid, item.session_id
                    )
                    pipe.publish(layout.channel, delta_announcement(conversation, item.delta))
                await pipe.execute()

        await self._connection.call("publish stream deltas", publish)

    async def announce_watch(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> None:
        """Tell the conversation's producer that a follower wants its deltas."""
        layout, client = self._connection.keys, self._connection.client
        message = announcement(
            layout.conversation(tenant, requester_uuid, session_id), StreamChange.WATCH
        )
        await self._connection.call(
            "announce a watch", lambda: client.publish(layout.channel, message)
        )

    async def listen(self) -> None:
        """Start the change feed now and wait until its channel is subscribed
        (optional: the first subscription starts it); ``StoreUnavailableError``
        if it is not within 5 seconds."""
        await self._connection.listen()

    async def wait_for_change(
        self, tenant: str, requester_uuid: str | None, session_id: str, max_wait: float
    ) -> bool:
        """True as soon as a put, delete or epoch-changing supervision write of
        this conversation is announced on the change channel (by any process);
        False after ``max_wait`` seconds without one.

        Listens on the connection's one shared subscription, started on the first
        call. While that subscription is down, this sleeps out ``max_wait`` (the
        caller polls) and the subscription is restored in the background; once
        it is back every waiter is woken, since changes may have been missed. A
        change that lands between the caller's read and this call is not seen
        here (:meth:`subscribe` sees it).
        """
        layout = self._connection.keys
        conversation = layout.conversation(tenant, requester_uuid, session_id)
        return await self._connection.wait_for_change(conversation, max_wait)


def _check_range(epoch: int) -> None:
    if not -_EXACT_EPOCHS < epoch < _EXACT_EPOCHS:
        raise ValueError(f"epoch {epoch} is out of the Redis backend's range (2^53)")

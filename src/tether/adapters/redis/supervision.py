"""Supervision rows on Redis: epoch compare-and-swap and guarded delete, each one Lua script."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

from tether.adapters.redis._changes import announcement
from tether.adapters.redis._keys import DEAD_TURNS, encode_part
from tether.adapters.redis._store import RedisStore, corrupt, parse_row
from tether.adapters.redis.presence import RedisPresenceLock
from tether.domain.chat_stream_recording_store import ChangeSubscription, StreamChange
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    PresenceLock,
    StaleTurn,
    SupervisionSwap,
)

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_CLEANUP = 1_000
"""At most this many members without a listable row are removed from the
running set by one ``list_stale_running`` call (a Lua script blocks the server
while it runs); the next call goes on."""


class RedisChatStreamSupervisionStore(RedisStore, ChatStreamSupervisionStore):
    """``ChatStreamSupervisionStore`` on Redis, correct for any number of replicas.

    One hash per conversation, ``{prefix}stream-supervision:{conversation}``
    (fields ``epoch``, ``message_id``, ``row`` JSON, ``token``). The check and
    the write of ``compare_and_swap`` and ``delete`` are one Lua script each, so
    no other client's command can come between them. Every write sets the
    connection's ``stream_ttl`` on the row (a running turn renews it with every
    heartbeat; the rows of finished or abandoned turns expire). Every write that
    changes the epoch (a claim, a takeover, a cancel, a verdict, a hand-off) and
    every delete publishes the conversation (kind ``SUPERVISION``) on the change
    channel, which wakes followers on any replica; a heartbeat (a swap at the
    same epoch) publishes nothing.

    Beside each row, ``{prefix}supervision-epoch:{conversation}`` holds the
    highest epoch ever written for the conversation (``last_epoch``). The same
    script that writes the row raises it, and it has no TTL, so neither the
    row's ``delete`` nor its expiry loses it: a claim (``expected_epoch=None``)
    at an epoch not above it is refused. One such key stays per conversation.

    A call the client resends after losing the reply (the driver retries once on
    a timeout) recognises its own earlier write by a per-call token and reports
    it as written, instead of refusing it as a stale epoch.

    ``{prefix}running-heartbeats``, one sorted set, holds the conversations
    whose row is RUNNING, scored by the heartbeat in microseconds: the same
    script that writes a row adds or removes its conversation, so the set
    never disagrees with a row it lists, and ``list_stale_running`` reads the
    oldest members and their rows in one script. Members whose row expired
    are removed when a listing meets them.
    """

    def presence_lock(self) -> PresenceLock:
        """A named client connection per replica (``tether.adapters.redis.presence``)."""
        return RedisPresenceLock(self._connection)

    async def announce_dead_turns(self) -> None:
        """A PUBLISH that wakes every replica's takeover loop (see the base class)."""
        layout, client = self._connection.keys, self._connection.client
        message = announcement(DEAD_TURNS, StreamChange.SUPERVISION)
        await self._connection.call(
            "announce dead turns", lambda: client.publish(layout.channel, message)
        )

    def subscribe_dead_turns(self) -> ChangeSubscription:
        """Hear ``announce_dead_turns`` on the connection's shared change feed
        (starting it if needed; while it is down, ``wait`` sleeps: the loop scans)."""
        return self._connection.subscribe(DEAD_TURNS)

    def for_another_loop(self) -> RedisChatStreamSupervisionStore:
        """This store over a client of its own (see the base class)."""
        return type(self)(self._connection.for_another_loop())

    async def compare_and_swap(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        expected_epoch: int | None,
        supervision: ChatStreamSupervision,
    ) -> bool:
        """Write ``supervision`` iff the row's epoch is ``expected_epoch`` (None: no
        row, and ``supervision.epoch`` above ``last_epoch``)."""
        swap = SupervisionSwap(tenant, requester_uuid, session_id, expected_epoch, supervision)
        (written,) = await self._swap([swap])
        return written

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        """All ``swaps`` in ONE round trip: one script call over all their keys.

        The script decides each swap by its own epoch guard, in order (a later
        swap of the same row sees the earlier one's write), exactly as the same
        calls one by one would; it is not a transaction across rows. Results
        are in the order of ``swaps``.

        Redis Cluster caveat: a script may only touch keys of one hash slot, and
        these keys carry no hash tag, so on a cluster this call would fail with
        CROSSSLOT. This backend takes a standalone (or Sentinel-managed)
        ``redis.asyncio.Redis``; a cluster port would hash-tag the conversation
        (a row and its epoch key must share a slot), group swaps by slot and
        send one script call per group.
        """
        if not swaps:
            return []
        return await self._swap(swaps)

    async def last_epoch(self, tenant: str, requester_uuid: str | None, session_id: str) -> int:
        """The highest epoch ever written for the conversation, ``0`` when none;
        kept when the row is deleted or expires. One GET."""
        layout = self._connection.keys
        key = layout.supervision_epoch(layout.conversation(tenant, requester_uuid, session_id))
        client = self._connection.client
        stored = await self._connection.call(
            "read a conversation's last epoch", lambda: client.get(key)
        )
        if stored is None:
            return 0
        try:
            return int(stored)
        except ValueError as error:
            raise corrupt(key, f"holds no epoch ({error})") from error

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        """The current row, or None. One HMGET: the row is never torn."""
        key = self._key(tenant, requester_uuid, session_id)
        client = self._connection.client
        epoch, document = await self._connection.call(
            "read a supervision row", lambda: client.hmget(key, ["epoch", "row"])
        )
        if epoch is None and document is None:
            return None
        if epoch is None or document is None:
            raise corrupt(key, "is a supervision row missing its epoch or row field")
        return parse_row(ChatStreamSupervision, document, epoch, key)

    async def find_by_message_id(
        self, tenant: str, requester_uuid: str | None, message_id: str
    ) -> str | None:
        """The requester's session whose row holds ``message_id``, or None: the
        turn's index key, checked against the row it names (two GETs)."""
        layout = self._connection.keys
        index = layout.supervision_message(tenant, requester_uuid, message_id)
        client = self._connection.client
        stored = await self._connection.call(
            "find a turn's conversation", lambda: client.get(index)
        )
        if stored is None:
            return None
        encoded = stored.decode("ascii") if isinstance(stored, bytes) else str(stored)
        session_id = unquote(encoded, errors="surrogatepass")
        key = self._key(tenant, requester_uuid, session_id)
        holding = await self._connection.call(
            "read a supervision row's turn", lambda: client.hget(key, "message_id")
        )
        if isinstance(holding, bytes):
            holding = holding.decode("utf-8", "surrogatepass")
        return session_id if holding == message_id else None

    async def list_stale_running(self, heartbeat_before: datetime, limit: int) -> list[StaleTurn]:
        """RUNNING rows whose heartbeat is older than ``heartbeat_before``, oldest
        first, at most ``limit``: one script reads the oldest members of the
        running set and their rows (one round trip), removing on its way the
        members whose row expired. A naive bound is UTC, as a row's heartbeat
        is; a listed row that cannot be read back raises ``StoreCorruptedError``."""
        if limit <= 0:
            return []
        if heartbeat_before.tzinfo is None:
            heartbeat_before = heartbeat_before.replace(tzinfo=UTC)
        layout = self._connection.keys
        keys = [layout.running_heartbeats]
        args: list[str | int] = [
            layout.supervision(""),  # a row's key is this and its conversation
            _microseconds(heartbeat_before),
            limit,
            _CLEANUP,
        ]
        scripts = self._connection.scripts
        found = await self._connection.call(
            "list dead turns", lambda: scripts.supervision_stale(keys, args)
        )
        stale: list[StaleTurn] = []
        for member, epoch, document in zip(found[0::3], found[1::3], found[2::3], strict=True):
            conversation = member.decode("utf-8") if isinstance(member, bytes) else str(member)
            key = layout.supervision(conversation)
            row = parse_row(ChatStreamSupervision, document, epoch, key)
            try:
                tenant, requester_uuid, session_id = layout.conversation_ids(conversation)
            except ValueError as error:
                problem = f"holds a member that names no conversation: {conversation[:200]!r}"
                raise corrupt(layout.running_heartbeats, problem) from error
            # The script's set is exact; the row itself has the last word.
            if row.status is ChatStreamStatus.RUNNING and row.heartbeat_at < heartbeat_before:
                stale.append(StaleTurn(tenant, requester_uuid, session_id, row))
        return stale

    async def server_time(self) -> datetime:
        """The server's clock (``TIME``), in UTC: one round trip."""
        client = self._connection.client
        seconds, microseconds = await self._connection.call(
            "read the server's time", lambda: client.time()
        )
        return datetime.fromtimestamp(int(seconds), UTC) + timedelta(microseconds=int(microseconds))

    async def delete(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_id: str,
        epoch: int,
    ) -> None:
        """Remove the row iff it still holds exactly ``message_id`` at ``epoch``;
        the conversation's ``last_epoch`` stays."""
        layout = self._connection.keys
        conversation = layout.conversation(tenant, requester_uuid, session_id)
        args: list[str | int] = [
            message_id,
            str(epoch),
            layout.channel,
            announcement(conversation, StreamChange.SUPERVISION),
            conversation,
        ]
        keys = [
            layout.supervision(conversation),
            layout.supervision_epoch(conversation),
            layout.supervision_message(tenant, requester_uuid, message_id),
            layout.running_heartbeats,
        ]
        scripts = self._connection.scripts
        await self._connection.call(
            "delete a supervision row", lambda: scripts.supervision_delete(keys, args)
        )

    async def _swap(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        layout = self._connection.keys
        keys: list[str] = [layout.running_heartbeats]
        args: list[str | int] = [self._connection.stream_ttl, layout.channel, uuid.uuid4().hex]
        for swap in swaps:
            conversation = layout.conversation(swap.tenant, swap.requester_uuid, swap.session_id)
            row = swap.supervision
            keys += [
                layout.supervision(conversation),
                layout.supervision_epoch(conversation),
                layout.supervision_message(swap.tenant, swap.requester_uuid, row.message_id),
            ]
            expected = "" if swap.expected_epoch is None else str(swap.expected_epoch)
            args += [
                expected,
                str(row.epoch),
                row.message_id,
                row.model_dump_json(),
                announcement(conversation, StreamChange.SUPERVISION),
                encode_part(swap.session_id),
                conversation,
                _microseconds(row.heartbeat_at) if row.status is ChatStreamStatus.RUNNING else "",
                layout.supervision_message(swap.tenant, swap.requester_uuid, ""),
            ]
        scripts = self._connection.scripts
        written = await self._connection.call(
            "compare-and-swap a supervision row", lambda: scripts.supervision_cas(keys, args)
        )
        return [int(flag) == 1 for flag in written]

    def _key(self, tenant: str, requester_uuid: str | None, session_id: str) -> str:
        layout = self._connection.keys
        return layout.supervision(layout.conversation(tenant, requester_uuid, session_id))


def _microseconds(moment: datetime) -> str:
    """``moment`` (aware) as whole microseconds since 1970, in decimal: the
    running set's score, exact (a datetime has no finer digit)."""
    return str((moment - _UNIX_EPOCH) // _MICROSECOND)

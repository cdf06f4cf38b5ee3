"""Replica presence on Redis: a named client connection per replica.

Each replica keeps one connection of its own open for its whole life, named
``{prefix}presence:{replica id}`` (``CLIENT SETNAME``, sent as it connects).
When the process dies the kernel closes the socket and Redis drops the
client at once; while the process lives (however slow, even SIGSTOP'd) the
connection stays, and a partitioned one stays until Redis's TCP keepalive
gives up on it (minutes). Other replicas read ``CLIENT LIST`` and judge an id
with no such connection gone (``tether.runtime.presence``).

The connection carries nothing but a ``PING`` each heartbeat interval
(``is_held``), and is never reconnected under its name: a dropped connection
(a Redis restart, a network reset) reads as a gone replica, for good, and the
replica takes a new id on a new connection (``tether.runtime.presence``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from tether.domain.chat_stream_supervision_store import PresenceLock

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection

    from tether.adapters.redis.connection import RedisConnection


class RedisPresenceLock(PresenceLock):
    def __init__(self, connection: RedisConnection) -> None:
        self._connection = connection
        self._held: AbstractConnection | None = None

    async def hold(self, replica_id: str) -> None:
        pool, keys = self._connection.client.connection_pool, self._connection.keys
        held = pool.connection_class(
            **{**pool.connection_kwargs, "client_name": keys.presence_client(replica_id)}
        )
        await self._connection.call("connect", held.connect)
        self._held = held

    async def find_free(self, replica_ids: Collection[str]) -> set[str]:
        client = self._connection.client
        listed = await self._connection.call("list clients", lambda: client.client_list("normal"))
        names = {entry.get("name", "") for entry in listed}
        keys = self._connection.keys
        return {r for r in replica_ids if keys.presence_client(r) not in names}

    async def is_held(self) -> bool:
        held = self._held
        # redis-py reconnects a disconnected connection on its next command,
        # under the same name: a lost one must stay lost, so it is not asked.
        if held is None or not held.is_connected:
            return False
        try:
            await held.send_command("PING")
            await held.read_response()
        except (RedisError, OSError):
            return False
        return True

    async def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            await held.disconnect()

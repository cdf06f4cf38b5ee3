"""Replica presence on PostgreSQL: a session-level advisory lock per replica.

Each replica holds ``pg_advisory_lock_shared(namespace, hash(replica id))`` on
a connection of its own for its whole life. When the process dies the kernel
closes that connection, the server ends the session and the lock is gone;
while the process lives (however slow) the session and the lock stay. Other
replicas read ``pg_locks`` (one query for every id they ask about) and judge
an id whose lock no session holds gone (``tether.runtime.presence``).

Shared mode, so that two ids whose 32-bit hashes collide can both be held;
a collision can then only make a dead replica look alive, which costs the
dead threshold, never a takeover of a live one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import psycopg

from tether.domain.chat_stream_supervision_store import PresenceLock

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from tether.adapters.postgres.database import PostgresDatabase

_NAMESPACE = int.from_bytes(b"tthr", "big", signed=True)
"""The advisory lock's first key: tether's presence locks, apart from any other
application's advisory locks on the same database."""

_HELD = """
SELECT objid::bigint AS objid FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND granted
  AND classid = %(namespace)s::bigint::oid
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def _key(replica_id: str) -> int:
    """The replica's lock key, as ``pg_advisory_lock_shared(int, int)`` takes it."""
    return int.from_bytes(hashlib.sha256(replica_id.encode()).digest()[:4], "big", signed=True)


def _unsigned(key: int) -> int:
    # pg_locks shows the int4 keys as oid (unsigned 32-bit).
    return key & 0xFFFFFFFF


class PostgresPresenceLock(PresenceLock):
    def __init__(self, database: PostgresDatabase) -> None:
        self._database = database
        self._connection: AsyncConnection[Any] | None = None

    async def hold(self, replica_id: str) -> None:
        connection = await self._database.connect_directly()
        try:
            await connection.execute(
                "SELECT pg_advisory_lock_shared(%s, %s)", (_NAMESPACE, _key(replica_id))
            )
        except BaseException:
            await connection.close()
            raise
        self._connection = connection

    async def find_free(self, replica_ids: Collection[str]) -> set[str]:
        rows = await self._database.fetch_all(_HELD, {"namespace": _unsigned(_NAMESPACE)})
        held = {row["objid"] for row in rows}
        return {r for r in replica_ids if _unsigned(_key(r)) not in held}

    async def is_held(self) -> bool:
        # While the session lives, so does its lock: ask the session itself
        # (one round trip a heartbeat interval, on the lock's own connection).
        connection = self._connection
        if connection is None or connection.closed:
            return False
        try:
            await connection.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    async def release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            # Closing the session releases its advisory locks.
            await connection.close()

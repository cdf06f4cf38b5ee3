"""The versioned schema: an append-only list of migrations, applied under an advisory lock.

``tether_schema_version`` holds one row per applied migration. :func:`upgrade`
takes a transaction-scoped advisory lock first, so replicas starting together
(each with ``create_schema=true``) or a deploy step running ``tether db
upgrade`` next to them apply each migration exactly once: the others wait for
the lock, then find nothing left to do. PostgreSQL DDL is transactional, so a
migration that fails leaves nothing half-applied.

A released migration is never edited: change the schema by appending a new one.
Migrations should stay backwards compatible for one release (add columns and
tables, drop them a release later), because during a rolling deploy replicas of
the previous version keep running on the upgraded schema.

Keys: every table is keyed by ``key``, the SHA-256 of the row's length-prefixed
ids (see ``_keys.row_key``), or for a conversation's stream rows and the
numbers kept for it for ever, its tombstone (``_keys.session_key``: a keyed
hash, since version 6); the ids are kept beside it as text for operators and
for listing, but not in those numbers, which outlive an erase. A digest
indexes ids of any length in 32 bytes, where a text key longer than about
2.7 kB would be refused by a B-tree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import DictRow, dict_row

from tether.adapters.postgres import queries
from tether.adapters.postgres._keys import session_key, tombstones

SCHEMA_LOCK_KEY = 8387237872774807553
"""The advisory lock upgrades hold: ``int.from_bytes(b"tether\\x00\\x01")``."""


@dataclass(frozen=True)
class Migration:
    """One step of the schema: ``before`` (a step no SQL alone can do), then
    ``statements`` in order, in one transaction."""

    version: int
    description: str
    statements: tuple[str, ...]
    before: Callable[[AsyncCursor[DictRow]], Awaitable[None]] | None = None


_KEYED_BY_CONVERSATION = (
    ("tether_agent_state", "user_uuid"),
    ("tether_stream_supervision", "requester_uuid"),
    ("tether_stream_recording", "requester_uuid"),
    ("tether_agent_state_fence", "user_uuid"),
    ("tether_stream_supervision_epoch", "requester_uuid"),
    ("tether_stream_recording_fence", "requester_uuid"),
)
"""The tables keyed by a conversation's ``session_key``, and their requester column."""


async def _rekey_by_tombstone(cursor: AsyncCursor[DictRow]) -> None:
    """Key every row of a conversation by its tombstone (``_keys.session_key``:
    a keyed hash), in place of the SHA-256 of its ids, while the fence tables
    still have the ids to compute it from. The table names are constants."""
    for table, requester in _KEYED_BY_CONVERSATION:
        await cursor.execute(
            f"SELECT key, tenant, {requester} AS requester, session_id FROM {table}"
        )
        rows = await cursor.fetchall()
        for row in rows:
            new = session_key(row["tenant"], row["requester"], row["session_id"])
            await cursor.execute(
                f"UPDATE {table} SET key = %(new)s WHERE key = %(old)s",
                {"new": new, "old": row["key"]},
            )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="agent state, stream supervision and recording, conversations",
        statements=(
            """
            CREATE TABLE tether_agent_state (
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                tenant text NOT NULL,
                user_uuid text NOT NULL,
                session_id text NOT NULL,
                state jsonb NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            """
            CREATE TABLE tether_stream_supervision (
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                tenant text NOT NULL,
                requester_uuid text NOT NULL,
                session_id text NOT NULL,
                status text NOT NULL CHECK (status IN ('running', 'done', 'errored', 'cancelled')),
                heartbeat_at timestamptz NOT NULL,
                message_id text NOT NULL,
                epoch bigint NOT NULL
            )
            """,
            """
            CREATE TABLE tether_stream_recording (
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                tenant text NOT NULL,
                requester_uuid text NOT NULL,
                session_id text NOT NULL,
                epoch bigint NOT NULL,
                stream_index bigint NOT NULL,
                message_id text NOT NULL,
                message jsonb NOT NULL,
                recorded_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            """
            CREATE TABLE tether_conversations (
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                owner_key bytea NOT NULL CHECK (octet_length(owner_key) = 32),
                tenant text NOT NULL,
                session_id text NOT NULL,
                owner_uuid text NOT NULL,
                agent_identifier text NOT NULL,
                shared boolean NOT NULL DEFAULT false,
                last_turn_status text
                    CHECK (last_turn_status IN ('running', 'complete', 'errored', 'cancelled')),
                title text,
                message_count integer NOT NULL DEFAULT 0,
                metadata jsonb NOT NULL DEFAULT '{}',
                created_at timestamptz NOT NULL,
                updated_at timestamptz NOT NULL
            )
            """,
            # Listing: a tenant's own conversations, most recently updated first.
            # owner_key is the digest of (tenant, owner_uuid), so this is the
            # (tenant, owner, updated_at DESC) index, whatever the ids' length.
            """
            CREATE INDEX tether_conversations_by_owner
            ON tether_conversations (owner_key, updated_at DESC, key DESC)
            """,
            """
            CREATE TABLE tether_conversation_messages (
                conversation_key bytea NOT NULL
                    REFERENCES tether_conversations (key) ON DELETE CASCADE,
                position integer NOT NULL,
                message jsonb NOT NULL,
                PRIMARY KEY (conversation_key, position)
            )
            """,
        ),
    ),
    Migration(
        version=2,
        description="epoch fences that outlive their rows",
        statements=(
            # Each fence is a table of its own, not a column or a tombstone in the
            # row it fences: a deleted row must leave its fence behind, and
            # replicas of the previous release, still running during a rolling
            # deploy, must never see a tombstone as a live row.
            #
            # The highest supervision epoch ever written per conversation.
            """
            CREATE TABLE tether_stream_supervision_epoch (
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                tenant text NOT NULL,
                requester_uuid text NOT NULL,
                session_id text NOT NULL,
                epoch bigint NOT NULL
            )
            """,
            """
            INSERT INTO tether_stream_supervision_epoch
                (key, tenant, requester_uuid, session_id, epoch)
            SELECT key, tenant, requester_uuid, session_id, epoch
            FROM tether_stream_supervision
            """,
            # The highest epoch of any accepted recording put or fence.
            """
            CREATE TABLE tether_stream_recording_fence (
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                tenant text NOT NULL,
                requester_uuid text NOT NULL,
                session_id text NOT NULL,
                epoch bigint NOT NULL
            )
            """,
            """
            INSERT INTO tether_stream_recording_fence
                (key, tenant, requester_uuid, session_id, epoch)
            SELECT key, tenant, requester_uuid, session_id, epoch
            FROM tether_stream_recording
            """,
            # The highest epoch of any accepted fenced checkpoint save or fence.
            """
            CREATE TABLE tether_agent_state_fence (
                key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
                tenant text NOT NULL,
                user_uuid text NOT NULL,
                session_id text NOT NULL,
                epoch bigint NOT NULL
            )
            """,
            # Until now a checkpoint was fenced by the epoch the runtime stores in
            # it (``TURN_STATE_KEY``); start each fence there, so the upgrade does
            # not let a paused producer overwrite a newer turn's checkpoint.
            # The CASE guards the cast: a blob without a numeric epoch gets no fence.
            """
            INSERT INTO tether_agent_state_fence (key, tenant, user_uuid, session_id, epoch)
            SELECT key, tenant, user_uuid, session_id, floor(turn_epoch)::bigint
            FROM (
                SELECT key, tenant, user_uuid, session_id,
                       CASE WHEN jsonb_typeof(state -> '__turn__' -> 'epoch') = 'number'
                           THEN (state -> '__turn__' ->> 'epoch')::numeric END AS turn_epoch
                FROM tether_agent_state
            ) AS saved
            WHERE turn_epoch >= 1 AND turn_epoch < 9223372036854775807
            """,
            # A conversation's fence goes with the conversation when it is deleted.
            """
            ALTER TABLE tether_conversations
            ADD COLUMN fence_epoch bigint NOT NULL DEFAULT 0
            """,
        ),
    ),
    Migration(
        version=3,
        description="lookups by message id and by age",
        statements=(
            # A cancel that names only its turn (find_by_message_id). A hash
            # index: ids of any length, where a B-tree entry over ~2.7 kB fails.
            """
            CREATE INDEX tether_stream_supervision_by_message
            ON tether_stream_supervision USING hash (message_id)
            """,
            # Retention: every owner's conversations, oldest first.
            """
            CREATE INDEX tether_conversations_by_age
            ON tether_conversations (updated_at, key)
            """,
        ),
    ),
    Migration(
        version=4,
        description="running turns by heartbeat",
        statements=(
            # Dead turns (list_stale_running): the RUNNING rows, oldest heartbeat
            # first. Partial, so finished rows cost nothing and a scan stops at
            # the first live heartbeat, however many live turns there are.
            """
            CREATE INDEX tether_stream_supervision_running_by_heartbeat
            ON tether_stream_supervision (heartbeat_at, key)
            WHERE status = 'running'
            """,
        ),
    ),
    Migration(
        version=5,
        description="the replica producing each turn",
        statements=(
            # ChatStreamSupervision.producer: lets a reader tell a killed
            # replica's turns at once, by its presence lock. Nullable, no
            # default, so adding it rewrites no row: the rows already there, and
            # those that replicas of the previous release claim during a rolling
            # deploy, have none (their swaps leave the column as it was).
            "ALTER TABLE tether_stream_supervision ADD COLUMN producer text",
        ),
    ),
    Migration(
        version=6,
        description="epochs and fences kept under tombstones",
        # Not backwards compatible, unlike the others: the rows' keys change
        # (``before``), so replicas of the previous release, which compute the
        # old keys, must be stopped before it runs. It makes an erase leave no
        # id behind: the numbers kept for ever per conversation hold only the
        # tombstone (a keyed hash, ``TETHER_TOMBSTONE_KEY``) and the number.
        before=_rekey_by_tombstone,
        statements=(
            *(
                f"ALTER TABLE {table} DROP COLUMN tenant, DROP COLUMN {requester}, "
                "DROP COLUMN session_id"
                for table, requester in _KEYED_BY_CONVERSATION[3:]
            ),
            # The check value of the key (``TombstoneKey.check``), recorded once:
            # a replica with another key is refused at start-up.
            "CREATE TABLE tether_tombstone_key (check_value text NOT NULL)",
        ),
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version


async def upgrade(connection: AsyncConnection[Any]) -> list[int]:
    """Apply every pending migration on ``connection`` (autocommit); returns their versions.

    Idempotent and safe to run concurrently from any number of processes: all of
    it happens in one transaction holding :data:`SCHEMA_LOCK_KEY`.
    """
    applied: list[int] = []
    async with connection.transaction(), connection.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(queries.LOCK_SCHEMA, {"lock_key": SCHEMA_LOCK_KEY})
        await cursor.execute(queries.CREATE_SCHEMA_VERSION_TABLE)
        await cursor.execute(queries.READ_SCHEMA_VERSION)
        row = await cursor.fetchone()
        current = 0 if row is None else int(row["version"])
        for migration in MIGRATIONS:
            if migration.version <= current:
                continue
            if migration.before is not None:
                await migration.before(cursor)
            for statement in migration.statements:
                await cursor.execute(statement)
            await cursor.execute(
                queries.RECORD_SCHEMA_VERSION,
                {"version": migration.version, "description": migration.description},
            )
            applied.append(migration.version)
        await _check_tombstone_key(cursor)
    return applied


async def check_tombstone_key(connection: AsyncConnection[Any]) -> None:
    """Record the tombstone key's check value on first use; raise
    ``TombstoneKeyError`` when the database was keyed with another key."""
    async with connection.transaction(), connection.cursor(row_factory=dict_row) as cursor:
        await _check_tombstone_key(cursor)


async def _check_tombstone_key(cursor: AsyncCursor[DictRow]) -> None:
    await cursor.execute(queries.TOMBSTONE_KEY_TABLE_EXISTS)
    present = await cursor.fetchone()
    if present is None or not present["present"]:
        return  # a schema before version 6 keys nothing by tombstone
    await cursor.execute(queries.READ_TOMBSTONE_KEY)
    row = await cursor.fetchone()
    tombstones().verify(None if row is None else str(row["check_value"]), "this PostgreSQL store")
    if row is None:
        await cursor.execute(queries.RECORD_TOMBSTONE_KEY, {"check_value": tombstones().check})


async def schema_version(connection: AsyncConnection[Any]) -> int:
    """The newest applied migration's version; 0 for a database tether never touched."""
    async with connection.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(queries.SCHEMA_VERSION_TABLE_EXISTS)
        row = await cursor.fetchone()
        if row is None or not row["present"]:
            return 0
        await cursor.execute(queries.READ_SCHEMA_VERSION)
        row = await cursor.fetchone()
        return 0 if row is None else int(row["version"])

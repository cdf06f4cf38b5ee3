"""Every SQL statement of the SQLite backend, named: the schema, its migrations, the queries.

Ids (tenant, user, session, message) are always bound parameters, stored as
BLOBs of their UTF-8 bytes (see ``_codec``), never interpolated. The only
statement built from a value is ``set_user_version``, because ``PRAGMA`` takes
no parameters; it accepts nothing but an ``int``.

Tables are ``STRICT`` (SQLite 3.37+), so a column can only ever hold its declared
type: an epoch is always an integer, an id always a blob.
"""

from __future__ import annotations

# Schema -------------------------------------------------------------------------------

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # Version 1: one table per store.
    (
        """
        CREATE TABLE agent_state (
            tenant BLOB NOT NULL,
            user_uuid BLOB NOT NULL,
            session_id BLOB NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (tenant, user_uuid, session_id)
        ) STRICT
        """,
        """
        CREATE TABLE stream_supervision (
            tenant BLOB NOT NULL,
            requester_uuid BLOB NOT NULL,
            session_id BLOB NOT NULL,
            epoch INTEGER NOT NULL,
            message_id BLOB NOT NULL,
            status TEXT NOT NULL,
            heartbeat_at TEXT NOT NULL,
            PRIMARY KEY (tenant, requester_uuid, session_id)
        ) STRICT
        """,
        """
        CREATE TABLE stream_recording (
            tenant BLOB NOT NULL,
            requester_uuid BLOB NOT NULL,
            session_id BLOB NOT NULL,
            epoch INTEGER NOT NULL,
            message_id BLOB NOT NULL,
            stream_index INTEGER NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (tenant, requester_uuid, session_id)
        ) STRICT
        """,
        # ``record`` is the whole ConversationRecord (messages included); ``summary``
        # its listing view, kept beside it so listing never parses transcripts.
        """
        CREATE TABLE conversation (
            tenant BLOB NOT NULL,
            session_id BLOB NOT NULL,
            owner_uuid BLOB NOT NULL,
            updated_us INTEGER NOT NULL,
            record TEXT NOT NULL,
            summary TEXT NOT NULL,
            PRIMARY KEY (tenant, session_id)
        ) STRICT
        """,
        """
        CREATE INDEX conversation_listing
            ON conversation (tenant, owner_uuid, updated_us DESC, session_id)
        """,
    ),
    # Version 2: fences that outlive the rows they guard. Each is one row per
    # conversation in a table of its own, so the existing rows keep their shape
    # and a ``delete`` of a row leaves its fence in place. The two stream tables
    # start from the epochs already stored, so an upgraded file forgets none;
    # a conversation's fence lives in its record (``fence_epoch``, default 0).
    (
        # The highest supervision epoch ever written per conversation.
        """
        CREATE TABLE stream_epoch (
            tenant BLOB NOT NULL,
            requester_uuid BLOB NOT NULL,
            session_id BLOB NOT NULL,
            epoch INTEGER NOT NULL,
            PRIMARY KEY (tenant, requester_uuid, session_id)
        ) STRICT
        """,
        """
        INSERT INTO stream_epoch (tenant, requester_uuid, session_id, epoch)
        SELECT tenant, requester_uuid, session_id, epoch FROM stream_supervision
        """,
        # The highest epoch of any accepted recording put or ``fence`` per conversation.
        """
        CREATE TABLE stream_fence (
            tenant BLOB NOT NULL,
            requester_uuid BLOB NOT NULL,
            session_id BLOB NOT NULL,
            epoch INTEGER NOT NULL,
            PRIMARY KEY (tenant, requester_uuid, session_id)
        ) STRICT
        """,
        """
        INSERT INTO stream_fence (tenant, requester_uuid, session_id, epoch)
        SELECT tenant, requester_uuid, session_id, epoch FROM stream_recording
        """,
        # The highest epoch of any accepted ``save_fenced`` or ``fence`` per conversation.
        """
        CREATE TABLE agent_state_fence (
            tenant BLOB NOT NULL,
            user_uuid BLOB NOT NULL,
            session_id BLOB NOT NULL,
            epoch INTEGER NOT NULL,
            PRIMARY KEY (tenant, user_uuid, session_id)
        ) STRICT
        """,
    ),
    # Version 3: lookups the API needs without a session id. A cancel names only
    # its turn (``find_by_message_id``); retention lists conversations of every
    # owner by age (``list_stale_conversations``).
    (
        """
        CREATE INDEX stream_supervision_by_message
            ON stream_supervision (message_id, tenant, requester_uuid)
        """,
        """
        CREATE INDEX conversation_by_age ON conversation (updated_us, tenant, session_id)
        """,
    ),
    # Version 4: turns whose producer died, found without a client
    # (``list_stale_running``). ``heartbeat_at`` is ``isoformat()`` text, whose
    # fraction is left out when zero: no fixed width to order it by. So the
    # row also has it as integer microseconds since 1970 (as
    # ``conversation.updated_us``): a column SQLite computes from the text on
    # every write, so no statement has to set it, the rows already there get
    # it too, and the index holds it. The text is 'YYYY-MM-DDTHH:MM:SS', then
    # '.ffffff' unless zero, then the offset: strftime gives the whole seconds
    # (with the offset), the microseconds are read off the text (exact, where
    # julianday would round them).
    (
        """
        ALTER TABLE stream_supervision ADD COLUMN heartbeat_us INTEGER GENERATED ALWAYS AS (
            CAST(strftime('%s', substr(heartbeat_at, 1, 19) || CASE
                WHEN substr(heartbeat_at, 20, 1) = '.' THEN substr(heartbeat_at, 27)
                ELSE substr(heartbeat_at, 20) END) AS INTEGER) * 1000000
            + CASE
                WHEN substr(heartbeat_at, 20, 1) = '.'
                    THEN CAST(substr(heartbeat_at, 21, 6) AS INTEGER)
                ELSE 0 END
        ) VIRTUAL
        """,
        """
        CREATE INDEX stream_supervision_by_heartbeat ON stream_supervision (status, heartbeat_us)
        """,
    ),
    # Version 5: the replica producing a turn (``ChatStreamSupervision.producer``),
    # so that a reader can tell a killed replica's turns without waiting out the
    # dead threshold. NULL where none is known: the rows already there, and those
    # of a replica without a presence lock. TEXT, not an id BLOB: the replica
    # makes it up itself (uuid4 hex), no request ever sets it.
    ("ALTER TABLE stream_supervision ADD COLUMN producer TEXT",),
    # Version 6: the numbers kept for ever per conversation (its highest epoch,
    # the recording's and the checkpoint's fences) are keyed by its tombstone,
    # ``tether_tombstone(tenant, user, session)`` (``domain.tombstones``, a
    # function each connection registers), not by its ids: an erased
    # conversation leaves no id in plain form. The check value of the key
    # goes in ``tombstone_key``, so a replica with another key cannot open it.
    (
        *(
            statement
            for table, user in (
                ("stream_epoch", "requester_uuid"),
                ("stream_fence", "requester_uuid"),
                ("agent_state_fence", "user_uuid"),
            )
            for statement in (
                f"""
                CREATE TABLE {table}_by_tombstone (
                    tombstone TEXT NOT NULL PRIMARY KEY,
                    epoch INTEGER NOT NULL
                ) STRICT
                """,
                f"""
                INSERT INTO {table}_by_tombstone (tombstone, epoch)
                SELECT tether_tombstone(tenant, {user}, session_id), max(epoch) FROM {table}
                GROUP BY 1
                """,
                f"DROP TABLE {table}",
                f"ALTER TABLE {table}_by_tombstone RENAME TO {table}",
            )
        ),
        "CREATE TABLE tombstone_key (check_value TEXT NOT NULL) STRICT",
    ),
)
"""Migration ``n`` (1-based) brings the schema from version ``n - 1`` to ``n``.
Append new migrations; never edit one that has shipped."""

SCHEMA_VERSION = len(MIGRATIONS)

READ_USER_VERSION = "PRAGMA user_version"
# The key's check value (``TombstoneKey.check``): recorded once, then compared.
TOMBSTONE_KEY_READ = "SELECT check_value FROM tombstone_key"
TOMBSTONE_KEY_RECORD = "INSERT INTO tombstone_key (check_value) VALUES (:check_value)"
READ_JOURNAL_MODE = "PRAGMA journal_mode"
SET_JOURNAL_MODE_WAL = "PRAGMA journal_mode = WAL"
READ_SYNCHRONOUS = "PRAGMA synchronous"
SET_SYNCHRONOUS_NORMAL = "PRAGMA synchronous = NORMAL"
SET_SYNCHRONOUS_FULL = "PRAGMA synchronous = FULL"


def set_user_version(version: int) -> str:
    """``PRAGMA user_version = version``: PRAGMA takes no bound parameters."""
    if type(version) is not int or version < 0:
        raise ValueError(f"a schema version is a non-negative int, not {version!r}")
    return f"PRAGMA user_version = {version}"


# Transactions -------------------------------------------------------------------------

# IMMEDIATE takes the write lock up front, so a read-then-write can never fail
# half-way with SQLITE_BUSY when another process committed in between; waiting
# for the lock goes through the busy timeout instead.
BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

# Agent state --------------------------------------------------------------------------

STATE_LOAD = """
    SELECT state FROM agent_state
    WHERE tenant = :tenant AND user_uuid = :user AND session_id = :session
"""
STATE_SAVE = """
    INSERT INTO agent_state (tenant, user_uuid, session_id, state)
    VALUES (:tenant, :user, :session, :state)
    ON CONFLICT (tenant, user_uuid, session_id) DO UPDATE SET state = excluded.state
"""
# The blob only: the fence stays in agent_state_fence.
STATE_DELETE = """
    DELETE FROM agent_state
    WHERE tenant = :tenant AND user_uuid = :user AND session_id = :session
"""
# A fenced save first raises the fence to its own epoch, only where the fence
# is not above it: the row count (0 for an upsert whose WHERE fails) says
# whether the save may write, and nothing else has to be read first.
STATE_ADVANCE_FENCE = """
    INSERT INTO agent_state_fence (tombstone, epoch)
    VALUES (tether_tombstone(:tenant, :user, :session), :epoch)
    ON CONFLICT (tombstone) DO UPDATE SET epoch = excluded.epoch
        WHERE excluded.epoch >= agent_state_fence.epoch
"""
# ``fence`` only ever raises it.
STATE_RAISE_FENCE = """
    INSERT INTO agent_state_fence (tombstone, epoch)
    VALUES (tether_tombstone(:tenant, :user, :session), :epoch)
    ON CONFLICT (tombstone) DO UPDATE
        SET epoch = max(agent_state_fence.epoch, excluded.epoch)
"""

# Stream supervision -------------------------------------------------------------------

SUPERVISION_READ = """
    SELECT epoch, message_id, status, heartbeat_at, producer FROM stream_supervision
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
"""
# The highest epoch ever written, also once the row is gone.
SUPERVISION_LAST_EPOCH = """
    SELECT epoch FROM stream_epoch WHERE tombstone = tether_tombstone(:tenant, :user, :session)
"""
# A claim (expected epoch None) writes only where no row exists, and only at an
# epoch above every epoch granted before (a removed row's stays in stream_epoch) ...
SUPERVISION_CLAIM = """
    INSERT INTO stream_supervision
        (tenant, requester_uuid, session_id, epoch, message_id, status, heartbeat_at, producer)
    SELECT :tenant, :user, :session, :epoch, :message_id, :status, :heartbeat_at, :producer
    WHERE :epoch > coalesce((
        SELECT epoch FROM stream_epoch WHERE tombstone = tether_tombstone(:tenant, :user, :session)
    ), 0)
    ON CONFLICT (tenant, requester_uuid, session_id) DO NOTHING
"""
# ... and every other swap only where the row holds the expected epoch. Either
# way the check and the write are one statement, so the row count says who won.
SUPERVISION_SWAP = """
    UPDATE stream_supervision
    SET epoch = :epoch, message_id = :message_id, status = :status,
        heartbeat_at = :heartbeat_at, producer = :producer
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
        AND epoch = :expected_epoch
"""
# Run after every write that succeeded, in its transaction: the highest epoch
# only grows, even when a swap writes a lower one.
SUPERVISION_RECORD_EPOCH = """
    INSERT INTO stream_epoch (tombstone, epoch)
    VALUES (tether_tombstone(:tenant, :user, :session), :epoch)
    ON CONFLICT (tombstone) DO UPDATE
        SET epoch = max(stream_epoch.epoch, excluded.epoch)
"""
# The requester's row holding a turn, by the index on message_id.
SUPERVISION_FIND_BY_MESSAGE = """
    SELECT session_id FROM stream_supervision
    WHERE message_id = :message_id AND tenant = :tenant AND requester_uuid = :user
    LIMIT 1
"""
# Turns whose producer died: RUNNING rows with a heartbeat before ``:before_us``,
# oldest first, read in order off the stream_supervision_by_heartbeat index.
SUPERVISION_LIST_STALE = """
    SELECT tenant, requester_uuid, session_id, epoch, message_id, status, heartbeat_at,
        producer
    FROM stream_supervision
    WHERE status = :running AND heartbeat_us < :before_us
    ORDER BY heartbeat_us ASC
    LIMIT :limit
"""
# The row only: its epoch stays in stream_epoch.
SUPERVISION_DELETE = """
    DELETE FROM stream_supervision
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
        AND message_id = :message_id AND epoch = :epoch
"""

# Stream recording ---------------------------------------------------------------------

RECORDING_READ = """
    SELECT epoch, message_id, stream_index, message FROM stream_recording
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
"""
RECORDING_FENCE = """
    SELECT epoch FROM stream_fence WHERE tombstone = tether_tombstone(:tenant, :user, :session)
"""
# A put first moves the fence to its own epoch, only where the fence is not
# above it: the row count (0 for an upsert whose WHERE fails) says whether the
# put may write. Accepted epochs never fall, so this only ever raises it.
RECORDING_ADVANCE_FENCE = """
    INSERT INTO stream_fence (tombstone, epoch)
    VALUES (tether_tombstone(:tenant, :user, :session), :epoch)
    ON CONFLICT (tombstone) DO UPDATE SET epoch = excluded.epoch
        WHERE excluded.epoch >= stream_fence.epoch
"""
# ``fence`` only ever raises it, and leaves the record alone.
RECORDING_RAISE_FENCE = """
    INSERT INTO stream_fence (tombstone, epoch)
    VALUES (tether_tombstone(:tenant, :user, :session), :epoch)
    ON CONFLICT (tombstone) DO UPDATE
        SET epoch = max(stream_fence.epoch, excluded.epoch)
"""
RECORDING_PUT = """
    INSERT INTO stream_recording
        (tenant, requester_uuid, session_id, epoch, message_id, stream_index, message)
    VALUES (:tenant, :user, :session, :epoch, :message_id, :stream_index, :message)
    ON CONFLICT (tenant, requester_uuid, session_id) DO UPDATE SET
        epoch = excluded.epoch, message_id = excluded.message_id,
        stream_index = excluded.stream_index, message = excluded.message
"""
# The record only: the fence stays in stream_fence.
RECORDING_DELETE = """
    DELETE FROM stream_recording
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
        AND message_id = :message_id
"""

# Conversations ------------------------------------------------------------------------

CONVERSATION_READ = """
    SELECT record FROM conversation WHERE tenant = :tenant AND session_id = :session
"""
CONVERSATION_UPSERT = """
    INSERT INTO conversation (tenant, session_id, owner_uuid, updated_us, record, summary)
    VALUES (:tenant, :session, :owner, :updated_us, :record, :summary)
    ON CONFLICT (tenant, session_id) DO UPDATE SET
        owner_uuid = excluded.owner_uuid, updated_us = excluded.updated_us,
        record = excluded.record, summary = excluded.summary
"""
CONVERSATION_DELETE = """
    DELETE FROM conversation WHERE tenant = :tenant AND session_id = :session
"""
# Newest first, ties by session id (UTF-8 byte order is code point order, the
# order of the shared conversation rules); ``:limit`` is one more than a page,
# to learn whether another page follows.
CONVERSATION_LIST_FIRST = """
    SELECT session_id, summary FROM conversation
    WHERE tenant = :tenant AND owner_uuid = :owner
    ORDER BY updated_us DESC, session_id ASC
    LIMIT :limit
"""
# Retention: every owner's conversations last updated before ``:before_us``,
# oldest first, by the conversation_by_age index.
CONVERSATION_LIST_STALE_FIRST = """
    SELECT tenant, session_id, summary FROM conversation
    WHERE updated_us < :before_us
    ORDER BY updated_us ASC, tenant ASC, session_id ASC
    LIMIT :limit
"""
CONVERSATION_LIST_STALE_AFTER = """
    SELECT tenant, session_id, summary FROM conversation
    WHERE updated_us < :before_us
        AND (updated_us, tenant, session_id) > (:after_us, :after_tenant, :after_session)
    ORDER BY updated_us ASC, tenant ASC, session_id ASC
    LIMIT :limit
"""
CONVERSATION_LIST_AFTER = """
    SELECT session_id, summary FROM conversation
    WHERE tenant = :tenant AND owner_uuid = :owner
        AND (updated_us < :after_us OR (updated_us = :after_us AND session_id > :after_session))
    ORDER BY updated_us DESC, session_id ASC
    LIMIT :limit
"""

# MCP OAuth (``mcp_repository``) -------------------------------------------------------

# Tables of their own, outside the schema version: the repository creates them
# at open with this idempotent DDL, in one ``BEGIN IMMEDIATE`` transaction.
MCP_CREATE_TABLES = (
    """
    CREATE TABLE IF NOT EXISTS mcp_oauth_integrations (
        tenant BLOB NOT NULL,
        user_uuid BLOB NOT NULL,
        server_name BLOB NOT NULL,
        pending_state BLOB,
        revision TEXT,
        document TEXT NOT NULL,
        PRIMARY KEY (tenant, user_uuid, server_name)
    ) STRICT
    """,
    """
    CREATE INDEX IF NOT EXISTS mcp_oauth_integrations_by_state
    ON mcp_oauth_integrations (pending_state) WHERE pending_state IS NOT NULL
    """,
    """
    CREATE TABLE IF NOT EXISTS mcp_oauth_clients (
        tenant BLOB NOT NULL,
        server_name BLOB NOT NULL,
        document TEXT NOT NULL,
        PRIMARY KEY (tenant, server_name)
    ) STRICT
    """,
)
_MCP_KEY = "tenant = :tenant AND user_uuid = :user AND server_name = :server"
MCP_LIST_INTEGRATIONS = """
    SELECT document FROM mcp_oauth_integrations
    WHERE tenant = :tenant AND user_uuid = :user ORDER BY server_name
"""
MCP_GET_INTEGRATION = f"SELECT document FROM mcp_oauth_integrations WHERE {_MCP_KEY}"
MCP_FIND_BY_STATE = """
    SELECT document FROM mcp_oauth_integrations WHERE pending_state = :state LIMIT 1
"""
MCP_UPSERT_INTEGRATION = """
    INSERT INTO mcp_oauth_integrations
        (tenant, user_uuid, server_name, pending_state, revision, document)
    VALUES (:tenant, :user, :server, :state, :revision, :document)
    ON CONFLICT (tenant, user_uuid, server_name) DO UPDATE SET
        pending_state = excluded.pending_state,
        revision = excluded.revision,
        document = excluded.document
"""
MCP_INSERT_INTEGRATION_IF_ABSENT = """
    INSERT INTO mcp_oauth_integrations
        (tenant, user_uuid, server_name, pending_state, revision, document)
    VALUES (:tenant, :user, :server, :state, :revision, :document)
    ON CONFLICT (tenant, user_uuid, server_name) DO NOTHING
"""
MCP_UPDATE_INTEGRATION_IF_REVISION = f"""
    UPDATE mcp_oauth_integrations
    SET pending_state = :state, revision = :revision, document = :document
    WHERE {_MCP_KEY} AND revision IS :expected
"""
MCP_DELETE_INTEGRATION = f"DELETE FROM mcp_oauth_integrations WHERE {_MCP_KEY}"
MCP_DELETE_INTEGRATION_IF_REVISION = f"{MCP_DELETE_INTEGRATION} AND revision IS :expected"
MCP_EXISTS_INTEGRATION = f"SELECT 1 FROM mcp_oauth_integrations WHERE {_MCP_KEY}"
MCP_LIST_CLIENTS = """
    SELECT document FROM mcp_oauth_clients WHERE tenant = :tenant ORDER BY server_name
"""
MCP_GET_CLIENT = """
    SELECT document FROM mcp_oauth_clients WHERE tenant = :tenant AND server_name = :server
"""
MCP_UPSERT_CLIENT = """
    INSERT INTO mcp_oauth_clients (tenant, server_name, document)
    VALUES (:tenant, :server, :document)
    ON CONFLICT (tenant, server_name) DO UPDATE SET document = excluded.document
"""
MCP_INSERT_CLIENT_IF_ABSENT = """
    INSERT INTO mcp_oauth_clients (tenant, server_name, document)
    VALUES (:tenant, :server, :document)
    ON CONFLICT (tenant, server_name) DO NOTHING
"""
MCP_UPDATE_CLIENT_IF_REVISION = """
    UPDATE mcp_oauth_clients SET document = :document
    WHERE tenant = :tenant AND server_name = :server
      AND json_extract(document, '$.revision') IS :expected
"""

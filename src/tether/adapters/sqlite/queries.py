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
)
"""Migration ``n`` (1-based) brings the schema from version ``n - 1`` to ``n``.
Append new migrations; never edit one that has shipped."""

SCHEMA_VERSION = len(MIGRATIONS)

READ_USER_VERSION = "PRAGMA user_version"
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
STATE_DELETE = """
    DELETE FROM agent_state
    WHERE tenant = :tenant AND user_uuid = :user AND session_id = :session
"""

# Stream supervision -------------------------------------------------------------------

SUPERVISION_READ = """
    SELECT epoch, message_id, status, heartbeat_at FROM stream_supervision
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
"""
# A claim (expected epoch None) writes only where no row exists ...
SUPERVISION_CLAIM = """
    INSERT INTO stream_supervision
        (tenant, requester_uuid, session_id, epoch, message_id, status, heartbeat_at)
    VALUES (:tenant, :user, :session, :epoch, :message_id, :status, :heartbeat_at)
    ON CONFLICT (tenant, requester_uuid, session_id) DO NOTHING
"""
# ... and every other swap only where the row holds the expected epoch. Either
# way the check and the write are one statement, so the row count says who won.
SUPERVISION_SWAP = """
    UPDATE stream_supervision
    SET epoch = :epoch, message_id = :message_id, status = :status,
        heartbeat_at = :heartbeat_at
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
        AND epoch = :expected_epoch
"""
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
RECORDING_EPOCH = """
    SELECT epoch FROM stream_recording
    WHERE tenant = :tenant AND requester_uuid = :user AND session_id = :session
"""
RECORDING_PUT = """
    INSERT INTO stream_recording
        (tenant, requester_uuid, session_id, epoch, message_id, stream_index, message)
    VALUES (:tenant, :user, :session, :epoch, :message_id, :stream_index, :message)
    ON CONFLICT (tenant, requester_uuid, session_id) DO UPDATE SET
        epoch = excluded.epoch, message_id = excluded.message_id,
        stream_index = excluded.stream_index, message = excluded.message
"""
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
CONVERSATION_LIST_AFTER = """
    SELECT session_id, summary FROM conversation
    WHERE tenant = :tenant AND owner_uuid = :owner
        AND (updated_us < :after_us OR (updated_us = :after_us AND session_id > :after_session))
    ORDER BY updated_us DESC, session_id ASC
    LIMIT :limit
"""

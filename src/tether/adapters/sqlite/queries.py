"""Every SQL statement of the SQLite stores, named: transactions and each store's queries.

Ids (tenant, user, session, message) are always bound parameters, stored as
BLOBs of their UTF-8 bytes (see ``_codec``), never interpolated. The schema,
its migrations and the connections' pragmas are in ``schema``; the MCP OAuth
repository's statements in ``queries_mcp``.
"""

from __future__ import annotations

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

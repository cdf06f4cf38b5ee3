"""Every SQL statement the PostgreSQL stores run, by name; the schema is in ``migrations``.

Rules every statement here follows:

- Ids are always parameters (``%(name)s``), never formatted into the text.
- A guarded write is **one statement**: the condition and the write cannot be
  separated by another writer (``INSERT ... ON CONFLICT DO NOTHING``,
  ``UPDATE ... WHERE epoch = ...``, ``INSERT ... ON CONFLICT DO UPDATE ... WHERE``,
  ``DELETE ... WHERE``). The row lock PostgreSQL takes for the write, and its
  re-check of the ``WHERE`` clause against the newest row version (READ
  COMMITTED), is what makes it atomic.
- Every write to a recording or a supervision row calls ``pg_notify`` on
  :data:`CHANNEL` with the row's key in hex, in the ``RETURNING`` clause of the
  same statement: a notification goes out exactly when a row was written, and
  only once that write commits.
- Where a write may skip the fsync wait (heartbeats, recording puts at the
  stored epoch; see ``PostgresDatabase``), the statement itself calls
  ``set_config('synchronous_commit', 'off', true)``, which is ``SET LOCAL`` for
  the statement's own transaction, so it costs no extra round trip.
"""

from __future__ import annotations

from typing import Final

CHANNEL: Final = "tether_stream_changes"
"""The NOTIFY channel of recording and supervision writes; the payload is the row key in hex."""

LISTEN: Final = "LISTEN tether_stream_changes"

# Schema bookkeeping ---------------------------------------------------------------------

LOCK_SCHEMA: Final = "SELECT pg_advisory_xact_lock(%(lock_key)s)"

CREATE_SCHEMA_VERSION_TABLE: Final = """
CREATE TABLE IF NOT EXISTS tether_schema_version (
    version integer PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

SCHEMA_VERSION_TABLE_EXISTS: Final = (
    "SELECT to_regclass('tether_schema_version') IS NOT NULL AS present"
)

READ_SCHEMA_VERSION: Final = (
    "SELECT coalesce(max(version), 0) AS version FROM tether_schema_version"
)

RECORD_SCHEMA_VERSION: Final = """
INSERT INTO tether_schema_version (version, description)
VALUES (%(version)s, %(description)s)
"""

# Agent state ----------------------------------------------------------------------------

LOAD_STATE: Final = "SELECT state FROM tether_agent_state WHERE key = %(key)s"

SAVE_STATE: Final = """
INSERT INTO tether_agent_state (key, tenant, user_uuid, session_id, state)
VALUES (%(key)s, %(tenant)s, %(user_uuid)s, %(session_id)s, %(state)s::jsonb)
ON CONFLICT (key) DO UPDATE SET state = excluded.state, updated_at = now()
"""

DELETE_STATE: Final = "DELETE FROM tether_agent_state WHERE key = %(key)s"

# Supervision ----------------------------------------------------------------------------

READ_SUPERVISION: Final = """
SELECT status, heartbeat_at, message_id, epoch
FROM tether_stream_supervision
WHERE key = %(key)s
"""

CLAIM_SUPERVISION: Final = """
WITH written AS (
    INSERT INTO tether_stream_supervision
        (key, tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch)
    VALUES (%(key)s, %(tenant)s, %(requester_uuid)s, %(session_id)s,
            %(status)s, %(heartbeat_at)s, %(message_id)s, %(epoch)s)
    ON CONFLICT (key) DO NOTHING
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex'))
)
SELECT count(*) AS written FROM written
"""
"""Compare-and-swap with ``expected_epoch = None``: write only if no row exists."""

SWAP_SUPERVISION: Final = """
WITH written AS (
    UPDATE tether_stream_supervision
    SET status = %(status)s, heartbeat_at = %(heartbeat_at)s,
        message_id = %(message_id)s, epoch = %(epoch)s
    WHERE key = %(key)s AND epoch = %(expected_epoch)s
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex'))
)
SELECT count(*) AS written,
       CASE WHEN %(relaxed_commit)s THEN set_config('synchronous_commit', 'off', true) END
           AS commit_mode
FROM written
"""
"""Compare-and-swap with an expected epoch: write only over a row at exactly that epoch."""

SWAP_SUPERVISION_MANY: Final = """
WITH swap AS (
    SELECT *
    FROM unnest(
        %(keys)s::bytea[], %(tenants)s::text[], %(requester_uuids)s::text[],
        %(session_ids)s::text[], %(expected_epochs)s::bigint[], %(statuses)s::text[],
        %(heartbeats)s::timestamptz[], %(message_ids)s::text[], %(epochs)s::bigint[]
    ) WITH ORDINALITY AS swap (
        key, tenant, requester_uuid, session_id, expected_epoch, status,
        heartbeat_at, message_id, epoch, position
    )
),
claimed AS (
    INSERT INTO tether_stream_supervision
        (key, tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch)
    SELECT key, tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch
    FROM swap
    WHERE expected_epoch IS NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex'))
),
swapped AS (
    UPDATE tether_stream_supervision AS stored
    SET status = swap.status, heartbeat_at = swap.heartbeat_at,
        message_id = swap.message_id, epoch = swap.epoch
    FROM swap
    WHERE stored.key = swap.key AND stored.epoch = swap.expected_epoch
    RETURNING stored.key, pg_notify('tether_stream_changes', encode(stored.key, 'hex'))
),
written AS (
    SELECT key FROM claimed
    UNION ALL
    SELECT key FROM swapped
)
SELECT swap.position,
       swap.key IN (SELECT key FROM written) AS written,
       CASE WHEN %(relaxed_commit)s THEN set_config('synchronous_commit', 'off', true) END
           AS commit_mode
FROM swap
ORDER BY swap.position
"""
"""Several compare-and-swaps on *distinct* keys in one statement, each with its own
guard (a claim for a NULL expected epoch, a swap otherwise); one row per swap, in order."""

DELETE_SUPERVISION: Final = """
WITH deleted AS (
    DELETE FROM tether_stream_supervision
    WHERE key = %(key)s AND message_id = %(message_id)s AND epoch = %(epoch)s
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex'))
)
SELECT count(*) AS deleted FROM deleted
"""

# Recording ------------------------------------------------------------------------------

READ_RECORDING: Final = """
SELECT stream_index, message, message_id, epoch
FROM tether_stream_recording
WHERE key = %(key)s
"""

PUT_RECORDING: Final = """
WITH previous AS (
    SELECT epoch FROM tether_stream_recording WHERE key = %(key)s
),
written AS (
    INSERT INTO tether_stream_recording AS stored
        (key, tenant, requester_uuid, session_id, epoch, stream_index, message_id, message)
    VALUES (%(key)s, %(tenant)s, %(requester_uuid)s, %(session_id)s,
            %(epoch)s, %(stream_index)s, %(message_id)s, %(message)s::jsonb)
    ON CONFLICT (key) DO UPDATE
    SET epoch = excluded.epoch, stream_index = excluded.stream_index,
        message_id = excluded.message_id, message = excluded.message, recorded_at = now()
    WHERE stored.epoch <= excluded.epoch
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex'))
)
SELECT count(*) AS written,
       CASE WHEN (SELECT epoch FROM previous) = %(epoch)s
           THEN set_config('synchronous_commit', 'off', true) END AS commit_mode
FROM written
"""
"""Insert, or overwrite unless the stored epoch is higher; ``written = 0`` means fenced.

Only a put at the epoch already stored skips the fsync wait: the put that raises
the epoch (a new turn, a takeover) is durable, so a server crash can lose
snapshots but never bring a lower epoch's record back."""

PUT_RECORDING_MANY: Final = """
WITH put AS (
    SELECT *
    FROM unnest(
        %(keys)s::bytea[], %(tenants)s::text[], %(requester_uuids)s::text[],
        %(session_ids)s::text[], %(epochs)s::bigint[], %(stream_indexes)s::bigint[],
        %(message_ids)s::text[], %(messages)s::jsonb[]
    ) WITH ORDINALITY AS put (
        key, tenant, requester_uuid, session_id, epoch, stream_index, message_id, message,
        position
    )
),
relaxed AS (
    SELECT NOT EXISTS (
        SELECT 1
        FROM put LEFT JOIN tether_stream_recording AS stored ON stored.key = put.key
        WHERE stored.epoch IS DISTINCT FROM put.epoch
    ) AS at_stored_epochs
),
written AS (
    INSERT INTO tether_stream_recording AS stored
        (key, tenant, requester_uuid, session_id, epoch, stream_index, message_id, message)
    SELECT key, tenant, requester_uuid, session_id, epoch, stream_index, message_id, message
    FROM put
    ON CONFLICT (key) DO UPDATE
    SET epoch = excluded.epoch, stream_index = excluded.stream_index,
        message_id = excluded.message_id, message = excluded.message, recorded_at = now()
    WHERE stored.epoch <= excluded.epoch
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex'))
)
SELECT put.position,
       put.key IN (SELECT key FROM written) AS written,
       CASE WHEN (SELECT at_stored_epochs FROM relaxed)
           THEN set_config('synchronous_commit', 'off', true) END AS commit_mode
FROM put
ORDER BY put.position
"""
"""Several fenced puts on *distinct* keys in one statement, each fenced on its own
row; one row per put, in order (``written`` false: fenced). The batch skips the
fsync wait only when every put is at the epoch already stored, as ``PUT_RECORDING``."""

DELETE_RECORDING: Final = """
WITH deleted AS (
    DELETE FROM tether_stream_recording
    WHERE key = %(key)s AND message_id = %(message_id)s
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex'))
)
SELECT count(*) AS deleted FROM deleted
"""

# Conversations --------------------------------------------------------------------------

LOCK_CONVERSATION: Final = """
SELECT tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status, title,
       message_count, metadata, created_at, updated_at
FROM tether_conversations
WHERE key = %(key)s
FOR UPDATE
"""

CREATE_CONVERSATION: Final = """
INSERT INTO tether_conversations
    (key, owner_key, tenant, session_id, owner_uuid, agent_identifier, shared,
     last_turn_status, title, message_count, metadata, created_at, updated_at)
VALUES (%(key)s, %(owner_key)s, %(tenant)s, %(session_id)s, %(owner_uuid)s,
        %(agent_identifier)s, false, %(last_turn_status)s, %(title)s, %(message_count)s,
        %(metadata)s::jsonb, %(created_at)s, %(updated_at)s)
ON CONFLICT (key) DO NOTHING
RETURNING key
"""
"""Create, unless a concurrent creator got there first (no row returned)."""

UPDATE_CONVERSATION: Final = """
UPDATE tether_conversations
SET agent_identifier = %(agent_identifier)s, last_turn_status = %(last_turn_status)s,
    title = %(title)s, message_count = %(message_count)s, metadata = %(metadata)s::jsonb,
    updated_at = %(updated_at)s
WHERE key = %(key)s
"""

APPEND_MESSAGES: Final = """
INSERT INTO tether_conversation_messages (conversation_key, position, message)
SELECT %(key)s, %(first_position)s::integer + appended.ordinality::integer - 1,
       appended.message
FROM unnest(%(messages)s::jsonb[]) WITH ORDINALITY AS appended (message, ordinality)
"""

SET_LAST_TURN_STATUS: Final = """
UPDATE tether_conversations
SET last_turn_status = %(last_turn_status)s, updated_at = %(updated_at)s
WHERE key = %(key)s AND owner_uuid = %(owner_uuid)s
RETURNING key
"""

SET_SHARED: Final = """
UPDATE tether_conversations
SET shared = %(shared)s
WHERE key = %(key)s AND owner_uuid = %(owner_uuid)s
RETURNING key
"""

DELETE_CONVERSATION: Final = """
DELETE FROM tether_conversations
WHERE key = %(key)s AND owner_uuid = %(owner_uuid)s
RETURNING key
"""
"""Owner-guarded; the messages go with it (``ON DELETE CASCADE``)."""

READ_TRANSCRIPT: Final = """
SELECT conversation.tenant, conversation.session_id, conversation.owner_uuid,
       conversation.agent_identifier, conversation.shared, conversation.last_turn_status,
       conversation.title, conversation.message_count, conversation.created_at,
       conversation.updated_at, message.message
FROM tether_conversations AS conversation
LEFT JOIN tether_conversation_messages AS message
    ON message.conversation_key = conversation.key
WHERE conversation.key = %(key)s
ORDER BY message.position
"""
"""The conversation's columns beside each of its messages, in one statement so that
the access check and the messages come from one snapshot."""

READ_SUMMARY: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE key = %(key)s
"""

LIST_CONVERSATIONS: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE owner_key = %(owner_key)s
ORDER BY updated_at DESC, key DESC
LIMIT %(limit)s
"""
"""The first page; served by the ``(owner_key, updated_at DESC, key DESC)`` index."""

LIST_CONVERSATIONS_AFTER: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE owner_key = %(owner_key)s
  AND (updated_at, key) < (%(after_updated_at)s, %(after_key)s)
ORDER BY updated_at DESC, key DESC
LIMIT %(limit)s
"""
"""A later page: everything strictly after the cursor's ``(updated_at, key)``."""

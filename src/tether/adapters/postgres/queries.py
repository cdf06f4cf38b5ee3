"""Every SQL statement the PostgreSQL stores run, by name; the schema is in ``migrations``.

Rules every statement here follows:

- Ids are always parameters (``%(name)s``), never formatted into the text.
- A guarded write is **one statement**: the condition and the write cannot be
  separated by another writer (``INSERT ... ON CONFLICT DO NOTHING``,
  ``UPDATE ... WHERE epoch = ...``, ``INSERT ... ON CONFLICT DO UPDATE ... WHERE``,
  ``DELETE ... WHERE``). The row lock PostgreSQL takes for the write, and its
  re-check of the ``WHERE`` clause against the newest row version (READ
  COMMITTED), is what makes it atomic.
- A fence (the highest epoch a conversation has granted or accepted) lives in a
  table of its own, so that it outlives the row it fences. A fenced write first
  upserts the fence row (``INSERT ... ON CONFLICT DO UPDATE ... WHERE``), which
  locks it and re-checks the newest fence, and writes the fenced row only if
  that upsert returned it: a concurrent ``fence`` waits for the write's commit
  or is seen by it, never neither. A supervision claim is the exception that
  runs in a transaction of its own (see :data:`CLAIM_SUPERVISION`).
- Every write to a recording, and every write to a supervision row that
  changes its epoch (a claim, a takeover, a cancel, a verdict, a hand-off, a
  delete; not a heartbeat, which swaps at the same epoch), calls ``pg_notify``
  on :data:`CHANNEL` with the row's key in hex and the kind of change
  (``<key hex>:r`` or ``<key hex>:s``), in the ``RETURNING`` clause of the same
  statement: a notification goes out exactly when such a write happened, and
  only once it commits.
- Where a write may skip the fsync wait (heartbeats, recording puts at the
  stored epoch; see ``PostgresDatabase``), the statement itself calls
  ``set_config('synchronous_commit', 'off', true)``, which is ``SET LOCAL`` for
  the statement's own transaction, so it costs no extra round trip.
"""

from __future__ import annotations

from typing import Final

CHANNEL: Final = "tether_stream_changes"
"""The NOTIFY channel of recording and supervision writes; the payload is the row key
in hex, ``:`` and the kind of change (:data:`RECORDING_CHANGE`, :data:`SUPERVISION_CHANGE`)."""

RECORDING_CHANGE: Final = "r"
"""The payload's kind of a recording put or delete."""

SUPERVISION_CHANGE: Final = "s"
"""The payload's kind of a supervision write that changed the epoch, or a delete."""

DELTA: Final = "d"
"""The payload's kind of a producer's delta: ``<key hex>:d:<encoded StreamDelta>``."""

WATCH: Final = "w"
"""The payload's kind of a follower asking the producer for deltas."""

MAX_PAYLOAD_BYTES: Final = 7999
"""PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more."""

PUBLISH: Final = """
SELECT pg_notify('tether_stream_changes', payload)
  FROM unnest(%(payloads)s::text[]) AS payload
"""
"""Several notifications in one statement (one transaction, one round trip):
producers' deltas and followers' watches, which go with no write."""

LISTEN: Final = "LISTEN tether_stream_changes"

# Schema bookkeeping ---------------------------------------------------------------------

LOCK_SCHEMA: Final = "SELECT pg_advisory_xact_lock(%(lock_key)s)"

TOMBSTONE_KEY_TABLE_EXISTS: Final = (
    "SELECT to_regclass('tether_tombstone_key') IS NOT NULL AS present"
)
READ_TOMBSTONE_KEY: Final = "SELECT check_value FROM tether_tombstone_key LIMIT 1"
RECORD_TOMBSTONE_KEY: Final = (
    "INSERT INTO tether_tombstone_key (check_value) VALUES (%(check_value)s)"
)
"""The check value of the key tombstones are made with (``TombstoneKey.check``)."""

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

SAVE_STATE_FENCED: Final = """
WITH fenced AS (
    INSERT INTO tether_agent_state_fence AS fence (key, epoch)
    VALUES (%(key)s, %(epoch)s)
    ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
    WHERE fence.epoch <= excluded.epoch
    RETURNING key
),
saved AS (
    INSERT INTO tether_agent_state (key, tenant, user_uuid, session_id, state)
    SELECT key, %(tenant)s, %(user_uuid)s, %(session_id)s, %(state)s::jsonb FROM fenced
    ON CONFLICT (key) DO UPDATE SET state = excluded.state, updated_at = now()
    RETURNING key
)
SELECT count(*) AS saved FROM saved
"""
"""Raise the fence to the save's epoch and replace the state, unless the fence is
higher; ``saved = 0`` means fenced (and nothing changed)."""

FENCE_STATE: Final = """
INSERT INTO tether_agent_state_fence AS fence (key, epoch)
VALUES (%(key)s, %(epoch)s)
ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
WHERE fence.epoch < excluded.epoch
"""
"""Raise the checkpoint fence to ``epoch``; never lowers it."""

DELETE_STATE: Final = "DELETE FROM tether_agent_state WHERE key = %(key)s"
"""The checkpoint only: its fence stays in ``tether_agent_state_fence``."""

# Supervision ----------------------------------------------------------------------------

READ_SUPERVISION: Final = """
SELECT status, heartbeat_at, message_id, epoch, producer
FROM tether_stream_supervision
WHERE key = %(key)s
"""

FIND_SUPERVISION_BY_MESSAGE: Final = """
SELECT session_id
FROM tether_stream_supervision
WHERE message_id = %(message_id)s
  AND tenant = %(tenant)s AND requester_uuid = %(requester_uuid)s
LIMIT 1
"""
"""The requester's row holding a turn; served by the hash index on ``message_id``."""

LIST_STALE_SUPERVISION: Final = """
SELECT tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch, producer
FROM tether_stream_supervision
WHERE status = 'running' AND heartbeat_at < %(heartbeat_before)s
ORDER BY heartbeat_at, key
LIMIT %(limit)s
"""
"""RUNNING rows whose heartbeat is older than the bound, oldest first: an ordered
scan of the partial index ``tether_stream_supervision_running_by_heartbeat``.
The status is a literal, never a parameter: only then can the planner (also a
prepared statement's generic plan) prove the index's ``WHERE`` clause."""

LAST_SUPERVISION_EPOCH: Final = """
SELECT greatest(
    (SELECT epoch FROM tether_stream_supervision_epoch WHERE key = %(key)s),
    (SELECT epoch FROM tether_stream_supervision WHERE key = %(key)s),
    0
) AS epoch
"""
"""The highest epoch ever written. The row is read too: a replica of the previous
release, during a rolling deploy, writes rows without raising the epoch table."""

CLAIM_SUPERVISION: Final = """
WITH written AS (
    INSERT INTO tether_stream_supervision
        (key, tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch,
         producer)
    SELECT %(key)s, %(tenant)s, %(requester_uuid)s, %(session_id)s,
           %(status)s, %(heartbeat_at)s, %(message_id)s, %(epoch)s, %(producer)s
    WHERE %(epoch)s > coalesce(
        (SELECT epoch FROM tether_stream_supervision_epoch WHERE key = %(key)s), 0
    )
    ON CONFLICT (key) DO NOTHING
    RETURNING key, tenant, requester_uuid, session_id, epoch,
              pg_notify('tether_stream_changes', encode(key, 'hex') || ':s')
),
raised AS (
    INSERT INTO tether_stream_supervision_epoch AS granted (key, epoch)
    SELECT key, epoch FROM written
    ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
    WHERE granted.epoch < excluded.epoch
    RETURNING key
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT count(*) FROM raised) AS raised
"""
"""Compare-and-swap with ``expected_epoch = None``: write only if no row exists and
the epoch is above every epoch ever written, and raise the epoch table to it.

Run in a transaction: the epoch check in the insert reads the statement's
snapshot, so a claim racing the commit of a higher epoch may pass it; the
upsert of the epoch table then locks and re-checks the newest epoch, and
``written > raised`` tells the caller to roll the claim back."""

SWAP_SUPERVISION: Final = """
WITH written AS (
    UPDATE tether_stream_supervision
    SET status = %(status)s, heartbeat_at = %(heartbeat_at)s,
        message_id = %(message_id)s, epoch = %(epoch)s, producer = %(producer)s
    WHERE key = %(key)s AND epoch = %(expected_epoch)s
    RETURNING key, tenant, requester_uuid, session_id, epoch,
              CASE WHEN epoch <> %(expected_epoch)s
                  THEN pg_notify('tether_stream_changes', encode(key, 'hex') || ':s') END
),
raised AS (
    INSERT INTO tether_stream_supervision_epoch AS granted (key, epoch)
    SELECT key, epoch FROM written
    WHERE epoch > %(expected_epoch)s
    ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
    WHERE granted.epoch < excluded.epoch
)
SELECT count(*) AS written,
       CASE WHEN %(relaxed_commit)s THEN set_config('synchronous_commit', 'off', true) END
           AS commit_mode
FROM written
"""
"""Compare-and-swap with an expected epoch: write only over a row at exactly that epoch.

A swap that raises the epoch (a takeover) raises the epoch table in the same
statement; a heartbeat (the same epoch) leaves it alone, so the hot path writes
one row and never waits on the epoch table's lock."""

SWAP_SUPERVISION_MANY: Final = """
WITH swap AS (
    SELECT *
    FROM unnest(
        %(keys)s::bytea[], %(tenants)s::text[], %(requester_uuids)s::text[],
        %(session_ids)s::text[], %(expected_epochs)s::bigint[], %(statuses)s::text[],
        %(heartbeats)s::timestamptz[], %(message_ids)s::text[], %(epochs)s::bigint[],
        %(producers)s::text[]
    ) WITH ORDINALITY AS swap (
        key, tenant, requester_uuid, session_id, expected_epoch, status,
        heartbeat_at, message_id, epoch, producer, position
    )
),
claimed AS (
    INSERT INTO tether_stream_supervision
        (key, tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch,
         producer)
    SELECT swap.key, swap.tenant, swap.requester_uuid, swap.session_id, swap.status,
           swap.heartbeat_at, swap.message_id, swap.epoch, swap.producer
    FROM swap
    LEFT JOIN tether_stream_supervision_epoch AS granted ON granted.key = swap.key
    WHERE swap.expected_epoch IS NULL AND swap.epoch > coalesce(granted.epoch, 0)
    ON CONFLICT (key) DO NOTHING
    RETURNING key, tenant, requester_uuid, session_id, epoch,
              pg_notify('tether_stream_changes', encode(key, 'hex') || ':s')
),
swapped AS (
    UPDATE tether_stream_supervision AS stored
    SET status = swap.status, heartbeat_at = swap.heartbeat_at,
        message_id = swap.message_id, epoch = swap.epoch, producer = swap.producer
    FROM swap
    WHERE stored.key = swap.key AND stored.epoch = swap.expected_epoch
    RETURNING stored.key, stored.tenant, stored.requester_uuid, stored.session_id,
              stored.epoch, swap.expected_epoch,
              CASE WHEN stored.epoch <> swap.expected_epoch
                  THEN pg_notify('tether_stream_changes', encode(stored.key, 'hex') || ':s') END
),
raised AS (
    INSERT INTO tether_stream_supervision_epoch AS granted (key, epoch)
    SELECT key, epoch FROM claimed
    UNION ALL
    SELECT key, epoch FROM swapped
    WHERE epoch > expected_epoch
    ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
    WHERE granted.epoch < excluded.epoch
    RETURNING key
),
written AS (
    SELECT key FROM claimed
    UNION ALL
    SELECT key FROM swapped
)
SELECT swap.position,
       swap.key IN (SELECT key FROM written) AS written,
       swap.key IN (SELECT key FROM claimed) AND swap.key NOT IN (SELECT key FROM raised)
           AS stale,
       CASE WHEN %(relaxed_commit)s THEN set_config('synchronous_commit', 'off', true) END
           AS commit_mode
FROM swap
ORDER BY swap.position
"""
"""Several compare-and-swaps on *distinct* keys in one statement, each with its own
guard (a claim for a NULL expected epoch, a swap otherwise); one row per swap, in order.

Claims and takeovers raise the epoch table as in ``CLAIM_SUPERVISION`` and
``SWAP_SUPERVISION``. A batch with a claim runs in a transaction: a ``stale``
claim (written, but the epoch table's newest epoch was not below it) rolls the
batch back, and the batch is sent again."""

DELETE_SUPERVISION: Final = """
WITH deleted AS (
    DELETE FROM tether_stream_supervision
    WHERE key = %(key)s AND message_id = %(message_id)s AND epoch = %(epoch)s
    RETURNING key, tenant, requester_uuid, session_id, epoch,
              pg_notify('tether_stream_changes', encode(key, 'hex') || ':s')
),
kept AS (
    INSERT INTO tether_stream_supervision_epoch AS granted (key, epoch)
    SELECT key, epoch FROM deleted
    ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
    WHERE granted.epoch < excluded.epoch
)
SELECT count(*) AS deleted FROM deleted
"""
"""Remove the row if it still holds that turn; its epoch stays in the epoch table
(already there unless a replica of the previous release wrote the row)."""

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
fenced AS (
    INSERT INTO tether_stream_recording_fence AS fence (key, epoch)
    VALUES (%(key)s, %(epoch)s)
    ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
    WHERE fence.epoch <= excluded.epoch
    RETURNING key, epoch
),
written AS (
    INSERT INTO tether_stream_recording AS stored
        (key, tenant, requester_uuid, session_id, epoch, stream_index, message_id, message)
    SELECT key, %(tenant)s, %(requester_uuid)s, %(session_id)s, epoch,
           %(stream_index)s, %(message_id)s, %(message)s::jsonb
    FROM fenced
    ON CONFLICT (key) DO UPDATE
    SET epoch = excluded.epoch, stream_index = excluded.stream_index,
        message_id = excluded.message_id, message = excluded.message, recorded_at = now()
    WHERE stored.epoch <= excluded.epoch
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex') || ':r')
)
SELECT count(*) AS written,
       CASE WHEN (SELECT epoch FROM previous) = %(epoch)s
           THEN set_config('synchronous_commit', 'off', true) END AS commit_mode
FROM written
"""
"""Insert, or overwrite, unless the fence or the stored epoch is higher; ``written = 0``
means fenced. The record's own guard matters only for rows a replica of the
previous release wrote without raising the fence.

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
fenced AS (
    INSERT INTO tether_stream_recording_fence AS fence (key, epoch)
    SELECT key, epoch FROM put
    ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
    WHERE fence.epoch <= excluded.epoch
    RETURNING key
),
written AS (
    INSERT INTO tether_stream_recording AS stored
        (key, tenant, requester_uuid, session_id, epoch, stream_index, message_id, message)
    SELECT key, tenant, requester_uuid, session_id, epoch, stream_index, message_id, message
    FROM put
    WHERE key IN (SELECT key FROM fenced)
    ON CONFLICT (key) DO UPDATE
    SET epoch = excluded.epoch, stream_index = excluded.stream_index,
        message_id = excluded.message_id, message = excluded.message, recorded_at = now()
    WHERE stored.epoch <= excluded.epoch
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex') || ':r')
)
SELECT put.position,
       put.key IN (SELECT key FROM written) AS written,
       CASE WHEN (SELECT at_stored_epochs FROM relaxed)
           THEN set_config('synchronous_commit', 'off', true) END AS commit_mode
FROM put
ORDER BY put.position
"""
"""Several fenced puts on *distinct* keys in one statement, each fenced on its own
fence and row; one row per put, in order (``written`` false: fenced). The batch skips the
fsync wait only when every put is at the epoch already stored, as ``PUT_RECORDING``."""

DELETE_RECORDING: Final = """
WITH deleted AS (
    DELETE FROM tether_stream_recording
    WHERE key = %(key)s AND message_id = %(message_id)s
    RETURNING key, pg_notify('tether_stream_changes', encode(key, 'hex') || ':r')
)
SELECT count(*) AS deleted FROM deleted
"""
"""The record only: its fence stays in ``tether_stream_recording_fence``."""

FENCE_RECORDING: Final = """
INSERT INTO tether_stream_recording_fence AS fence (key, epoch)
VALUES (%(key)s, %(epoch)s)
ON CONFLICT (key) DO UPDATE SET epoch = excluded.epoch
WHERE fence.epoch < excluded.epoch
"""
"""Raise the recording fence to ``epoch``; never lowers it, leaves the record alone."""

# Conversations --------------------------------------------------------------------------

LOCK_CONVERSATION: Final = """
SELECT tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status, title,
       message_count, metadata, fence_epoch, created_at, updated_at
FROM tether_conversations
WHERE key = %(key)s
FOR UPDATE
"""

CREATE_CONVERSATION: Final = """
INSERT INTO tether_conversations
    (key, owner_key, tenant, session_id, owner_uuid, agent_identifier, shared,
     last_turn_status, title, message_count, metadata, fence_epoch, created_at, updated_at)
VALUES (%(key)s, %(owner_key)s, %(tenant)s, %(session_id)s, %(owner_uuid)s,
        %(agent_identifier)s, false, %(last_turn_status)s, %(title)s, %(message_count)s,
        %(metadata)s::jsonb, %(fence_epoch)s, %(created_at)s, %(updated_at)s)
ON CONFLICT (key) DO NOTHING
RETURNING key
"""
"""Create, unless a concurrent creator got there first (no row returned)."""

UPDATE_CONVERSATION: Final = """
UPDATE tether_conversations
SET agent_identifier = %(agent_identifier)s, last_turn_status = %(last_turn_status)s,
    title = %(title)s, message_count = %(message_count)s, metadata = %(metadata)s::jsonb,
    fence_epoch = %(fence_epoch)s, updated_at = %(updated_at)s
WHERE key = %(key)s
"""
"""Run under the row lock of ``LOCK_CONVERSATION``, with values computed from it."""

FENCE_CONVERSATION: Final = """
UPDATE tether_conversations
SET fence_epoch = %(epoch)s
WHERE key = %(key)s AND fence_epoch < %(epoch)s
"""
"""Raise the conversation's fence; never lowers it, and creates no conversation."""

PRESENT_MESSAGE_IDS: Final = """
SELECT DISTINCT message ->> 'message_id' AS message_id
FROM tether_conversation_messages
WHERE conversation_key = %(key)s AND message ->> 'message_id' = ANY(%(message_ids)s::text[])
"""
"""Which of ``message_ids`` the transcript holds already (``append_fenced`` appends
only the others); run under the row lock, so no append can slip in between."""

APPEND_MESSAGES: Final = """
INSERT INTO tether_conversation_messages (conversation_key, position, message)
SELECT %(key)s, %(first_position)s::integer + appended.ordinality::integer - 1,
       appended.message
FROM unnest(%(messages)s::jsonb[]) WITH ORDINALITY AS appended (message, ordinality)
"""

# A rollback (``remove_fenced``), run under the row lock of ``LOCK_CONVERSATION``.
# Positions stay dense (0 .. message_count - 1), so an append after it still
# starts at ``message_count``: the messages after a removed one move down.

REMOVE_MESSAGES: Final = """
DELETE FROM tether_conversation_messages
WHERE conversation_key = %(key)s AND message ->> 'message_id' = ANY(%(message_ids)s::text[])
RETURNING position
"""
"""Remove the messages with those ids; returns the positions they held."""

CLOSE_GAPS_AWAY: Final = """
UPDATE tether_conversation_messages AS kept
SET position = -1 - (kept.position - (
    SELECT count(*) FROM unnest(%(removed)s::integer[]) AS gone (position)
    WHERE gone.position < kept.position
)::integer)
WHERE kept.conversation_key = %(key)s AND kept.position > %(lowest)s
"""
"""First half of closing the gaps: each message after the lowest removed
position goes to its new position, stored negated (``-1 - new``). The primary
key is checked row by row, so moving straight down could meet a row not moved
yet; no message sits at a negative position, so this never does."""

CLOSE_GAPS_BACK: Final = """
UPDATE tether_conversation_messages
SET position = -1 - position
WHERE conversation_key = %(key)s AND position < 0
"""
"""Second half: the moved messages take their new positions, all distinct."""

FIRST_USER_MESSAGE: Final = """
SELECT message
FROM tether_conversation_messages
WHERE conversation_key = %(key)s AND message ->> 'sender' = %(sender)s
ORDER BY position
LIMIT 1
"""
"""What the title is taken from again after messages were removed."""

UPDATE_CONVERSATION_AFTER_REMOVAL: Final = """
UPDATE tether_conversations
SET last_turn_status = %(last_turn_status)s, title = %(title)s,
    message_count = %(message_count)s, fence_epoch = %(fence_epoch)s,
    updated_at = %(updated_at)s
WHERE key = %(key)s
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

LIST_STALE_CONVERSATIONS: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE updated_at < %(before)s
ORDER BY updated_at ASC, key ASC
LIMIT %(limit)s
"""
"""Retention: every owner's conversations not updated since ``before``, oldest
first; served by the ``(updated_at, key)`` index."""

LIST_STALE_CONVERSATIONS_AFTER: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE updated_at < %(before)s
  AND (updated_at, key) > (%(after_updated_at)s, %(after_key)s)
ORDER BY updated_at ASC, key ASC
LIMIT %(limit)s
"""

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

SERVER_TIME: Final = "SELECT clock_timestamp() AS now"
"""The server's clock as it reads now (``now()`` would be the transaction's
start): what replicas stamp and judge heartbeats by (``server_time``)."""

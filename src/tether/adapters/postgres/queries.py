"""The SQL the PostgreSQL stores share, and their agent state's and recordings', by name.

The supervision store's statements are in ``queries_supervision``, the
conversation store's in ``queries_conversation``, the MCP OAuth repository's in
``queries_mcp``; the schema is in ``migrations``.

Rules every statement of the backend follows, here and in the other ``queries_*``:

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
  runs in a transaction of its own (see ``queries_supervision.CLAIM_SUPERVISION``).
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

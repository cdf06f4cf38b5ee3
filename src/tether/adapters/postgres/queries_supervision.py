"""The SQL of the PostgreSQL supervision store (``supervision``), by name.

Beside ``queries``, whose rules hold here too. The supervision row of a
conversation lives in ``tether_stream_supervision``; the highest epoch ever
granted for it in ``tether_stream_supervision_epoch``, which outlives the row.
Every write that changes a row's epoch notifies on ``queries.CHANNEL``
(``<key hex>:s``) in its ``RETURNING`` clause; a heartbeat (a swap at the same
epoch) does not, and skips the fsync wait when asked (``relaxed_commit``).
"""

from __future__ import annotations

from typing import Final

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

SERVER_TIME: Final = "SELECT clock_timestamp() AS now"
"""The server's clock as it reads now (``now()`` would be the transaction's
start): what replicas stamp and judge heartbeats by (``server_time``)."""

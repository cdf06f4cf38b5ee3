"""The SQLite backend's schema, its migrations, and the pragmas a connection is set up with.

The schema's version is SQLite's ``user_version``; ``set_user_version`` is the
only statement built from a value, because ``PRAGMA`` takes no parameters, and
it accepts nothing but an ``int``. Tables are ``STRICT`` (SQLite 3.37+), so a
column can only ever hold its declared type: an epoch is always an integer, an
id always a blob. The stores' statements are in ``queries``.
"""

from __future__ import annotations

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

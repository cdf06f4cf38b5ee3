"""SQLite backend: all four stores in one database file, for several processes on one host.

``tether.stores.from_url("sqlite:///relative/path.db")`` (or
``sqlite:////absolute/path.db``; ``stores_from_url`` here) builds the agent
state, stream recording, stream supervision and conversation stores over one
shared ``SQLiteDatabase``. The only URL option is ``busy_timeout`` (seconds a
write waits for another process's lock, default 5): ``sqlite:///t.db?busy_timeout=10``.

Each store also stands alone: ``SQLiteChatAgentStateStore(database)`` over a
database you open and close (``async with SQLiteDatabase(path) as database``),
or ``SQLiteChatAgentStateStore.from_url(url)`` / ``.from_path(path)`` over one
of its own. Stores are async context managers, and ``setup_app`` opens and
closes them.

Guarantees (see ``database`` for how): WAL mode and ``BEGIN IMMEDIATE``
transactions make every check-and-write atomic across processes sharing the
file, so epochs have one claimant and fenced writes change nothing; checkpoints
and transcripts are fsynced when acknowledged, heartbeats and recordings are
atomic but not fsynced. Corrupt rows raise ``StoreCorruptedError`` and are left
as is. The file must be on a local disk: SQLite's locking (and WAL's shared
memory) does not work over network file systems, so this backend is for one
host; use PostgreSQL across hosts. The processes sharing the file push changes
and deltas to each other as Unix datagrams in ``{file}.wake``
(``tether.adapters.unix_datagrams``); one that cannot listen there polls
(``follower_poll_interval``).

Stdlib ``sqlite3`` only, linked against SQLite 3.37 or newer (``STRICT`` tables).
"""

from tether.adapters.sqlite.agent_state import SQLiteChatAgentStateStore
from tether.adapters.sqlite.bundle import stores_from_url
from tether.adapters.sqlite.conversation import SQLiteChatConversationStore
from tether.adapters.sqlite.database import Lane, SQLiteDatabase, SQLiteDiagnostics
from tether.adapters.sqlite.recording import SQLiteChatStreamRecordingStore
from tether.adapters.sqlite.supervision import SQLiteChatStreamSupervisionStore

__all__ = [
    "Lane",
    "SQLiteChatAgentStateStore",
    "SQLiteChatConversationStore",
    "SQLiteChatStreamRecordingStore",
    "SQLiteChatStreamSupervisionStore",
    "SQLiteDatabase",
    "SQLiteDiagnostics",
    "stores_from_url",
]

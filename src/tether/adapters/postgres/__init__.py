"""PostgreSQL stores (``postgresql://`` URLs): state, recording, supervision, conversations.

Needs ``psycopg`` 3 and ``psycopg-pool`` (the ``tether[postgres]`` extra); importing
this package without them fails, and nothing else does.
"""

from tether.adapters.postgres._conninfo import PostgresOptions
from tether.adapters.postgres.agent_state import PostgresChatAgentStateStore
from tether.adapters.postgres.bundle import stores_from_url
from tether.adapters.postgres.conversation import PostgresChatConversationStore
from tether.adapters.postgres.database import PostgresDatabase
from tether.adapters.postgres.migrations import LATEST_VERSION, MIGRATIONS, Migration
from tether.adapters.postgres.recording import PostgresChatStreamRecordingStore
from tether.adapters.postgres.supervision import PostgresChatStreamSupervisionStore

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "Migration",
    "PostgresChatAgentStateStore",
    "PostgresChatConversationStore",
    "PostgresChatStreamRecordingStore",
    "PostgresChatStreamSupervisionStore",
    "PostgresDatabase",
    "PostgresOptions",
    "stores_from_url",
]

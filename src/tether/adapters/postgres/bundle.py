"""``postgresql://`` store URLs: every store on one shared database."""

from __future__ import annotations

from tether.adapters.postgres.agent_state import PostgresChatAgentStateStore
from tether.adapters.postgres.conversation import PostgresChatConversationStore
from tether.adapters.postgres.database import PostgresDatabase
from tether.adapters.postgres.recording import PostgresChatStreamRecordingStore
from tether.adapters.postgres.supervision import PostgresChatStreamSupervisionStore
from tether.domain.store_bundle import StoreBundle


def stores_from_url(url: str) -> StoreBundle:
    """The four stores on the database at ``url``, sharing one pool and one listener.

    ``url`` is a libpq URL (``postgresql://`` or ``postgres://``; its query
    parameters such as ``sslmode`` go to libpq) plus tether's own parameters:

    - ``create_schema=true`` (the default): create or upgrade the schema when the
      stores open. Concurrent replicas are safe (advisory lock). With ``false``
      the stores only check the schema version at open and refuse an old one:
      run ``tether db upgrade --store URL`` first. Use that where the runtime
      role may not run DDL, or to upgrade in a deploy step of its own.
    - ``pool_min_size=1``, ``pool_max_size=10``: connection pool bounds (the
      LISTEN connection, opened on the first follower's wait, is one more).
    - ``timeout=5``: seconds a store call (or the open) may take, waiting for a
      connection included, before it raises ``StoreUnavailableError``.

    Nothing connects until the first store opens. Raises ``StoreURLError`` for a
    malformed URL or option.
    """
    database = PostgresDatabase.from_url(url)
    return StoreBundle(
        agent_state_store=PostgresChatAgentStateStore(database),
        chat_stream_recording_store=PostgresChatStreamRecordingStore(database),
        chat_stream_supervision_store=PostgresChatStreamSupervisionStore(database),
        chat_conversation_store=PostgresChatConversationStore(database),
    )

"""``tether.stores.from_url("sqlite:///...")``: all four stores over one database."""

from __future__ import annotations

from tether.adapters.sqlite.agent_state import SQLiteChatAgentStateStore
from tether.adapters.sqlite.conversation import SQLiteChatConversationStore
from tether.adapters.sqlite.database import SQLiteDatabase
from tether.adapters.sqlite.recording import SQLiteChatStreamRecordingStore
from tether.adapters.sqlite.supervision import SQLiteChatStreamSupervisionStore
from tether.domain.store_bundle import StoreBundle


def stores_from_url(url: str) -> StoreBundle:
    """State, recording, supervision and conversation stores sharing one
    ``SQLiteDatabase`` on the file ``url`` names.

    Nothing is opened yet: ``setup_app`` opens each store, and each takes one
    hold on the shared database, so it connects once and closes when the last
    store is closed. A malformed URL raises ``StoreURLError`` here; a file that
    cannot be created or opened raises ``StoreError`` naming the URL at open.
    """
    database = SQLiteDatabase.from_url(url)
    return StoreBundle(
        agent_state_store=SQLiteChatAgentStateStore(database),
        chat_stream_recording_store=SQLiteChatStreamRecordingStore(database),
        chat_stream_supervision_store=SQLiteChatStreamSupervisionStore(database),
        chat_conversation_store=SQLiteChatConversationStore(database),
    )

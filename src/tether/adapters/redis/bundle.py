"""``tether.stores.from_url("redis://...")``: the three Redis stores over one connection."""

from __future__ import annotations

from tether.adapters.redis.agent_state import RedisChatAgentStateStore
from tether.adapters.redis.connection import RedisConnection
from tether.adapters.redis.recording import RedisChatStreamRecordingStore
from tether.adapters.redis.supervision import RedisChatStreamSupervisionStore
from tether.domain.store_bundle import StoreBundle


def stores_from_url(url: str) -> StoreBundle:
    """State, recording and supervision stores sharing one ``RedisConnection``.

    No conversation store (None): transcripts must be durable and listable,
    which is a SQL backend's job; pair Redis with one, e.g. ``tether serve
    --store sqlite:///... --stream-store redis://...`` (``tether.stores.compose``).
    Nothing connects until ``setup_app`` opens the stores.
    """
    connection = RedisConnection.from_url(url)
    return StoreBundle(
        agent_state_store=RedisChatAgentStateStore(connection),
        chat_stream_recording_store=RedisChatStreamRecordingStore(connection),
        chat_stream_supervision_store=RedisChatStreamSupervisionStore(connection),
        chat_conversation_store=None,
    )

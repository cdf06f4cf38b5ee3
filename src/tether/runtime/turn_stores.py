"""The optional stores a server runs with; each one present unlocks its layer."""

from __future__ import annotations

from dataclasses import dataclass

from tether.domain.chat_agent_state_store import ChatAgentStateStore
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_stream_recording_store import ChatStreamRecordingStore
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore


@dataclass(frozen=True)
class TurnStores:
    agent_state: ChatAgentStateStore | None = None
    recording: ChatStreamRecordingStore | None = None
    supervision: ChatStreamSupervisionStore | None = None
    conversation: ChatConversationStore | None = None

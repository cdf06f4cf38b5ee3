"""Agent state (checkpoint) stores: file-backed and in-memory."""

from tether.adapters.agent_state.in_memory import InMemoryChatAgentStateStore
from tether.adapters.agent_state.local_file import LocalFileChatAgentStateStore

__all__ = ["InMemoryChatAgentStateStore", "LocalFileChatAgentStateStore"]

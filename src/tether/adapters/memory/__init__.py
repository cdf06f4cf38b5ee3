"""In-memory backend (``memory://``): every store in this process's dicts.

For tests, demos and single-process development: the stores keep the same
rules as the durable ones (fences, ownership, sealed MCP credentials, JSON
round trips), so code tested here behaves the same on a real backend. The
recording and supervision stores share one ``InMemoryChangeChannel`` to wake
followers. The MCP OAuth repository is ``mcp_repository``.

Limits: one process, nothing survives its exit, and no other replica sees a
write; never use it for a deployment.
"""

from tether.adapters.memory.agent_state import InMemoryChatAgentStateStore
from tether.adapters.memory.conversation import InMemoryChatConversationStore
from tether.adapters.memory.stream_buffer import (
    InMemoryChangeChannel,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)

__all__ = [
    "InMemoryChangeChannel",
    "InMemoryChatAgentStateStore",
    "InMemoryChatConversationStore",
    "InMemoryChatStreamRecordingStore",
    "InMemoryChatStreamSupervisionStore",
]

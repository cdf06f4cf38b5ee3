"""Old import path, kept working: the agent state stores now live in ``tether.adapters.memory`` and
``tether.adapters.file``.

Only a re-export remains here, so that code importing ``tether.adapters.agent_state`` (the
seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.agent_state import LocalFileChatAgentStateStore
from tether.adapters.memory.agent_state import InMemoryChatAgentStateStore

__all__ = [
    "InMemoryChatAgentStateStore",
    "LocalFileChatAgentStateStore",
]

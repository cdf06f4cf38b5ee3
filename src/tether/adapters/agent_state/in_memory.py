"""Old import path, kept working: the in-memory agent state store now lives in
``tether.adapters.memory.agent_state``.

Only a re-export remains here, so that code importing ``tether.adapters.agent_state.in_memory``
(the seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.memory.agent_state import InMemoryChatAgentStateStore

__all__ = [
    "InMemoryChatAgentStateStore",
]

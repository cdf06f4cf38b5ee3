"""Old import path, kept working: the file agent state store now lives in
``tether.adapters.file.agent_state``.

Only a re-export remains here, so that code importing ``tether.adapters.agent_state.local_file``
(the seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.agent_state import LocalFileChatAgentStateStore

__all__ = [
    "LocalFileChatAgentStateStore",
]

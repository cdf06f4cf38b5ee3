"""Old import path, kept working: the in-memory conversation store now lives in
``tether.adapters.memory.conversation``.

Only a re-export remains here, so that code importing ``tether.adapters.conversation.in_memory``
(the seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.memory.conversation import InMemoryChatConversationStore

__all__ = [
    "InMemoryChatConversationStore",
]

"""Old import path, kept working: the conversation stores now live in ``tether.adapters.memory``
and ``tether.adapters.file``.

Only a re-export remains here, so that code importing ``tether.adapters.conversation`` (the
seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.conversation import LocalFileChatConversationStore
from tether.adapters.memory.conversation import InMemoryChatConversationStore

__all__ = [
    "InMemoryChatConversationStore",
    "LocalFileChatConversationStore",
]

"""Old import path, kept working: the file conversation store now lives in
``tether.adapters.file.conversation``.

Only a re-export remains here, so that code importing
``tether.adapters.conversation.local_file`` (the seed's wiring, third-party code) runs
unchanged; import from the new place in new code.
"""

from tether.adapters.file.conversation import LocalFileChatConversationStore

__all__ = [
    "LocalFileChatConversationStore",
]

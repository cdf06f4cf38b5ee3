"""Old import path, kept working: the stream buffer stores now live in ``tether.adapters.memory``
and ``tether.adapters.file``.

Only a re-export remains here, so that code importing ``tether.adapters.stream_buffer`` (the
seed's wiring, third-party code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.recording import LocalFileChatStreamRecordingStore
from tether.adapters.file.supervision import LocalFileChatStreamSupervisionStore
from tether.adapters.memory.stream_buffer import (
    InMemoryChangeChannel,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)

__all__ = [
    "InMemoryChangeChannel",
    "InMemoryChatStreamRecordingStore",
    "InMemoryChatStreamSupervisionStore",
    "LocalFileChatStreamRecordingStore",
    "LocalFileChatStreamSupervisionStore",
]

"""Stream buffer stores: supervision rows and recordings, file-backed and in-memory."""

from tether.adapters.stream_buffer.in_memory import (
    InMemoryChangeChannel,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.adapters.stream_buffer.local_file_recording import LocalFileChatStreamRecordingStore
from tether.adapters.stream_buffer.local_file_supervision import (
    LocalFileChatStreamSupervisionStore,
)

__all__ = [
    "InMemoryChangeChannel",
    "InMemoryChatStreamRecordingStore",
    "InMemoryChatStreamSupervisionStore",
    "LocalFileChatStreamRecordingStore",
    "LocalFileChatStreamSupervisionStore",
]

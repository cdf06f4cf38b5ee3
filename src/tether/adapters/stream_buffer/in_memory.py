"""Old import path, kept working: the in-memory stream buffer stores now live in
``tether.adapters.memory.stream_buffer``.

Only a re-export remains here, so that code importing
``tether.adapters.stream_buffer.in_memory`` (the seed's wiring, third-party code) runs
unchanged; import from the new place in new code.
"""

from tether.adapters.memory.stream_buffer import (
    InMemoryChangeChannel,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)

__all__ = [
    "InMemoryChangeChannel",
    "InMemoryChatStreamRecordingStore",
    "InMemoryChatStreamSupervisionStore",
]

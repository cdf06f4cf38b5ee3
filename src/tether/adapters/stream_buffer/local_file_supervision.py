"""Old import path, kept working: the file supervision store now lives in
``tether.adapters.file.supervision``.

Only a re-export remains here, so that code importing
``tether.adapters.stream_buffer.local_file_supervision`` (the seed's wiring, third-party code)
runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.supervision import LocalFileChatStreamSupervisionStore

__all__ = [
    "LocalFileChatStreamSupervisionStore",
]

"""Old import path, kept working: the file recording store now lives in
``tether.adapters.file.recording``.

Only a re-export remains here, so that code importing
``tether.adapters.stream_buffer.local_file_recording`` (the seed's wiring, third-party code)
runs unchanged; import from the new place in new code.
"""

from tether.adapters.file.recording import LocalFileChatStreamRecordingStore

__all__ = [
    "LocalFileChatStreamRecordingStore",
]

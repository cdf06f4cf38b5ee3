"""File backend (``file://DIR`` URLs): every store as JSON files in a directory.

For local work and single-host deployments: any number of processes may share
the directory. Each row is one document, replaced atomically (fsynced where it
must survive an OS crash: checkpoints, transcripts, fences); read-check-write
steps hold an ``flock`` on the row's ``.lock`` file (``_files``), and what a
store keeps of a conversation for ever is a number named by its tombstone
(``kept_numbers``). The MCP OAuth repository is ``mcp_repository``.

Limits: one host and a local disk (``flock``, the Unix datagrams that wake
followers and the presence locks do not reach across hosts or over network
file systems), POSIX only, and listing a user's conversations reads every
conversation document of the tenant, so it suits small numbers of them. Use
SQLite on one host for more, PostgreSQL across hosts.
"""

from tether.adapters.file.agent_state import LocalFileChatAgentStateStore
from tether.adapters.file.conversation import LocalFileChatConversationStore
from tether.adapters.file.recording import LocalFileChatStreamRecordingStore
from tether.adapters.file.supervision import LocalFileChatStreamSupervisionStore

__all__ = [
    "LocalFileChatAgentStateStore",
    "LocalFileChatConversationStore",
    "LocalFileChatStreamRecordingStore",
    "LocalFileChatStreamSupervisionStore",
]

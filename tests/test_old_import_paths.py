"""The file and in-memory stores, and the MCP OAuth repositories, moved into a
folder per backend (``adapters/file/``, ``adapters/memory/``, ``adapters/sqlite/``,
``adapters/postgres/``), and the crash test's instruments out of ``tether.testing``
(into ``tether.crashtest.instruments``); every old import path still gives the
very same objects."""

from __future__ import annotations

import importlib

import pytest

from tests.support.services import import_or_skip

MOVED = [
    # (old module, names, new module)
    ("tether.adapters.agent_state", ["InMemoryChatAgentStateStore"], "tether.adapters.memory"),
    ("tether.adapters.agent_state", ["LocalFileChatAgentStateStore"], "tether.adapters.file"),
    (
        "tether.adapters.agent_state.in_memory",
        ["InMemoryChatAgentStateStore"],
        "tether.adapters.memory.agent_state",
    ),
    (
        "tether.adapters.agent_state.local_file",
        ["LocalFileChatAgentStateStore"],
        "tether.adapters.file.agent_state",
    ),
    ("tether.adapters.conversation", ["InMemoryChatConversationStore"], "tether.adapters.memory"),
    ("tether.adapters.conversation", ["LocalFileChatConversationStore"], "tether.adapters.file"),
    (
        "tether.adapters.conversation.in_memory",
        ["InMemoryChatConversationStore"],
        "tether.adapters.memory.conversation",
    ),
    (
        "tether.adapters.conversation.local_file",
        ["LocalFileChatConversationStore"],
        "tether.adapters.file.conversation",
    ),
    (
        "tether.adapters.conversation._record",
        ["ConversationRecord", "Append", "Removal", "page"],
        "tether.adapters.conversation_record",
    ),
    (
        "tether.adapters.stream_buffer",
        [
            "InMemoryChangeChannel",
            "InMemoryChatStreamRecordingStore",
            "InMemoryChatStreamSupervisionStore",
        ],
        "tether.adapters.memory",
    ),
    (
        "tether.adapters.stream_buffer",
        ["LocalFileChatStreamRecordingStore", "LocalFileChatStreamSupervisionStore"],
        "tether.adapters.file",
    ),
    (
        "tether.adapters.stream_buffer.in_memory",
        [
            "InMemoryChangeChannel",
            "InMemoryChatStreamRecordingStore",
            "InMemoryChatStreamSupervisionStore",
        ],
        "tether.adapters.memory.stream_buffer",
    ),
    (
        "tether.adapters.stream_buffer.local_file_recording",
        ["LocalFileChatStreamRecordingStore"],
        "tether.adapters.file.recording",
    ),
    (
        "tether.adapters.stream_buffer.local_file_supervision",
        ["LocalFileChatStreamSupervisionStore"],
        "tether.adapters.file.supervision",
    ),
    (
        "tether.adapters.mcp",
        ["InMemoryMCPOAuthRepository"],
        "tether.adapters.memory.mcp_repository",
    ),
    ("tether.adapters.mcp", ["LocalFileMCPOAuthRepository"], "tether.adapters.file.mcp_repository"),
    (
        "tether.adapters.mcp.in_memory",
        ["InMemoryMCPOAuthRepository"],
        "tether.adapters.memory.mcp_repository",
    ),
    (
        "tether.adapters.mcp.local_file",
        ["LocalFileMCPOAuthRepository"],
        "tether.adapters.file.mcp_repository",
    ),
    ("tether.adapters._files", ["write_json"], "tether.adapters.file._files"),
    (
        "tether.adapters._files",
        ["RowFiles", "encode_component", "row_files"],
        "tether.adapters.file._paths",
    ),
    (
        "tether.adapters.kept_numbers",
        ["KEY_CHECK_FILE", "KeptNumber", "KeptNumbers"],
        "tether.adapters.file.kept_numbers",
    ),
    (
        "tether.testing.pause_in_write",
        [
            "PAUSE_IN_VARIABLE",
            "QUIET_WITHIN",
            "PauseGate",
            "PauseInWrite",
            "WriteKind",
            "install",
            "install_from_env",
            "stop_this_process",
        ],
        "tether.crashtest.instruments.pause_in_write",
    ),
    (
        "tether.testing.tool_ledger",
        ["HOLD_AT_MOST", "LEDGER_VARIABLE", "ToolLedger", "ToolRun", "recorded"],
        "tether.crashtest.instruments.tool_ledger",
    ),
]

MOVED_SQL = [
    (
        "tether.adapters.mcp.sqlite_repository",
        ["SQLiteMCPOAuthRepository", "DATABASE_TYPE", "mcp_oauth_repository_from_url"],
        "tether.adapters.sqlite.mcp_repository",
    ),
    (
        "tether.adapters.mcp.postgres_repository",
        ["PostgresMCPOAuthRepository", "DATABASE_TYPE", "mcp_oauth_repository_from_url"],
        "tether.adapters.postgres.mcp_repository",
    ),
]


@pytest.mark.parametrize(("old", "names", "new"), MOVED, ids=lambda value: str(value))
def test_an_old_path_gives_the_moved_objects(old: str, names: list[str], new: str) -> None:
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name), name
        assert name in old_module.__all__


@pytest.mark.parametrize(("old", "names", "new"), MOVED_SQL, ids=lambda value: str(value))
def test_an_old_mcp_sql_path_gives_the_moved_repository(
    old: str, names: list[str], new: str
) -> None:
    new_module = import_or_skip(new)
    old_module = importlib.import_module(old)
    for name in names:
        assert getattr(old_module, name) is getattr(new_module, name), name

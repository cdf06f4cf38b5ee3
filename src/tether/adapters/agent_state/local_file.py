"""Checkpoints as one JSON file per conversation, for local work and single-node deployments."""

from __future__ import annotations

import os
from typing import Any

from tether.adapters._files import (
    RowFiles,
    read_json,
    remove_file,
    row_files,
    run_in_thread,
    store_root,
    write_json,
)
from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.domain.store_errors import StoreCorruptedError


class LocalFileChatAgentStateStore(ChatAgentStateStore):
    """``ChatAgentStateStore`` on a directory, shared safely by any number of processes.

    The layout follows ``construct_agent_state_key`` with every id escaped:
    ``{base_path}/agent-state/{tenant}/{user_uuid}/{session_id}.json`` (a missing
    user is ``""``, as in the key). A save replaces the file atomically and is
    durable when it returns. Saves need no lock: each replaces the whole blob, so
    the last one wins, which is the contract.
    """

    def __init__(self, base_path: str | os.PathLike[str]) -> None:
        self._base = store_root(base_path)

    async def load(self, tenant: str, user_uuid: str | None, session_id: str) -> DependencyState:
        """The saved state, or ``{}``; a damaged file raises ``StoreCorruptedError``."""
        return await run_in_thread(self._load, self._files(tenant, user_uuid, session_id))

    async def save(
        self, tenant: str, user_uuid: str | None, session_id: str, state: DependencyState
    ) -> None:
        """Atomically and durably replace the saved state with ``state``."""
        _check_shape(state)
        files = self._files(tenant, user_uuid, session_id)
        await run_in_thread(write_json, files.data, state, durable=True)

    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        """Remove the saved state; a no-op when nothing exists."""
        files = self._files(tenant, user_uuid, session_id)
        await run_in_thread(remove_file, files.data, durable=True)

    def _files(self, tenant: str, user_uuid: str | None, session_id: str) -> RowFiles:
        return row_files(self._base, "agent-state", tenant, user_uuid or "", session_id)

    @staticmethod
    def _load(files: RowFiles) -> DependencyState:
        document = read_json(files.data)
        if document is None:
            return {}
        if not _is_state(document):
            raise StoreCorruptedError(
                f"{files.data} does not hold {{state_key: object}} checkpoint state; left as is"
            )
        return document


def _is_state(document: Any) -> bool:
    return isinstance(document, dict) and all(
        isinstance(key, str) and isinstance(blob, dict) for key, blob in document.items()
    )


def _check_shape(state: DependencyState) -> None:
    # Refuse up front what could never be loaded back as DependencyState.
    if not _is_state(state):
        raise TypeError("agent state must be a dict of {state_key: dict blob}")

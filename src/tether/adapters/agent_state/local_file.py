"""Checkpoints as one JSON file per conversation, for local work and single-node deployments."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tether.adapters._files import (
    RowFiles,
    exclusive_lock,
    read_json,
    remove_file,
    remove_lock_file,
    row_files,
    run_in_thread,
    store_root,
    write_json,
)
from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.domain.store_errors import StoreCorruptedError

_FENCE = "fence"


class LocalFileChatAgentStateStore(ChatAgentStateStore):
    """``ChatAgentStateStore`` on a directory, shared safely by any number of processes.

    The layout follows ``construct_agent_state_key`` with every id escaped:
    ``{base_path}/agent-state/{tenant}/{user_uuid}/{session_id}.json`` (a missing
    user is ``""``, as in the key) holds exactly the saved state. A save replaces
    the file atomically and is durable when it returns. Plain saves need no lock:
    each replaces the whole blob, so the last one wins, which is the contract.

    The conversation's fence lives beside it, in ``{session_id}.fence.json`` as
    ``{"fence": n}`` (escaped ids never hold a ".", so no session's state file
    can have that name). ``save_fenced`` and ``fence`` hold an exclusive
    ``flock`` on the sibling ``.lock`` file across reading the fence and
    writing; ``delete`` removes the state (and the lock file) and keeps the fence. A fenced save
    raises the fence before it writes the state, so a crash between the two
    leaves a fence, never a state its fence does not guard.
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

    async def save_fenced(
        self,
        tenant: str,
        user_uuid: str | None,
        session_id: str,
        state: DependencyState,
        epoch: int,
    ) -> bool:
        """Replace the state unless the fence is above ``epoch``, under the row's lock."""
        _check_shape(state)
        files = self._files(tenant, user_uuid, session_id)
        return await run_in_thread(_save_fenced, files, state, epoch)

    async def fence(self, tenant: str, user_uuid: str | None, session_id: str, epoch: int) -> None:
        """Refuse later fenced saves below ``epoch``; the state is unchanged."""
        files = self._files(tenant, user_uuid, session_id)
        await run_in_thread(_fence, files, epoch)

    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        """Remove the saved state and its lock file (the fence stays); a no-op
        when nothing exists."""
        files = self._files(tenant, user_uuid, session_id)
        await run_in_thread(_delete, files)

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


def _fence_path(files: RowFiles) -> Path:
    # "<session>.json" -> "<session>.fence.json", in the same directory.
    return files.data.with_suffix(f".{_FENCE}.json")


def _read_fence(path: Path) -> int:
    document = read_json(path)
    if document is None:
        return 0
    fence = document.get(_FENCE) if isinstance(document, dict) else None
    if not isinstance(fence, int) or isinstance(fence, bool):
        raise StoreCorruptedError(f'{path} does not hold {{"{_FENCE}": integer}}; left as is')
    return fence


def _save_fenced(files: RowFiles, state: DependencyState, epoch: int) -> bool:
    fence_path = _fence_path(files)
    with exclusive_lock(files.lock):
        fence = _read_fence(fence_path)
        if fence > epoch:
            return False
        if fence != epoch:
            # A state that is not JSON must fail before the fence moves.
            json.dumps(state)
            write_json(fence_path, {_FENCE: epoch}, durable=True)
        write_json(files.data, state, durable=True)
        return True


def _delete(files: RowFiles) -> None:
    with exclusive_lock(files.lock):
        remove_file(files.data, durable=True)
        remove_lock_file(files.lock)


def _fence(files: RowFiles, epoch: int) -> None:
    fence_path = _fence_path(files)
    with exclusive_lock(files.lock):
        if epoch > _read_fence(fence_path):
            write_json(fence_path, {_FENCE: epoch}, durable=True)


def _is_state(document: Any) -> bool:
    return isinstance(document, dict) and all(
        isinstance(key, str) and isinstance(blob, dict) for key, blob in document.items()
    )


def _check_shape(state: DependencyState) -> None:
    # Refuse up front what could never be loaded back as DependencyState.
    if not _is_state(state):
        raise TypeError("agent state must be a dict of {state_key: dict blob}")

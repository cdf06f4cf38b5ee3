"""Checkpoints as one JSON file per conversation, for local work and single-node deployments."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.adapters.file._files import (
    locked_row,
    read_json,
    remove_file,
    run_in_thread,
    write_json,
)
from tether.adapters.file._paths import RowFiles, row_files, store_root
from tether.adapters.file.kept_numbers import KeptNumber, KeptNumbers
from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.domain.store_errors import StoreCorruptedError
from tether.domain.tombstones import TombstoneKey

_FENCE = "fence"
_STATE = "agent-state"
_FENCES = "agent-state-fence"


class LocalFileChatAgentStateStore(ChatAgentStateStore):
    """``ChatAgentStateStore`` on a directory, shared safely by any number of processes.

    The layout follows ``construct_agent_state_key`` with every id escaped:
    ``{base_path}/agent-state/{tenant}/{user_uuid}/{session_id}.json`` (a missing
    user is ``""``, as in the key) holds exactly the saved state. A save replaces
    the file atomically and is durable when it returns. Plain saves need no lock:
    each replaces the whole blob, so the last one wins, which is the contract.

    The conversation's fence is kept for ever, and so under its tombstone,
    not its ids: in ``{base_path}/agent-state-fence/{tombstone[:2]}/{tombstone}.json``
    as ``{"fence": n}`` (``tether.adapters.file.kept_numbers``: a keyed hash,
    ``TETHER_TOMBSTONE_KEY``), also while the state exists (a file of its own
    either way, so keeping it there costs nothing). ``save_fenced``, ``fence``
    and ``delete`` hold an exclusive ``flock`` on the state's sibling ``.lock``
    file across reading the fence and writing; ``delete`` removes the state
    and keeps the fence, and a step that leaves no state removes the lock
    file too, with the directories named after the ids it leaves empty
    (``_files.locked_row``). A fenced save raises the fence before it writes
    the state, so a crash between the two leaves a fence, never a state its
    fence does not guard. A fence an earlier release kept beside the state,
    in ``{session_id}.fence.json`` (escaped ids never hold a ".", so no
    session's state file can have that name), still counts, and moves under
    the tombstone at the conversation's next locked step.
    """

    def __init__(
        self, base_path: str | os.PathLike[str], *, tombstone_key: TombstoneKey | None = None
    ) -> None:
        """``tombstone_key`` names the files of the fences (default:
        ``TETHER_TOMBSTONE_KEY``; see ``domain.tombstones``)."""
        self._base = store_root(base_path)
        self._fences = KeptNumbers(
            self._base, _FENCES, _FENCE, tombstone_key or TombstoneKey.from_env()
        )

    async def open(self) -> None:
        """Record the tombstone key's check value, or refuse a store kept
        under another key (``StoreError``), before the first request."""
        await run_in_thread(self._fences.verify)

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

    def _files(self, tenant: str, user_uuid: str | None, session_id: str) -> _RowFiles:
        files = row_files(self._base, _STATE, tenant, user_uuid or "", session_id)
        kept = self._fences.of(tenant, user_uuid, session_id)
        return _RowFiles(files.data, files.lock, files.top, kept)

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


@dataclass(frozen=True)
class _RowFiles(RowFiles):
    """A state's files, and where the conversation's fence is kept."""

    kept: KeptNumber


def _named_fence_path(files: RowFiles) -> Path:
    # "<session>.json" -> "<session>.fence.json", in the same directory.
    return files.data.with_suffix(f".{_FENCE}.json")


def _read_fence(files: _RowFiles) -> int:
    """The conversation's fence. Call it under the row's lock."""
    _move_named_fence(files)
    return files.kept.read()


def _move_named_fence(files: _RowFiles) -> None:
    """Move a fence an earlier release kept beside the state, named after the
    ids, under the conversation's tombstone. Call it under the row's lock."""
    path = _named_fence_path(files)
    document = read_json(path)
    if document is None:
        return
    fence = document.get(_FENCE) if isinstance(document, dict) else None
    if not isinstance(fence, int) or isinstance(fence, bool):
        raise StoreCorruptedError(f'{path} does not hold {{"{_FENCE}": integer}}; left as is')
    files.kept.write(max(fence, files.kept.read()))
    remove_file(path, durable=True)


def _save_fenced(files: _RowFiles, state: DependencyState, epoch: int) -> bool:
    with locked_row(files):
        fence = _read_fence(files)
        if fence > epoch:
            return False
        if fence != epoch:
            # A state that is not JSON must fail before the fence moves.
            json.dumps(state)
            files.kept.write(epoch)
        write_json(files.data, state, durable=True)
        return True


def _delete(files: _RowFiles) -> None:
    # ``locked_row``: with the state gone, its lock file and directories go too.
    with locked_row(files):
        _move_named_fence(files)
        remove_file(files.data, durable=True)


def _fence(files: _RowFiles, epoch: int) -> None:
    with locked_row(files):
        if epoch > _read_fence(files):
            files.kept.write(epoch)


def _is_state(document: Any) -> bool:
    return isinstance(document, dict) and all(
        isinstance(key, str) and isinstance(blob, dict) for key, blob in document.items()
    )


def _check_shape(state: DependencyState) -> None:
    # Refuse up front what could never be loaded back as DependencyState.
    if not _is_state(state):
        raise TypeError("agent state must be a dict of {state_key: dict blob}")

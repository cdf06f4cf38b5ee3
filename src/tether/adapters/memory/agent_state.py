"""Checkpoints in a dict: for tests and single-process development."""

from __future__ import annotations

import asyncio
import json

from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.domain.tombstones import TombstoneKey

_Key = tuple[str, str, str]


class InMemoryChatAgentStateStore(ChatAgentStateStore):
    """``ChatAgentStateStore`` held in this process's memory; lost when it exits.

    Blobs are kept as JSON text, so ``load`` always returns a fresh copy, and a
    state the file store could not persist fails here too, at ``save``. The
    fence of each conversation is kept apart from its blob, so ``delete``
    leaves it in place, under the conversation's tombstone
    (``domain.tombstones``), not its ids.
    """

    def __init__(self, tombstone_key: TombstoneKey | None = None) -> None:
        self._lock = asyncio.Lock()
        self._states: dict[_Key, str] = {}
        self._tombstones = tombstone_key or TombstoneKey.from_env()
        self._fences: dict[str, int] = {}

    async def load(self, tenant: str, user_uuid: str | None, session_id: str) -> DependencyState:
        """The saved state (a copy), or ``{}`` when nothing is saved."""
        async with self._lock:
            text = self._states.get(_key(tenant, user_uuid, session_id))
        if text is None:
            return {}
        state: DependencyState = json.loads(text)
        return state

    async def save(
        self, tenant: str, user_uuid: str | None, session_id: str, state: DependencyState
    ) -> None:
        """Replace the saved state with a copy of ``state``."""
        text = _dumps(state)
        async with self._lock:
            self._states[_key(tenant, user_uuid, session_id)] = text

    async def save_fenced(
        self,
        tenant: str,
        user_uuid: str | None,
        session_id: str,
        state: DependencyState,
        epoch: int,
    ) -> bool:
        """Replace the state unless the fence is above ``epoch``, under the lock."""
        text = _dumps(state)
        key = _key(tenant, user_uuid, session_id)
        tombstone = self._tombstones.of(tenant, user_uuid, session_id)
        async with self._lock:
            if self._fences.get(tombstone, 0) > epoch:
                return False
            self._fences[tombstone] = epoch
            self._states[key] = text
            return True

    async def fence(self, tenant: str, user_uuid: str | None, session_id: str, epoch: int) -> None:
        """Refuse later fenced saves below ``epoch``."""
        tombstone = self._tombstones.of(tenant, user_uuid, session_id)
        async with self._lock:
            self._fences[tombstone] = max(self._fences.get(tombstone, 0), epoch)

    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        """Remove the saved state; a no-op when nothing exists."""
        async with self._lock:
            self._states.pop(_key(tenant, user_uuid, session_id), None)


def _dumps(state: DependencyState) -> str:
    if not isinstance(state, dict) or not all(
        isinstance(key, str) and isinstance(blob, dict) for key, blob in state.items()
    ):
        raise TypeError("agent state must be a dict of {state_key: dict blob}")
    return json.dumps(state)


def _key(tenant: str, user_uuid: str | None, session_id: str) -> _Key:
    # A missing user is "", exactly as construct_agent_state_key spells it.
    return (tenant, user_uuid or "", session_id)

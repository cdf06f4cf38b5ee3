"""Checkpoints in PostgreSQL: one jsonb row per conversation, replaced whole."""

from __future__ import annotations

import json
from typing import Any

from tether.adapters.postgres import queries
from tether.adapters.postgres._keys import session_key
from tether.adapters.postgres._store import PostgresStore
from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.domain.store_errors import StoreCorruptedError


class PostgresChatAgentStateStore(PostgresStore, ChatAgentStateStore):
    """``ChatAgentStateStore`` on PostgreSQL, for any number of replicas.

    Table ``tether_agent_state``, one row per ``(tenant, user_uuid, session_id)``
    (a missing user is ``""``, as in ``construct_agent_state_key``). A save is one
    upsert, atomic and durable (a normal commit) when it returns; the last save
    wins, which is the contract. State must be JSON without NaN or infinities,
    and strings without NUL characters (jsonb cannot hold ``\\u0000``).

    Fencing: ``tether_agent_state_fence`` keeps each conversation's fence apart
    from its checkpoint, so ``delete`` leaves it. ``save_fenced`` is one
    statement that raises the fence (an upsert, which locks the fence row and
    re-checks its newest value) and writes the state only if that succeeded.
    """

    async def load(self, tenant: str, user_uuid: str | None, session_id: str) -> DependencyState:
        """The saved state, or ``{}``; a row of the wrong shape raises ``StoreCorruptedError``."""
        key = session_key(tenant, user_uuid, session_id)
        row = await self._database.fetch_one(queries.LOAD_STATE, {"key": key})
        if row is None:
            return {}
        state = row["state"]
        if not _is_state(state):
            raise StoreCorruptedError(
                f"tether_agent_state row for {(tenant, user_uuid, session_id)!r} does not "
                "hold {state_key: object} checkpoint state; left as is"
            )
        return state

    async def save(
        self, tenant: str, user_uuid: str | None, session_id: str, state: DependencyState
    ) -> None:
        """Atomically and durably replace the saved state with ``state``."""
        document = _document(state)
        await self._database.execute(
            queries.SAVE_STATE, {**_row_params(tenant, user_uuid, session_id), "state": document}
        )

    async def save_fenced(
        self,
        tenant: str,
        user_uuid: str | None,
        session_id: str,
        state: DependencyState,
        epoch: int,
    ) -> bool:
        """Replace the saved state with ``state`` and raise the fence to ``epoch``,
        unless the fence is above ``epoch``; atomic (one statement) and durable.
        Returns whether it saved; a refused save changes nothing."""
        document = _document(state)
        row = await self._database.fetch_one(
            queries.SAVE_STATE_FENCED,
            {**_row_params(tenant, user_uuid, session_id), "state": document, "epoch": epoch},
        )
        return row is not None and row["saved"] == 1

    async def fence(self, tenant: str, user_uuid: str | None, session_id: str, epoch: int) -> None:
        """Refuse every later ``save_fenced`` below ``epoch``, durably; the saved
        state is unchanged, and a lower fence never lowers it."""
        await self._database.execute(
            queries.FENCE_STATE, {**_row_params(tenant, user_uuid, session_id), "epoch": epoch}
        )

    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        """Remove the saved state; a no-op when nothing exists. The fence stays."""
        key = session_key(tenant, user_uuid, session_id)
        await self._database.execute(queries.DELETE_STATE, {"key": key})


def _document(state: DependencyState) -> str:
    # Refuse up front what could never be loaded back as DependencyState.
    if not _is_state(state):
        raise TypeError("agent state must be a dict of {state_key: dict blob}")
    return json.dumps(state, allow_nan=False, separators=(",", ":"))


def _row_params(tenant: str, user_uuid: str | None, session_id: str) -> dict[str, Any]:
    return {
        "key": session_key(tenant, user_uuid, session_id),
        "tenant": tenant,
        "user_uuid": user_uuid or "",
        "session_id": session_id,
    }


def _is_state(document: Any) -> bool:
    return isinstance(document, dict) and all(
        isinstance(key, str) and isinstance(blob, dict) for key, blob in document.items()
    )

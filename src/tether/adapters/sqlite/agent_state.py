"""Checkpoints as one row per conversation, written durably."""

from __future__ import annotations

import sqlite3
from typing import Any

from tether.adapters.sqlite import _codec, queries
from tether.adapters.sqlite._codec import RowKey
from tether.adapters.sqlite._store import SQLiteStore
from tether.adapters.sqlite.database import Lane
from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.domain.store_errors import StoreCorruptedError


class SQLiteChatAgentStateStore(SQLiteStore, ChatAgentStateStore):
    """``ChatAgentStateStore`` in the ``agent_state`` table, keyed by
    ``(tenant, user_uuid, session_id)`` (a missing user is ``""``, as in
    ``construct_agent_state_key``).

    A save is one upsert of the whole blob as JSON: atomic (a reader sees the
    old blob or the new one) and, on the durable lane, fsynced before it
    returns. A row that does not hold ``{state_key: object}`` JSON raises
    ``StoreCorruptedError`` and is left as is.

    The fence of a conversation (the highest epoch of any accepted
    ``save_fenced`` or ``fence``) is a row of the ``agent_state_fence`` table,
    apart from the blob, so ``delete`` leaves it and a fence holds on a
    conversation with nothing saved. The plain ``save`` neither checks nor
    moves it.
    """

    async def load(self, tenant: str, user_uuid: str | None, session_id: str) -> DependencyState:
        """The saved state, or ``{}`` when nothing is saved."""
        row = RowKey(tenant, user_uuid, session_id)
        return await self._database.read(Lane.DURABLE, lambda c: _load(c, row))

    async def save(
        self, tenant: str, user_uuid: str | None, session_id: str, state: DependencyState
    ) -> None:
        """Atomically and durably replace the saved state with ``state``."""
        if not _is_state(state):
            # Refuse up front what could never be loaded back as DependencyState.
            raise TypeError("agent state must be a dict of {state_key: dict blob}")
        values = {**RowKey(tenant, user_uuid, session_id).params(), "state": _codec.dump(state)}
        await self._database.write(Lane.DURABLE, lambda c: c.execute(queries.STATE_SAVE, values))

    async def save_fenced(
        self,
        tenant: str,
        user_uuid: str | None,
        session_id: str,
        state: DependencyState,
        epoch: int,
    ) -> bool:
        """Atomically and durably replace the saved state with ``state`` and raise
        the fence to ``epoch``, unless the fence is above ``epoch``: then change
        nothing and return False. The check and the write are one transaction."""
        if not _is_state(state):
            raise TypeError("agent state must be a dict of {state_key: dict blob}")
        values = {
            **RowKey(tenant, user_uuid, session_id).params(),
            "state": _codec.dump(state),
            "epoch": epoch,
        }

        def save(connection: sqlite3.Connection) -> bool:
            # The fence statement is the check: it writes only where the fence
            # is not above ``epoch``, and a refused save writes nothing else.
            if connection.execute(queries.STATE_ADVANCE_FENCE, values).rowcount != 1:
                return False
            connection.execute(queries.STATE_SAVE, values)
            return True

        return await self._database.write(Lane.DURABLE, save)

    async def fence(self, tenant: str, user_uuid: str | None, session_id: str, epoch: int) -> None:
        """Refuse every later ``save_fenced`` below ``epoch`` (the fence never
        falls); the saved state is unchanged. Durable when it returns."""
        values = {**RowKey(tenant, user_uuid, session_id).params(), "epoch": epoch}
        await self._database.write(
            Lane.DURABLE, lambda c: c.execute(queries.STATE_RAISE_FENCE, values)
        )

    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        """Remove the saved state; a no-op when nothing exists. The fence stays."""
        where = RowKey(tenant, user_uuid, session_id).params()
        await self._database.write(Lane.DURABLE, lambda c: c.execute(queries.STATE_DELETE, where))


def _load(connection: sqlite3.Connection, row: RowKey) -> DependencyState:
    found = connection.execute(queries.STATE_LOAD, row.params()).fetchone()
    if found is None:
        return {}
    what = row.describe("agent_state")
    document = _codec.load(found[0], what)
    if not _is_state(document):
        raise StoreCorruptedError(
            f"{what} does not hold {{state_key: object}} checkpoint state; left as is"
        )
    state: DependencyState = document
    return state


def _is_state(document: Any) -> bool:
    return isinstance(document, dict) and all(
        isinstance(key, str) and isinstance(blob, dict) for key, blob in document.items()
    )

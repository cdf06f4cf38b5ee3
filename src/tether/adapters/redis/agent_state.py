"""Agent state checkpoints on Redis: one JSON string per conversation."""

from __future__ import annotations

import json
from typing import Any

from tether.adapters.redis._store import RedisStore, corrupt
from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState


class RedisChatAgentStateStore(RedisStore, ChatAgentStateStore):
    """``ChatAgentStateStore`` on Redis: ``{prefix}agent-state:{conversation}``.

    ``save`` is one ``SET`` (atomic: a reader gets the old blob or the new one),
    ``delete`` one ``DEL``; the last save wins, which is the contract. No TTL by
    default: a checkpoint also serves stateful follow-ups long after its turn,
    and the runtime deletes what it no longer needs. With ``state_ttl`` set on
    the connection, every save (re)sets that expiry instead.

    Durability is the server's: ``save`` returns once Redis has the blob in
    memory. It survives a Redis restart only as far as the server's persistence
    is configured (``appendonly yes`` with ``appendfsync everysec`` loses at most
    about a second; RDB snapshots alone lose everything since the last one; no
    persistence loses all), and a failover to a replica can lose the writes not
    yet replicated. Choose the server configuration for the loss you can accept.

    Fencing: ``{prefix}agent-state-fence:{conversation}`` holds the epoch of the
    last accepted ``save_fenced`` (or a higher ``fence``). ``save_fenced`` checks
    and writes both in one Lua script; the fence has no TTL, so ``delete`` and
    ``state_ttl`` never lower it. One fence key stays per conversation fenced.
    """

    async def load(self, tenant: str, user_uuid: str | None, session_id: str) -> DependencyState:
        """The saved state, or ``{}``; a damaged value raises ``StoreCorruptedError``."""
        key = self._key(tenant, user_uuid, session_id)
        client = self._connection.client
        raw = await self._connection.call("load agent state", lambda: client.get(key))
        if raw is None:
            return {}
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise corrupt(key, f"is not valid JSON ({error})") from error
        if not _is_state(document):
            raise corrupt(key, "does not hold {state_key: object} checkpoint state")
        return document

    async def save(
        self, tenant: str, user_uuid: str | None, session_id: str, state: DependencyState
    ) -> None:
        """Replace the saved state with ``state`` (``TypeError`` if it is not JSON
        of the shape ``{state_key: dict}``)."""
        document = _dumps(state)
        key = self._key(tenant, user_uuid, session_id)
        client, ttl = self._connection.client, self._connection.state_ttl
        # A plain SET also clears an expiry left by an earlier state_ttl.
        await self._connection.call("save agent state", lambda: client.set(key, document, ex=ttl))

    async def save_fenced(
        self,
        tenant: str,
        user_uuid: str | None,
        session_id: str,
        state: DependencyState,
        epoch: int,
    ) -> bool:
        """Replace the saved state with ``state`` and set the fence to ``epoch``,
        unless the fence is above ``epoch``: then change nothing and return
        False. One script, so the check and the write are one atomic step."""
        document = _dumps(state)
        layout = self._connection.keys
        conversation = layout.conversation(tenant, user_uuid, session_id)
        keys = [layout.agent_state(conversation), layout.agent_state_fence(conversation)]
        ttl = self._connection.state_ttl
        args: list[str | int] = [str(int(epoch)), document, "" if ttl is None else ttl]
        scripts = self._connection.scripts
        saved = await self._connection.call(
            "save agent state", lambda: scripts.agent_state_save(keys, args)
        )
        return int(saved) == 1

    async def fence(self, tenant: str, user_uuid: str | None, session_id: str, epoch: int) -> None:
        """Refuse every later ``save_fenced`` below ``epoch``; the saved state is
        unchanged. The fence never goes down, and holds with nothing saved too."""
        layout = self._connection.keys
        key = layout.agent_state_fence(layout.conversation(tenant, user_uuid, session_id))
        scripts = self._connection.scripts
        await self._connection.call(
            "fence agent state", lambda: scripts.agent_state_fence([key], [str(int(epoch))])
        )

    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        """Remove the saved state (its fence stays); a no-op when nothing exists."""
        key = self._key(tenant, user_uuid, session_id)
        client = self._connection.client
        await self._connection.call("delete agent state", lambda: client.delete(key))

    def _key(self, tenant: str, user_uuid: str | None, session_id: str) -> str:
        layout = self._connection.keys
        return layout.agent_state(layout.conversation(tenant, user_uuid, session_id))


def _dumps(state: DependencyState) -> str:
    """``state`` as compact JSON (``TypeError`` unless ``{state_key: dict}``)."""
    if not _is_state(state):
        raise TypeError("agent state must be a dict of {state_key: dict blob}")
    return json.dumps(state, separators=(",", ":"))


def _is_state(document: Any) -> bool:
    return isinstance(document, dict) and all(
        isinstance(key, str) and isinstance(blob, dict) for key, blob in document.items()
    )

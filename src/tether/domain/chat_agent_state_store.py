"""Where a dead producer's work survives: the checkpoint a resumed turn is revived from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

DependencyState = dict[str, dict[str, Any]]
"""``{state_key: blob}``: one JSON object per resumable dependency."""

TURN_STATE_KEY = "__turn__"
"""Reserved key the runtime adds to every checkpoint: which turn (message_id,
epoch) wrote it, so a resume can tell its own checkpoint from an earlier turn's."""


def construct_agent_state_key(tenant: str, user_uuid: str | None, session_id: str) -> str:
    """The canonical relative key ``agent-state/{tenant}/{user_uuid}/{session_id}``.

    The parts are used as given; a backend that turns the key into a path must
    escape them (the file store does).
    """
    return f"agent-state/{tenant}/{user_uuid or ''}/{session_id}"


class ChatAgentStateStore(ABC):
    """Checkpoint blobs of a conversation's resumable dependencies.

    ``save`` is called every 5 seconds during a stateful turn, after every
    completed tool call, and once when the turn finishes. Each call replaces
    the whole blob, so a plain overwrite is correct; it must be atomic (a
    reader sees the old blob or the new one, never a mix) and durable once it
    returns.

    Fencing: the runtime saves with ``save_fenced``, which names the turn's
    lease epoch; the store refuses it, in the same atomic step as the write,
    when a save or ``fence`` at a higher epoch was accepted for the
    conversation. The shipped backends keep that epoch when ``delete`` removes
    the blob. A seed-only adapter (``load``, ``save``, ``delete``) still works:
    ``save_fenced`` then reads the epoch the runtime stored inside the blob and
    saves if it is not higher, a check made before the write, so a producer
    paused between the two can still overwrite its successor's checkpoint.
    """

    @abstractmethod
    async def load(self, tenant: str, user_uuid: str | None, session_id: str) -> DependencyState:
        """The saved state, or ``{}`` when nothing is saved."""

    @abstractmethod
    async def save(
        self, tenant: str, user_uuid: str | None, session_id: str, state: DependencyState
    ) -> None:
        """Replace the saved state with ``state``."""

    @abstractmethod
    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        """Remove the saved state; a no-op when nothing exists."""

    async def save_fenced(
        self,
        tenant: str,
        user_uuid: str | None,
        session_id: str,
        state: DependencyState,
        epoch: int,
    ) -> bool:
        """Replace the saved state with ``state`` unless the conversation's fence
        is above ``epoch``, atomically with that check; return whether it saved.
        An accepted save raises the fence to ``epoch``.

        Optional: the default checks the epoch in the stored blob's
        ``TURN_STATE_KEY`` and then calls ``save`` (not atomic).
        """
        stored = await self.load(tenant, user_uuid, session_id)
        if int(stored.get(TURN_STATE_KEY, {}).get("epoch", 0)) > epoch:
            return False
        await self.save(tenant, user_uuid, session_id, state)
        return True

    async def fence(self, tenant: str, user_uuid: str | None, session_id: str, epoch: int) -> None:
        """Refuse every later ``save_fenced`` below ``epoch`` for the
        conversation; the saved state itself is unchanged. Optional: the
        default does nothing."""
        return None  # a seed-only adapter has nothing to fence with

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
    returns. Guarding against a fenced producer is the runtime's job: it
    re-checks its lease before every save.
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

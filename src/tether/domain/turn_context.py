"""What an agent or dependency may know about the turn it runs in (injectable by type)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TurnContext:
    tenant: str
    requester_uuid: str
    session_id: str | None
    message_id: str
    agent_identifier: str
    stateful: bool = False
    resuming: bool = False

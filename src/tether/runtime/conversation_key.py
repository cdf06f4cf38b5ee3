"""Which conversation a row, a recording or a checkpoint belongs to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConversationKey:
    tenant: str
    requester_uuid: str
    session_id: str

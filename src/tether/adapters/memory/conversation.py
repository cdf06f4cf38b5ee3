"""Conversations in a dict: for tests and single-process development."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tether.adapters.conversation_record import (
    Append,
    Clock,
    ConversationRecord,
    Removal,
    page,
    stale_page,
    stamp,
    utc_now,
)
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationPage,
    ConversationSummary,
    LastTurnStatus,
    normalize_owner,
)
from tether.domain.chat_message import ChatMessage, ConversationContext

_Key = tuple[str, str]


class InMemoryChatConversationStore(ChatConversationStore):
    """``ChatConversationStore`` in this process's memory, lost when it exits.

    Same rules as the file store (they share them): keyed by ``(tenant,
    session_id)``, owner-only writes, owner-or-shared reads, copies in and out.
    ``clock`` stamps ``created_at``/``updated_at`` and must return an aware
    datetime.
    """

    def __init__(self, clock: Clock = utc_now) -> None:
        self._clock = clock
        self._lock = asyncio.Lock()
        self._records: dict[_Key, ConversationRecord] = {}

    async def append_messages(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        agent_identifier: str,
        messages: list[ChatMessage],
        user_roles: list[str] | None = None,
        user_tenants: list[str] | None = None,
        user_agent_id: str | None = None,
        bot_params: dict[str, Any] | None = None,
        last_turn_status: LastTurnStatus | None = None,
        create_if_absent: bool = True,
        conversation_context: ConversationContext | None = None,
    ) -> None:
        """Append ``messages``, creating the conversation unless ``create_if_absent`` is False."""
        change = Append(
            tenant=tenant,
            requester_uuid=requester_uuid,
            session_id=session_id,
            agent_identifier=agent_identifier,
            messages=messages,
            user_roles=user_roles,
            user_tenants=user_tenants,
            user_agent_id=user_agent_id,
            bot_params=bot_params,
            last_turn_status=last_turn_status,
            create_if_absent=create_if_absent,
            conversation_context=conversation_context,
        )
        async with self._lock:
            updated = change.apply(self._records.get((tenant, session_id)), stamp(self._clock))
            if updated is not None:
                self._records[(tenant, session_id)] = updated

    async def append_fenced(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        agent_identifier: str,
        messages: list[ChatMessage],
        *,
        epoch: int,
        user_roles: list[str] | None = None,
        user_tenants: list[str] | None = None,
        bot_params: dict[str, Any] | None = None,
        last_turn_status: LastTurnStatus | None = None,
        create_if_absent: bool = True,
        conversation_context: ConversationContext | None = None,
    ) -> bool:
        """``append_messages`` fenced by ``epoch``, idempotent by ``message_id``,
        under the store's lock."""
        change = Append(
            tenant=tenant,
            requester_uuid=requester_uuid,
            session_id=session_id,
            agent_identifier=agent_identifier,
            messages=messages,
            user_roles=user_roles,
            user_tenants=user_tenants,
            user_agent_id=None,
            bot_params=bot_params,
            last_turn_status=last_turn_status,
            create_if_absent=create_if_absent,
            conversation_context=conversation_context,
        )
        async with self._lock:
            current = self._records.get((tenant, session_id))
            updated, accepted = change.apply_fenced(current, stamp(self._clock), epoch)
            if updated is not None:
                self._records[(tenant, session_id)] = updated
            return accepted

    async def remove_fenced(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        message_ids: Sequence[str],
        *,
        epoch: int,
        last_turn_status: LastTurnStatus | None = None,
    ) -> bool:
        """Remove the messages with those ids, fenced by ``epoch`` (a rollback),
        under the store's lock, as ``append_fenced`` is."""
        removal = Removal.of(requester_uuid, message_ids, last_turn_status)
        async with self._lock:
            current = self._records.get((tenant, session_id))
            updated, accepted = removal.apply_fenced(current, stamp(self._clock), epoch)
            if updated is not None:
                self._records[(tenant, session_id)] = updated
            return accepted

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Raise the conversation's fence to ``epoch``; a no-op when it is missing."""
        async with self._lock:
            record = self._records.get((tenant, session_id))
            if record is not None:
                record.fence_epoch = max(record.fence_epoch, epoch)

    async def set_last_turn_status(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        last_turn_status: LastTurnStatus,
    ) -> None:
        """Set the last turn's status (owner only); a no-op when no conversation exists."""
        async with self._lock:
            record = self._records.get((tenant, session_id))
            if record is None:
                return
            record.require_owner(requester_uuid)
            record.last_turn_status = last_turn_status
            record.updated_at = stamp(self._clock)

    async def get_transcript(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> list[ChatMessage]:
        """Copies of the messages (owner, or anyone when shared); ``[]`` when missing."""
        async with self._lock:
            record = self._records.get((tenant, session_id))
            if record is None:
                return []
            record.require_readable(requester_uuid)
            return record.transcript()

    async def get_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ConversationSummary | None:
        """The summary (owner, or anyone when shared); None when missing."""
        async with self._lock:
            record = self._records.get((tenant, session_id))
            if record is None:
                return None
            record.require_readable(requester_uuid)
            return record.summary()

    async def list_conversations(
        self,
        tenant: str,
        requester_uuid: str | None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """The requester's own conversations in ``tenant``, most recently updated first."""
        owner = normalize_owner(requester_uuid)
        async with self._lock:
            own = [
                record
                for (record_tenant, _), record in self._records.items()
                if record_tenant == tenant and record.owner_uuid == owner
            ]
            return page(own, limit, cursor)

    async def list_stale_conversations(
        self, updated_before: datetime, limit: int = 100, cursor: str | None = None
    ) -> ConversationPage:
        """Every owner's conversations last updated before ``updated_before``, oldest first."""
        async with self._lock:
            return stale_page(list(self._records.values()), updated_before, limit, cursor)

    async def set_shared(
        self, tenant: str, requester_uuid: str | None, session_id: str, shared: bool
    ) -> None:
        """Share or unshare (owner only); a no-op when no conversation exists."""
        async with self._lock:
            record = self._records.get((tenant, session_id))
            if record is None:
                return
            record.require_owner(requester_uuid)
            record.shared = shared

    async def delete_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> bool:
        """Remove the conversation (owner only); returns whether one existed."""
        async with self._lock:
            record = self._records.get((tenant, session_id))
            if record is None:
                return False
            record.require_owner(requester_uuid)
            del self._records[(tenant, session_id)]
            return True

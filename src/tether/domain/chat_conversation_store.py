"""The durable transcript: conversations users list and reopen later."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, field_validator

from tether.domain.chat_message import ChatMessage, ConversationContext
from tether.domain.safe_text import repair_surrogates

logger = logging.getLogger(__name__)

LastTurnStatus = Literal["running", "complete", "errored", "cancelled"]


class ConversationNotOwnedError(Exception):
    """A write (or a private read) by someone other than the conversation's owner.

    The server maps it to 403 ``CONVERSATION_NOT_OWNED``.
    """


class ConversationSummary(BaseModel):
    """A conversation as listed: ids, owner, sharing and last-turn status, no messages."""

    tenant: str
    session_id: str
    owner_uuid: str
    agent_identifier: str
    shared: bool = False
    last_turn_status: LastTurnStatus | None = None
    created_at: datetime
    updated_at: datetime
    message_count: int = 0
    title: str = ""

    @field_validator("title")
    @classmethod
    def _repair_title(cls, title: str) -> str:
        # The first user message's text: see ChatMessage's repair. Ids are
        # left exactly as stored; the API never lets a lone surrogate into one.
        repaired, count = repair_surrogates(title)
        if count:
            logger.warning("a conversation title held a lone UTF-16 surrogate; replaced by U+FFFD")
        return str(repaired)


class ConversationPage(BaseModel):
    items: list[ConversationSummary]
    next_cursor: str | None = None


def normalize_owner(requester_uuid: str | None) -> str:
    """A missing requester is the owner ``""`` (the seed's rule), never None."""
    return requester_uuid or ""


class ChatConversationStore(ABC):
    """Conversations keyed by ``(tenant, session_id)``, owned by ``requester_uuid``.

    Writes are owner-only: any other requester gets ``ConversationNotOwnedError``.
    Reads are allowed to the owner and, for a shared conversation, to anyone in
    the tenant. ``append_messages`` and ``set_last_turn_status`` must be durable
    when they return.

    The first three methods are the seed's contract. ``get_conversation``,
    ``list_conversations``, ``set_shared`` and ``delete_conversation`` are
    optional: an adapter that leaves them out still serves chat turns, and the
    routes that need them answer 501.

    Fencing: the runtime writes a turn's messages with ``append_fenced``, which
    names the turn's lease epoch and is idempotent by ``message_id``; the store
    refuses it, in the same atomic step as the write, when the conversation's
    fence is above that epoch. So a producer fenced by a cancel or a takeover
    cannot add its answer after the fact, and a resumed turn or a cancel racing
    the producer's own seal leaves exactly one bot message. A seed-only adapter
    still works: the default ``append_fenced`` reads the transcript and appends
    what is missing (not atomic), and the runtime renews its lease just before
    (a check made before the write, so a producer paused between the two can
    still append).
    """

    @abstractmethod
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
        """Append ``messages`` (and set ``last_turn_status`` when given).

        With ``create_if_absent=False`` a missing conversation stays missing: the
        handler appends the bot turn that way, so a conversation deleted
        mid-stream is not resurrected as a ghost row.
        """

    @abstractmethod
    async def set_last_turn_status(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        last_turn_status: LastTurnStatus,
    ) -> None:
        """Set the status of the last turn; a no-op when no conversation exists."""

    @abstractmethod
    async def get_transcript(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> list[ChatMessage]:
        """The messages in order; ``[]`` when no conversation exists."""

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
        """``append_messages``, fenced by ``epoch`` and idempotent by ``message_id``.

        Atomically: when the conversation's fence is above ``epoch``, change
        nothing and return False. Otherwise raise the fence to ``epoch``, append
        the messages whose ``message_id`` is not in the transcript yet (a
        message without one is always appended), set ``last_turn_status`` when
        given (also when every message was there already), and return True.
        Ownership and ``create_if_absent`` work as in ``append_messages``; a
        missing conversation that is not created returns True.

        Optional: the default reads the transcript and appends what is missing
        (not atomic, and without the epoch fence).
        """
        transcript = await self.get_transcript(tenant, requester_uuid, session_id)
        present = {m.message_id for m in transcript if m.message_id}
        missing = [m for m in messages if not m.message_id or m.message_id not in present]
        if missing:
            await self.append_messages(
                tenant,
                requester_uuid,
                session_id,
                agent_identifier,
                missing,
                user_roles=user_roles,
                user_tenants=user_tenants,
                bot_params=bot_params,
                last_turn_status=last_turn_status,
                create_if_absent=create_if_absent,
                conversation_context=conversation_context,
            )
        elif last_turn_status is not None:
            await self.set_last_turn_status(tenant, requester_uuid, session_id, last_turn_status)
        return True

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
        """Remove the messages whose ``message_id`` is in ``message_ids``, fenced
        by ``epoch`` (a rollback: the interrupted turn's user message and partial
        answer leave the transcript).

        Atomically: when the conversation's fence is above ``epoch``, change
        nothing and return False. Otherwise raise the fence to ``epoch``, remove
        those messages (ids not in the transcript are ignored), keep the order
        of the rest, set ``last_turn_status`` when given, and return True. A
        missing conversation returns True. Owner-only, as every write.

        Optional: the default raises ``NotImplementedError`` (the
        ``rollback`` strategy is then refused with a 501).
        """
        raise NotImplementedError

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse every later ``append_fenced`` below ``epoch`` for the
        conversation; a no-op when no conversation exists. Optional: the
        default does nothing."""
        return None  # a seed-only adapter has nothing to fence with

    async def get_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ConversationSummary | None:
        """The conversation's summary if the requester may read it, else None/raise."""
        raise NotImplementedError

    async def list_conversations(
        self,
        tenant: str,
        requester_uuid: str | None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """The requester's own conversations, most recently updated first."""
        raise NotImplementedError

    async def set_shared(
        self, tenant: str, requester_uuid: str | None, session_id: str, shared: bool
    ) -> None:
        """Share the conversation with the tenant, or make it private again."""
        raise NotImplementedError

    async def delete_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> bool:
        """Remove the conversation; returns whether one existed."""
        raise NotImplementedError

    async def list_stale_conversations(
        self, updated_before: datetime, limit: int = 100, cursor: str | None = None
    ) -> ConversationPage:
        """Conversations of every tenant and owner last updated before
        ``updated_before``, oldest first; ``cursor`` (opaque, from
        ``next_cursor``) continues after the page that gave it.

        For retention (``tether db prune``), which then erases each as its
        owner. No requester is checked, so no route may serve it. A malformed
        cursor or a limit below 1 raises ``ValueError``. Optional: the default
        raises ``NotImplementedError`` and prune says the store cannot do it.
        """
        raise NotImplementedError

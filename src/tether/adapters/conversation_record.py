"""The conversation rules every conversation store shares: one record, pure functions.

Keeping ownership, append, title and pagination rules here means the stores of
the backends (``memory``, ``file``, ``sqlite``, ``postgres``) cannot drift apart;
each store only adds how it keeps records (a dict under an asyncio lock, files
under flock, rows in a database).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from tether.domain.chat_conversation_store import (
    ConversationNotOwnedError,
    ConversationPage,
    ConversationSummary,
    LastTurnStatus,
    normalize_owner,
)
from tether.domain.chat_message import ChatMessage, ChatMessageSender, ConversationContext

Clock = Callable[[], datetime]

TITLE_LENGTH = 80


def utc_now() -> datetime:
    """The default clock."""
    return datetime.now(UTC)


def stamp(clock: Clock) -> datetime:
    """The clock's current time in UTC; a naive datetime is refused."""
    now = clock()
    if now.tzinfo is None:
        raise ValueError("a store clock must return an aware datetime")
    return now.astimezone(UTC)


class ConversationRecord(BaseModel):
    """Everything stored about one conversation; the file store's JSON document."""

    tenant: str
    session_id: str
    owner_uuid: str
    agent_identifier: str
    shared: bool = False
    last_turn_status: LastTurnStatus | None = None
    created_at: datetime
    updated_at: datetime
    title: str = ""
    messages: list[ChatMessage] = Field(default_factory=list)
    user_roles: list[str] | None = None
    user_tenants: list[str] | None = None
    user_agent_id: str | None = None
    bot_params: dict[str, Any] | None = None
    conversation_context: ConversationContext | None = None
    fence_epoch: int = 0
    """The highest turn epoch that wrote here or fenced it (``append_fenced``)."""

    def require_owner(self, requester_uuid: str | None) -> None:
        """Refuse a write by anyone but the owner."""
        if normalize_owner(requester_uuid) != self.owner_uuid:
            raise ConversationNotOwnedError(
                f"conversation {self.session_id!r} in tenant {self.tenant!r} "
                "belongs to another user"
            )

    def require_readable(self, requester_uuid: str | None) -> None:
        """Refuse a read by anyone but the owner, unless the conversation is shared."""
        if not self.shared:
            self.require_owner(requester_uuid)

    def summary(self) -> ConversationSummary:
        """The listing view: everything but the messages."""
        return ConversationSummary(
            tenant=self.tenant,
            session_id=self.session_id,
            owner_uuid=self.owner_uuid,
            agent_identifier=self.agent_identifier,
            shared=self.shared,
            last_turn_status=self.last_turn_status,
            created_at=self.created_at,
            updated_at=self.updated_at,
            message_count=len(self.messages),
            title=self.title,
        )

    def transcript(self) -> list[ChatMessage]:
        """Copies of the messages, in order."""
        return [message.model_copy(deep=True) for message in self.messages]


@dataclass(frozen=True)
class Append:
    """One ``append_messages`` call, applied to whatever record is stored."""

    tenant: str
    requester_uuid: str | None
    session_id: str
    agent_identifier: str
    messages: list[ChatMessage]
    user_roles: list[str] | None
    user_tenants: list[str] | None
    user_agent_id: str | None
    bot_params: dict[str, Any] | None
    last_turn_status: LastTurnStatus | None
    create_if_absent: bool
    conversation_context: ConversationContext | None

    def apply(self, current: ConversationRecord | None, now: datetime) -> ConversationRecord | None:
        """The record to store, or None when nothing changes (missing, not created).

        Raises ``ConversationNotOwnedError`` for an existing conversation owned by
        someone else. ``current`` is never modified.
        """
        if current is None:
            if not self.create_if_absent:
                return None
            record = ConversationRecord(
                tenant=self.tenant,
                session_id=self.session_id,
                owner_uuid=normalize_owner(self.requester_uuid),
                agent_identifier=self.agent_identifier,
                created_at=now,
                updated_at=now,
            )
        else:
            current.require_owner(self.requester_uuid)
            record = current.model_copy(deep=True)
            record.agent_identifier = self.agent_identifier
            record.updated_at = now
        # Copies: a caller mutating its messages later must not reach the store.
        record.messages.extend(message.model_copy(deep=True) for message in self.messages)
        if not record.title:
            record.title = title_of(record.messages)
        if self.last_turn_status is not None:
            record.last_turn_status = self.last_turn_status
        self._merge_metadata(record)
        return record

    def apply_fenced(
        self, current: ConversationRecord | None, now: datetime, epoch: int
    ) -> tuple[ConversationRecord | None, bool]:
        """``append_fenced``: the record to store (None: nothing changes) and
        whether the write was accepted. Refused when the record's fence is
        above ``epoch``; messages whose ``message_id`` is there already are
        not appended again."""
        if current is not None and current.fence_epoch > epoch:
            return None, False
        present = {m.message_id for m in current.messages if m.message_id} if current else set()
        missing = [m for m in self.messages if not m.message_id or m.message_id not in present]
        updated = replace(self, messages=missing).apply(current, now)
        if updated is not None:
            updated.fence_epoch = max(updated.fence_epoch, epoch)
        return updated, True

    def _merge_metadata(self, record: ConversationRecord) -> None:
        # Request metadata is kept as of the latest turn that carried it.
        if self.user_roles is not None:
            record.user_roles = list(self.user_roles)
        if self.user_tenants is not None:
            record.user_tenants = list(self.user_tenants)
        if self.user_agent_id is not None:
            record.user_agent_id = self.user_agent_id
        if self.bot_params is not None:
            record.bot_params = json.loads(json.dumps(self.bot_params))
        if self.conversation_context is not None:
            record.conversation_context = self.conversation_context.model_copy(deep=True)


@dataclass(frozen=True)
class Removal:
    """One ``remove_fenced`` call (a rollback), applied to whatever record is stored."""

    requester_uuid: str | None
    message_ids: frozenset[str]
    """Only ids that name something: a message without an id is never removed."""
    last_turn_status: LastTurnStatus | None

    @classmethod
    def of(
        cls,
        requester_uuid: str | None,
        message_ids: Collection[str],
        last_turn_status: LastTurnStatus | None,
    ) -> Removal:
        """The removal of ``message_ids``; empty ids are dropped (they match no message)."""
        ids = frozenset(message_id for message_id in message_ids if message_id)
        return cls(requester_uuid, ids, last_turn_status)

    def removes(self, message: ChatMessage) -> bool:
        """Whether ``message`` is one of those to remove."""
        return bool(message.message_id) and message.message_id in self.message_ids

    def apply_fenced(
        self, current: ConversationRecord | None, now: datetime, epoch: int
    ) -> tuple[ConversationRecord | None, bool]:
        """The record to store (None: nothing changes) and whether the removal
        was accepted. A missing conversation is accepted with nothing to do;
        someone else's raises ``ConversationNotOwnedError``; one fenced above
        ``epoch`` is refused. ``current`` is never modified.

        The title is taken again from what is left (the first user message's,
        as for an append), so rolling back a conversation's first turn does
        not leave it named after a message it no longer holds.
        """
        if current is None:
            return None, True
        current.require_owner(self.requester_uuid)
        if current.fence_epoch > epoch:
            return None, False
        record = current.model_copy(deep=True)
        record.messages = [message for message in record.messages if not self.removes(message)]
        record.title = title_of(record.messages)
        if self.last_turn_status is not None:
            record.last_turn_status = self.last_turn_status
        record.fence_epoch = max(record.fence_epoch, epoch)
        record.updated_at = now
        return record, True


def page(records: Iterable[ConversationRecord], limit: int, cursor: str | None) -> ConversationPage:
    """One page of ``records``, most recently updated first.

    Ties are broken by session id, so the order is total and the cursor (the last
    item's position, base64url JSON, opaque to callers) pages without gaps or
    repeats while nothing changes. A malformed cursor or a limit below 1 raises
    ``ValueError``.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    after = _decode_cursor(cursor) if cursor is not None else None
    ordered = sorted(records, key=lambda record: record.session_id)
    ordered.sort(key=lambda record: record.updated_at, reverse=True)
    if after is not None:
        ordered = [record for record in ordered if _is_after(record, *after)]
    items = [record.summary() for record in ordered[:limit]]
    next_cursor = _encode_cursor(ordered[limit - 1]) if len(ordered) > limit else None
    return ConversationPage(items=items, next_cursor=next_cursor)


def stale_page(
    records: Iterable[ConversationRecord],
    updated_before: datetime,
    limit: int,
    cursor: str | None,
) -> ConversationPage:
    """The records last updated before ``updated_before``, oldest first (ties by
    tenant, then session id), one page of ``limit``; the cursor is the last
    item's position, as in ``page``."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    after = _decode_stale_cursor(cursor) if cursor is not None else None
    ordered = sorted(
        (record for record in records if record.updated_at < updated_before),
        key=lambda record: (record.updated_at, record.tenant, record.session_id),
    )
    if after is not None:
        ordered = [r for r in ordered if (r.updated_at, r.tenant, r.session_id) > after]
    items = [record.summary() for record in ordered[:limit]]
    next_cursor = _encode_stale_cursor(ordered[limit - 1]) if len(ordered) > limit else None
    return ConversationPage(items=items, next_cursor=next_cursor)


def _encode_stale_cursor(record: ConversationRecord) -> str:
    position = [record.updated_at.isoformat(), record.tenant, record.session_id]
    return base64.urlsafe_b64encode(json.dumps(position).encode("ascii")).decode("ascii")


def _decode_stale_cursor(cursor: str) -> tuple[datetime, str, str]:
    try:
        updated_at, tenant, session_id = json.loads(
            base64.urlsafe_b64decode(cursor.encode("ascii"))
        )
        position = (datetime.fromisoformat(updated_at), tenant, session_id)
    except (binascii.Error, UnicodeError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed conversation cursor: {cursor!r}") from exc
    if position[0].tzinfo is None or not (isinstance(tenant, str) and isinstance(session_id, str)):
        raise ValueError(f"malformed conversation cursor: {cursor!r}")
    return position


def title_of(messages: list[ChatMessage]) -> str:
    """The conversation's title: its first user message, whitespace collapsed,
    cut to ``TITLE_LENGTH``; ``""`` when there is none."""
    for message in messages:
        if message.sender is ChatMessageSender.USER:
            text = " ".join(message.content.split())
            if len(text) <= TITLE_LENGTH:
                return text
            return text[: TITLE_LENGTH - 1].rstrip() + "\u2026"
    return ""


def _is_after(record: ConversationRecord, updated_at: datetime, session_id: str) -> bool:
    if record.updated_at != updated_at:
        return record.updated_at < updated_at
    return record.session_id > session_id


def _encode_cursor(record: ConversationRecord) -> str:
    position = [record.updated_at.isoformat(), record.session_id]
    return base64.urlsafe_b64encode(json.dumps(position).encode("ascii")).decode("ascii")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        updated_at, session_id = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        position = (datetime.fromisoformat(updated_at), session_id)
    except (binascii.Error, UnicodeError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed conversation cursor: {cursor!r}") from exc
    if position[0].tzinfo is None or not isinstance(position[1], str):
        raise ValueError(f"malformed conversation cursor: {cursor!r}")
    return position

"""Conversations as one durable row each, under the shared conversation rules."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tether.adapters.conversation_record import Append, Clock, Removal, stamp, utc_now
from tether.adapters.sqlite import _codec, queries
from tether.adapters.sqlite._conversation_rows import (
    decode_cursor,
    decode_stale_cursor,
    encode_cursor,
    encode_stale_cursor,
    read_readable,
    read_record,
    summary_of,
    where,
    write_record,
)
from tether.adapters.sqlite._store import SQLiteStore
from tether.adapters.sqlite.database import Lane, SQLiteDatabase
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationPage,
    ConversationSummary,
    LastTurnStatus,
    normalize_owner,
)
from tether.domain.chat_message import ChatMessage, ConversationContext


class SQLiteChatConversationStore(SQLiteStore, ChatConversationStore):
    """``ChatConversationStore`` in the ``conversation`` table, keyed by ``(tenant, session_id)``.

    A row holds the whole conversation record (messages and metadata, so one
    statement changes both) and, beside it, its listing summary with the owner
    and ``updated_at`` as columns, so listing is an indexed query that never
    parses a transcript. Ownership, appends and titles follow the rules the
    other conversation stores share (``tether.adapters.conversation_record``).
    Every write reads, checks and writes inside one ``BEGIN IMMEDIATE``
    transaction on the durable lane, so it is atomic across processes and
    fsynced when it returns.
    ``clock`` stamps ``created_at``/``updated_at``; it is read inside the write
    transaction (from the database's thread), so stamps follow commit order.

    The fence of a conversation is part of its record (``fence_epoch``), so
    ``append_fenced`` and ``remove_fenced`` check it and write in that same
    transaction, and it goes with the conversation when the conversation is
    deleted.
    """

    def __init__(self, database: SQLiteDatabase, clock: Clock = utc_now) -> None:
        super().__init__(database)
        self._clock = clock

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

        def append(connection: sqlite3.Connection) -> None:
            current = read_record(connection, tenant, session_id)
            updated = change.apply(current, stamp(self._clock))
            if updated is not None:
                write_record(connection, updated)

        await self._database.write(Lane.DURABLE, append)

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
        """``append_messages`` fenced by ``epoch`` and idempotent by ``message_id``:
        False, changing nothing, when the fence is above ``epoch``; else raise the
        fence, append the missing messages, set the status, and return True.
        The check and the write are one transaction, durable when it returns."""
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

        def append(connection: sqlite3.Connection) -> bool:
            current = read_record(connection, tenant, session_id)
            updated, accepted = change.apply_fenced(current, stamp(self._clock), epoch)
            if updated is not None:
                write_record(connection, updated)
            return accepted

        return await self._database.write(Lane.DURABLE, append)

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
        """Remove the messages with those ids, fenced by ``epoch`` (a rollback):
        False, changing nothing, when the fence is above ``epoch``; else raise the
        fence, remove them, set the status, and return True (also when the
        conversation is missing). The check and the write are one transaction,
        as for ``append_fenced``, durable when it returns."""
        removal = Removal.of(requester_uuid, message_ids, last_turn_status)

        def remove(connection: sqlite3.Connection) -> bool:
            current = read_record(connection, tenant, session_id)
            updated, accepted = removal.apply_fenced(current, stamp(self._clock), epoch)
            if updated is not None:
                write_record(connection, updated)
            return accepted

        return await self._database.write(Lane.DURABLE, remove)

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse every later ``append_fenced`` below ``epoch`` (the fence never
        falls); a no-op when no conversation exists. Durable when it returns."""

        def fence(connection: sqlite3.Connection) -> None:
            record = read_record(connection, tenant, session_id)
            # Unchanged rows are not rewritten: a repeated fence costs no write.
            if record is None or record.fence_epoch >= epoch:
                return
            record.fence_epoch = epoch
            write_record(connection, record)

        await self._database.write(Lane.DURABLE, fence)

    async def set_last_turn_status(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        last_turn_status: LastTurnStatus,
    ) -> None:
        """Set the last turn's status (owner only); a no-op when no conversation exists."""

        def set_status(connection: sqlite3.Connection) -> None:
            record = read_record(connection, tenant, session_id)
            if record is None:
                return
            record.require_owner(requester_uuid)
            record.last_turn_status = last_turn_status
            record.updated_at = stamp(self._clock)
            write_record(connection, record)

        await self._database.write(Lane.DURABLE, set_status)

    async def get_transcript(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> list[ChatMessage]:
        """The messages (owner, or anyone when shared); ``[]`` when missing."""
        record = await self._database.read(
            Lane.DURABLE, lambda c: read_readable(c, tenant, requester_uuid, session_id)
        )
        return [] if record is None else record.messages

    async def get_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ConversationSummary | None:
        """The summary (owner, or anyone when shared); None when missing."""
        record = await self._database.read(
            Lane.DURABLE, lambda c: read_readable(c, tenant, requester_uuid, session_id)
        )
        return None if record is None else record.summary()

    async def list_conversations(
        self,
        tenant: str,
        requester_uuid: str | None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """The requester's own conversations in ``tenant``, most recently updated
        first, ties by session id; ``cursor`` continues after the page that gave it.
        A malformed cursor or a limit below 1 raises ``ValueError``."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        values: dict[str, object] = {
            "tenant": _codec.key(tenant),
            "owner": _codec.key(normalize_owner(requester_uuid)),
            "limit": limit + 1,
        }
        statement = queries.CONVERSATION_LIST_FIRST
        if cursor is not None:
            after_us, after_session = decode_cursor(cursor)
            values.update(after_us=after_us, after_session=_codec.key(after_session))
            statement = queries.CONVERSATION_LIST_AFTER

        def listing(connection: sqlite3.Connection) -> list[ConversationSummary]:
            rows = connection.execute(statement, values).fetchall()
            return [summary_of(tenant, session, summary) for session, summary in rows]

        summaries = await self._database.read(Lane.DURABLE, listing)
        items = summaries[:limit]
        next_cursor = encode_cursor(items[-1]) if len(summaries) > limit else None
        return ConversationPage(items=items, next_cursor=next_cursor)

    async def list_stale_conversations(
        self, updated_before: datetime, limit: int = 100, cursor: str | None = None
    ) -> ConversationPage:
        """Every owner's conversations last updated before ``updated_before``,
        oldest first (ties by tenant, then session id), by the age index."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        values: dict[str, object] = {
            "before_us": _codec.microseconds(updated_before),
            "limit": limit + 1,
        }
        statement = queries.CONVERSATION_LIST_STALE_FIRST
        if cursor is not None:
            after_us, after_tenant, after_session = decode_stale_cursor(cursor)
            values.update(
                after_us=after_us,
                after_tenant=_codec.key(after_tenant),
                after_session=_codec.key(after_session),
            )
            statement = queries.CONVERSATION_LIST_STALE_AFTER

        def listing(connection: sqlite3.Connection) -> list[ConversationSummary]:
            rows = connection.execute(statement, values).fetchall()
            return [
                summary_of(_codec.text(tenant, "a conversation row's tenant"), session, summary)
                for tenant, session, summary in rows
            ]

        summaries = await self._database.read(Lane.DURABLE, listing)
        items = summaries[:limit]
        next_cursor = encode_stale_cursor(items[-1]) if len(summaries) > limit else None
        return ConversationPage(items=items, next_cursor=next_cursor)

    async def set_shared(
        self, tenant: str, requester_uuid: str | None, session_id: str, shared: bool
    ) -> None:
        """Share or unshare (owner only); a no-op when no conversation exists."""

        def share(connection: sqlite3.Connection) -> None:
            record = read_record(connection, tenant, session_id)
            if record is None:
                return
            record.require_owner(requester_uuid)
            record.shared = shared
            write_record(connection, record)

        await self._database.write(Lane.DURABLE, share)

    async def delete_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> bool:
        """Remove the conversation (owner only); returns whether one existed."""

        def delete(connection: sqlite3.Connection) -> bool:
            record = read_record(connection, tenant, session_id)
            if record is None:
                return False
            record.require_owner(requester_uuid)
            connection.execute(queries.CONVERSATION_DELETE, where(tenant, session_id))
            return True

        return await self._database.write(Lane.DURABLE, delete)

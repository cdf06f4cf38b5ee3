"""Conversations in PostgreSQL: a row per conversation, a row per message.

The store maps the interface onto them; how a row reads as a record is in
``_conversation_rows``, the writes that hold a conversation's row lock in
``_conversation_locked``, the statements in ``queries_conversation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import DictRow
from pydantic import ValidationError

from tether.adapters.conversation_record import Append, Clock, Removal, stamp, utc_now
from tether.adapters.postgres import _conversation_locked as locked
from tether.adapters.postgres import queries_conversation as queries
from tether.adapters.postgres._conversation_rows import (
    decode_cursor,
    encode_cursor,
    json_text,
    record_of,
    summary_of,
)
from tether.adapters.postgres._keys import check_ids, row_key
from tether.adapters.postgres._store import PostgresStore
from tether.adapters.postgres.database import PostgresDatabase
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationPage,
    ConversationSummary,
    LastTurnStatus,
    normalize_owner,
)
from tether.domain.chat_message import ChatMessage, ConversationContext
from tether.domain.store_errors import StoreCorruptedError


class PostgresChatConversationStore(PostgresStore, ChatConversationStore):
    """``ChatConversationStore`` on PostgreSQL, every optional method included.

    ``tether_conversations`` holds one row per ``(tenant, session_id)`` (owner,
    sharing, status, title, metadata, times) and ``tether_conversation_messages``
    one row per message, so an append writes only the new messages. The rules
    are every conversation store's (``tether.adapters.conversation_record``):
    owner-only writes, owner-or-shared reads, no ghost rows, the first user
    message as title.

    An append locks the conversation row (``SELECT ... FOR UPDATE``) for its
    transaction, so concurrent appends serialize and lose or duplicate nothing;
    two users creating one conversation at once leave one owner. Sharing, status
    and deletion are single owner-guarded statements. Every write is durable
    when it returns. Listing reads the ``(owner, updated_at DESC)`` index and
    pages with an opaque cursor. ``clock`` stamps ``created_at``/``updated_at``.

    Fencing: the conversation row's ``fence_epoch`` is the highest epoch that
    appended (``append_fenced``), removed (``remove_fenced``) or fenced it.
    ``append_fenced`` runs as an append does, under the row lock, so its fence
    check, its check of which messages are there already and its write are one
    atomic step; ``remove_fenced`` likewise checks, deletes and renumbers the
    messages left (positions stay dense, so appends still go after them) in
    one transaction holding the row lock; ``fence`` is one guarded
    ``UPDATE``. The fence goes with the conversation when it is deleted.
    """

    def __init__(self, database: PostgresDatabase, clock: Clock = utc_now) -> None:
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
        key = _conversation_key(tenant, requester_uuid, session_id)
        check_ids(agent_identifier)
        # Serialized before the transaction: a message that is not JSON fails
        # without holding the row lock.
        documents = [json_text(message.model_dump(mode="json")) for message in messages]
        now = stamp(self._clock)

        async def append(cursor: AsyncCursor[DictRow]) -> None:
            await locked.append(cursor, key, change, documents, now)

        await self._database.run(append, transaction=True)

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
        """``append_messages`` fenced by ``epoch`` and idempotent by ``message_id``,
        in one transaction holding the conversation's row lock.

        Returns False, having changed nothing, when the conversation's fence is
        above ``epoch``. Otherwise raises the fence to ``epoch``, appends the
        messages not in the transcript yet (a message without an id always),
        sets ``last_turn_status`` when given, and returns True; a missing
        conversation that is not created returns True. Durable when it returns.
        """
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
        key = _conversation_key(tenant, requester_uuid, session_id)
        message_ids = [message.message_id for message in messages if message.message_id]
        check_ids(agent_identifier, *message_ids)
        # Serialized before the transaction: a message that is not JSON fails
        # without holding the row lock.
        documents = [json_text(message.model_dump(mode="json")) for message in messages]
        now = stamp(self._clock)

        async def append(cursor: AsyncCursor[DictRow]) -> bool:
            return await locked.append_fenced(cursor, key, change, documents, now, epoch)

        return await self._database.run(append, transaction=True)

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
        in one transaction holding the conversation's row lock.

        Returns False, having changed nothing, when the conversation's fence is
        above ``epoch``. Otherwise raises the fence to ``epoch``, removes the
        messages, moves the later ones down so positions stay dense, takes the
        title again from what is left, sets ``last_turn_status`` when given, and
        returns True; a missing conversation returns True. Durable when it
        returns.
        """
        removal = Removal.of(requester_uuid, message_ids, last_turn_status)
        key = _conversation_key(tenant, requester_uuid, session_id)
        check_ids(*sorted(removal.message_ids))
        now = stamp(self._clock)

        async def remove(cursor: AsyncCursor[DictRow]) -> bool:
            return await locked.remove_fenced(cursor, key, removal, now, epoch)

        return await self._database.run(remove, transaction=True)

    async def fence(
        self, tenant: str, requester_uuid: str | None, session_id: str, epoch: int
    ) -> None:
        """Refuse every later ``append_fenced`` below ``epoch``, durably; one guarded
        statement that never lowers the fence. A no-op when no conversation exists."""
        key = _conversation_key(tenant, requester_uuid, session_id)
        await self._database.execute(queries.FENCE_CONVERSATION, {"key": key, "epoch": epoch})

    async def set_last_turn_status(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        last_turn_status: LastTurnStatus,
    ) -> None:
        """Set the last turn's status (owner only); a no-op when no conversation exists."""
        key = _conversation_key(tenant, requester_uuid, session_id)
        params = {
            "key": key,
            "owner_uuid": normalize_owner(requester_uuid),
            "last_turn_status": last_turn_status,
            "updated_at": stamp(self._clock),
        }
        if await self._database.fetch_one(queries.SET_LAST_TURN_STATUS, params) is None:
            await self._refuse_if_not_owner(key, requester_uuid)

    async def get_transcript(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> list[ChatMessage]:
        """The messages (owner, or anyone when shared); ``[]`` when missing."""
        key = _conversation_key(tenant, requester_uuid, session_id)
        rows = await self._database.fetch_all(queries.READ_TRANSCRIPT, {"key": key})
        if not rows:
            return []
        record_of(rows[0]).require_readable(requester_uuid)
        try:
            return [
                ChatMessage.model_validate(row["message"])
                for row in rows
                if row["message"] is not None
            ]
        except ValidationError as error:
            raise StoreCorruptedError(
                f"tether_conversation_messages of {(tenant, session_id)!r} hold an invalid "
                f"message ({error}); left as is"
            ) from error

    async def get_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ConversationSummary | None:
        """The summary (owner, or anyone when shared); None when missing."""
        key = _conversation_key(tenant, requester_uuid, session_id)
        row = await self._database.fetch_one(queries.READ_SUMMARY, {"key": key})
        if row is None:
            return None
        record = record_of(row)
        record.require_readable(requester_uuid)
        return summary_of(record, row)

    async def list_conversations(
        self,
        tenant: str,
        requester_uuid: str | None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ConversationPage:
        """The requester's own conversations in ``tenant``, most recently updated first.

        Ties in ``updated_at`` are broken by the row key, so the order is total and
        the cursor pages without gaps or repeats while nothing changes. A
        malformed cursor or a limit below 1 raises ``ValueError``.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        owner = normalize_owner(requester_uuid)
        check_ids(tenant, owner)
        params: dict[str, Any] = {"owner_key": row_key(tenant, owner), "limit": limit + 1}
        if cursor is None:
            rows = await self._database.fetch_all(queries.LIST_CONVERSATIONS, params)
        else:
            params["after_updated_at"], params["after_key"] = decode_cursor(cursor)
            rows = await self._database.fetch_all(queries.LIST_CONVERSATIONS_AFTER, params)
        items = [summary_of(record_of(row), row) for row in rows[:limit]]
        next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
        return ConversationPage(items=items, next_cursor=next_cursor)

    async def list_stale_conversations(
        self, updated_before: datetime, limit: int = 100, cursor: str | None = None
    ) -> ConversationPage:
        """Every owner's conversations last updated before ``updated_before``,
        oldest first (ties by row key), by the ``(updated_at, key)`` index."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        params: dict[str, Any] = {"before": updated_before, "limit": limit + 1}
        if cursor is None:
            rows = await self._database.fetch_all(queries.LIST_STALE_CONVERSATIONS, params)
        else:
            params["after_updated_at"], params["after_key"] = decode_cursor(cursor)
            rows = await self._database.fetch_all(queries.LIST_STALE_CONVERSATIONS_AFTER, params)
        items = [summary_of(record_of(row), row) for row in rows[:limit]]
        next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
        return ConversationPage(items=items, next_cursor=next_cursor)

    async def set_shared(
        self, tenant: str, requester_uuid: str | None, session_id: str, shared: bool
    ) -> None:
        """Share or unshare (owner only); a no-op when no conversation exists."""
        key = _conversation_key(tenant, requester_uuid, session_id)
        params = {"key": key, "owner_uuid": normalize_owner(requester_uuid), "shared": shared}
        if await self._database.fetch_one(queries.SET_SHARED, params) is None:
            await self._refuse_if_not_owner(key, requester_uuid)

    async def delete_conversation(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> bool:
        """Remove the conversation and its messages (owner only); whether one existed."""
        key = _conversation_key(tenant, requester_uuid, session_id)
        params = {"key": key, "owner_uuid": normalize_owner(requester_uuid)}
        if await self._database.fetch_one(queries.DELETE_CONVERSATION, params) is not None:
            return True
        await self._refuse_if_not_owner(key, requester_uuid)
        return False

    async def _refuse_if_not_owner(self, key: bytes, requester_uuid: str | None) -> None:
        # An owner-guarded write matched no row: either there is no conversation
        # (a no-op) or someone else owns it (refused). If the requester's own
        # conversation appeared in between, the write ordered before it: a no-op.
        row = await self._database.fetch_one(queries.READ_SUMMARY, {"key": key})
        if row is not None:
            record_of(row).require_owner(requester_uuid)


def _conversation_key(tenant: str, requester_uuid: str | None, session_id: str) -> bytes:
    check_ids(tenant, normalize_owner(requester_uuid), session_id)
    return row_key(tenant, session_id)

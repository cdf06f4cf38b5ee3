"""Conversations in PostgreSQL: a row per conversation, a row per message."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import DictRow
from pydantic import ValidationError

from tether.adapters.conversation_record import (
    Append,
    Clock,
    ConversationRecord,
    Removal,
    stamp,
    title_of,
    utc_now,
)
from tether.adapters.postgres import queries
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
from tether.domain.chat_message import ChatMessage, ChatMessageSender, ConversationContext
from tether.domain.store_errors import StoreCorruptedError, StoreError

# Request metadata kept as of the latest turn that carried it (see ``Append``).
_METADATA = {"user_roles", "user_tenants", "user_agent_id", "bot_params", "conversation_context"}


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
        documents = [_json(message.model_dump(mode="json")) for message in messages]
        now = stamp(self._clock)

        async def append(cursor: AsyncCursor[DictRow]) -> None:
            # Twice at most: if a concurrent creator wins the insert, lock its row.
            for _ in range(2):
                await cursor.execute(queries.LOCK_CONVERSATION, {"key": key})
                row = await cursor.fetchone()
                updated = change.apply(None if row is None else _record(row), now)
                if updated is None:
                    return
                params = _write_params(key, updated, row, messages)
                if row is None:
                    await cursor.execute(queries.CREATE_CONVERSATION, params)
                    if await cursor.fetchone() is None:
                        continue
                else:
                    await cursor.execute(queries.UPDATE_CONVERSATION, params)
                first_position = 0 if row is None else row["message_count"]
                await cursor.execute(
                    queries.APPEND_MESSAGES,
                    {"key": key, "first_position": first_position, "messages": documents},
                )
                return
            raise StoreError(f"conversation {session_id!r} kept changing under an append; retry")

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
        documents = [_json(message.model_dump(mode="json")) for message in messages]
        now = stamp(self._clock)

        async def append(cursor: AsyncCursor[DictRow]) -> bool:
            # Twice at most: if a concurrent creator wins the insert, lock its row.
            for _ in range(2):
                await cursor.execute(queries.LOCK_CONVERSATION, {"key": key})
                row = await cursor.fetchone()
                present: set[str] = set()
                if row is not None and message_ids:
                    # A statement after the lock: its snapshot sees every append
                    # that committed before this transaction got the row.
                    await cursor.execute(
                        queries.PRESENT_MESSAGE_IDS, {"key": key, "message_ids": message_ids}
                    )
                    present = {found["message_id"] for found in await cursor.fetchall()}
                positions = [
                    position
                    for position, message in enumerate(messages)
                    if not message.message_id or message.message_id not in present
                ]
                missing = [messages[position] for position in positions]
                # The record read here holds no messages: the transcript was
                # deduplicated above, so ``apply_fenced`` sees only the missing ones.
                updated, accepted = replace(change, messages=missing).apply_fenced(
                    None if row is None else _record(row), now, epoch
                )
                if updated is None:
                    return accepted
                params = _write_params(key, updated, row, missing)
                if row is None:
                    await cursor.execute(queries.CREATE_CONVERSATION, params)
                    if await cursor.fetchone() is None:
                        continue
                else:
                    await cursor.execute(queries.UPDATE_CONVERSATION, params)
                if positions:
                    await cursor.execute(
                        queries.APPEND_MESSAGES,
                        {
                            "key": key,
                            "first_position": 0 if row is None else row["message_count"],
                            "messages": [documents[position] for position in positions],
                        },
                    )
                return True
            raise StoreError(f"conversation {session_id!r} kept changing under an append; retry")

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
        ids = sorted(removal.message_ids)
        check_ids(*ids)
        now = stamp(self._clock)

        async def remove(cursor: AsyncCursor[DictRow]) -> bool:
            await cursor.execute(queries.LOCK_CONVERSATION, {"key": key})
            row = await cursor.fetchone()
            # The record read here holds no messages: only its owner, fence and
            # status matter to ``apply_fenced``; the messages are removed in SQL.
            updated, accepted = removal.apply_fenced(
                None if row is None else _record(row), now, epoch
            )
            if row is None or updated is None:
                return accepted
            removed: list[int] = []
            if ids:
                await cursor.execute(queries.REMOVE_MESSAGES, {"key": key, "message_ids": ids})
                removed = [found["position"] for found in await cursor.fetchall()]
            new_title = row["title"]
            if removed:
                params = {"key": key, "removed": removed, "lowest": min(removed)}
                await cursor.execute(queries.CLOSE_GAPS_AWAY, params)
                await cursor.execute(queries.CLOSE_GAPS_BACK, {"key": key})
                new_title = await _first_user_title(cursor, key)
            await cursor.execute(
                queries.UPDATE_CONVERSATION_AFTER_REMOVAL,
                {
                    "key": key,
                    "last_turn_status": updated.last_turn_status,
                    "title": new_title,
                    "message_count": row["message_count"] - len(removed),
                    "fence_epoch": updated.fence_epoch,
                    "updated_at": updated.updated_at,
                },
            )
            return True

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
        _record(rows[0]).require_readable(requester_uuid)
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
        record = _record(row)
        record.require_readable(requester_uuid)
        return _summary(record, row)

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
            params["after_updated_at"], params["after_key"] = _decode_cursor(cursor)
            rows = await self._database.fetch_all(queries.LIST_CONVERSATIONS_AFTER, params)
        items = [_summary(_record(row), row) for row in rows[:limit]]
        next_cursor = _encode_cursor(rows[limit - 1]) if len(rows) > limit else None
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
            params["after_updated_at"], params["after_key"] = _decode_cursor(cursor)
            rows = await self._database.fetch_all(queries.LIST_STALE_CONVERSATIONS_AFTER, params)
        items = [_summary(_record(row), row) for row in rows[:limit]]
        next_cursor = _encode_cursor(rows[limit - 1]) if len(rows) > limit else None
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
            _record(row).require_owner(requester_uuid)


def _conversation_key(tenant: str, requester_uuid: str | None, session_id: str) -> bytes:
    check_ids(tenant, normalize_owner(requester_uuid), session_id)
    return row_key(tenant, session_id)


def _json(document: Any) -> str:
    return json.dumps(document, allow_nan=False, separators=(",", ":"))


def _record(row: DictRow) -> ConversationRecord:
    """The stored conversation, without its messages."""
    try:
        return ConversationRecord(
            tenant=row["tenant"],
            session_id=row["session_id"],
            owner_uuid=row["owner_uuid"],
            agent_identifier=row["agent_identifier"],
            shared=row["shared"],
            last_turn_status=row["last_turn_status"],
            created_at=row["created_at"].astimezone(UTC),
            updated_at=row["updated_at"].astimezone(UTC),
            title=row["title"] or "",
            # Only the locking read selects the fence; the others do not need it.
            fence_epoch=row.get("fence_epoch") or 0,
            **(row.get("metadata") or {}),
        )
    except (ValidationError, TypeError) as error:
        raise StoreCorruptedError(
            f"tether_conversations row of {(row.get('tenant'), row.get('session_id'))!r} "
            f"is not a valid conversation ({error}); left as is"
        ) from error


async def _first_user_title(cursor: AsyncCursor[DictRow], key: bytes) -> str | None:
    # NULL when no user message is left, so the next one names the conversation
    # (as in ``_write_params``).
    await cursor.execute(
        queries.FIRST_USER_MESSAGE, {"key": key, "sender": ChatMessageSender.USER.value}
    )
    found = await cursor.fetchone()
    if found is None:
        return None
    try:
        first = ChatMessage.model_validate(found["message"])
    except ValidationError as error:
        raise StoreCorruptedError(
            f"tether_conversation_messages hold an invalid message ({error}); left as is"
        ) from error
    return title_of([first])


def _summary(record: ConversationRecord, row: DictRow) -> ConversationSummary:
    return record.summary().model_copy(update={"message_count": row["message_count"]})


def _write_params(
    key: bytes, updated: ConversationRecord, row: DictRow | None, messages: list[ChatMessage]
) -> dict[str, Any]:
    # The title is the first user message's; until one arrives it stays NULL, so
    # a first user message whose title is "" still counts as the first.
    title = None if row is None else row["title"]
    if title is None and any(message.sender is ChatMessageSender.USER for message in messages):
        title = updated.title
    return {
        "key": key,
        "owner_key": row_key(updated.tenant, updated.owner_uuid),
        "tenant": updated.tenant,
        "session_id": updated.session_id,
        "owner_uuid": updated.owner_uuid,
        "agent_identifier": updated.agent_identifier,
        "last_turn_status": updated.last_turn_status,
        "title": title,
        "message_count": (0 if row is None else row["message_count"]) + len(messages),
        "metadata": _json(updated.model_dump(mode="json", include=_METADATA)),
        "fence_epoch": updated.fence_epoch,
        "created_at": updated.created_at,
        "updated_at": updated.updated_at,
    }


def _encode_cursor(row: DictRow) -> str:
    position = [row["updated_at"].astimezone(UTC).isoformat(), bytes(row["key"]).hex()]
    return base64.urlsafe_b64encode(json.dumps(position).encode("ascii")).decode("ascii")


def _decode_cursor(cursor: str) -> tuple[datetime, bytes]:
    try:
        updated_at, key = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        position = (datetime.fromisoformat(updated_at), bytes.fromhex(key))
    except (binascii.Error, UnicodeError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed conversation cursor: {cursor!r}") from exc
    if position[0].tzinfo is None or len(position[1]) != 32:
        raise ValueError(f"malformed conversation cursor: {cursor!r}")
    return position

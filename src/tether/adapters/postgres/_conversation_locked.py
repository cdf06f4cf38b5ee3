"""A conversation's writes that hold its row lock: appends and a rollback's removal.

Each runs in one transaction on the cursor it is given, and starts by locking
the conversation's row (``LOCK_CONVERSATION``): concurrent writes to one
conversation serialize, and the checks each makes (the owner, the fence, the
messages already there) hold until it commits. Positions stay dense (0 ..
``message_count`` - 1), so an append always goes after the last message.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from psycopg import AsyncCursor
from psycopg.rows import DictRow
from pydantic import ValidationError

from tether.adapters.conversation_record import Append, Removal, title_of
from tether.adapters.postgres import queries_conversation as queries
from tether.adapters.postgres._conversation_rows import record_of, write_params
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.store_errors import StoreCorruptedError, StoreError


async def append(
    cursor: AsyncCursor[DictRow], key: bytes, change: Append, documents: list[str], now: datetime
) -> None:
    """``append_messages``: apply ``change`` to the row ``key``, its messages
    serialized as ``documents``."""
    # Twice at most: if a concurrent creator wins the insert, lock its row.
    for _ in range(2):
        await cursor.execute(queries.LOCK_CONVERSATION, {"key": key})
        row = await cursor.fetchone()
        updated = change.apply(None if row is None else record_of(row), now)
        if updated is None:
            return
        params = write_params(key, updated, row, change.messages)
        if not await _write_row(cursor, row, params):
            continue  # a concurrent creator won the insert
        first_position = 0 if row is None else row["message_count"]
        await cursor.execute(
            queries.APPEND_MESSAGES,
            {"key": key, "first_position": first_position, "messages": documents},
        )
        return
    raise StoreError(f"conversation {change.session_id!r} kept changing under an append; retry")


async def append_fenced(
    cursor: AsyncCursor[DictRow],
    key: bytes,
    change: Append,
    documents: list[str],
    now: datetime,
    epoch: int,
) -> bool:
    """``append_fenced``: ``append`` at ``epoch``, of the messages the
    transcript does not hold yet; False when the fence is above ``epoch``."""
    messages = change.messages
    message_ids = [message.message_id for message in messages if message.message_id]
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
            None if row is None else record_of(row), now, epoch
        )
        if updated is None:
            return accepted
        params = write_params(key, updated, row, missing)
        if not await _write_row(cursor, row, params):
            continue  # a concurrent creator won the insert
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
    raise StoreError(f"conversation {change.session_id!r} kept changing under an append; retry")


async def remove_fenced(
    cursor: AsyncCursor[DictRow], key: bytes, removal: Removal, now: datetime, epoch: int
) -> bool:
    """``remove_fenced``: the rollback ``removal`` at ``epoch``; the messages
    after a removed one move down. False when the fence is above ``epoch``."""
    ids = sorted(removal.message_ids)
    await cursor.execute(queries.LOCK_CONVERSATION, {"key": key})
    row = await cursor.fetchone()
    # The record read here holds no messages: only its owner, fence and
    # status matter to ``apply_fenced``; the messages are removed in SQL.
    updated, accepted = removal.apply_fenced(None if row is None else record_of(row), now, epoch)
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


async def _write_row(
    cursor: AsyncCursor[DictRow], row: DictRow | None, params: dict[str, Any]
) -> bool:
    """Create the conversation's row (``row`` None: none was read) or update it;
    False when a concurrent creator's insert came first (then lock its row)."""
    if row is None:
        await cursor.execute(queries.CREATE_CONVERSATION, params)
        return await cursor.fetchone() is not None
    await cursor.execute(queries.UPDATE_CONVERSATION, params)
    return True


async def _first_user_title(cursor: AsyncCursor[DictRow], key: bytes) -> str | None:
    # NULL when no user message is left, so the next one names the conversation
    # (as in ``write_params``).
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

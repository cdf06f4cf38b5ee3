"""A conversation's rows as records: what the conversation store reads from
``tether_conversations``, what it writes back, and its listing's cursor."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import DictRow
from pydantic import ValidationError

from tether.adapters.conversation_record import ConversationRecord
from tether.adapters.postgres._keys import row_key
from tether.domain.chat_conversation_store import ConversationSummary
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.store_errors import StoreCorruptedError

# Request metadata kept as of the latest turn that carried it (see ``Append``).
_METADATA = {"user_roles", "user_tenants", "user_agent_id", "bot_params", "conversation_context"}


def json_text(document: Any) -> str:
    """``document`` as the compact JSON a ``jsonb`` parameter takes."""
    return json.dumps(document, allow_nan=False, separators=(",", ":"))


def record_of(row: DictRow) -> ConversationRecord:
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


def summary_of(record: ConversationRecord, row: DictRow) -> ConversationSummary:
    """The listing's view of ``record``, with the row's count of messages."""
    return record.summary().model_copy(update={"message_count": row["message_count"]})


def write_params(
    key: bytes, updated: ConversationRecord, row: DictRow | None, messages: list[ChatMessage]
) -> dict[str, Any]:
    """The parameters that create or update the row ``key`` (``row`` as it was
    read, None when there was none) to ``updated``, with ``messages`` added."""
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
        "metadata": json_text(updated.model_dump(mode="json", include=_METADATA)),
        "fence_epoch": updated.fence_epoch,
        "created_at": updated.created_at,
        "updated_at": updated.updated_at,
    }


def encode_cursor(row: DictRow) -> str:
    """The cursor of the page after ``row``: its ``(updated_at, key)``, opaque."""
    position = [row["updated_at"].astimezone(UTC).isoformat(), bytes(row["key"]).hex()]
    return base64.urlsafe_b64encode(json.dumps(position).encode("ascii")).decode("ascii")


def decode_cursor(cursor: str) -> tuple[datetime, bytes]:
    """The ``(updated_at, key)`` a cursor names; ``ValueError`` for a malformed one."""
    try:
        updated_at, key = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        position = (datetime.fromisoformat(updated_at), bytes.fromhex(key))
    except (binascii.Error, UnicodeError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed conversation cursor: {cursor!r}") from exc
    if position[0].tzinfo is None or len(position[1]) != 32:
        raise ValueError(f"malformed conversation cursor: {cursor!r}")
    return position

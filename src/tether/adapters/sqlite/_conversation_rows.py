"""A conversation's row in the SQLite ``conversation`` table, read and written
as its ``ConversationRecord``, and the listings' cursors."""

from __future__ import annotations

import base64
import binascii
import json
import sqlite3

from tether.adapters.conversation_record import ConversationRecord
from tether.adapters.sqlite import _codec, queries
from tether.domain.chat_conversation_store import ConversationSummary
from tether.domain.store_errors import StoreCorruptedError


def where(tenant: str, session_id: str) -> dict[str, bytes]:
    """The parameters that name the conversation's row."""
    return {"tenant": _codec.key(tenant), "session": _codec.key(session_id)}


def _described(tenant: str, session_id: str) -> str:
    return (
        f"the conversation row of tenant {_codec.shown(tenant)}, session {_codec.shown(session_id)}"
    )


def read_record(
    connection: sqlite3.Connection, tenant: str, session_id: str
) -> ConversationRecord | None:
    """The conversation's record, or None when it has no row."""
    found = connection.execute(queries.CONVERSATION_READ, where(tenant, session_id)).fetchone()
    if found is None:
        return None
    what = _described(tenant, session_id)
    record = _codec.load_model(ConversationRecord, found[0], what)
    if (record.tenant, record.session_id) != (tenant, session_id):
        raise StoreCorruptedError(f"{what} holds another conversation's record; left as is")
    return record


def read_readable(
    connection: sqlite3.Connection, tenant: str, requester_uuid: str | None, session_id: str
) -> ConversationRecord | None:
    """``read_record``, refused unless the requester owns it or it is shared."""
    record = read_record(connection, tenant, session_id)
    if record is not None:
        record.require_readable(requester_uuid)
    return record


def write_record(connection: sqlite3.Connection, record: ConversationRecord) -> None:
    """Create or replace the row of ``record``, with its listing summary beside it."""
    connection.execute(
        queries.CONVERSATION_UPSERT,
        {
            **where(record.tenant, record.session_id),
            "owner": _codec.key(record.owner_uuid),
            "updated_us": _codec.microseconds(record.updated_at),
            "record": _codec.dump_model(record),
            "summary": _codec.dump_model(record.summary()),
        },
    )


def summary_of(tenant: str, session: object, raw: object) -> ConversationSummary:
    """The listing summary a row of ``tenant`` holds (``session``: its session id)."""
    what = _described(
        tenant, _codec.text(session, f"a conversation row of tenant {_codec.shown(tenant)}")
    )
    return _codec.load_model(ConversationSummary, raw, what)


# The cursor is the last listed item's position, (updated_at in microseconds,
# session id), as base64url JSON: opaque to callers, exact for SQL comparison.


def encode_cursor(item: ConversationSummary) -> str:
    position = [_codec.microseconds(item.updated_at), item.session_id]
    return base64.urlsafe_b64encode(json.dumps(position).encode("ascii")).decode("ascii")


def encode_stale_cursor(item: ConversationSummary) -> str:
    position = [_codec.microseconds(item.updated_at), item.tenant, item.session_id]
    return base64.urlsafe_b64encode(json.dumps(position).encode("ascii")).decode("ascii")


def decode_stale_cursor(cursor: str) -> tuple[int, str, str]:
    try:
        updated_us, tenant, session_id = json.loads(
            base64.urlsafe_b64decode(cursor.encode("ascii"))
        )
    except (binascii.Error, UnicodeError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed conversation cursor: {cursor!r}") from exc
    if not _is_position(updated_us) or not (
        isinstance(tenant, str) and isinstance(session_id, str)
    ):
        raise ValueError(f"malformed conversation cursor: {cursor!r}")
    return updated_us, tenant, session_id


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        updated_us, session_id = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (binascii.Error, UnicodeError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed conversation cursor: {cursor!r}") from exc
    if not _is_position(updated_us) or not isinstance(session_id, str):
        raise ValueError(f"malformed conversation cursor: {cursor!r}")
    return updated_us, session_id


def _is_position(updated_us: object) -> bool:
    # SQLite integers are 64-bit: a larger one overflows in the driver, which
    # would make a forged cursor a server error instead of a refusal.
    return type(updated_us) is int and 0 <= updated_us < 2**63

"""The SQL of the PostgreSQL conversation store (``conversation``), by name.

Beside ``queries``, whose rules hold here too. A conversation is a row of
``tether_conversations`` (owner, sharing, status, title, metadata, its fence,
times) and a row per message in ``tether_conversation_messages``, at dense
positions from 0. Its writes run under the conversation's row lock
(``LOCK_CONVERSATION``), or are one owner-guarded statement.
"""

from __future__ import annotations

from typing import Final

LOCK_CONVERSATION: Final = """
SELECT tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status, title,
       message_count, metadata, fence_epoch, created_at, updated_at
FROM tether_conversations
WHERE key = %(key)s
FOR UPDATE
"""

CREATE_CONVERSATION: Final = """
INSERT INTO tether_conversations
    (key, owner_key, tenant, session_id, owner_uuid, agent_identifier, shared,
     last_turn_status, title, message_count, metadata, fence_epoch, created_at, updated_at)
VALUES (%(key)s, %(owner_key)s, %(tenant)s, %(session_id)s, %(owner_uuid)s,
        %(agent_identifier)s, false, %(last_turn_status)s, %(title)s, %(message_count)s,
        %(metadata)s::jsonb, %(fence_epoch)s, %(created_at)s, %(updated_at)s)
ON CONFLICT (key) DO NOTHING
RETURNING key
"""
"""Create, unless a concurrent creator got there first (no row returned)."""

UPDATE_CONVERSATION: Final = """
UPDATE tether_conversations
SET agent_identifier = %(agent_identifier)s, last_turn_status = %(last_turn_status)s,
    title = %(title)s, message_count = %(message_count)s, metadata = %(metadata)s::jsonb,
    fence_epoch = %(fence_epoch)s, updated_at = %(updated_at)s
WHERE key = %(key)s
"""
"""Run under the row lock of ``LOCK_CONVERSATION``, with values computed from it."""

FENCE_CONVERSATION: Final = """
UPDATE tether_conversations
SET fence_epoch = %(epoch)s
WHERE key = %(key)s AND fence_epoch < %(epoch)s
"""
"""Raise the conversation's fence; never lowers it, and creates no conversation."""

PRESENT_MESSAGE_IDS: Final = """
SELECT DISTINCT message ->> 'message_id' AS message_id
FROM tether_conversation_messages
WHERE conversation_key = %(key)s AND message ->> 'message_id' = ANY(%(message_ids)s::text[])
"""
"""Which of ``message_ids`` the transcript holds already (``append_fenced`` appends
only the others); run under the row lock, so no append can slip in between."""

APPEND_MESSAGES: Final = """
INSERT INTO tether_conversation_messages (conversation_key, position, message)
SELECT %(key)s, %(first_position)s::integer + appended.ordinality::integer - 1,
       appended.message
FROM unnest(%(messages)s::jsonb[]) WITH ORDINALITY AS appended (message, ordinality)
"""

# A rollback (``remove_fenced``), run under the row lock of ``LOCK_CONVERSATION``.
# Positions stay dense (0 .. message_count - 1), so an append after it still
# starts at ``message_count``: the messages after a removed one move down.

REMOVE_MESSAGES: Final = """
DELETE FROM tether_conversation_messages
WHERE conversation_key = %(key)s AND message ->> 'message_id' = ANY(%(message_ids)s::text[])
RETURNING position
"""
"""Remove the messages with those ids; returns the positions they held."""

CLOSE_GAPS_AWAY: Final = """
UPDATE tether_conversation_messages AS kept
SET position = -1 - (kept.position - (
    SELECT count(*) FROM unnest(%(removed)s::integer[]) AS gone (position)
    WHERE gone.position < kept.position
)::integer)
WHERE kept.conversation_key = %(key)s AND kept.position > %(lowest)s
"""
"""First half of closing the gaps: each message after the lowest removed
position goes to its new position, stored negated (``-1 - new``). The primary
key is checked row by row, so moving straight down could meet a row not moved
yet; no message sits at a negative position, so this never does."""

CLOSE_GAPS_BACK: Final = """
UPDATE tether_conversation_messages
SET position = -1 - position
WHERE conversation_key = %(key)s AND position < 0
"""
"""Second half: the moved messages take their new positions, all distinct."""

FIRST_USER_MESSAGE: Final = """
SELECT message
FROM tether_conversation_messages
WHERE conversation_key = %(key)s AND message ->> 'sender' = %(sender)s
ORDER BY position
LIMIT 1
"""
"""What the title is taken from again after messages were removed."""

UPDATE_CONVERSATION_AFTER_REMOVAL: Final = """
UPDATE tether_conversations
SET last_turn_status = %(last_turn_status)s, title = %(title)s,
    message_count = %(message_count)s, fence_epoch = %(fence_epoch)s,
    updated_at = %(updated_at)s
WHERE key = %(key)s
"""

SET_LAST_TURN_STATUS: Final = """
UPDATE tether_conversations
SET last_turn_status = %(last_turn_status)s, updated_at = %(updated_at)s
WHERE key = %(key)s AND owner_uuid = %(owner_uuid)s
RETURNING key
"""

SET_SHARED: Final = """
UPDATE tether_conversations
SET shared = %(shared)s
WHERE key = %(key)s AND owner_uuid = %(owner_uuid)s
RETURNING key
"""

DELETE_CONVERSATION: Final = """
DELETE FROM tether_conversations
WHERE key = %(key)s AND owner_uuid = %(owner_uuid)s
RETURNING key
"""
"""Owner-guarded; the messages go with it (``ON DELETE CASCADE``)."""

READ_TRANSCRIPT: Final = """
SELECT conversation.tenant, conversation.session_id, conversation.owner_uuid,
       conversation.agent_identifier, conversation.shared, conversation.last_turn_status,
       conversation.title, conversation.message_count, conversation.created_at,
       conversation.updated_at, message.message
FROM tether_conversations AS conversation
LEFT JOIN tether_conversation_messages AS message
    ON message.conversation_key = conversation.key
WHERE conversation.key = %(key)s
ORDER BY message.position
"""
"""The conversation's columns beside each of its messages, in one statement so that
the access check and the messages come from one snapshot."""

READ_SUMMARY: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE key = %(key)s
"""

LIST_CONVERSATIONS: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE owner_key = %(owner_key)s
ORDER BY updated_at DESC, key DESC
LIMIT %(limit)s
"""
"""The first page; served by the ``(owner_key, updated_at DESC, key DESC)`` index."""

LIST_STALE_CONVERSATIONS: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE updated_at < %(before)s
ORDER BY updated_at ASC, key ASC
LIMIT %(limit)s
"""
"""Retention: every owner's conversations not updated since ``before``, oldest
first; served by the ``(updated_at, key)`` index."""

LIST_STALE_CONVERSATIONS_AFTER: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE updated_at < %(before)s
  AND (updated_at, key) > (%(after_updated_at)s, %(after_key)s)
ORDER BY updated_at ASC, key ASC
LIMIT %(limit)s
"""

LIST_CONVERSATIONS_AFTER: Final = """
SELECT key, tenant, session_id, owner_uuid, agent_identifier, shared, last_turn_status,
       title, message_count, created_at, updated_at
FROM tether_conversations
WHERE owner_key = %(owner_key)s
  AND (updated_at, key) < (%(after_updated_at)s, %(after_key)s)
ORDER BY updated_at DESC, key DESC
LIMIT %(limit)s
"""
"""A later page: everything strictly after the cursor's ``(updated_at, key)``."""

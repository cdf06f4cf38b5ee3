"""Erasing a conversation and everything it owns, for its owner or for retention.

A conversation owns more than its transcript: the checkpoint of its agent's
state, the recording of its last turn and the supervision row of that turn
(and, on the file store, the lock files beside them). ``erase_conversation``
removes all of them, and keeps what is not user data: the epoch and the
fences each store keeps per conversation, so that epochs still only grow and
a producer paused past the erase can never write again.

A conversation with a live turn is not erased (409): its producer would write
on. A dead turn's producer may only be paused, so the stores are fenced at the
next epoch first; a finished turn has no producer left. The supervision row
is removed guarded by its turn and epoch, so a newer turn's row is left alone.
The transcript goes last: an erase that fails half-way (a store outage) can be
repeated, because the conversation is still there to be deleted.

What stays possible: a turn that starts *while* its conversation is being
erased (the owner racing their own delete, or retention racing a user who
comes back at that very moment) may lose its first checkpoint or find its
transcript gone; it then runs as a turn of a new conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from tether.domain.chat_conversation_store import ConversationNotOwnedError, normalize_owner
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.handlers.errors import ConversationBusyError
from tether.runtime.fenced_writer import raise_fences
from tether.runtime.lease import ConversationKey
from tether.runtime.turn_stores import TurnStores

RunningLocally = Callable[[ConversationKey], str | None]
"""The message id of a turn this replica produces for a conversation, if any."""


async def erase_conversation(
    stores: TurnStores,
    tenant: str,
    requester_uuid: str | None,
    session_id: str,
    *,
    now: datetime,
    dead_after: timedelta,
    running_locally: RunningLocally | None = None,
) -> bool:
    """Erase the conversation ``(tenant, session_id)`` of owner ``requester_uuid``:
    its transcript, checkpoint, recording and supervision row. Returns whether
    a transcript existed.

    Raises ``ConversationNotOwnedError`` (someone else's, before anything is
    erased), ``ConversationBusyError`` (a live turn occupies it) and, with a
    conversation store that cannot read or delete conversations,
    ``NotImplementedError`` before anything is erased.
    """
    owner = normalize_owner(requester_uuid)
    key = ConversationKey(tenant, owner, session_id)
    conversations = stores.conversation
    if conversations is not None:
        summary = await conversations.get_conversation(tenant, owner, session_id)
        if summary is not None and summary.owner_uuid != owner:
            raise ConversationNotOwnedError(f"only the owner may delete {session_id!r}")
    row = None
    if stores.supervision is not None:
        row = await stores.supervision.read(tenant, owner, session_id)
        if row is not None and row.is_live(now, dead_after):
            raise ConversationBusyError(
                f"turn {row.message_id} is running in this conversation; cancel it first",
                message_id=row.message_id,
                session_id=session_id,
            )
    elif running_locally is not None and (running := running_locally(key)) is not None:
        # Without a supervision store only this replica's own turns can be known.
        raise ConversationBusyError(
            f"turn {running} is running in this conversation; cancel it first",
            message_id=running,
            session_id=session_id,
        )
    if row is not None and row.status is ChatStreamStatus.RUNNING:
        # A dead turn: its producer may be paused, not gone. Fence it out first.
        await raise_fences(stores, key, row.epoch + 1)
    if stores.agent_state is not None:
        await stores.agent_state.delete(tenant, owner, session_id)
    if stores.recording is not None:
        record = await stores.recording.read(tenant, owner, session_id)
        turns = {r.message_id for r in (record, row) if r is not None}
        for message_id in sorted(turns):
            await stores.recording.delete(tenant, owner, session_id, message_id)
    if row is not None and stores.supervision is not None:
        await stores.supervision.delete(tenant, owner, session_id, row.message_id, row.epoch)
    if conversations is None:
        return False
    return await conversations.delete_conversation(tenant, owner, session_id)

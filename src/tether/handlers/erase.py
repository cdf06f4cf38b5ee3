"""Erasing a conversation and everything it owns, for its owner or for retention.

A conversation owns more than its transcript: the checkpoint of its agent's
state, the recording of its last turn and the supervision row of that turn
(and, on the file store, the lock files beside them). ``erase_conversation``
removes all of them, and keeps what is not user data: the epoch and the
fences each store keeps per conversation, so that epochs still only grow and
a producer paused past the erase can never write again.

A conversation with a live turn is not erased (409): its producer would write
on. Otherwise the erase first takes the supervision row (``conversation_row``:
``ERASE``, a tombstone at the next epoch, every other store fenced at it), so
a dead turn's producer, only paused perhaps, can write nothing more, and no
claim made during the erase wins: not a takeover resuming that dead turn, not
a queued turn a status poll kicks, not a new message. An erase that loses the
row to one of them answers 409 and has erased nothing. The tombstone goes
last, guarded by its epoch; the stores keep the epoch and their fences.
The transcript goes just before it: an erase that fails half-way (a store
outage, a replica killed) can be repeated, because the conversation is still
there to be deleted, and its tombstone reads dead and frees the row
(``conversation_row.is_stuck``). The takeover scan repeats it when it finds
such a tombstone (``handlers.takeover``), so a killed erase still ends.

What stays possible: an erase slower than the dead threshold between taking
the row and removing the transcript finds its tombstone taken (a new turn
may claim a dead erase's row) and answers 409 with the transcript still
there; the checkpoint and recording it removed belonged to the conversation
being erased.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import ConversationNotOwnedError, normalize_owner
from tether.domain.chat_stream_supervision_store import ChatStreamSupervision
from tether.handlers.errors import ConversationBusyError
from tether.runtime import conversation_row as rows
from tether.runtime.conversation_row import ERASING_ID, Move, RowState
from tether.runtime.fenced_writer import raise_fences
from tether.runtime.lease import (
    ClaimRefusedError,
    Clock,
    ConversationKey,
    FencedError,
    Lease,
    Producer,
    take,
)
from tether.runtime.turn_stores import TurnStores

ERASE_NEEDS = (Capability.CONVERSATION_GET, Capability.CONVERSATION_DELETE)
"""What an erase needs of a conversation store: it reads the conversation
first (whose it is) and deletes it last."""

RunningLocally = Callable[[ConversationKey], str | None]
"""The message id of a turn this replica produces for a conversation, if any."""
EndDead = Callable[[ConversationKey, str], Awaitable[bool]]
"""End a dead turn with its verdict (``TurnEndings.end_dead_turn``)."""


async def erase_conversation(
    stores: TurnStores,
    tenant: str,
    requester_uuid: str | None,
    session_id: str,
    *,
    clock: Clock,
    dead_after: timedelta,
    running_locally: RunningLocally | None = None,
    producer: Producer = lambda: None,
    end_dead: EndDead | None = None,
) -> bool:
    """Erase the conversation ``(tenant, session_id)`` of owner ``requester_uuid``:
    its transcript, checkpoint, recording and supervision row. Returns whether
    a transcript existed.

    Raises ``ConversationNotOwnedError`` (someone else's, before anything is
    erased), ``ConversationBusyError`` (a live turn occupies it) and, with a
    conversation store that cannot read or delete conversations (see
    ``ERASE_NEEDS``; the route answers 501 before it asks),
    ``NotImplementedError`` before anything is erased.
    """
    owner = normalize_owner(requester_uuid)
    key = ConversationKey(tenant, owner, session_id)
    conversations = stores.conversation
    if conversations is not None and not all(supports(conversations, n) for n in ERASE_NEEDS):
        raise NotImplementedError(
            f"{type(conversations).__name__} cannot read and delete conversations"
        )
    summary = None
    if conversations is not None:
        summary = await conversations.get_conversation(tenant, owner, session_id)
        if summary is not None and summary.owner_uuid != owner:
            raise ConversationNotOwnedError(f"only the owner may delete {session_id!r}")
    tombstone: Lease | None = None
    row = None
    if stores.supervision is not None:
        reading = await rows.read(stores.supervision, key)
        row = reading.row
        if row is None and conversations is not None and summary is None:
            return False  # nothing to erase, and nothing to take
        now = clock()  # one moment for both decisions below
        if end_dead is not None and row is not None and _awaits_an_end(row, now, dead_after):
            # Ended first, with its verdict: should the erase then lose the
            # row to a claim and stop half way, the turn's question still has
            # its answer, as it would have had the erase never begun.
            await end_dead(key, row.message_id)
            reading = await rows.read(stores.supervision, key)
            row = reading.row
            now = clock()
            if row is not None and _awaits_an_end(row, now, dead_after):
                raise _busy(session_id, "a turn is ending in this conversation", row.message_id)
        tombstone = await _take_row(stores, key, reading, now, dead_after, clock, producer)
    elif running_locally is not None and (running := running_locally(key)) is not None:
        # Without a supervision store only this replica's own turns can be known.
        raise ConversationBusyError(
            f"turn {running} is running in this conversation; cancel it first",
            message_id=running,
            session_id=session_id,
        )
    if stores.agent_state is not None:
        await stores.agent_state.delete(tenant, owner, session_id)
    if stores.recording is not None:
        record = await stores.recording.read(tenant, owner, session_id)
        turns = {r.message_id for r in (record, row) if r is not None} - {ERASING_ID}
        for message_id in sorted(turns):
            await stores.recording.delete(tenant, owner, session_id, message_id)
    if tombstone is not None:
        try:
            # Still ours: nothing claimed the conversation while we erased
            # it, and nothing that read the tombstone before now (dead, had
            # we been slow) can claim it before the transcript goes.
            await tombstone.advance()
        except FencedError as lost:
            raise _busy(session_id, "the conversation was claimed while it was erased") from lost
    erased = False
    if conversations is not None:
        erased = await conversations.delete_conversation(tenant, owner, session_id)
    if tombstone is not None:
        await tombstone.delete_row()
    return erased


async def _take_row(
    stores: TurnStores,
    key: ConversationKey,
    reading: rows.Reading,
    now: datetime,
    dead_after: timedelta,
    clock: Clock,
    producer: Producer,
) -> Lease:
    """The erase's tombstone over the row as read, judged at ``now``; 409
    when a turn holds it live or it changed hands since it was read."""
    assert stores.supervision is not None
    row = reading.row
    state = rows.state_of(row, now, dead_after)
    stuck = rows.is_stuck(row, now, dead_after)
    if row is not None and not (rows.may(Move.ERASE, state) or stuck):
        raise _busy(
            key.session_id,
            f"turn {row.message_id} is running in this conversation; cancel it first",
            row.message_id,
        )
    try:
        return await take(
            stores.supervision,
            key,
            reading,
            ERASING_ID,
            clock,
            functools.partial(raise_fences, stores, key),
            producer,
        )
    except ClaimRefusedError as refused:
        holder = refused.occupant.message_id if refused.occupant is not None else ""
        raise _busy(
            key.session_id, "the conversation changed hands during the erase; try again", holder
        ) from refused


def _awaits_an_end(row: ChatStreamSupervision, now: datetime, dead_after: timedelta) -> bool:
    """Whether ``row`` holds a turn whose producer died (or whose ending did)."""
    state = rows.state_of(row, now, dead_after)
    return state is RowState.DEAD or (
        state is RowState.ENDING and rows.is_stuck(row, now, dead_after)
    )


def _busy(session_id: str, message: str, message_id: str = "") -> ConversationBusyError:
    return ConversationBusyError(message, message_id=message_id, session_id=session_id)

"""A conversation's supervision row: its states, the moves between them, and
the only code that writes it.

Read it as a table, like ``runtime.lifecycle`` for a producer. Every module
that changes the row (a claim, a heartbeat, a verdict, a drain's hand-off, the
queue's pass-on, a cancel, the reaper, an erase, the retention lease, the
clean-up of a finished turn) calls a function of this module, and every one
of them returns whether the store took the write: a refused write is a
decision for the caller, never something to drop.

The states, as a reader classifies the row it read (``state_of``):

=============  ===================================================================
``FREE``       no row, or a verdict (done, errored, cancelled): a new turn may claim
``LIVE``       turn T runs at epoch e: its producer renews a RUNNING heartbeat
``DEAD``       a RUNNING row whose heartbeat is old or whose producer is gone:
               turn T waits for a takeover or a client's resume. A drain's
               hand-off and the queue's pass-on to a queued turn Q read dead at
               once (a heartbeat from long ago), so whoever looks first goes on
``ENDING``     another hand than the producer took T's row at the next epoch to
               end it: a cancel, or the reaper (a dead turn that will not be
               resumed). It keeps T's partial answer, then writes the verdict
               at the epoch after
``ERASING``    an erase holds the row (a tombstone at the next epoch) while it
               removes the conversation; any claim made meanwhile loses
=============  ===================================================================

``ENDING`` and ``ERASING`` are RUNNING rows as the stores see them (so the
stores' liveness index, the takeover scan and every reader's "is it live"
treat them as occupied) told apart by a reserved producer or message id that
no replica and no client can have (ids with a slash, which ``api.ids``
refuses). The producer says which hand ends the turn (``CANCELLER``,
``REAPER``), so of a cancel and the reaper only one writes a verdict. Each
can itself read dead: a mover that died half way. A dead end is finished by
whoever finds it (the takeover scan: the user asked for the cancel; the
reaper's verdict stands); a dead erase's tombstone is free to the next claim,
and the takeover scan finishes the erase if no claim comes first.

The moves (``Move``), with the states a mover may make them from (``MOVES``);
every move but ``RENEW`` takes the next epoch, so a late heartbeat of an
older holder can never undo one:

=============  ====================  ============================================
move           from                  to
=============  ====================  ============================================
``CLAIM``      FREE                  LIVE(T, e+1): a new turn
``TAKE_OVER``  DEAD(T)               LIVE(T, e+1): takeover, resume, or the start
                                     of the queued turn the row was passed to
``RENEW``      LIVE(T, e)            LIVE(T, e): the heartbeat
``FINISH``     LIVE, ENDING          FREE(verdict, e+1)
``HAND_OFF``   LIVE(T, e)            DEAD(T, e+1): a draining replica
``PASS_ON``    LIVE(T, e)            DEAD(Q, e+1): T ended with Q queued behind it
``END``        LIVE, DEAD, FREE      ENDING(T, e+1), then FINISH: a cancel (live or
                                     dead), the reaper (dead only); from FREE, the
                                     cancel of a queued turn T (``handlers.cancel``)
``ERASE``      FREE, DEAD            ERASING(e+1), then DELETE
``DELETE``     FREE, ERASING         no row; the store keeps the epoch
=============  ====================  ============================================

A new turn never displaces a DEAD turn by itself: whoever starts it decides
first (``handlers``: enqueue waits, interrupt cancels it, the default ends it
with what it recorded), so no answer is lost to a new message.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    SupervisionSwap,
)
from tether.runtime.conversation_key import ConversationKey

LONG_AGO = datetime(1970, 1, 1, tzinfo=UTC)
"""The heartbeat of a row written dead on purpose (a hand-off, a pass-on)."""
CANCELLER = "tether/cancel"
"""The producer of an ENDING row a cancel holds."""
REAPER = "tether/reap"
"""The producer of an ENDING row the reaper holds."""
_ENDERS = frozenset({CANCELLER, REAPER})
ERASING_ID = "tether/erasing"
"""The message id of an erase's tombstone."""


class RowState(StrEnum):
    FREE = "free"
    LIVE = "live"
    DEAD = "dead"
    ENDING = "ending"
    ERASING = "erasing"


class Move(StrEnum):
    CLAIM = "claim"
    TAKE_OVER = "take_over"
    RENEW = "renew"
    FINISH = "finish"
    HAND_OFF = "hand_off"
    PASS_ON = "pass_on"
    END = "end"
    ERASE = "erase"
    DELETE = "delete"


_S = RowState
MOVES: dict[Move, frozenset[RowState]] = {
    Move.CLAIM: frozenset({_S.FREE}),
    Move.TAKE_OVER: frozenset({_S.DEAD}),
    Move.RENEW: frozenset({_S.LIVE}),
    Move.FINISH: frozenset({_S.LIVE, _S.ENDING}),
    Move.HAND_OFF: frozenset({_S.LIVE}),
    Move.PASS_ON: frozenset({_S.LIVE}),
    Move.END: frozenset({_S.LIVE, _S.DEAD, _S.FREE}),
    Move.ERASE: frozenset({_S.FREE, _S.DEAD}),
    Move.DELETE: frozenset({_S.FREE, _S.ERASING}),
}
"""From which states, as the mover read them, each move may be made. A move
whose compare-and-swap is refused found the row moved on meanwhile."""


def state_of(
    row: ChatStreamSupervision | None,
    now: datetime,
    dead_after: timedelta,
    gone: Collection[str] = (),
) -> RowState:
    """The state of ``row`` as read at ``now`` (see the module's table). A
    dead end reads ``ENDING`` and a dead erase ``ERASING``; ``is_stuck``
    tells them from live ones."""
    if row is None or row.status is not ChatStreamStatus.RUNNING:
        return RowState.FREE
    if row.message_id == ERASING_ID:
        return RowState.ERASING
    if row.producer in _ENDERS:
        return RowState.ENDING
    return RowState.DEAD if row.is_dead(now, dead_after, gone) else RowState.LIVE


def is_stuck(row: ChatStreamSupervision | None, now: datetime, dead_after: timedelta) -> bool:
    """Whether an ENDING or ERASING row was left by a mover that died half way."""
    return (
        row is not None and row.status is ChatStreamStatus.RUNNING and row.is_dead(now, dead_after)
    )


def may(move: Move, state: RowState) -> bool:
    return state in MOVES[move]


def is_handed_on(row: ChatStreamSupervision | None) -> bool:
    """Whether ``row`` was written dead on purpose for another replica to go
    on (``HAND_OFF``, ``PASS_ON``): no producer has claimed it since."""
    return (
        row is not None and row.status is ChatStreamStatus.RUNNING and row.heartbeat_at == LONG_AGO
    )


def is_cancelling(row: ChatStreamSupervision | None) -> bool:
    """Whether a cancel holds ``row`` to write its verdict."""
    return row is not None and row.status is ChatStreamStatus.RUNNING and row.producer == CANCELLER


# ------------------------------------------------------------------ writes


async def write(
    store: ChatStreamSupervisionStore,
    key: ConversationKey,
    expected_epoch: int | None,
    row: ChatStreamSupervision,
) -> bool:
    """Write ``row`` if the row is still at ``expected_epoch`` (None: absent):
    the one compare-and-swap every move makes. Whether the store took it."""
    return await store.compare_and_swap(
        key.tenant, key.requester_uuid, key.session_id, expected_epoch, row
    )


async def renew_many(
    store: ChatStreamSupervisionStore,
    renewals: Sequence[tuple[ConversationKey, ChatStreamSupervision]],
) -> list[bool]:
    """``RENEW`` several turns' rows in one batch, each at its own epoch."""
    swaps = [
        SupervisionSwap(k.tenant, k.requester_uuid, k.session_id, row.epoch, row)
        for k, row in renewals
    ]
    return await store.compare_and_swap_many(swaps)


async def delete(
    store: ChatStreamSupervisionStore, key: ConversationKey, message_id: str, epoch: int
) -> None:
    """``DELETE``: remove the row if it still holds ``message_id`` at ``epoch``
    (a newer holder's row is left alone); the store keeps the epoch."""
    await store.delete(key.tenant, key.requester_uuid, key.session_id, message_id, epoch)


def running(
    message_id: str, epoch: int, heartbeat_at: datetime, producer: str | None
) -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING,
        heartbeat_at=heartbeat_at,
        message_id=message_id,
        epoch=epoch,
        producer=producer,
    )


def verdict(
    message_id: str, epoch: int, status: ChatStreamStatus, now: datetime
) -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=status, heartbeat_at=now, message_id=message_id, epoch=epoch
    )


@dataclass(frozen=True)
class Reading:
    """The row as read, with the epoch it stands at: the row's own, or with no
    row the last epoch ever granted (epochs outlive their rows)."""

    row: ChatStreamSupervision | None
    epoch: int


async def read(store: ChatStreamSupervisionStore, key: ConversationKey) -> Reading:
    """The row and its epoch as of one moment. With no row, the last epoch is
    read after it and the row read again: a claim landing before the second
    read shows in the row, and one landing after it is above the epoch
    returned, so a move made from this reading never fences a newer holder
    it did not see (a move fences the stores at the epoch after it)."""
    row = await store.read(key.tenant, key.requester_uuid, key.session_id)
    if row is not None:
        return Reading(row, row.epoch)
    floor = await store.last_epoch(key.tenant, key.requester_uuid, key.session_id)
    again = await store.read(key.tenant, key.requester_uuid, key.session_id)
    return Reading(again, again.epoch if again is not None else floor)

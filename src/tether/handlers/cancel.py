"""Cancelling a turn, running or queued, from any replica.

A cancel that returns is final: the cancelled turn never produces afterwards
(design invariant 14), and the partial answer its readers were shown stays
in the transcript (13). What it does depends on the conversation's row as
read (``runtime.conversation_row``):

- The row names another turn, or none: the turn is queued. It is taken out
  of the queue, fenced at the row's epoch, so a claim that starts it
  meanwhile (a queue kick on any replica) makes the removal fail, and the
  cancel reads again and cancels it as a running turn. A claim fences the
  stores before its grant, and one that gives up (the turn it was for had
  left the queue) leaves them fenced above the row: so a refused removal
  with the turn still queued is not a lost race to report but one to run
  again. With the conversation free, the cancel takes the row itself for
  the queued turn (``CANCELLER``, as a cancel of a running turn does), takes
  it out at that epoch and writes its verdict; a claim in flight then loses
  its grant, or wins it and the cancel finds the turn running. With another
  turn's row, whose mover is on its way, it reads again a little later.
- The row was passed on to the turn (written dead on purpose, and the turn
  still queued): it has not started. Out of the queue first, at the row's epoch, before
  anything can start it; then its verdict. A start that claimed in between
  finds it gone and gives the conversation back.
- The turn runs, live or dead (or a cancel of it died half way): the cancel
  takes the row (``END``: ``ENDING`` at the next epoch, every store
  fenced there), so its producer, wherever it runs, can change nothing more;
  then, while the conversation is still held, it takes the turn's queued
  copy out if it has one, keeps the newest recorded message as the partial
  answer, and only then writes the verdict (``FINISH``), which frees the
  conversation. A write refused on the way means another hand took the row;
  the cancel reads it again. If a hand that was ending the turn (the
  producer's seal, the reaper, a new message ending a dead turn) stalled
  after it wrote its verdict into the transcript, and the cancel took its
  row as stuck, that verdict stands: the cancel writes it to the row and
  answers that the turn had ended.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.handlers.errors import ConversationBusyError, TurnEndedError, TurnNotFoundError
from tether.handlers.replica import Replica
from tether.runtime import conversation_row as rows
from tether.runtime.conversation_row import CANCELLER, RowState
from tether.runtime.fenced_writer import raise_fences
from tether.runtime.lease import ClaimRefusedError, ConversationKey, FencedError, take

if TYPE_CHECKING:
    from tether.handlers.turn import Turn

_TRIES = 4
"""Reads of the row one cancel of a running turn makes: more than one only
when other hands keep moving the row (a start, a takeover) while it cancels."""
_QUEUED_TRIES = 24
"""Reads of the row one cancel of a queued turn makes: the queue moves under
it each time a turn ahead of it starts, ends or is cancelled, which a client
cancelling a whole queue at once does many times over."""
_QUEUED_PAUSE = 0.005
"""Seconds between two reads of the row that another hand is moving (doubled
each time, up to ``_QUEUED_PAUSE_MAX``): its write lands within moments."""
_QUEUED_PAUSE_MAX = 0.2


async def cancel_turn(
    handler: Replica, key: ConversationKey, message_id: str, local: Turn | None
) -> None:
    """Cancel ``message_id`` of conversation ``key`` (see the module). Raises
    ``TurnNotFoundError`` (no such turn), ``TurnEndedError`` (it ended before
    the cancel) or ``ConversationBusyError`` (another cancel holds it, or the
    row kept changing hands: try again)."""
    store = handler.stores.supervision
    assert store is not None
    took = False
    running_tries = queued_tries = 0
    while running_tries < _TRIES and queued_tries < _QUEUED_TRIES:
        epoch, row = await handler.queue.epoch_and_row(key)
        if row is None or row.message_id != message_id:
            if await handler.queue.take_out(key, message_id, epoch):
                return
            if not await handler.queue.is_waiting(key, message_id):
                raise TurnNotFoundError(f"turn {message_id} is not running or queued")
            # Still queued: a claim fenced the stores above the row as read.
            state = rows.state_of(row, handler.clock(), handler.dead_after, handler.presence.gone)
            if state is RowState.FREE:
                if await _cancel_queued(handler, key, rows.Reading(row, epoch), message_id):
                    return
            else:
                await asyncio.sleep(min(_QUEUED_PAUSE * 2**queued_tries, _QUEUED_PAUSE_MAX))
            queued_tries += 1
            continue
        running_tries += 1
        state = rows.state_of(row, handler.clock(), handler.dead_after, handler.presence.gone)
        if state is RowState.ERASING:
            # An erase holds the conversation (an interrupt found its
            # tombstone in the way): no turn to cancel. A dead one is free to
            # the next claim, or finished by the takeover scan.
            raise ConversationBusyError(
                "the conversation is being erased",
                message_id=message_id,
                session_id=key.session_id,
            )
        if state is RowState.FREE:
            if took and row.status is ChatStreamStatus.CANCELLED:
                return  # our cancel, finished by another hand after ours stalled
            raise TurnEndedError(f"turn {message_id} already ended ({row.status.value})")
        if rows.is_handed_on(row) and await handler.queue.is_waiting(key, message_id):
            if await _cancel_passed_on(handler, key, row):
                return
            continue
        if state is RowState.ENDING and not rows.is_stuck(row, handler.clock(), handler.dead_after):
            # Another cancel, or the reaper, writes its verdict now.
            raise ConversationBusyError(
                f"turn {message_id} is ending; ask its status",
                message_id=message_id,
                session_id=key.session_id,
            )
        took = True
        if await _cancel_running(handler, key, rows.Reading(row, row.epoch), local):
            return
    raise ConversationBusyError(
        f"turn {message_id} changed hands while cancelling; try again",
        message_id=message_id,
        session_id=key.session_id,
    )


async def _cancel_passed_on(
    handler: Replica, key: ConversationKey, row: ChatStreamSupervision
) -> bool:
    """Cancel the queued turn the row was passed on to, before it starts;
    whether it is cancelled (False: a start claimed it first: read again)."""
    if not await handler.queue.take_out(key, row.message_id, row.epoch):
        return False
    store = handler.stores.supervision
    assert store is not None
    ended = rows.verdict(row.message_id, row.epoch + 1, ChatStreamStatus.CANCELLED, handler.clock())
    # Refused: another hand claimed the row since the removal (a start, which
    # finds the turn gone and gives the row back, or the reaper, which ends
    # a turn whose question was never recorded ``cancelled``). Either way the
    # turn is out of the queue and can never start: the cancel holds.
    await rows.write(store, key, row.epoch, ended)
    return True


async def _cancel_queued(
    handler: Replica, key: ConversationKey, reading: rows.Reading, message_id: str
) -> bool:
    """Cancel queued turn ``message_id`` of a free conversation whose stores a
    claim fenced above the row: take the row for it at the next epoch, so no
    start of it can be granted, take it out of the queue there, and end it
    ``cancelled``. Whether it is cancelled (False: another hand took the row
    first: read again)."""
    store = handler.stores.supervision
    assert store is not None
    try:
        lease = await take(
            store,
            key,
            reading,
            message_id,
            handler.clock,
            functools.partial(raise_fences, handler.stores, key),
            lambda: CANCELLER,
        )
    except ClaimRefusedError:
        return False
    # Refused only if a newer epoch holds the conversation, which a row taken
    # by this cancel rules out but for an erase: read again, and it is gone.
    if not await handler.queue.remove(key, message_id, lease.epoch):
        return False
    try:
        await lease.finish(ChatStreamStatus.CANCELLED)
    except FencedError:
        return False
    handler.endings.forget_later(key, message_id, lease.row_epoch)
    return True


async def _cancel_running(
    handler: Replica, key: ConversationKey, reading: rows.Reading, local: Turn | None
) -> bool:
    """Cancel the running turn the row names; whether it is cancelled (False:
    the row changed hands on the way: read again)."""
    store = handler.stores.supervision
    assert store is not None and reading.row is not None
    row = reading.row
    message_id = row.message_id
    ours = (
        local is not None
        and local.lease is not None
        and local.key == key
        and local.lease.epoch == row.epoch
    )
    if ours:
        assert local is not None
        # Ours and live: stop it and flush what its clients saw first.
        await local.stop_for_cancel()
    try:
        lease = await take(
            store,
            key,
            reading,
            message_id,
            handler.clock,
            functools.partial(raise_fences, handler.stores, key),
            lambda: CANCELLER,
        )
    except ClaimRefusedError:
        return False
    if await handler.queue.has_copy(key, message_id):
        # Claimed by a start that had not yet taken its queued copy out (it
        # may have recorded its question, and been fenced before the copy
        # went): the copy goes too, or a later kick would start it again.
        if not await handler.queue.remove(key, message_id, lease.epoch):
            return False
    # A hand before ours (the producer's seal, the reaper, another cancel)
    # may have written the verdict and died before the row said it: that
    # verdict stands, and the row is finished with it.
    verdict = await handler.endings.written_verdict(key, message_id)
    if verdict is None:
        if not await handler.endings.keep_partial_answer(key, message_id, lease.epoch):
            return False
        verdict = ChatStreamStatus.CANCELLED
    try:
        await lease.finish(verdict)
    except FencedError:
        return False
    if local is not None and local.key == key:
        # Told once the verdict is written: its readers here then find the
        # partial answer kept in the transcript.
        local.cancelled()
    handler.endings.forget_later(key, message_id, lease.row_epoch)
    if verdict is not ChatStreamStatus.CANCELLED:
        raise TurnEndedError(f"turn {message_id} already ended ({verdict.value})")
    return True

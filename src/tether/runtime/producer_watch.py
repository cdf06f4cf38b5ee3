"""A producer's view of its conversation's row, through the stores' change channel.

Another hand may take a turn's row at any moment (a cancel, a takeover, a
new turn after a cancel). The producer learns it at its next fenced write at
the latest; where the stores push changes (``ChatStreamRecordingStore.
subscribe``), it learns it at once (``watch``). And once fenced, it waits
briefly for the row to name whoever fenced it (``row_past``), so its readers
are told how the turn went on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tether.domain.chat_stream_recording_store import (
    ChangeSubscription,
    ChatStreamRecordingStore,
    StreamChange,
)
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.runtime import conversation_row as rows
from tether.runtime.lease import ConversationKey, Lease
from tether.runtime.live_buffer import EndReason

logger = logging.getLogger(__name__)

_ROW_POLL = 0.05
"""Seconds between reads of the row while a fenced producer waits for its new
owner's write, where the stores announce nothing."""


async def watch(
    recording: ChatStreamRecordingStore,
    lease: Lease,
    key: ConversationKey,
    *,
    producing: Callable[[], bool],
    interval: float,
    on_watched: Callable[[], None],
    on_taken: Callable[[], None],
) -> None:
    """Listen to the conversation's channel while ``producing()``.

    A follower's watch (``StreamChange.WATCH``) calls ``on_watched`` (the
    producer publishes its deltas for it: ``DeltaPublisher``). When the
    conversation's epoch moves past the lease's (a cancel or a takeover on
    any replica), ``on_taken`` runs and the watch ends: the producer stops at
    once rather than at the next write the stores would refuse."""
    async with recording.subscribe(key.tenant, key.requester_uuid, key.session_id) as changes:
        while producing():
            heard = await changes.wait(interval)
            if StreamChange.WATCH in heard:
                on_watched()
            if StreamChange.SUPERVISION not in heard:
                continue
            try:
                row = await lease.store.read(key.tenant, key.requester_uuid, key.session_id)
            except Exception:
                # The fenced writes and the heartbeats still stop it in time.
                logger.debug("turn %s: watch read failed", lease.message_id, exc_info=True)
                continue
            if row is None or row.epoch > lease.row_epoch:
                on_taken()
                return


async def row_past(
    lease: Lease,
    recording: ChatStreamRecordingStore | None,
    key: ConversationKey,
    *,
    wait: float,
    past: int | None = None,
) -> ChatStreamSupervision | None:
    """The conversation's row once its epoch is past ``past`` (default: the
    lease's), that is once it names whoever fenced ``lease``. A new
    owner (a cancel, a takeover) raises the stores' fences before it writes
    the row, so a write refused in between (a recording put, made for every
    message) finds the row still the lease's: wait for it to move, at most
    ``wait`` seconds (a new owner that died there leaves the row to read
    dead, and a producer fenced by its own unrenewed lease finds nobody)."""
    changes = (
        recording.subscribe(key.tenant, key.requester_uuid, key.session_id)
        if recording is not None
        else ChangeSubscription()
    )
    threshold = lease.row_epoch if past is None else past
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    async with changes:  # before the read: a move after it is heard
        while True:
            row = await lease.store.read(key.tenant, key.requester_uuid, key.session_id)
            left = deadline - loop.time()
            if row is None or row.epoch > threshold or left <= 0:
                return row
            await changes.wait(min(left, _ROW_POLL))


async def ending_after_fence(
    lease: Lease,
    recording: ChatStreamRecordingStore | None,
    key: ConversationKey,
    *,
    wait: float,
) -> EndReason:
    """How a turn whose lease another writer took ended, as its local readers
    hear it: a cancel says ``cancelled`` (once its verdict is written, or
    after ``wait`` while it still keeps the partial), and so does a newer
    turn in the row (an interrupt or a rollback
    cancelled this one before it claimed; nothing carries this turn on); a
    takeover says ``gone``: ask the status, the turn lives elsewhere."""
    with contextlib.suppress(Exception):
        row = await row_past(lease, recording, key, wait=wait)
        if row is not None and rows.is_cancelling(row):
            # The cancel keeps the partial answer, then writes its verdict:
            # wait for the verdict, so a reader told ``cancelled`` finds the
            # answer kept in the transcript (a chat page re-reads it then).
            row = await row_past(lease, recording, key, wait=wait, past=row.epoch) or row
        if row is not None and (
            row.message_id != lease.message_id
            or row.status is ChatStreamStatus.CANCELLED
            or rows.is_cancelling(row)
        ):
            return EndReason.CANCELLED
    return EndReason.GONE

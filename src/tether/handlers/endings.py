"""How a turn ends when its producer cannot end it: the reaper's verdict, a
cancel's kept partial, and the clean-up of a turn another hand ended.

A turn's own producer writes its verdict (``handlers.turn``). Any other hand
that ends it (a cancel, the reaper of a dead turn, a new message over a dead
turn, the takeover limit, an erase) takes its row at the next epoch first
(``conversation_row``: ``END``) and then writes here: the answer the turn
recorded, marked with how it ended (``handlers.turn_ends``), fenced at that
epoch, then the verdict on the row.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import LastTurnStatus
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_supervision_store import ChatStreamStatus
from tether.handlers.turn_ends import ending_of, kept_answer
from tether.metrics import TetherMetrics
from tether.runtime import conversation_row as rows
from tether.runtime.conversation_row import RowState
from tether.runtime.fenced_writer import raise_fences
from tether.runtime.lease import ClaimRefusedError, ConversationKey, FencedError, take
from tether.runtime.presence import ReplicaPresence
from tether.runtime.turn_stores import TurnStores

logger = logging.getLogger(__name__)

PRODUCER_LOST = "PRODUCER_LOST"
"""The error code of a turn ended because its producer died and it was not resumed."""


class TurnEndings:
    """The endings another hand than a turn's producer writes, on one replica."""

    def __init__(
        self,
        stores: TurnStores,
        *,
        clock: Callable[[], datetime],
        dead_after: timedelta,
        presence: ReplicaPresence,
        metrics: TetherMetrics,
        grace: float,
        kick: Callable[[ConversationKey], None],
        in_background: Callable[[Coroutine[Any, Any, object]], None],
    ) -> None:
        """``grace``: how long a finished turn's rows stay readable
        (``finished_turn_grace``); ``kick`` starts the conversation's next
        queued turn (in the background); ``in_background`` runs work the
        replica waits for at shutdown."""
        self._stores = stores
        self._clock = clock
        self._dead_after = dead_after
        self._presence = presence
        self._metrics = metrics
        self._grace = grace
        self._kick = kick
        self._in_background = in_background

    async def end_dead_turn(
        self, key: ConversationKey, message_id: str, code: str, reason: str
    ) -> bool:
        """End a dead turn that will not be resumed (the reaper, the takeover
        limit, a new message over it), or one whose ending stopped half way:
        the row taken at the next epoch (``ENDING``, so no cancel ends it
        too), then ``errored``, with what it recorded kept as its answer;
        ``cancelled``, with nothing written to the transcript, when its
        question was never recorded (a queued turn taken out of the queue
        after the row was passed on to it). Whether this replica ended it:
        False when the turn is no longer dead or another replica was first."""
        store = self._stores.supervision
        assert store is not None
        row = await store.read(key.tenant, key.requester_uuid, key.session_id)
        if row is None or row.message_id != message_id:
            return False
        state = rows.state_of(row, self._clock(), self._dead_after, self._presence.gone)
        if not (state is RowState.DEAD or rows.is_stuck(row, self._clock(), self._dead_after)):
            return False  # live, finished, or another hand ends it now
        try:
            lease = await take(
                store,
                key,
                rows.Reading(row, row.epoch),
                message_id,
                self._clock,
                functools.partial(raise_fences, self._stores, key),
                lambda: rows.REAPER,
            )
        except ClaimRefusedError:
            return False
        asked = await self.asked(key, message_id)
        written = await self.written_verdict(key, message_id)
        if written is not None:
            # An ender before us (a cancel, the reaper, the producer's own
            # seal) wrote the verdict and died before the row said it: the
            # row now says the same, so every reader hears one ending.
            status, reaped = written, False
        elif rows.is_cancelling(row):
            # A cancel that died half way: its intent stands, and it is the
            # verdict the cancel's own retry would write.
            status, reaped = ChatStreamStatus.CANCELLED, False
            if not await self.keep_partial_answer(key, message_id, lease.epoch):
                return False  # a newer epoch took the conversation meanwhile
        elif asked:
            status, reaped = ChatStreamStatus.ERRORED, True
            logger.warning("turn %s: ended errored (%s): %s", message_id, code, reason)
            kept = await self.keep_partial_answer(
                key, message_id, lease.epoch, status="errored", error=(code, reason)
            )
            if not kept:
                return False  # a newer epoch took the conversation meanwhile
        else:
            status, reaped = ChatStreamStatus.CANCELLED, False
        try:
            await lease.finish(status)
        except FencedError:
            return False
        if reaped:
            self._metrics.turns_reaped.labels(code).inc()
        self.forget_later(key, message_id, lease.row_epoch)
        self._kick(key)
        return True

    async def end_erased_turn(self, key: ConversationKey, message_id: str) -> bool:
        """``end_dead_turn`` for a dead turn whose conversation is being erased."""
        return await self.end_dead_turn(
            key,
            message_id,
            PRODUCER_LOST,
            "the turn's producer died and its conversation was erased",
        )

    async def asked(self, key: ConversationKey, message_id: str) -> bool:
        """Whether turn ``message_id``'s user message is in the transcript (a
        turn records it right after its claim): only then may its verdict
        write an answer there. True without a conversation store."""
        store = self._stores.conversation
        if store is None:
            return True
        transcript = await store.get_transcript(key.tenant, key.requester_uuid, key.session_id)
        return any(m.message_id == f"{message_id}-user" for m in transcript)

    async def written_verdict(
        self, key: ConversationKey, message_id: str
    ) -> ChatStreamStatus | None:
        """The verdict already in the transcript for turn ``message_id`` (its
        answer, marked with how it ended: ``turn_ends``), or None. Read by a
        hand that has just taken the row of a turn whose ending stopped half
        way: the row then says what the transcript says."""
        answer = await self.answer_in_transcript(key, message_id)
        return ChatStreamStatus(ending_of(answer).reason) if answer is not None else None

    async def keep_partial_answer(
        self,
        key: ConversationKey,
        message_id: str,
        epoch: int,
        *,
        status: LastTurnStatus = "cancelled",
        error: tuple[str, str] | None = None,
    ) -> bool:
        """Write a turn's verdict, given by another hand than its producer's (a
        cancel, the reaper), into its transcript at that verdict's epoch: the
        newest recorded message (read after the fence, so nothing a fenced
        producer writes later can be newer than it) as its answer, marked
        with the way it ended (``handlers.turn_ends``: a cancel, or an
        ``error`` (code, message)), so the transcript says why the answer
        stops where it does. Nothing is written for a turn whose question was
        never recorded: an answer there would follow no question.

        Fenced and idempotent by ``message_id``: if the producer sealed its whole
        answer before the fence, that answer stays the one bot message.
        Whether the store took it (False: a newer epoch holds the conversation)."""
        conversations = self._stores.conversation
        if conversations is None or not await self.asked(key, message_id):
            return True
        partial: ChatMessage | None = None
        if self._stores.recording is not None:
            record = await self._stores.recording.read(
                key.tenant, key.requester_uuid, key.session_id
            )
            if record is not None and record.message_id == message_id:
                partial = record.message
        # With its tool calls closed and its end marked (``turn_ends``).
        partial = kept_answer(
            partial, status, session_id=key.session_id, message_id=message_id, error=error
        )
        return await conversations.append_fenced(
            key.tenant,
            key.requester_uuid,
            key.session_id,
            await self._stored_agent(key),
            [partial] if partial is not None else [],
            epoch=epoch,
            last_turn_status=status,
            create_if_absent=False,
        )

    async def _stored_agent(self, key: ConversationKey) -> str:
        """The conversation's agent as stored: appending names it again, and a
        verdict written by another replica (a cancel, the reaper) repeats it."""
        store = self._stores.conversation
        assert store is not None
        if not supports(store, Capability.CONVERSATION_GET):
            return ""
        summary = await store.get_conversation(key.tenant, key.requester_uuid, key.session_id)
        return summary.agent_identifier if summary is not None else ""

    def forget_later(self, key: ConversationKey, message_id: str, epoch: int) -> None:
        async def forget() -> None:
            await asyncio.sleep(self._grace)
            with contextlib.suppress(Exception):
                if self._stores.recording is not None:
                    await self._stores.recording.delete(
                        key.tenant, key.requester_uuid, key.session_id, message_id
                    )
                if self._stores.supervision is not None:
                    await rows.delete(self._stores.supervision, key, message_id, epoch)

        self._in_background(forget())

    async def answer_in_transcript(
        self, key: ConversationKey, message_id: str
    ) -> ChatMessage | None:
        """Turn ``message_id``'s answer as the transcript holds it, if it does."""
        store = self._stores.conversation
        if store is None:
            return None
        transcript = await store.get_transcript(key.tenant, key.requester_uuid, key.session_id)
        return next(
            (
                m
                for m in transcript
                if m.message_id == message_id and m.sender is ChatMessageSender.BOT
            ),
            None,
        )

"""Reading a conversation's turn: attaching to its stream, and its status.

A reader may be on any replica. On the one producing the turn it reads the
turn's live buffer; elsewhere it follows the turn's recording in the stores
(``runtime.follower``), which the producer writes before anything is shown
(issue 25: shown implies durable). A turn that is over is told from the
transcript, where its answer says how it ended (``handlers.turn_ends``); a
queued one is followed once it starts, wherever it does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import ConversationNotOwnedError, normalize_owner
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.queued_messages import Waiting
from tether.handlers.errors import NotOwnerError, TurnEndedError, TurnNotFoundError
from tether.handlers.replica import Replica
from tether.handlers.running_turns import RunningTurns
from tether.handlers.turn_ends import ending_of
from tether.runtime.follower import RecordingFollower, has_push, shows_the_same
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

_STARTING_WAIT = 5.0
"""Seconds an attach waits for a turn this replica claimed to start, before it
reads the turn from the stores instead."""


@dataclass(frozen=True)
class TurnStatus:
    """The answer to ``GET /chat/stream/status``."""

    message_id: str
    status: str  # running | done | errored | cancelled | dead
    epoch: int
    heartbeat_at: datetime | None
    queue: list[Waiting] = field(default_factory=list)
    """The turns waiting after this one, in the order they will run."""


class TurnReaders:
    """The readers of the turns of one replica's conversations."""

    def __init__(
        self,
        replica: Replica,
        running: RunningTurns,
        *,
        takeover_running: Callable[[], bool],
    ) -> None:
        """``takeover_running``: whether this replica's automatic takeover
        runs (a follower of a dead turn then waits for it to be taken over)."""
        self._replica = replica
        self._running = running
        self._takeover_running = takeover_running

    async def reader_key(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ConversationKey:
        """The key of the stream rows a reader may see: their own, or, for a
        conversation shared with them, its owner's. A private conversation of
        someone else is a 403, whatever the reader guesses."""
        key = _key(tenant, requester_uuid, session_id)
        store = self._replica.stores.conversation
        if not supports(store, Capability.CONVERSATION_GET):
            return key  # no store, or it cannot say whose the conversation is
        assert store is not None
        try:
            summary = await store.get_conversation(tenant, key.requester_uuid, session_id)
        except ConversationNotOwnedError as error:
            raise NotOwnerError("this conversation is private to its owner") from error
        if summary is None or summary.owner_uuid == key.requester_uuid:
            return key
        return ConversationKey(tenant, summary.owner_uuid, session_id)

    async def _settled(
        self,
        events: AsyncIterator[StreamEvent | StreamEnd],
        key: ConversationKey,
        message_id: str,
        start_index: int,
    ) -> AsyncIterator[StreamEvent | StreamEnd]:
        """A follower's events, its ``gone`` settled by the transcript.

        The follower hears ``gone`` once the row names another turn: the next
        queued one, to which this turn handed the conversation at its end
        (``Lease.pass_on``), or an interrupt's, which claimed it right after
        its cancel. Then the turn's answer, and how it ended, are in the
        transcript (``handlers.turn_ends``): the reader gets that answer, if
        it was not the last message it was sent, and that verdict. So does a
        follower whose turn's row was cleaned up meanwhile. Without an answer
        there (a rolled-back turn, one cancelled before anything of it was
        recorded) it stays ``gone``."""
        last: StreamEvent | None = None
        async for item in events:
            if isinstance(item, StreamEvent):
                last = item
            elif item.reason is EndReason.GONE:
                recorded = await self._replica.endings.answer_in_transcript(key, message_id)
                if recorded is not None:
                    answer, item = recorded, ending_of(recorded)
                    if last is None or not shows_the_same(last.message, answer):
                        index = last.index + 1 if last is not None else start_index
                        yield StreamEvent(index, answer)
            yield item

    async def attach(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str | None,
        message_id: str,
        start_index: int,
    ) -> tuple[AsyncIterator[StreamEvent | StreamEnd], bool]:
        """The turn's events from ``start_index``: from the live buffer when this
        replica produces it, else by following the recording from the stores.
        The flag says whether the source is the live buffer."""
        requester = normalize_owner(requester_uuid)
        starting = self._running.start_of(message_id)
        if starting is not None:
            # Claimed here a moment ago: follow it from its live buffer once it
            # runs (from the stores, should its start fail or take long).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(starting), _STARTING_WAIT)
        local = self._running.get(message_id)
        if local is not None and local.lease is not None and local.lease.lost:
            # This replica lost the turn (a takeover, a cancel, a drain): its buffer
            # is a stale copy. Follow the stores, where the current owner writes.
            local = None
        if (
            local is not None
            and local.lease is not None
            and local.buffer.end is not None
            and self._replica.stores.supervision is not None
        ):
            # A stateful turn over here: served from memory only while its row
            # still names it. Once the row is gone (an erase, or the clean-up)
            # or names the next turn, the transcript is the one answer there is.
            k = local.key
            row = await self._replica.stores.supervision.read(
                k.tenant, k.requester_uuid, k.session_id
            )
            if row is None or row.message_id != message_id:
                local = None
        # The local buffer serves only the turn of the key the reader names: its
        # own turn (of the session given, if any), or below, a shared one's.
        if (
            local is not None
            and (local.context.tenant, local.context.requester_uuid) == (tenant, requester)
            and (not session_id or local.context.session_id in (None, session_id))
        ):
            return self._replica.metrics.lagged(local.buffer.follow(start_index)), True
        recording, supervision = self._replica.stores.recording, self._replica.stores.supervision
        if not session_id or recording is None or supervision is None:
            raise TurnNotFoundError(
                f"turn {message_id} is not running on this server"
                + ("" if session_id else "; pass its session_id to follow it from another")
            )
        key = await self.reader_key(tenant, requester, session_id)
        if local is not None and local.key == key:
            return self._replica.metrics.lagged(local.buffer.follow(start_index)), True
        row = await supervision.read(key.tenant, key.requester_uuid, key.session_id)
        if row is None or row.message_id != message_id:
            if await self._replica.queue.is_waiting(key, message_id):
                # Queued: stream it once it starts, wherever it does.
                async def later(start: int) -> AsyncIterator[StreamEvent | StreamEnd]:
                    events, _ = await self.attach(tenant, requester, session_id, message_id, start)
                    return events

                return self._replica.queue.follow_when_started(
                    key, message_id, later, start_index
                ), False
            answer = await self._replica.endings.answer_in_transcript(key, message_id)
            if answer is None:
                raise TurnEndedError(
                    f"turn {message_id} is finished and cleaned up, or never existed"
                )
            # Over, its row cleaned up or naming the next turn: its answer
            # says how it ended (``handlers.turn_ends``).
            return _told(StreamEvent(start_index, answer), ending_of(answer)), False

        def live_here(epoch: int, start: int) -> AsyncIterator[StreamEvent | StreamEnd] | None:
            """The turn's live buffer, once this replica produces it at ``epoch``."""
            turn = self._running.get(message_id)
            if turn is None or turn.lease is None or turn.lease.lost:
                return None
            if (turn.key, turn.lease.epoch) != (key, epoch):
                return None
            return self._replica.metrics.lagged(turn.buffer.follow(start))

        follower = RecordingFollower(
            recording,
            supervision,
            key,
            message_id,
            clock=self._replica.clock,
            dead_after=self._replica.dead_after,
            poll_interval=(
                self._replica.settings.follower_push_fallback_interval
                if has_push(recording)
                else self._replica.settings.follower_poll_interval
            ),
            await_takeover=self._replica.settings.dead_after if self._takeover_running() else 0.0,
            live_here=live_here,
            monotonic=self._replica.monotonic,
        )
        return self._settled(follower.follow(start_index), key, message_id, start_index), False

    # --------------------------------------------------- status and cancel

    async def status(self, tenant: str, requester_uuid: str | None, session_id: str) -> TurnStatus:
        store = self._replica.stores.supervision
        if store is not None:
            key = await self.reader_key(tenant, requester_uuid, session_id)
            row = await store.read(key.tenant, key.requester_uuid, key.session_id)
            waiting = await self._replica.queue.waiting(key)
            if waiting and (
                row is None
                or row.status is not ChatStreamStatus.RUNNING
                or self._replica.reads_dead(row)
            ):
                # Idle (or its row dead: a hand-off to the next queued turn
                # whose replica died) with turns waiting: start the next one
                # now, and say so.
                if await self._replica.queue.kick(key) is not None or row is None:
                    row = await store.read(key.tenant, key.requester_uuid, key.session_id)
                    waiting = await self._replica.queue.waiting(key)
            if row is None:
                # No turn, or an erased conversation: a turn this replica still
                # remembers must not be told of after its row is gone.
                raise TurnNotFoundError(f"no turn is known for conversation {session_id!r}")
            return TurnStatus(
                row.message_id, self._verdict(row), row.epoch, row.heartbeat_at, waiting
            )
        # Without a supervision store only this replica's own turns can be known.
        for turn in reversed(list(self._running)):
            ctx = turn.context
            if (ctx.tenant, ctx.requester_uuid, ctx.session_id) == (
                tenant,
                normalize_owner(requester_uuid),
                session_id,
            ):
                end = turn.buffer.end
                return TurnStatus(turn.message_id, end.reason if end else "running", 0, None)
        raise TurnNotFoundError(f"no turn is known for conversation {session_id!r}")

    def _verdict(self, row: ChatStreamSupervision) -> str:
        if row.status is ChatStreamStatus.RUNNING:
            return "dead" if self._replica.reads_dead(row) else "running"
        return row.status.value


def _key(tenant: str, requester_uuid: str | None, session_id: str) -> ConversationKey:
    return ConversationKey(tenant, normalize_owner(requester_uuid), session_id)


async def _told(*items: StreamEvent | StreamEnd) -> AsyncIterator[StreamEvent | StreamEnd]:
    for item in items:
        yield item
